"""The typed manifest on its own: a round trip through JSON loses nothing (fields this release does not know
included), every field's type is checked with one line naming it, and other formats are refused."""

from __future__ import annotations

import json

import pytest

from retriever.errors import DamagedIndexError, RetrieverError
from retriever.versions.manifest import EncoderRecord, FileEntry, Manifest, SegmentEntry, record_checksum


def manifest(**changes) -> Manifest:
    return Manifest(name="docs", created="2026-01-01T00:00:00+00:00",
                    encoder=EncoderRecord(model="m", pooling="last-avg", layers=None, max_length=8, dtype="fp32",
                                          dim=4),
                    calibrator={"name": "flow", "seed": 0}, index={"type": "flat"}, dim=4, documents=5,
                    segments=(SegmentEntry("000001", 3, 0, "flat"), SegmentEntry("000002", 3, 1, "flat")),
                    next_rowid=7, next_segment=3, versions={"retriever": "0"}, deleted=1,
                    files={"segments/000001/raw.npy": FileEntry(10, "a" * 64)}).replace(**changes)


def test_a_manifest_survives_json_with_its_checksum():
    written = manifest().with_files({"calibrator/calibrator.json": FileEntry(3, "b" * 64)})
    record = json.loads(json.dumps(written.to_record()))
    assert record["checksum"] == record_checksum(record)
    read = Manifest.from_record(record, "index 'docs'")
    assert read == written and read.segments[1].deleted == 1 and read.files["calibrator/calibrator.json"].bytes == 3


def test_fields_a_newer_release_wrote_are_kept_when_rewritten():
    record = {**manifest().to_record(), "keyword_index": {"kind": "fts5"}}
    read = Manifest.from_record(record)
    assert read.extra == {"keyword_index": {"kind": "fts5"}}
    assert read.replace(documents=4).to_record()["keyword_index"] == {"kind": "fts5"}


def test_optional_fields_that_do_not_apply_stay_out_of_the_record():
    record = manifest().to_record()
    assert not {"engine", "calibrator_fallback", "refitted"} & set(record)
    assert record["segments"][0] == {"name": "000001", "rows": 3, "deleted": 0, "index": "flat"}


def test_a_segment_record_from_before_deleted_counts_reads_as_unknown():
    record = manifest().to_record()
    record["segments"] = [{"name": "000001", "rows": 3}]
    assert Manifest.from_record(record).segments == (SegmentEntry("000001", 3, None, None),)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("next_rowid"), "lacks 'next_rowid'"),
    (lambda r: r.update(documents=True), "wrong type for 'documents'"),
    (lambda r: r.update(refitted=3), "wrong type for 'refitted'"),
    (lambda r: r["encoder"].pop("dim"), "lacks 'encoder.dim'"),
    (lambda r: r["encoder"].update(layers="0,1"), "wrong type for 'encoder.layers'"),
    (lambda r: r.update(segments=[{"name": "000001", "rows": "3"}]), "malformed 'segments'"),
    (lambda r: r.update(segments=[{"name": "../x", "rows": 3}]), "'../x', which is not a segment's name"),
    (lambda r: r.update(files={"a": {"bytes": 1}}), "malformed 'files'"),
])
def test_a_wrong_field_is_one_line_naming_it(change, message):
    record = manifest().to_record()
    change(record)
    with pytest.raises(DamagedIndexError, match=f"index 'docs' is damaged: its manifest .*{message}") as error:
        Manifest.from_record(record, "index 'docs'")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("version, words", [(1, "an older retriever"), (3, "another retriever")])
def test_another_format_says_to_rebuild(version, words):
    with pytest.raises(RetrieverError, match=f"built by {words} \\(index format {version}\\); rebuild it"):
        Manifest.from_record({**manifest().to_record(), "format_version": version}, "index 'docs'")
