"""Building over a name, the kept versions of an index, and rolling back to one (CLI and library)."""

from __future__ import annotations

import json

import pytest

from retriever.errors import ConflictError, NotFoundError

FIRST = "".join(f"Note {i} about cats and their habits.\n" for i in range(12))
SECOND = "".join(f"Note {i} about ships and the sea.\n" for i in range(7))


def kept(cli, name="notes"):
    done = cli("versions", "--name", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["versions"]


def test_build_over_a_name_needs_replace_and_keeps_what_it_replaced(cli, tmp_path, tiny_bert):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(FIRST)
    second.write_text(SECOND)
    built = cli("build", first, "--name", "notes", "--model", tiny_bert, "--calibrator", "none")
    assert built.returncode == 0, built.stderr
    assert "calibrator: none" in built.stderr and "written to " in built.stderr
    refused = cli("build", second, "--name", "notes", "--model", tiny_bert, "--calibrator", "none")
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert "index 'notes' exists (12 documents" in line and "--replace" in line and "Traceback" not in refused.stderr
    assert [v["documents"] for v in kept(cli)] == [12]  # refused before anything was written
    replaced = cli("build", second, "--name", "notes", "--model", tiny_bert, "--calibrator", "none", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "the version it replaced is kept" in replaced.stderr
    versions = kept(cli)
    assert [(v["documents"], v["current"]) for v in versions] == [(7, True), (12, False)]

    back = cli("rollback", versions[1]["version"], "--name", "notes")
    assert back.returncode == 0, back.stderr
    assert "is at version" in back.stderr and "12 documents" in back.stderr
    assert json.loads(cli("info", "--name", "notes", "--json").stdout)["documents"] == 12
    assert [(v["documents"], v["current"]) for v in kept(cli)] == [(7, False), (12, True)]  # undoable
    forward = cli("rollback", versions[0]["version"], "--name", "notes")
    assert forward.returncode == 0 and json.loads(cli("info", "--name", "notes", "--json").stdout)["documents"] == 7

    unknown = cli("rollback", "20990101T000000000000-abcdef", "--name", "notes")
    assert unknown.returncode != 0 and "has no kept version" in unknown.stderr.strip().splitlines()[-1]


def test_the_library_keeps_the_current_version_and_the_one_it_replaced(tmp_path, tiny_bert):
    from retriever import Document, Index

    home = tmp_path / "home"
    notes = [Document(f"n{i}", f"Note {i} about cats.", None, "mem", i + 1) for i in range(12)]
    Index.build(notes, "notes", home, model=str(tiny_bert), calibrator="none")
    with pytest.raises(ConflictError, match="replace=True"):
        Index.build(notes[:5], "notes", home, model=str(tiny_bert), calibrator="none", replace=False)
    index = Index.open("notes", home, device="cpu")
    index.delete(["n0"])  # a second version
    versions = Index.versions("notes", home)
    assert [v["documents"] for v in versions] == [11, 12]
    older = Index.rollback("notes", versions[1]["version"], home, device="cpu")
    assert len(older) == 12
    Index.open("notes", home, device="cpu").delete(["n1", "n2"])  # a write after the rollback
    # Retention: the new version and the one it replaced (the rolled-back-to one), not the abandoned one.
    assert [v["documents"] for v in Index.versions("notes", home)] == [10, 12]
    with pytest.raises(NotFoundError, match="has no kept version"):
        Index.rollback("notes", versions[0]["version"], home)
