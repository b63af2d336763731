"""Reading a person's files: each format's text and title, a folder walked into documents, bad files skipped."""

from __future__ import annotations

import pytest

from retriever.errors import RetrieverError
from retriever.files import FolderOptions, FolderReport, page_of, read_folder
from tests.files_folder import LAST_SENTENCES, UNREADABLE, make_folder
from tests.helpers import one_line_error


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("files") / "mine")


def test_every_readable_file_is_one_document_with_its_text_title_and_metadata(folder):
    skipped, report = [], FolderReport()
    documents = {d.doc_id: d for d in read_folder(folder, on_skip=lambda path, why: skipped.append(path),
                                                  report=report)}
    assert set(documents) == set(LAST_SENTENCES)
    for path, sentence in LAST_SENTENCES.items():
        assert sentence in documents[path].text, path
        metadata = documents[path].metadata
        assert metadata["path"] == path and metadata["size"] == (folder / path).stat().st_size
        assert len(metadata["sha256"]) == 64 and metadata["modified"].endswith("+00:00")
        assert metadata["folder"] == str(folder.resolve())
    titles = {path: document.title for path, document in documents.items()}
    assert titles["notes/garden.md"] == "Garden diary" and titles["site/index.html"] == "The lighthouse"
    assert titles["docs/install.rst"] == "Installing the tool" and titles["reports/annual.pdf"] == "Annual report"
    assert titles["letters/offer.docx"] == "An offer of partnership" and titles["journal.txt"] == "journal.txt"
    types = {path: document.metadata["type"] for path, document in documents.items()}
    assert types["notes/recipes/bread.markdown"] == "markdown" and types["letters/offer.docx"] == "docx"
    # text as a reader sees it: no markup, no front matter, no script; code kept as text
    garden = documents["notes/garden.md"].text
    assert "**" not in garden and "tags:" not in garden and "water(plants, litres=2)" in garden and "basil" in garden
    page = documents["site/index.html"].text
    assert "tracking" not in page and "color" not in page and "<p>" not in page
    assert ".. note::" not in documents["docs/install.rst"].text and "Keep a backup" in documents["docs/install.rst"].text
    # bad files: each skipped with a line; other formats counted; hidden, ignored and looping ones left out
    assert set(skipped) == UNREADABLE | {"notes/again"}  # the loop said too, as a build prints each
    why = dict(report.skipped)
    assert "damaged PDF" in why["reports/broken.pdf"] and "encrypted" in why["reports/locked.pdf"]
    assert "not UTF-8" in why["legacy/latin1.txt"] and why["notes/again"].startswith("a symbolic link loop")
    assert report.read == len(LAST_SENTENCES) and report.other_formats == {".png": 1}
    assert "7 files read; 4 skipped (no text read from them); 1 of other formats left out (.png 1)" == report.summary()


def test_a_pdf_says_where_each_page_starts(folder):
    (pdf,) = [d for d in read_folder(folder) if d.doc_id == "reports/annual.pdf"]
    starts = pdf.metadata["page_starts"]
    assert len(starts) == 3 and starts[0] == 0
    last = pdf.text.index(LAST_SENTENCES["reports/annual.pdf"])
    assert page_of(pdf.metadata, last) == 3 and page_of(pdf.metadata, 0) == 1
    assert page_of(pdf.metadata, pdf.text.index("Funding")) == 2 and page_of({}, 5) is None


def test_a_blank_first_page_leaves_every_page_number_right(tmp_path, tiny_bert):
    """From a QA run: a PDF whose cover page has no text began its text with the blank line joining the pages,
    which the document's trimming took away: every hit's page was one low."""
    from retriever.index import Index
    from tests.files_folder import write_pdf

    def write(relative, content):
        (tmp_path / "pdfs" / relative).write_bytes(content)

    (tmp_path / "pdfs").mkdir()
    filler = " ".join(f"word{number}" for number in range(60))  # passages of 32 tokens: each page cut apart
    write_pdf(write, "cover.pdf", [" ", f"Second page qxsecond. {filler}", " ", f"Fourth page qxfourth. {filler}"])
    index = Index.build(tmp_path / "pdfs", "pdfs", tmp_path / "ix", model=str(tiny_bert), calibrator="none",
                        device="cpu", max_length=32).open()
    assert index.search("qxsecond", k=1, mode="keyword")[0].page == 2


def test_markup_a_reader_does_not_show_stays_out_of_the_text():
    """From a QA run: front matter written with CR LF line ends was read as text and titled the note; Sphinx's
    reStructuredText left docutils' error messages, comments, substitution definitions and the directives' source
    in the text."""
    from retriever.files.readers import read_markdown, read_rst

    note = read_markdown(b"---\r\ntitle: CRLF Title\r\nsecret: qxsecret\r\n---\r\n\r\n# Heading\r\n\r\nBody.\r\n")
    assert (note.title, note.text) == ("CRLF Title", "Heading\n\nBody.")
    guide = read_rst(b"Guide\n=====\n\n.. contents::\n\n.. toctree::\n\n   intro\n\nSee :ref:`install` and |name|.\n\n"
                     b".. |name| replace:: Named\n\n.. raw:: html\n\n   <b>qxraw</b>\n\n"
                     b".. a comment qxcomment\n\nText.\n")
    assert guide.text == "Guide\n\nSee :ref:`install` and Named.\n\nText."


@pytest.mark.parametrize("source, title", [
    (b'---\ntitle: ""\n---\n\n# Heading One\n\nBody\n', "Heading One"),  # empty: the first heading titles
    (b"---\ntitle: 'It''s here' # a comment\n---\n\nBody\n", "It's here"),
    (b"---\ntitle: >\n  Folded\n  title\n---\n\nBody\n", "Folded title"),
    (b'---\ntitle: "Quoted \\"inner\\""\n---\n\nBody\n', 'Quoted "inner"'),
    (b'+++\ndate = 2024-01-01\n[params]\ntitle = "Not this"\n+++\n\n# Real\n\nBody\n', "Real"),
    (b'+++\ntitle = "TOML title"\n+++\n\nBody\n', "TOML title"),
    (b"---\ntitle: [unclosed\n---\n\n# Heading\n\nBody\n", "Heading"),  # front matter that does not parse
])
def test_front_matter_titles_are_read_by_their_formats_parser(source, title):
    """From a QA run: a pattern read titles as written, quotes, comments and '>' included, and took a title from
    TOML's [params]."""
    from retriever.files.readers import read_markdown

    assert read_markdown(source).title == title


def test_an_html_page_in_a_legacy_encoding_is_read_in_the_one_it_declares():
    """From a QA run: a page declaring windows-1252 (as saved by older editors and sites) was skipped as not UTF-8.
    Latin-1 is read as a browser reads it (windows-1252: curly quotes, the euro); a page saved as UTF-8 since, its
    old declaration left in, stays UTF-8; bytes the declared encoding has no character for, an encoding Python does
    not know, and legacy bytes with no declaration are one line each."""
    from retriever.files.readers import UnreadableFile, read_html

    page = read_html('<html><head><meta charset="windows-1252"><title>Caf\xe9 \x93menu\x94</title></head>'
                     '<body><p>Cr\xe8me br\xfbl\xe9e \x80 5</p></body></html>'.encode("latin-1"))
    assert (page.title, page.text) == ("Café “menu”", "Crème brûlée € 5")
    old = read_html('<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1"><p>na\xefve \x85</p>'
                    .encode("latin-1"))
    assert old.text == "naïve …"
    assert read_html('<meta charset="koi8-r"><p>Привет</p>'.encode("koi8-r")).text == "Привет"
    assert read_html('<meta charset="iso-8859-1"><p>déjà “vu”</p>'.encode("utf-8")).text == "déjà “vu”"
    for data, why in [('<meta charset="windows-1252"><p>\x81</p>', "not windows-1252 text as it declares: byte 0x81"),
                      ('<meta charset="bogus"><p>\xe9</p>', "encoding it declares is one Python does not know"),
                      ("<p>caf\xe9</p>", "not UTF-8 text: byte 0xe9 at offset 6")]:
        with pytest.raises(UnreadableFile, match=why):
            read_html(data.encode("latin-1"))


def test_a_title_is_one_line(tmp_path):
    """From a QA run: an HTML title written over two lines, and a file named with a line break, wrapped `show`."""
    from retriever.files.folder import read_folder

    (tmp_path / "g.html").write_text("<title>Gamma\n   rays</title><p>Gamma radiation.</p>")
    (tmp_path / "two\nlines.txt").write_text("Some text.")
    assert {document.doc_id: document.title for document in read_folder(tmp_path)} == {
        "g.html": "Gamma rays", "two\nlines.txt": "two lines.txt"}


def test_a_word_file_reads_in_order_with_its_tables_headers_and_footers_once():
    """From a QA run: every table came after every paragraph, a cell merged across three columns was read three
    times, a nested table and the headers and footers were lost."""
    import io

    import docx

    from retriever.files.readers import read_docx

    document = docx.Document()
    document.add_heading("Memo", level=1)
    document.add_paragraph("Before the table.")
    table = document.add_table(rows=2, cols=3)
    table.cell(0, 0).merge(table.cell(0, 2)).text = "merged"
    table.cell(1, 0).text, table.cell(1, 1).text = "left", "middle"
    table.cell(1, 2).add_table(rows=1, cols=1).cell(0, 0).text = "nested"
    document.add_paragraph("After the table.")
    document.sections[0].header.paragraphs[0].text = "The header"
    document.sections[0].footer.paragraphs[0].text = "The footer"
    written = io.BytesIO()
    document.save(written)
    found = read_docx(written.getvalue())
    assert found.title == "Memo"
    assert found.text.splitlines() == ["Memo", "Before the table.", "merged", "left\tmiddle\tnested",
                                       "After the table.", "The header", "The footer"]


def test_include_and_exclude_patterns_choose_the_files(folder):
    only_notes = {d.doc_id for d in read_folder(folder, FolderOptions(include=("notes/**",)))}
    assert only_notes == {"notes/garden.md", "notes/recipes/bread.markdown"}
    no_pdfs = {d.doc_id for d in read_folder(folder, FolderOptions(exclude=("*.pdf", "letters/")))}
    assert no_pdfs == set(LAST_SENTENCES) - {"reports/annual.pdf", "letters/offer.docx"}


def test_strict_stops_at_the_first_unreadable_file_in_one_line(folder):
    with pytest.raises(RetrieverError, match=r"^legacy/latin1.txt: not UTF-8 text") as error:
        list(read_folder(folder, FolderOptions(strict=True)))
    assert "\n" not in str(error.value)


def test_a_file_over_the_size_limit_and_a_missing_folder(folder, tmp_path):
    report = FolderReport()
    kept = {d.doc_id for d in read_folder(folder, FolderOptions(max_bytes=300), report=report)}
    assert "journal.txt" in kept and "reports/annual.pdf" not in kept
    assert "KiB, over the 300 bytes a file may hold" in dict(report.skipped)["reports/annual.pdf"]
    with pytest.raises(RetrieverError, match="no such folder"):
        list(read_folder(tmp_path / "nowhere"))


def test_a_folder_builds_and_every_readable_file_is_found_by_its_last_sentence_in_every_mode(folder, tmp_path):
    from retriever.index import Index

    summary = Index.build(folder, "mine", tmp_path, device="cpu")  # the default model
    assert summary.documents == len(LAST_SENTENCES)
    assert {f"skipped {path}" for path in UNREADABLE} <= {note.split(":")[0] for note in summary.notes}
    assert summary.notes[-1].endswith("7 files read; 4 skipped (no text read from them); 1 of other formats left out "
                                      "(.png 1)")
    with summary.open() as index:
        for path, sentence in LAST_SENTENCES.items():
            for mode in ("dense", "keyword", "hybrid"):
                hits = index.search([sentence], k=3, mode=mode)[0]
                assert hits[0].doc_id == path, (mode, path, [hit.doc_id for hit in hits])
        (hit,) = index.search([LAST_SENTENCES["reports/annual.pdf"]], k=1, mode="keyword")[0]
        assert hit.metadata["type"] == "pdf" and hit.metadata["path"] == "reports/annual.pdf"


def test_the_cli_builds_a_folder_says_what_it_skipped_and_a_hit_says_its_page(folder, cli, tmp_path):
    import json

    home = tmp_path / "home"
    result = cli("build", folder, "--index-dir", home, "--exclude", "site/")
    assert result.returncode == 0, result.stderr
    assert "skipped reports/broken.pdf: a damaged PDF" in result.stderr
    assert "skipped legacy/latin1.txt: not UTF-8 text" in result.stderr and "Traceback" not in result.stderr
    assert "6 files read; 4 skipped (no text read from them)" in result.stderr
    # a Markdown file's first heading is its title and opens its text: a hit's row shows it once
    table = cli("search", "planted basil and mint", "--name", "mine", "--index-dir", home, "--mode", "keyword",
                "-k", "1")
    assert table.returncode == 0 and "notes/garden.md" in table.stdout and table.stdout.count("Garden diary") == 1
    # patterns that let no file through say so
    refused = cli("build", folder, "--name", "none", "--index-dir", home, "--include", "*.odt")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1].endswith(
        "no documents (no file in it that a reader reads: Markdown, HTML, reStructuredText, text, PDF, Word, among the "
        "files --include *.odt let through)")
    found = cli("search", LAST_SENTENCES["reports/annual.pdf"], "--name", "mine", "--index-dir", home, "--json",
                "-k", "1")
    (hit,) = json.loads(found.stdout)["results"]
    assert hit["doc_id"] == "reports/annual.pdf" and hit["page"] == 3 and hit["metadata"]["type"] == "pdf"
    # show names a file where it lies (a QA run: it said the folder, and "line 1" of a file)
    shown = cli("show", "reports/annual.pdf", "--name", "mine", "--index-dir", home).stdout
    assert str(folder / "reports" / "annual.pdf") in "".join(shown.replace("│", "").split()) and "line " not in shown
    # info says which folder, and by which patterns, sync reads again
    described = "".join(cli("info", "mine", "--index-dir", home).stdout.replace("│", "").split())
    assert "".join(f"read from the folder {folder}, exclude 'site/' (as `retriever sync` reads it again)".split()) \
        in described
    assert cli("build", folder / "journal.txt", "--name", "x", "--index-dir", home, "--strict").stderr.startswith(
        "error: --include, --exclude, --strict and --corpus-files choose the files of a folder")
    strict = cli("build", folder, "--name", "strict", "--index-dir", home, "--strict")
    assert strict.returncode != 0 and "legacy/latin1.txt: not UTF-8 text" in strict.stderr
    assert "Traceback" not in strict.stderr


def test_adding_a_folder_and_upserting_an_edited_file(folder, tmp_path, cli):
    import shutil

    from retriever.index import Index

    mine = tmp_path / "mine"
    shutil.copytree(folder / "notes", mine / "notes", ignore=shutil.ignore_patterns("again"))
    home = tmp_path / "home"
    assert cli("build", mine, "--index-dir", home).returncode == 0
    more = tmp_path / "more"
    shutil.copytree(folder / "docs", more / "docs")
    added = cli("add", "mine", more, "--index-dir", home)
    assert added.returncode == 0 and "1 file read" in added.stderr
    (mine / "notes" / "garden.md").write_text("# Garden diary\n\nThe pumpkins won a prize at the autumn fair.\n")
    assert cli("add", "mine", mine, "--index-dir", home, "--upsert", "--include", "*.md").returncode == 0
    with Index.open("mine", home) as index:
        assert len(index) == 3
        (hit,) = index.search(["pumpkins prize autumn fair"], k=1, mode="keyword")[0]
        assert hit.doc_id == "notes/garden.md" and "pumpkins" in hit.text
    # sync reads the folder the index was built from: what was added from another folder stays
    synced = cli("sync", "mine", "--index-dir", home)
    assert "0 added, 0 changed, 0 deleted, 2 unchanged" in synced.stderr
    with Index.open("mine", home) as index:
        assert len(index) == 3 and index.document("docs/install.rst") is not None


def without_module(monkeypatch, module: str) -> None:
    """MODULE not installed, as the readers import their parsers (`importlib.import_module`)."""
    import importlib

    real = importlib.import_module

    def importing(name, *args):
        if name == module:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", importing)


def test_a_missing_reader_library_is_one_line_naming_the_extra(folder, monkeypatch):
    without_module(monkeypatch, "pypdf")
    with pytest.raises(RetrieverError, match=r"^reading PDF needs pypdf: pip install 'retriever\[files\]'$"):
        list(read_folder(folder, FolderOptions(include=("reports/*.pdf",))))


def test_markdown_is_read_with_the_package_alone_and_a_missing_parser_names_markdown(folder, monkeypatch):
    import importlib.metadata

    # What the package's own install brings (no extra): Markdown's parser and its renderer's reader
    core = [line for line in importlib.metadata.requires("retriever") if "extra ==" not in line]
    assert all(any(line.startswith(package) for line in core)
               for package in ("markdown-it-py", "beautifulsoup4", "pathspec")), core
    without_module(monkeypatch, "bs4")
    with pytest.raises(RetrieverError, match=r"^reading Markdown needs beautifulsoup4: pip install beautifulsoup4$"):
        list(read_folder(folder, FolderOptions(include=("*.md",))))


def test_sync_makes_exactly_the_folders_changes_and_leaves_untouched_files_unread(folder, tmp_path, cli,
                                                                                    monkeypatch):
    import shutil

    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder
    from retriever.index import Index

    mine = tmp_path / "mine"
    shutil.copytree(folder, mine, ignore=shutil.ignore_patterns("again", "broken.pdf", "locked.pdf", "latin1.txt"))
    home = tmp_path / "home"
    assert cli("build", mine, "--index-dir", home, "--exclude", "site/").returncode == 0
    in_step = cli("sync", "mine", "--index-dir", home)
    assert in_step.returncode == 0 and "is in step with its folder: 0 added, 0 changed, 0 deleted, 6 unchanged" \
        in in_step.stderr and Index.versions("mine", home)[0]["version"] == 1
    (mine / "journal.txt").write_text("The lighthouse keeper retired after forty winters on the rock.\n")
    (mine / "letters" / "offer.docx").unlink()
    (mine / "notes" / "plants.md").write_text("# Plants\n\nFerns prefer the shade under the old walnut tree.\n")
    (mine / "site" / "extra.html").write_text("<p>excluded by the build's pattern</p>")
    encoded = []
    for encoder in (Encoder, QueryKitEncoder):  # by the model or from its kit, whichever encodes
        monkeypatch.setattr(encoder, "encode_tokenized",
                            lambda self, tokenized, *a, original=encoder.encode_tokenized, **k:
                            (encoded.extend(tokenized.texts), original(self, tokenized, *a, **k))[1])
    synced = cli("sync", "mine", "--index-dir", home)
    assert synced.returncode == 0, synced.stderr
    assert "to version 2: 1 added, 1 changed, 1 deleted, 4 unchanged (not read again)" in synced.stderr
    assert len(encoded) == 2 and any("walnut" in text for text in encoded) and any("forty winters" in text
                                                                                  for text in encoded)  # only those
    again = cli("sync", "mine", "--index-dir", home)  # the folder is still known to the version sync wrote
    assert "is in step with its folder: 0 added, 0 changed, 0 deleted, 6 unchanged" in again.stderr
    fresh_home = tmp_path / "fresh"
    assert cli("build", mine, "--index-dir", fresh_home, "--exclude", "site/").returncode == 0

    def documents(index):
        return {row["doc_id"]: (row["title"], row["text"]) for segment in index.snapshot.segments
                for row in index.snapshot.rows(segment.rowids[index.snapshot.live_documents(segment)],
                                               ("doc_id", "title", "text")).values()}

    with Index.open("mine", home) as synced_index, Index.open("mine", fresh_home) as built:
        assert documents(synced_index) == documents(built) and len(synced_index) == 6
        (hit,) = synced_index.search(["ferns in the shade"], k=1, mode="keyword")[0]
        assert hit.doc_id == "notes/plants.md"
    not_a_folder = tmp_path / "plain.jsonl"
    not_a_folder.write_text('{"_id": "a", "text": "one"}\n')
    assert cli("build", not_a_folder, "--index-dir", home).returncode == 0
    refused = cli("sync", "plain", "--index-dir", home)
    assert refused.returncode != 0 and "was not built from a folder of files" in refused.stderr


def test_a_sync_of_a_folder_left_empty_deletes_nothing_unless_asked(tmp_path, tiny_bert, cli):
    """From a CLI QA run: the folder moved away and an empty one made in its place (or a drive not mounted), a sync
    deleted every document, and one more write dropped the version that held them."""
    from retriever.index import Index

    notes, home = tmp_path / "notes", tmp_path / "home"
    notes.mkdir()
    for name in ("tides", "ferns", "harps"):
        (notes / f"{name}.md").write_text(f"# {name}\n\nA note about {name}.\n")
    Index.build(notes, "notes", home, model=str(tiny_bert), calibrator="none", device="cpu")
    notes.rename(tmp_path / "moved")
    notes.mkdir()
    refused = cli("sync", "notes", "--index-dir", home)
    assert refused.returncode == 1 and "holds none of the 3 files index 'notes' was built from now" in refused.stderr
    assert "nothing deleted" in refused.stderr and "--allow-empty" in refused.stderr
    assert len(Index.open("notes", home)) == 3 and Index.versions("notes", home)[0]["version"] == 1
    (notes / "tides.md").write_text("# tides\n\nA note about tides.\n")  # one file back: a sync as ever
    assert cli("sync", "notes", "--index-dir", home).returncode == 0 and len(Index.open("notes", home)) == 1
    (notes / "tides.md").unlink()
    emptied = cli("sync", "notes", "--index-dir", home, "--allow-empty")
    assert emptied.returncode == 0 and "1 deleted" in emptied.stderr and len(Index.open("notes", home)) == 0


def test_the_server_syncs_an_index_built_from_a_folder(folder, tmp_path, tiny_bert):
    import shutil

    from fastapi.testclient import TestClient

    from retriever.index import Index
    from retriever.serve.app import create_app

    mine = tmp_path / "mine"
    shutil.copytree(folder / "notes", mine, ignore=shutil.ignore_patterns("again"))
    home = tmp_path / "home"
    Index.build(mine, "mine", home, model=str(tiny_bert), calibrator="none", device="cpu")
    Index.build([{"_id": "a", "text": "one plain record"}], "plain", home, model=str(tiny_bert), calibrator="none",
                device="cpu")
    (mine / "garden.md").unlink()
    with TestClient(create_app(home, device="cpu"), base_url="http://127.0.0.1") as client:
        synced = client.post("/indexes/mine/sync")
        assert synced.status_code == 200, synced.text
        assert {key: synced.json()[key] for key in ("added", "changed", "deleted", "unchanged", "documents")} == \
            {"added": 0, "changed": 0, "deleted": 1, "unchanged": 1, "documents": 1}
        assert "not built from a folder" in one_line_error(client.post("/indexes/plain/sync"), 400)
        # the last file gone: refused, said without the server's folder, unless asked
        (mine / "recipes" / "bread.markdown").unlink()
        refused = one_line_error(client.post("/indexes/mine/sync"), 400)
        assert "nothing deleted" in refused and "allow_empty" in refused and str(mine) not in refused
        emptied = client.post("/indexes/mine/sync", params={"allow_empty": "true"})
        assert emptied.status_code == 200 and emptied.json()["documents"] == 0


def test_a_folder_of_corpus_files_is_read_as_one_corpus_when_said_so(tmp_path, tiny_bert, cli):
    from retriever.index import Index

    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.txt").write_text("first line of a\nsecond line of a\n")
    (parts / "b.jsonl").write_text('{"_id": "b1", "text": "a record of b"}\n{"_id": "b2", "text": "another of b"}\n')
    home = tmp_path / "home"
    as_files = cli("build", parts, "--name", "files", "--index-dir", home, "--model", tiny_bert, "--calibrator", "none")
    as_corpus = cli("build", parts, "--name", "corpus", "--index-dir", home, "--model", tiny_bert, "--calibrator",
                    "none", "--corpus-files")
    assert as_files.returncode == 0 and as_corpus.returncode == 0, as_corpus.stderr
    with Index.open("files", home) as files, Index.open("corpus", home) as corpus:
        assert len(files) == 1 and files.document("a.txt")["text"] == "first line of a\nsecond line of a"
        assert len(corpus) == 4 and corpus.document("b2")["text"] == "another of b"
        assert corpus.document("a.txt:2")["text"] == "second line of a"
    assert "a folder of --corpus-files is read whole" in cli("build", parts, "--index-dir", home, "--corpus-files",
                                                             "--exclude", "*.txt").stderr


def test_files_named_one_by_one_are_a_corpus_and_one_can_be_added(folder, tmp_path, cli):
    from retriever.index import Index

    home = tmp_path / "home"
    pdf, page, notes = folder / "reports/annual.pdf", folder / "site/index.html", folder / "notes/garden.md"
    built = cli("build", pdf, page, "--name", "picked", "--index-dir", home)
    assert built.returncode == 0, built.stderr
    assert cli("add", "picked", notes, "--index-dir", home).returncode == 0
    with Index.open("picked", home) as index:
        assert len(index) == 3 and index.document("reports/annual.pdf")["title"] == "Annual report"
        assert index.document("site/index.html") is not None and index.document("garden.md") is not None
        (hit,) = index.search([LAST_SENTENCES["notes/garden.md"]], k=1, mode="keyword")[0]
        assert hit.doc_id == "garden.md"
    single = cli("build", pdf, "--index-dir", home)  # named after the file
    assert single.returncode == 0 and "index 'annual'" in single.stderr
    assert "name it with --name" in cli("build", pdf, page, "--index-dir", home).stderr
    broken = cli("build", folder / "reports/broken.pdf", pdf, "--name", "strict", "--index-dir", home, "--strict")
    assert broken.returncode != 0 and "broken.pdf: a damaged PDF" in broken.stderr and "Traceback" not in broken.stderr


def test_a_file_that_vanishes_while_the_folder_is_read_is_skipped_with_a_line(tmp_path):
    from retriever.files.folder import folder_files, read_file

    folder = tmp_path / "going"
    folder.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (folder / name).write_text(f"# {name}\n\nA note called {name}.\n")
    skipped, report = [], FolderReport()
    found = []
    for document in read_folder(folder, on_skip=lambda path, why: skipped.append((path, why)), report=report):
        found.append(document.doc_id)
        (folder / "c.md").unlink(missing_ok=True)  # gone before its turn
    assert found == ["a.md", "b.md"] and skipped == [("c.md", "it vanished while the folder was read")]
    with pytest.raises(Exception, match="vanished"):
        read_file(folder / "c.md", "c.md", str(folder))
    assert list(folder_files(folder, FolderOptions(), FolderReport())) == [(folder / "a.md", "a.md"),
                                                                          (folder / "b.md", "b.md")]


def test_a_folder_that_cannot_be_entered_is_skipped_and_a_sync_keeps_what_it_held(tmp_path, tiny_bert, monkeypatch):
    import os
    from pathlib import Path

    import retriever.files.folder as folder_module
    from retriever.index import Index

    notes = tmp_path / "notes"
    (notes / "locked").mkdir(parents=True)
    (notes / "open.md").write_text("# Open\n\nThe open note is about tides.\n")
    (notes / "locked" / "kept.md").write_text("# Kept\n\nThe locked note is about glaciers.\n")
    Index.build(notes, "notes", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")

    # the folder's mode now 000, as for a user without root: neither listed nor entered (a stat inside it fails)
    scandir, is_file = os.scandir, Path.is_file

    def refused(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    def refused_inside(path):
        if path.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return is_file(path)

    monkeypatch.setattr(folder_module.os, "scandir", refused)
    monkeypatch.setattr(Path, "is_file", refused_inside)
    synced = Index.open("notes", tmp_path / "home").sync()
    assert (synced.added, synced.changed, synced.deleted, synced.stale) == (0, 0, 0, 1)
    assert any("locked: a folder that cannot be listed" in note and "indexed documents kept" in note
               for note in synced.notes)
    assert Index.open("notes", tmp_path / "home").document("locked/kept.md") is not None
    # a build of the folder now skips it too, rather than stopping at its ignore files
    rebuilt = Index.build(notes, "again", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")
    assert rebuilt.documents == 1


def test_a_sync_works_out_its_changes_from_the_version_another_sync_committed(tmp_path, tiny_bert):
    from retriever.index import Index

    notes = tmp_path / "notes"
    notes.mkdir()
    for name in ("tides", "glaciers", "harps"):
        (notes / f"{name}.md").write_text(f"# {name}\n\nA note about {name}.\n")
    Index.build(notes, "notes", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")
    opened_before = Index.open("notes", tmp_path / "home")  # a second sync's index, opened before the first wrote
    (notes / "tides.md").write_text("# tides\n\nA note about tides and the moon.\n")
    (notes / "harps.md").unlink()
    first = Index.open("notes", tmp_path / "home").sync()
    assert (first.added, first.changed, first.deleted) == (0, 1, 1)
    second = opened_before.sync()  # nothing left to do: it reads what the first wrote
    assert (second.added, second.changed, second.deleted, second.change) == (0, 0, 0, None)
    # and where the folder went back meanwhile, what the first wrote is undone
    (notes / "tides.md").write_text("# tides\n\nA note about tides.\n")
    third = opened_before.sync()
    assert (third.added, third.changed, third.deleted) == (0, 1, 0)
    assert Index.open("notes", tmp_path / "home").document("tides.md")["text"].endswith("A note about tides.")


def test_a_sync_deletes_a_file_emptied_and_keeps_one_it_cannot_read(tmp_path, tiny_bert, monkeypatch):
    import retriever.files.folder as folder_module
    from retriever.files.readers import UnreadableFile
    from retriever.index import Index

    notes = tmp_path / "notes"
    notes.mkdir()
    for name in ("tides", "glaciers", "harps"):
        (notes / f"{name}.md").write_text(f"# {name}\n\nA note about {name}.\n")
    Index.build(notes, "notes", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")
    (notes / "tides.md").write_text("")  # emptied: the file says it holds nothing now
    (notes / "harps.md").write_text("# harps\n\nA note about harps and lutes.\n")
    read_file = folder_module.read_file

    def refusing_harps(path, *args, **kwargs):  # changed, then not readable (as a file mid-write can be)
        if path.name == "harps.md":
            raise UnreadableFile("permission denied")
        return read_file(path, *args, **kwargs)

    monkeypatch.setattr("retriever.index.read_file", refusing_harps)
    synced = Index.open("notes", tmp_path / "home").sync()
    assert (synced.added, synced.changed, synced.deleted) == (0, 0, 1)
    assert "skipped tides.md: no text in it; its indexed version deleted" in synced.notes
    assert "skipped harps.md: permission denied; its indexed version kept" in synced.notes
    assert synced.stale == 1 and "1 deleted, 1 unchanged (not read again), 1 kept as indexed (not readable now)" \
        in synced.line()
    again = Index.open("notes", tmp_path / "home").sync()  # not in step while harps.md cannot be read
    assert again.change is None and again.line().startswith("index 'notes' has nothing it can write from its folder")
    with Index.open("notes", tmp_path / "home") as index:
        assert index.document("tides.md") is None and index.document("harps.md")["text"].endswith("about harps.")


def test_a_link_to_a_file_or_folder_inside_the_folder_is_read_where_it_lies_and_one_outside_is_followed(tmp_path):
    import os

    from retriever.files.folder import folder_files

    root, outside = tmp_path / "notes", tmp_path / "elsewhere"
    (root / "trips").mkdir(parents=True)
    outside.mkdir()
    (root / "trips" / "alps.md").write_text("# Alps\n")
    (root / "home.md").write_text("# Home\n")
    (outside / "shared.md").write_text("# Shared\n")
    os.symlink(root / "trips", root / "a-trips")  # met before the folder it names
    os.symlink(root / "home.md", root / "trips" / "home-again.md")
    os.symlink(root, root / "trips" / "up")  # a loop
    os.symlink(outside, root / "linked")
    os.symlink(root / "gone.md", root / "trips" / "dangling.md")
    report, told = FolderReport(), []
    assert [relative for _, relative in folder_files(root, FolderOptions(), report,
                                                     lambda *skip: told.append(skip))] == [
        "home.md", "linked/shared.md", "trips/alps.md"]
    assert report.linked == [("a-trips", "trips"), ("trips/home-again.md", "home.md")]
    assert told == report.skipped == [
        ("trips/dangling.md", f"a broken symbolic link (to {root / 'gone.md'}, which does not exist)"),
        ("trips/up", "a symbolic link loop (the folder was read already)")]
    assert report.summary() == ("0 files read; 2 skipped (no text read from them); 2 symbolic links within the "
                                "folder not followed (what they name is read where it lies)")
    # a link to what the walk leaves out where it lies (a hidden folder) is read through the link; one to a folder
    # above the root is a loop (it walked the whole parent)
    (root / ".private").mkdir()
    (root / ".private" / "kept.md").write_text("# Kept\n")
    os.symlink(root / ".private", root / "shown")
    os.symlink(tmp_path, root / "trips" / "all")
    os.symlink(root / ".private", root / "shown-again")  # read once, through the first link
    (root / "drafts").mkdir()
    (root / "drafts" / "secret.md").write_text("# Secret\n")
    os.symlink(root / "drafts", root / "published")  # what --exclude leaves out stays out
    report = FolderReport()
    assert [relative for _, relative in folder_files(root, FolderOptions(exclude=("drafts/",)), report)] == [
        "home.md", "linked/shared.md", "shown/kept.md", "trips/alps.md"]
    assert ("trips/all", "a symbolic link loop (the folder was read already)") in report.skipped
    assert ("published", "a symbolic link to drafts, which this folder's patterns leave out") in report.skipped
    assert ("shown-again", ".private") in report.linked
    # an outside file named by a link and by a link to its folder is read once; --include leaves out silently what
    # it does not name, a broken link too
    os.symlink(outside / "shared.md", root / "a-shared.md")
    report = FolderReport()
    assert [relative for _, relative in folder_files(root, FolderOptions(include=("*.md",)), report)] == [
        "a-shared.md", "drafts/secret.md", "home.md", "shown/kept.md", "trips/alps.md"]
    assert ("linked/shared.md", str(outside / "shared.md")) in report.linked
    report = FolderReport()
    assert [relative for _, relative in folder_files(root, FolderOptions(include=("*.txt",)), report)] == []
    assert report.skipped == [(link, "a symbolic link loop (the folder was read already)")
                              for link in ("trips/all", "trips/up")]


def test_inline_code_and_links_stay_inside_their_sentence_and_blocks_keep_their_lines():
    """Every element was put on a line of its own: "Use\\ngit rebase -i HEAD~5\\n to squash" in a hit's passage."""
    from retriever.files.readers import read_html, read_markdown, read_text

    markdown = read_markdown(b"# Rebase\n\nUse `git rebase -i HEAD~5` to squash, see [the book](http://x).\n"
                             b"A second line.\n\n- an item with `code`\n\n```\nkeep   this\n  as is\n```\n\n"
                             b"| a | b |\n|---|---|\n")
    # a paragraph's source line breaks are spaces (a hard-wrapped note's sentences read whole), a table is rows
    assert markdown.text == ("Rebase\n\nUse git rebase -i HEAD~5 to squash, see the book. A second line.\n\n"
                             "an item with code\n\nkeep   this\n  as is\n\na b")
    page = read_html(b"<html><head><title>T</title><script>x = 1</script></head><body>\n  <h1>Welcome</h1>\n"
                     b"  <p>\n    Click <a href='#'>here</a>   <em>now</em>.<br>Next line</p>"
                     b"<div>A <b>bold</b> div</div><table><tr><td>x</td><td>y</td></tr></table></body></html>")
    assert page.text == "Welcome\n\nClick here now.\nNext line\n\nA bold div\n\nx y" and page.title == "T"
    # from a review: HTML's own line breaks are spaces; preformatted text keeps its first line's indentation; a
    # <br> and the line break after it are one; options are blocks; a heading's title is its text as shown
    cases = {b"<p>Use\n<code>git rebase</code>\nto squash</p>": "Use git rebase to squash",
             b"<p>x</p><pre>    indented\n  two</pre>": "x\n\n    indented\n  two",
             b"<ul><li>item<pre>  a\n  b</pre></li></ul>": "item\n  a\n  b",
             b"<p>Click <a> here</a> <!-- c --> now<br>\nnext</p>": "Click here now\nnext",
             b"x<select><option>o1</option><option>o2</option></select>": "x\no1\n\no2",
             # inside preformatted text a <br> or a highlighter's line is a line break; control characters go
             b"<pre>a<br>b</pre><pre><div>one</div><div>  two</div></pre>": "a\nb\n\none\n  two",
             b"<p>a&#1;b</p><pre>  x\n  y</pre><p>c &#2;  d</p>": "ab\n\n  x\n  y\n\nc d"}
    assert {source: read_html(source).text for source in cases} == cases
    code = read_markdown(b"# Title<br>with **bold** `code`\n\n```\n    indented = True\n```\nline one  \nline two\n")
    assert code.title == "Title with bold code"
    assert code.text == "Title\nwith bold code\n\n    indented = True\n\nline one\nline two"
    # from a user's run: TOML front matter, an image's words, an escaped pipe in a table, control characters
    toml = read_markdown(b'+++\ntitle = "Notes"\n+++\n\nSee ![a flow diagram](f.png "Flow") here.\n\n'
                         b"| opt | what |\n|---|---|\n| `-a \\| -b` | either |\n")
    assert (toml.title, toml.text) == ("Notes", "See a flow diagram here.\n\nopt what\n\n-a | -b either")
    assert read_text(b"a bell\x07 and\x1b[1m escape\x0cthen a page").text == "a bell and escape\nthen a page"
    # a saved terminal log: its colours, a window title and a charset switch go whole, not only their ESC
    log = b"\x1b]0;build\x07\x1b(B\x1b[1;31mERROR\x1b[0m: disk full\r\n\x1b[32mok\x1b[m [x]\n"
    assert read_text(log).text == "ERROR: disk full\nok [x]"
    # a window title's sequence cut short takes its ESC ] alone, not the file up to a later BEL (from the review)
    cut_short = b"Intro.\nA stray \x1b] here\nThe rest.\nend\x07."
    assert read_text(cut_short).text == "Intro.\nA stray  here\nThe rest.\nend."


def test_a_sync_keeps_a_file_behind_a_broken_link_and_does_not_hang_on_a_pipe(tmp_path, tiny_bert):
    """A link whose target is gone (an unmounted drive) deleted its document; a FIFO in the folder was hashed
    before it was checked, and the sync never ended."""
    import os

    from retriever.index import Index

    notes, drive = tmp_path / "notes", tmp_path / "drive"
    notes.mkdir()
    drive.mkdir()
    (notes / "here.md").write_text("# Here\n\nA note about tides.\n")
    (drive / "away.md").write_text("# Away\n\nA note about glaciers.\n")
    os.symlink(drive / "away.md", notes / "away.md")
    (drive / "box").mkdir()
    (drive / "box" / "inside.md").write_text("# Inside\n\nA note about harps.\n")
    os.symlink(drive / "box", notes / "box")  # a folder behind a link: its documents are kept too
    Index.build(notes, "notes", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")
    drive.rename(tmp_path / "unmounted")
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", notes / "pipe.md")  # a link is read whatever it names
    os.mkfifo(notes / "fifo.md")  # and a pipe in the folder itself was passed over without a word
    synced = Index.open("notes", tmp_path / "home").sync()
    assert (synced.added, synced.changed, synced.deleted, synced.stale, synced.change) == (0, 0, 0, 2, None)
    assert any(note.startswith("skipped away.md: a broken symbolic link") and note.endswith("indexed version kept")
               for note in synced.notes)
    assert {"skipped pipe.md: not a regular file", "skipped fifo.md: not a regular file"} <= set(synced.notes)
    assert any(note.startswith("skipped box: a broken symbolic link") and note.endswith("indexed documents kept")
               for note in synced.notes)
    kept = Index.open("notes", tmp_path / "home")
    assert kept.document("away.md") is not None and kept.document("box/inside.md") is not None


def test_a_pattern_git_cannot_read_is_refused_and_an_ignore_file_s_bad_line_passed_over(tmp_path, tiny_bert):
    """From a CLI QA run: --include '[' matched no file without a word; a .gitignore holding a lone '!' stopped the
    build with pathspec's traceback (git passes such a line over)."""
    from retriever.index import Index

    for pattern in ("[", "*.[md", "!", "\\"):
        with pytest.raises(RetrieverError, match=r"^include '.*' is no pattern git reads .*: it would match no file$"):
            FolderOptions(include=(pattern,))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "tides.md").write_text("# Tides\n\nThe moon pulls the sea.\n")
    (notes / "scratch.tmp.md").write_text("# Scratch\n\nleft out\n")
    (notes / ".gitignore").write_text("!\n*.tmp.md\n")
    Index.build(notes, "notes", tmp_path / "home", model=str(tiny_bert), calibrator="none", device="cpu")
    assert [row["doc_id"] for row in Index.open("notes", tmp_path / "home").documents()] == ["tides.md"]
    # a file added again is named by its path, with no line (a file is a document whole)
    with pytest.raises(RetrieverError, match=r": 1 id is already in the index: 'tides.md'; to replace it, add with"):
        Index.open("notes", tmp_path / "home").add(notes)
