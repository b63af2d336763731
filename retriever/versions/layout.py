"""The names of an index version's files and folders, in one place: what every writer and reader of a version
(`Index`, both build engines, their workers) agrees on. A segment's own files are named in `retriever.store.layout`.

    indexes/NAME -> .versions/NAME/FOLDER    (VERSIONS; .versions/NAME/LOCK is the writer lock, and
                                              .versions/NAME/NUMBERS the version numbers given out and committed)
    FOLDER/
      manifest.json          MANIFEST (`retriever.versions.manifest`): the version's number, every file's size and
                             hash, the segments, the counts
      calibrator/            CALIBRATOR: the fitted calibrator (calibrator.json and its weights)
      trained.faiss          TEMPLATE: the trained IVF quantizer every segment shares (IVF index types only)
      tombstones.npy         TOMBSTONES: row ids deleted since the segments were written
      segments/NNNNNN/       SEGMENTS: the segments (`retriever.store.layout`)
      encoded.npy            ENCODED: a build's raw vectors, in its partial folder until the segment is written
      build-state.json       BUILD_STATE: in a build's partial folder, what it has finished, for resuming
"""

from __future__ import annotations

MANIFEST, BUILD_STATE, VERSIONS, LOCK = "manifest.json", "build-state.json", ".versions", "lock"
NUMBERS = "numbers.json"
CALIBRATOR, TEMPLATE, TOMBSTONES, SEGMENTS = "calibrator", "trained.faiss", "tombstones.npy", "segments"
ENCODED = "encoded.npy"
