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
    with pytest.raises(ConflictError, match="replace=True"):  # the library refuses as the CLI and the API do
        Index.build(notes[:5], "notes", home, model=str(tiny_bert), calibrator="none")
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


def test_versions_are_numbered_and_numbers_only_grow(tmp_path, tiny_bert, monkeypatch):
    """Each write takes one more than any number given out for the name: a rollback and the write after it, or a
    write that failed, never bring a number back; and the order is the numbers', whatever the folders are called
    (they used to be named by the clock, which can step back)."""
    from retriever import Document, Index
    from retriever.errors import RetrieverError

    names = iter(f"{letter * 12}" for letter in "fedcba9876543210")  # each name sorts before the one before
    monkeypatch.setattr("retriever.versions.folder._new_folder_name", lambda: next(names))
    home = tmp_path / "home"
    notes = [Document(f"n{i}", f"Note {i} about cats.", None, "mem", i + 1) for i in range(12)]
    assert Index.build(notes, "notes", home, model=str(tiny_bert), calibrator="none").version == 1
    assert Index.open("notes", home, device="cpu").delete(["n0"]).version == 2
    assert [(v["version"], v["current"]) for v in Index.versions("notes", home)] == [(2, True), (1, False)]
    assert len(Index.rollback("notes", 1, home, device="cpu")) == 12
    third = Index.open("notes", home, device="cpu").delete(["n1"])
    assert third.version == 3 and [v["version"] for v in Index.versions("notes", home)] == [3, 1]
    with pytest.raises(RetrieverError):
        Index.open("notes", home, device="cpu").delete(["nobody"])  # fails: its number is not given out again
    assert Index.open("notes", home, device="cpu").delete(["n2"]).version == 5
    assert Index.open("notes", home, device="cpu").snapshot.manifest.version == 5
    with pytest.raises(NotFoundError, match="has no kept version '2'; kept: 5, 3"):
        Index.rollback("notes", 2, home)


def test_rollback_takes_a_version_s_number_on_the_command_line(cli, tmp_path, tiny_bert):
    first = tmp_path / "first.txt"
    first.write_text(FIRST)
    assert cli("build", first, "--name", "notes", "--model", tiny_bert, "--calibrator", "none").returncode == 0
    assert cli("delete", "first.txt:1", "--name", "notes").returncode == 0
    assert [(v["version"], v["documents"]) for v in kept(cli)] == [(2, 11), (1, 12)]
    table = cli("versions", "--name", "notes").stdout
    assert "2 *" in table and " 1 " in table
    back = cli("rollback", "1", "--name", "notes")
    assert back.returncode == 0 and "index 'notes' is at version 1 again: 12 documents" in back.stderr
    assert [(v["version"], v["current"]) for v in kept(cli)] == [(2, False), (1, True)]
    again = cli("rollback", "1", "--name", "notes")  # the current one: said so (it read as a rollback done)
    assert again.returncode == 0 and again.stderr.strip() == "index 'notes' is at version 1 already: nothing changed"


def test_a_commit_whose_number_was_not_recorded_is_never_taken_for_an_orphan(tmp_path, tiny_bert):
    """A writer can die after its swap and before it records the commit (`numbers.json`). Its version was current,
    so a rollback past it and the next write must keep it as committed: not delete it as a version no reader saw,
    nor give its number to the next version."""
    from retriever import Document, Index
    from retriever.versions.layout import NUMBERS, VERSIONS

    home = tmp_path / "home"
    notes = [Document(f"n{i}", f"Note {i} about ships.", None, "mem", i + 1) for i in range(12)]
    Index.build(notes, "notes", home, model=str(tiny_bert), calibrator="none")
    Index.open("notes", home, device="cpu").delete(["n0"])
    Index.open("notes", home, device="cpu").delete(["n1"])  # version 3, current
    record = home / VERSIONS / "notes" / NUMBERS
    record.write_text(json.dumps({"given": 3, "committed": 2}))  # as if the writer died before recording it
    Index.rollback("notes", 2, home, device="cpu")
    assert [(v["version"], v["current"]) for v in Index.versions("notes", home)] == [(3, False), (2, True)]
    assert Index.open("notes", home, device="cpu").delete(["n5"]).version == 4
    assert [v["version"] for v in Index.versions("notes", home)] == [4, 2]
    assert json.loads(record.read_text()) == {"given": 4, "committed": 4}


def test_a_version_never_swapped_in_is_removed_by_the_next_write_and_its_number_not_reused(tmp_path, tiny_bert):
    """A writer killed between renaming its folder and swapping the link leaves a complete version no reader
    saw: the next write removes it, and numbers past it."""
    import shutil

    from retriever import Document, Index
    from retriever.versions.layout import MANIFEST, VERSIONS
    from retriever.versions.manifest import record_checksum

    home = tmp_path / "home"
    notes = [Document(f"n{i}", f"Note {i} about ships.", None, "mem", i + 1) for i in range(12)]
    Index.build(notes, "notes", home, model=str(tiny_bert), calibrator="none")
    current = (home / "notes").resolve()
    orphan = home / VERSIONS / "notes" / "0123456789ab"
    shutil.copytree(current, orphan)
    manifest = json.loads((orphan / MANIFEST).read_text())
    manifest["version"] = 2
    manifest["checksum"] = record_checksum(manifest)
    (orphan / MANIFEST).write_text(json.dumps(manifest))
    assert Index.open("notes", home, device="cpu").delete(["n0"]).version == 3
    assert not orphan.exists() and [v["version"] for v in Index.versions("notes", home)] == [3, 1]


def two_versions(cli, tmp_path, tiny_bert):
    """An index 'notes' in a home of its own: built (version 1), then added to (version 2); the home and the corpus
    added."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(FIRST)
    second.write_text(SECOND)
    home = tmp_path / "home"
    assert cli("build", first, "--name", "notes", "--model", tiny_bert, "--calibrator", "none",
               "--index-dir", home).returncode == 0
    assert cli("add", "notes", second, "--index-dir", home).returncode == 0
    return home, second


def test_versions_whose_link_is_gone_are_kept_by_a_rollback_and_a_build(cli, tmp_path, tiny_bert):
    """From a QA run: with the index's link gone (removed by hand, a copy of the home that skipped links, a killed
    `remove`), a rollback to one kept version deleted the other, and a build without --replace went ahead and
    deleted every kept version."""
    home, second = two_versions(cli, tmp_path, tiny_bert)
    (home / "notes").unlink()
    listed = cli("versions", "--name", "notes", "--index-dir", home)
    assert "no version of 'notes' is current" in listed.stderr and "retriever rollback 2" in listed.stderr
    refused = cli("build", second, "--name", "notes", "--model", tiny_bert, "--calibrator", "none",
                  "--index-dir", home)
    assert refused.returncode != 0 and "has no current version" in refused.stderr and "--replace" in refused.stderr
    assert cli("rollback", "1", "--name", "notes", "--index-dir", home).returncode == 0
    versions = json.loads(cli("versions", "--name", "notes", "--index-dir", home, "--json").stdout)["versions"]
    assert [(v["version"], v["current"]) for v in versions] == [(2, False), (1, True)]  # 2 kept, as a rollback keeps

    (home / "notes").unlink()
    rebuilt = cli("build", second, "--name", "notes", "--model", tiny_bert, "--calibrator", "none", "--replace",
                  "--index-dir", home)
    assert rebuilt.returncode == 0, rebuilt.stderr
    versions = json.loads(cli("versions", "--name", "notes", "--index-dir", home, "--json").stdout)["versions"]
    assert [(v["version"], v["current"]) for v in versions] == [(3, True), (2, False)]  # the newest kept


def test_a_rollback_to_a_damaged_kept_version_names_that_version(cli, tmp_path, tiny_bert):
    """From a QA run: rolling back to a damaged kept version said the index was damaged and to rebuild it, while
    the current version was intact; a damaged current version said only "rebuild"."""
    home, second = two_versions(cli, tmp_path, tiny_bert)
    (older,) = [folder for folder in (home / ".versions" / "notes").iterdir()
                if folder.is_dir() and folder.name != (home / "notes").resolve().name]
    damaged = older / "calibrator" / "calibrator.json"
    damaged.unlink()  # its own file: versions share unchanged files as hard links
    damaged.write_text('{"name": "whitening"}')
    refused = cli("rollback", "1", "--name", "notes", "--index-dir", home)
    line = refused.stderr.strip()
    assert refused.returncode != 0 and "\n" not in line
    assert line.startswith("error: version 1 of index 'notes' is damaged: calibrator/calibrator.json has 21 bytes")
    assert line.endswith("; it cannot be made current, and the current version is as it was")
    assert cli("verify", "notes", "--index-dir", home).returncode == 0
    current = (home / "notes").resolve()
    (current / "calibrator" / "calibrator.json").write_text('{"name": "whitening"}')
    assert "roll back to a kept version" in cli("verify", "notes", "--index-dir", home).stderr


def test_versions_of_a_name_whose_only_build_was_interrupted_says_there_is_no_index(cli, tmp_path):
    """From a QA run: it printed an empty table headed "0 kept versions" and exit code 0."""
    home = tmp_path / "home"
    (home / ".versions" / "q" / "20260101T000000000000-abcdef.partial").mkdir(parents=True)
    done = cli("versions", "q", "--index-dir", home)
    assert done.returncode == 1 and done.stdout == "" and done.stderr.strip() == (
        f"error: no index named 'q' in {home} (a build of it was interrupted before its first version: "
        "`retriever list` shows what it left)")
