"""What the version store shows people: the indexes of a home (`retriever list`, `GET /indexes`), builds a kill
left unfinished, the kept versions of one index (`retriever versions`), and a version's calibrator in a few words.

Plain dict work over manifests: `list` reads many of them and must not import torch or FAISS for it. Nothing here
writes or deletes (leftovers are tidied by writes: `folder.sweep_leftovers`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from retriever.defaults import DEFAULT_WEIGHT
from retriever.encode.external import is_external
from retriever.metadata import listed_fields
from retriever.errors import ConflictError, RetrieverError, param
from retriever.text import counted, counted_queries
from retriever.versions.folder import kept_versions
from retriever.versions.home import check_name, index_options, index_path, list_indexes
from retriever.versions.integrity import read_manifest
from retriever.versions.layout import BUILD_STATE, MANIFEST, VERSIONS
from retriever.versions.manifest import Manifest


def pick_index(index_dir: str | Path, name: str | None, writing: bool = False) -> str:
    """NAME when given; else the only index, or for reading the default one (`default_index`)."""
    if name:
        return check_name(name)
    names = list_indexes(index_dir)
    if not names:
        build = f"retriever build CORPUS {index_options(index_dir)}".rstrip()
        raise RetrieverError(f"no index in {index_dir}; build one with: {build}")
    if len(names) > 1 and writing:
        raise RetrieverError(f"{len(names)} indexes in {index_dir} ({', '.join(names)}); say which with {param('name')}")
    return default_index(index_dir, names)


def default_index(index_dir: str | Path, names: list[str] | None = None) -> str | None:
    """The index read when none is named (None where there is none): the most recently written one that encodes
    its own queries. A store of vectors computed outside it (a Haystack store's: `encode.external`) takes no text
    query, so it is the default only where every index is such a store. An index whose manifest fails its checks
    stays a candidate: reading it says what is wrong."""
    names = list_indexes(index_dir) if names is None else names
    for name in names:
        try:
            manifest = read_manifest(Path(index_dir, name).resolve(), name=name)
        except (RetrieverError, OSError):
            return name
        if not is_external(manifest.encoder):
            return name
    return names[0] if names else None


def describe_indexes(index_dir: str | Path) -> list[dict]:
    """One record per index in INDEX_DIR, most recently written first, with name, version (its number), documents,
    passages (a vector each: as many as documents where none is cut), model, calibrator, calibrator_asked (only
    after a fallback), hybrid_weight (hybrid search's dense weight, `Manifest.hybrid`), index_type, written (when its
    current version was written, ISO 8601 UTC), folder and fields
    (its metadata paths), read from each manifest after the cheap checks; an index that fails them has name,
    written, folder and "problem" instead."""
    records = []
    for name in list_indexes(index_dir):
        link = Path(index_dir) / name
        try:
            modified = (link / MANIFEST).stat().st_mtime
        except FileNotFoundError:
            continue  # removed since it was listed
        written = datetime.fromtimestamp(modified, timezone.utc).isoformat(timespec="seconds")
        record: dict = {"name": name, "written": written, "folder": str(link.resolve())}
        try:
            manifest = read_manifest(link.resolve(), name=name)
            record.update(version=manifest.version, documents=manifest.documents, passages=manifest.live_vectors,
                          model=manifest.encoder["model"],
                          calibrator=calibrator_label(manifest.calibrator), index_type=str(manifest.index["type"]),
                          fields=listed_fields(manifest.metadata_fields),
                          hybrid_weight=float(manifest.hybrid["weight"]) if manifest.hybrid else DEFAULT_WEIGHT)
            if manifest.calibrator_fallback:
                record["calibrator_asked"] = str(manifest.calibrator_fallback["asked"])
        except (RetrieverError, KeyError, TypeError) as error:
            record["problem"] = str(error) if isinstance(error, RetrieverError) else f"index '{name}' is damaged"
        records.append(record)
    return records


def version_records(index_dir: str | Path, name: str) -> list[dict]:
    """The kept versions of NAME, newest first (`retriever versions`): version (its number; 0: written before
    versions were numbered), folder (its folder's name), current (bool), written (ISO 8601 UTC), and documents and
    calibrator read from its manifest, or "problem" where that fails."""
    records = []
    for kept in kept_versions(index_dir, name):
        record: dict = {"version": kept.number, "folder": kept.folder.name, "current": kept.current}
        if kept.written is not None:
            record["written"] = kept.written
        if kept.manifest is not None:
            record.update(documents=kept.manifest.documents, calibrator=calibrator_label(kept.manifest.calibrator))
        else:
            record["problem"] = kept.problem
        records.append(record)
    return records


def interrupted_builds(index_dir: str | Path) -> list[dict]:
    """Builds a kill or Ctrl-C left unfinished in INDEX_DIR, resumable by running the same command again: name,
    documents (read so far: None until all are), encoded, model, since (ISO 8601 UTC) and folder, for `list`."""
    records = []
    for state_path in sorted(Path(index_dir).glob(f"{VERSIONS}/*/*.partial/{BUILD_STATE}")):
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
            since = datetime.fromtimestamp(state_path.parent.stat().st_mtime, timezone.utc)
        except (OSError, ValueError):
            continue  # being written or removed right now
        encoder = (state.get("key") or {}).get("encoder") or {}
        records.append({"name": state_path.parent.parent.name, "documents": state.get("documents"),
                        "encoded": int(state.get("encoded") or 0), "model": encoder.get("model"),
                        "since": since.isoformat(timespec="seconds"), "folder": str(state_path.parent)})
    return records


def refuse_replacing(index_dir: str | Path, name: str) -> None:
    """Refuse to build NAME over an index of that name, saying what it holds and how to go ahead."""
    link = index_path(index_dir, check_name(name))
    if not link.is_symlink():
        try:
            kept = kept_versions(index_dir, name)
        except RetrieverError:
            return
        if kept:  # the link is gone (removed by hand, left out of a copy), its versions are not: still an index
            numbers = ", ".join(str(version.number or version.folder.name) for version in kept)
            raise ConflictError(f"index '{name}' has no current version (its link in {Path(index_dir).absolute()} "
                                f"is gone) but keeps versions {numbers}: `retriever rollback {name} "
                                f"{kept[0].number or kept[0].folder.name}` makes the newest current again; building "
                                f"it again keeps that one: pass {param('replace', True)}, or choose another "
                                f"{param('name')}")
        return
    what = ""
    try:
        manifest = read_manifest(link.resolve(), name=name)
        written = datetime.fromtimestamp((link / MANIFEST).stat().st_mtime, timezone.utc)
        what = f" ({counted(manifest.documents, 'document')}, written {written.isoformat(timespec='seconds')})"
    except (OSError, RetrieverError, KeyError, TypeError):
        pass  # a damaged index is still one the build would replace
    raise ConflictError(f"index '{name}' exists{what}; building it again replaces it: pass {param('replace', True)} "
                        f"(its current version is kept, and rollback restores it), or choose another {param('name')}")


def describe_calibrator(manifest: Manifest) -> str:
    """What a version's calibrator is, for one line after a write: the label (`calibrator_label`) and, where
    too few documents made the build fall back, what was asked for and why."""
    label = calibrator_label(manifest.calibrator)
    fallback = manifest.calibrator_fallback
    if isinstance(fallback, dict) and fallback.get("asked"):
        label += f" (asked for {fallback['asked']}: {fallback.get('reason', 'too few documents')})"
    return label


def calibrator_label(record: dict) -> str:
    """The calibrator's name; for auto, with what it chose and the retrieval check's evidence:
    "auto: none (flow +0.31 [-0.52, +1.14] on 2,000 pseudo-queries)"."""
    decision = record.get("decision")
    if not isinstance(decision, dict) or not isinstance(decision.get("chosen"), dict):
        return str(record["name"])
    return f"{record['name']}: {short_decision(decision)}"


def short_decision(decision: dict) -> str:
    """What auto chose, with the retrieval check's difference for it (or, where it kept the raw vectors, for the
    best candidate): "flow-254 (flow-254 +14.20 [+12.10, +16.40] on 2,000 pseudo-queries)"."""
    chosen = str((decision.get("chosen") or {}).get("name", "?"))
    check = decision.get("check")
    if not isinstance(check, dict) or not check.get("candidates"):
        reason = decision.get("reason")  # no check was run: say why (e.g. too few pseudo-queries)
        return f"{chosen} ({str(reason).split(' (')[0].split(':')[0]})" if reason else chosen
    shown = next((c for c in check["candidates"] if c.get("name") == chosen), None) or \
        max(check["candidates"], key=lambda c: c.get("ndcg@10", 0))
    low, high = shown["interval"]
    kinds = (f", {len(shown['kinds_improved'])} of {len(check['voting_kinds'])} kinds better"
             if "kinds_improved" in shown and check.get("voting_kinds") else "")
    return (f"{chosen} ({shown['name']} {shown['difference']:+.2f} [{low:+.2f}, {high:+.2f}]{kinds} on "
            f"{counted_queries(check)})")
