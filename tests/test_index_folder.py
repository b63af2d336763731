"""The index folder on its own (no model, no index): the name rule, manifests and their checksums, the writer
lock, and hard-linked files keeping their old entries (so damage cannot be laundered by a write)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from retriever.errors import ConflictError, DamagedIndexError, RetrieverError
from retriever.versions.home import check_name
from retriever.versions.integrity import read_manifest, verify_files, write_manifest
from retriever.versions.folder import writer_lock
from retriever.versions.layout import MANIFEST
from retriever.versions.manifest import EncoderRecord, Manifest


@pytest.mark.parametrize("name", ["docs", "a", "A-1.2_b", "9" * 64])
def test_names_that_are_safe_everywhere_are_taken(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "../up", "a b", "ü", "x" * 65, "a\nb", 7])
def test_other_names_are_one_line_naming_the_rule(name):
    with pytest.raises(RetrieverError, match="a name is 1 to 64 ASCII letters") as error:
        check_name(name)
    assert "\n" not in str(error.value)


def _version(folder: Path) -> Path:
    (folder / "segments" / "000001").mkdir(parents=True)
    (folder / "segments" / "000001" / "raw.npy").write_bytes(b"vectors" * 100)
    (folder / "calibrator.json").write_text('{"name": "sn"}')
    (folder / "scratch.partial").write_text("a killed writer's temporary file")
    write_manifest(folder, minimal_manifest("docs"))
    return folder


def minimal_manifest(name: str) -> Manifest:
    return Manifest(name=name, created="2026-01-01T00:00:00+00:00", encoder=EncoderRecord(
        model="m", pooling="last-avg", layers=None, max_length=8, dtype="fp32", dim=2), calibrator={"name": "sn"},
        index={"type": "flat"}, dim=2, documents=0, segments=(), next_rowid=1, next_segment=1, versions={})


def test_a_manifest_lists_every_file_but_temporary_ones_and_vouches_for_itself(tmp_path):
    folder = _version(tmp_path / "v1")
    manifest = read_manifest(folder, "docs")
    assert sorted(manifest.files) == ["calibrator.json", "segments/000001/raw.npy"]
    assert verify_files(folder, manifest, "docs") == 700 + len('{"name": "sn"}')
    record = json.loads((folder / MANIFEST).read_text())
    record["name"] = "edited"
    (folder / MANIFEST).write_text(json.dumps(record))
    with pytest.raises(DamagedIndexError, match="does not match its own checksum"):
        read_manifest(folder, "docs")


def test_a_file_of_another_size_or_content_is_damage_naming_it(tmp_path):
    folder = _version(tmp_path / "v1")
    raw = folder / "segments" / "000001" / "raw.npy"
    raw.write_bytes(b"VECTORS" * 100)  # same size, other bytes: only the full check sees it
    manifest = read_manifest(folder, "docs")
    with pytest.raises(DamagedIndexError, match="index 'docs' .*raw.npy does not match"):
        verify_files(folder, manifest, "docs")
    raw.write_bytes(b"short")
    with pytest.raises(DamagedIndexError, match="raw.npy has 5 bytes"):
        read_manifest(folder, "docs")


def test_a_hard_linked_file_keeps_its_old_entry_so_damage_stays_visible(tmp_path):
    old = _version(tmp_path / "v1")
    raw = old / "segments" / "000001" / "raw.npy"
    raw.write_bytes(b"DAMAGED" * 100)  # damaged in place after it was written and hashed
    new = tmp_path / "v2"
    (new / "segments" / "000001").mkdir(parents=True)
    (new / "segments" / "000001" / "raw.npy").hardlink_to(raw)
    (new / "calibrator.json").write_text('{"name": "sn"}')
    manifest = write_manifest(new, minimal_manifest("docs"), previous=old, known=read_manifest(old, "docs").files)
    with pytest.raises(DamagedIndexError, match="raw.npy does not match"):
        verify_files(new, manifest, "docs")  # a fresh hash would have vouched for the damaged bytes


def test_writers_of_one_name_take_turns_and_a_non_waiting_one_is_refused_naming_the_holder(tmp_path):
    order = []

    def second():
        with writer_lock(tmp_path, "docs"):
            order.append("second")

    with writer_lock(tmp_path, "docs"):
        waiter = threading.Thread(target=second)
        waiter.start()
        with pytest.raises(ConflictError, match="being written by another writer in this process; wait"):
            with writer_lock(tmp_path, "docs", wait=False):
                pass
        order.append("first")
    waiter.join(timeout=10)
    assert order == ["first", "second"]
    with writer_lock(tmp_path, "other", wait=False):  # another name never waits for this one
        pass
