"""Damaged indexes: damage in any file is one line naming the index wherever it is read (open, search, info,
check, verify), and no write carries damaged bytes into a new version, where a fresh hash would vouch for them."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from retriever.errors import DamagedIndexError
from retriever.index import Index, verify_index
from retriever.versions.manifest import record_checksum
from retriever.versions.layout import MANIFEST, VERSIONS
from tests.helpers import sentences, write_jsonl


SEGMENT = "segments/000001"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_bert) -> Path:
    """An index home with 'tiny': 100 documents in one segment, 5 more in a second, one of them deleted."""
    folder = tmp_path_factory.mktemp("pristine")
    home = folder / "indexes"
    Index.build(write_jsonl(folder / "base.jsonl", sentences(100)), "tiny", home, model=str(tiny_bert),
                calibrator="whitening", device="cpu")
    Index.open("tiny", home, device="cpu").add(write_jsonl(folder / "more.jsonl", sentences(5, start=100)))
    Index.open("tiny", home, device="cpu").delete(["d101"])
    return home


@pytest.fixture()
def home(pristine, tmp_path) -> Path:
    """A copy of the pristine index home, to damage."""
    copy = tmp_path / "indexes"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def current(home: Path) -> Path:
    return (home / "tiny").resolve()


def flip(path: Path, start: int, length: int) -> None:
    """Invert LENGTH bytes of PATH from START: same size, so only a re-hash or a parse can tell."""
    data = bytearray(path.read_bytes())
    end = min(len(data), start + length)
    data[start:end] = bytes(byte ^ 0xFF for byte in data[start:end])
    path.write_bytes(bytes(data))


def edit_text(path: Path) -> None:
    """Change one stored text in place, same length (what an edit with a hex editor or sqlite would do)."""
    data = path.read_bytes()
    assert b"harbour on day 5." in data
    path.write_bytes(data.replace(b"harbour on day 5.", b"HARBOUR on day 5.", 1))


def assert_one_line(error: Exception) -> None:
    message = str(error)
    assert message.startswith("index 'tiny' is damaged: ") and "\n" not in message, message


# Damage that parses: only a re-hash can tell it, so the files a write reads must be re-hashed.
SILENT = {
    "raw.npy, 4 KB flipped": lambda folder: flip(folder / SEGMENT / "raw.npy", 1024, 4096),
    "documents.db, a text edited": lambda folder: edit_text(folder / SEGMENT / "documents.db"),
    "vectors.faiss, a vector flipped": lambda folder: flip(folder / SEGMENT / "vectors.faiss", 4096, 64),
    "tombstones.npy, a row id changed": lambda folder: flip(folder / "tombstones.npy", 128, 1),
    "keyword-counts.npy, counts flipped": lambda folder: flip(folder / SEGMENT / "keyword-counts.npy", 200, 16),
}
WRITES = {
    "add": lambda index, tmp: index.add(write_jsonl(tmp / "new.jsonl", sentences(3, start=500))),
    "delete": lambda index, tmp: index.delete(["d7"]),
    "compact": lambda index, tmp: index.compact(),
    "refit": lambda index, tmp: index.refit(),
}
# What each write does with each damage that leaves the file's time as it was (bit rot): refuse it (it reads those
# bytes into the new version), or link the file with its old manifest entry (the new version is as damaged, and
# says so), or drop it (refit writes every vector index again from the raw vectors: nothing of the damaged file is
# left). Damage written in place (a newer time than the version's manifest) is refused by every write.
OUTCOMES = {
    ("raw.npy, 4 KB flipped", "add"): "linked",
    ("raw.npy, 4 KB flipped", "delete"): "linked",
    ("raw.npy, 4 KB flipped", "compact"): "refused",
    ("raw.npy, 4 KB flipped", "refit"): "refused",
    ("documents.db, a text edited", "add"): "linked",
    ("documents.db, a text edited", "delete"): "linked",
    ("documents.db, a text edited", "compact"): "refused",
    ("documents.db, a text edited", "refit"): "linked",
    ("vectors.faiss, a vector flipped", "add"): "linked",
    ("vectors.faiss, a vector flipped", "delete"): "linked",
    ("vectors.faiss, a vector flipped", "compact"): "refused",
    ("vectors.faiss, a vector flipped", "refit"): "dropped",
    ("tombstones.npy, a row id changed", "add"): "refused",
    ("tombstones.npy, a row id changed", "delete"): "refused",
    ("tombstones.npy, a row id changed", "compact"): "refused",
    ("tombstones.npy, a row id changed", "refit"): "refused",
    ("keyword-counts.npy, counts flipped", "add"): "linked",
    ("keyword-counts.npy, counts flipped", "delete"): "linked",
    ("keyword-counts.npy, counts flipped", "compact"): "refused",
    ("keyword-counts.npy, counts flipped", "refit"): "linked",
}


@pytest.mark.parametrize("in_place", [True, False], ids=["written in place", "rotted, its time kept"])
@pytest.mark.parametrize("damage, write", list(OUTCOMES))
def test_no_write_launders_damage(home, tmp_path, damage, write, in_place):
    before = current(home)
    SILENT[damage](before)
    if not in_place:  # every file older than the manifest, the damaged one too: no time says it changed
        # A time of its own: a write remembers the files it hashed by (device, inode, size, time), and these copies
        # reuse the inode numbers of the tests' copies before them.
        older = (before / MANIFEST).stat().st_mtime_ns - 10**9 - time.time_ns() % 10**9
        for path in before.rglob("*"):
            if path.is_file() and path.name != MANIFEST:
                os.utime(path, ns=(older, older))
    with pytest.raises(DamagedIndexError, match="does not match its manifest checksum"):
        verify_index("tiny", home)
    index = Index.open("tiny", home, device="cpu")  # sizes and parses are fine: only hashes can tell
    outcome = OUTCOMES[(damage, write)] if not in_place else "refused"
    if outcome == "refused":
        with pytest.raises(DamagedIndexError, match="does not match its manifest checksum; nothing was written") as raised:
            WRITES[write](index, tmp_path)
        assert_one_line(raised.value)
        assert current(home) == before and not list((home / VERSIONS / "tiny").glob("*.partial"))
        return
    WRITES[write](index, tmp_path)
    assert current(home) != before
    if outcome == "linked":  # the new version lists the file with the hash it was written with: still damaged
        with pytest.raises(DamagedIndexError, match="does not match its manifest checksum"):
            verify_index("tiny", home)
    else:
        verify_index("tiny", home)
        assert not any(path.samefile(before / SEGMENT / "vectors.faiss") for path in current(home).rglob("*.faiss"))


@pytest.mark.parametrize("write", ["add", "delete"])
def test_a_file_cut_short_after_the_index_was_opened_is_refused_by_its_next_write(home, tmp_path, write):
    """A server holds a version open for hours: a write linked a file truncated since into the version it
    committed (201), and every later request on it answered 503."""
    before = current(home)
    index = Index.open("tiny", home, device="cpu")
    vectors = before / SEGMENT / "vectors.faiss"
    vectors.write_bytes(vectors.read_bytes()[:100])
    with pytest.raises(DamagedIndexError, match=r"vectors.faiss has 100 bytes, its manifest says") as raised:
        WRITES[write](index, tmp_path)
    assert_one_line(raised.value)
    assert current(home) == before and not list((home / VERSIONS / "tiny").glob("*.partial"))


def test_add_refuses_a_damaged_template(tmp_path, tiny_bert):
    home = tmp_path / "indexes"
    Index.build(write_jsonl(tmp_path / "base.jsonl", sentences(100)), "tiny", home, model=str(tiny_bert),
                calibrator="none", index_type="ivf", device="cpu")
    before = current(home)
    flip(before / "trained.faiss", 200, 16)
    with pytest.raises(DamagedIndexError, match="trained.faiss does not match its manifest checksum"):
        Index.open("tiny", home, device="cpu").add(write_jsonl(tmp_path / "new.jsonl", sentences(3, start=500)))
    assert current(home) == before


def npz_member_flip(folder: Path) -> None:
    flip(folder / "calibrator" / "calibrator.npz", 200, 8)


# Damage that no longer parses, file by file: every one is a DamagedIndexError naming the index and the file,
# never the parser's own exception (UnicodeDecodeError, ValueError, RuntimeError, zipfile.BadZipFile...).
UNREADABLE = {
    "calibrator.json, a byte that is not UTF-8": (lambda f: flip(f / "calibrator" / "calibrator.json", 3, 1),
                                                  "calibrator cannot be read"),
    "calibrator.json, a name changed": (lambda f: _replace(f / "calibrator" / "calibrator.json", b"whitening",
                                                           b"whitenimg"), "calibrator cannot be read"),
    "calibrator weights": (npz_member_flip, "calibrator cannot be read"),
    "raw.npy header": (lambda f: flip(f / SEGMENT / "raw.npy", 10, 40), f"{SEGMENT} cannot be read"),
    "rowids.npy header": (lambda f: flip(f / SEGMENT / "rowids.npy", 10, 40), f"{SEGMENT} cannot be read"),
    "vectors.faiss header": (lambda f: flip(f / SEGMENT / "vectors.faiss", 0, 64), f"{SEGMENT} cannot be read"),
    "documents.db header": (lambda f: flip(f / SEGMENT / "documents.db", 0, 100), f"{SEGMENT} cannot be read"),
    "tombstones.npy header": (lambda f: flip(f / "tombstones.npy", 10, 40), "tombstones.npy cannot be read"),
    "tombstones.npy, ids out of order": (lambda f: _tombstones(f, [9, 3]), "tombstones.npy cannot be read"),
    "keywords.db header": (lambda f: flip(f / SEGMENT / "keywords.db", 0, 100), f"{SEGMENT} cannot be read"),
    "keyword-postings.npy header": (lambda f: flip(f / SEGMENT / "keyword-postings.npy", 10, 40),
                                    f"{SEGMENT} cannot be read"),
}


def _replace(path: Path, old: bytes, new: bytes) -> None:
    path.write_bytes(path.read_bytes().replace(old, new))


def _tombstones(folder: Path, ids: list[int]) -> None:
    """Tombstones of the same size (a 1-element file becomes another 1-element file would not show): rewritten
    with their manifest entry and checksum, as a buggy tool might."""
    path = folder / "tombstones.npy"
    path.unlink()
    np.save(path, np.asarray(ids, dtype=np.int64))
    reseal(folder, lambda manifest: {**manifest, "documents": manifest["documents"] + 1 - len(ids), "files": {
        **manifest["files"], "tombstones.npy": {"bytes": path.stat().st_size, "sha256": "0" * 64}}})


def reseal(folder: Path, change) -> None:
    """Rewrite the manifest of the version in FOLDER through CHANGE, with a checksum that matches: what a tool
    (or an attacker) writes, which the checksum cannot catch."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest = change(manifest)
    manifest["checksum"] = record_checksum(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", list(UNREADABLE))
def test_a_file_that_no_longer_parses_is_one_line_naming_the_index(home, damage):
    spoil, where = UNREADABLE[damage]
    spoil(current(home))
    with pytest.raises(DamagedIndexError, match=f"index 'tiny' is damaged: {where}") as raised:
        Index.open("tiny", home, device="cpu")
    assert_one_line(raised.value)
    assert str(current(home)) not in str(raised.value)  # the index's name and the file's place in it, no path
    assert raised.value.__cause__ is not None  # what the parser said, for a traceback that wants it


def test_damage_found_while_searching_or_reading_is_one_line(home):
    database = current(home) / SEGMENT / "documents.db"
    data = bytearray(database.read_bytes())
    data[4096:] = bytes(len(data) - 4096)  # the header and first page stay: it opens, then its pages are gone
    database.write_bytes(bytes(data))
    damaged = Index.open("tiny", home, device="cpu")
    with pytest.raises(DamagedIndexError, match=f"index 'tiny' is damaged: {SEGMENT}/documents.db cannot be read"):
        damaged.search(sentences(1)["d0"], k=3)
    with pytest.raises(DamagedIndexError, match="documents.db cannot be read"):
        damaged.document("d0")
    postings = current(home) / SEGMENT / "keyword-postings.npy"
    postings.write_bytes(postings.read_bytes()[:128] + b"\xff" * (postings.stat().st_size - 128))  # positions -1
    with pytest.raises(DamagedIndexError, match="index 'tiny' is damaged: segments cannot be read \\(.*keywords.db: "
                                                "the postings of 'harbour' are out of range"):
        Index.open("tiny", home, device="cpu").search("the harbour", k=3, mode="keyword")
    raw = current(home) / SEGMENT / "raw.npy"
    raw.write_bytes(raw.read_bytes()[:128] + b"\xff" * (raw.stat().st_size - 128))  # float16 0xFFFF is NaN
    with pytest.raises(DamagedIndexError, match=f"{SEGMENT}/raw.npy cannot be read \\(it holds values that are not"):
        Index.open("tiny", home, device="cpu").info()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: {**m, "documents": m["documents"] + 1}, "the manifest counts 105 documents, but its segments "
                                                           "hold 105 rows of which 1 are deleted"),
        (lambda m: {**m, "segments": [{**m["segments"][0], "rows": 99}, *m["segments"][1:]]},
         f"{SEGMENT}/rowids.npy holds 100 rows, the manifest says 99"),
    ],
)
def test_counts_that_disagree_with_the_files_are_damage(home, change, message):
    reseal(current(home), change)
    for check in (lambda: Index.open("tiny", home, device="cpu"), lambda: verify_index("tiny", home)):
        with pytest.raises(DamagedIndexError, match=message):
            check()


def test_a_crafted_manifest_cannot_reach_outside_its_version(home, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(current(home) / SEGMENT, outside)
    escape = os.path.relpath(outside, current(home) / "segments")
    assert escape.startswith("../") and (current(home) / "segments" / escape).resolve() == outside.resolve()

    def renamed(manifest):
        files = {key.replace(SEGMENT, f"segments/{escape}"): value for key, value in manifest["files"].items()}
        return {**manifest, "files": files,
                "segments": [{**manifest["segments"][0], "name": escape}, *manifest["segments"][1:]]}

    reseal(current(home), renamed)
    for check in (lambda: Index.open("tiny", home, device="cpu"), lambda: verify_index("tiny", home)):
        with pytest.raises(DamagedIndexError, match="lists a file outside its version"):
            check()
    reseal(current(home), lambda manifest: {**manifest, "files": {
        key.replace(f"segments/{escape}", SEGMENT): value for key, value in manifest["files"].items()}})
    for check in (lambda: Index.open("tiny", home, device="cpu"), lambda: verify_index("tiny", home)):
        with pytest.raises(DamagedIndexError, match=re.escape(f"names a segment {escape!r}, which is not a")):
            check()


# A bug is not damage: an exception raised by the search code itself propagates as it is, with its traceback (the
# server answers 500 and logs it), where calling it "damaged" would send a user to rebuild a sound index.
PLANTED = {
    "a segment's vector search": ("retriever.store.vectors:VectorStore.search", "dense"),
    "the keyword scoring": ("retriever.store.keywords:QueryMatches.candidates", "keyword"),
    "the fusion": ("retriever.search.fusion:UnionZScore.scores", "hybrid"),  # the default fusion
    "the plan": ("retriever.search.searcher:Searcher.plan", "dense"),
}


@pytest.mark.parametrize("where", list(PLANTED))
def test_a_bug_in_the_search_path_is_not_reported_as_damage(home, monkeypatch, caplog, where):
    import importlib
    import logging

    from fastapi.testclient import TestClient

    from retriever.serve.app import create_app

    target, mode = PLANTED[where]
    module, _, attribute = target.partition(":")
    owner, name = attribute.split(".")

    def planted(*args, **kwargs):
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setattr(getattr(importlib.import_module(module), owner), name, planted)
    with pytest.raises(ZeroDivisionError, match="a planted bug"):
        Index.open("tiny", home, device="cpu").search("the harbour on day 5", k=3, mode=mode)
    with TestClient(create_app(home, device="cpu", runtime="torch"), base_url="http://127.0.0.1",
                    raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR, "retriever.serve"):
        answer = client.get("/search", params={"q": "the harbour on day 5", "k": 3, "mode": mode})
    assert answer.status_code == 500 and answer.json()["detail"] == (
        "internal error (ZeroDivisionError); the server log has the details")
    logged = [record for record in caplog.records if record.exc_info]
    assert logged and logged[-1].exc_info[0] is ZeroDivisionError  # with its traceback


def test_a_write_over_a_file_changed_since_its_version_refuses_and_keeps_the_intact_one(tmp_path, tiny_bert):
    """From a QA run: a byte flipped in a segment an add had linked on, then a delete: the delete linked the damaged
    file on unread, and pruning removed the only intact version. A file modified after its version was committed is
    re-hashed before a write links it, and the write is refused."""
    from retriever.versions.home import index_path

    home = tmp_path / "home"
    index = Index.build([{"_id": f"a{i}", "text": f"note {i} on cats"} for i in range(30)], "c", home,
                        model=str(tiny_bert), calibrator="none", device="cpu").open()
    index = index.add([{"_id": f"b{i}", "text": f"note {i} on ships"} for i in range(30)]).open()
    raw = index_path(home, "c").resolve() / "segments" / "000002" / "raw.npy"
    with open(raw, "r+b") as file:  # in place, as `dd conv=notrunc` does: same size, a newer time
        file.seek(200)
        byte = file.read(1)
        file.seek(200)
        file.write(bytes([byte[0] ^ 1]))
    os.utime(raw, ns=(raw.stat().st_atime_ns, raw.stat().st_mtime_ns + 10**9))  # the clock's step, made certain
    with pytest.raises(DamagedIndexError, match="segments/000002/raw.npy does not match its manifest checksum; "
                                             "nothing was written"):
        Index.open("c", home, device="cpu").delete(["a1"])
    versions = [version["version"] for version in Index.versions("c", home)]
    assert versions == [2, 1]  # the intact version 1 kept
