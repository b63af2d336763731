"""The version store: an index is a name pointing at one immutable version, swapped atomically by a writer.

`home` (where indexes live, their names), `folder` (partial version folders, the atomic swap, the writer lock,
pruning and rollback), `integrity` (manifests on disk, their checksums, re-hashing), `manifest` (the typed
manifest), `layout` (a version's file names), `writer` (one write transaction), `snapshot` (one version opened for
reading) and `catalog` (what `list` and `versions` show)."""
