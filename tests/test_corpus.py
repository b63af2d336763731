import json
import os

import pytest

from retriever.corpus import (
    Document,
    check_unique_ids,
    document_text,
    documents_from_records,
    given_documents,
    iter_corpus,
    read_corpus,
    read_queries,
)
from retriever.errors import RetrieverError


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", newline="")
    return path


def error_of(path, **kwargs):
    with pytest.raises(RetrieverError) as caught:
        read_corpus(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- formats ---


def test_txt_one_document_per_non_blank_line(tmp_path):
    path = write(tmp_path, "corpus.txt", "\ufefffirst doc\r\n\n   \nsecond doc  \nthird\n")
    docs = read_corpus(path)
    assert docs == [
        Document(doc_id="corpus.txt:1", text="first doc", title=None, source=str(path), line=1),
        Document(doc_id="corpus.txt:4", text="second doc", title=None, source=str(path), line=4),
        Document(doc_id="corpus.txt:5", text="third", title=None, source=str(path), line=5),
    ]


def test_txt_stray_carriage_return_does_not_split_a_line(tmp_path):
    docs = read_corpus(write(tmp_path, "corpus.txt", "a\rb\nc\n"))
    assert [(d.doc_id, d.text) for d in docs] == [("corpus.txt:1", "a\rb"), ("corpus.txt:2", "c")]


def test_jsonl_beir_layout(tmp_path):
    lines = [
        {"_id": "doc-a", "title": "Alpha", "text": "alpha text", "metadata": {}},
        {"_id": 7, "title": "", "text": "  numeric id  "},
        {"id": "plain-id", "text": "no title key"},
    ]
    content = "\n".join(json.dumps(line) for line in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n"
    path = write(tmp_path, "corpus.jsonl", content)
    docs = read_corpus(path)
    assert [(d.doc_id, d.title, d.text, d.line) for d in docs] == [
        ("doc-a", "Alpha", "alpha text", 1),
        ("7", None, "  numeric id  ", 2),  # a text is kept as given
        ("plain-id", None, "no title key", 4),
    ]


def test_csv_with_title_and_quoted_multiline_field(tmp_path):
    content = 'ID,Title,text\n1,First,"hello, world"\n2,,"spans\ntwo lines"\nx3,Third,plain\n'
    docs = read_corpus(write(tmp_path, "corpus.csv", content))
    assert [(d.doc_id, d.title, d.text, d.line) for d in docs] == [
        ("1", "First", "hello, world", 2),
        ("2", None, "spans\ntwo lines", 3),
        ("x3", "Third", "plain", 5),
    ]


def test_tsv_without_title_keeps_quotes_as_text(tmp_path):
    content = '\ufeffid\ttext\n10\tsays "hi" there\n\n20\tsecond\n'
    docs = read_corpus(write(tmp_path, "corpus.tsv", content))
    assert [(d.doc_id, d.title, d.text, d.line) for d in docs] == [
        ("10", None, 'says "hi" there', 2),
        ("20", None, "second", 4),
    ]


def test_other_encoding(tmp_path):
    path = write(tmp_path, "corpus.txt", "café\n".encode("latin-1"))
    assert read_corpus(path, encoding="latin-1")[0].text == "café"


def test_iter_corpus_streams_lazily(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"_id": "a", "text": "ok"}\nnot json\n')
    documents = iter_corpus(path)
    assert next(documents).doc_id == "a"
    with pytest.raises(RetrieverError, match="line 2"):
        next(documents)


def test_read_queries_txt_and_jsonl(tmp_path):
    txt = write(tmp_path, "queries.txt", "what is x\n\nwho is y\n")
    assert read_queries(txt) == [("1", "what is x"), ("3", "who is y")]
    content = '{"_id": 42, "text": "q one", "metadata": {}}\n{"_id": "b", "text": "q two"}\n'
    jsonl = write(tmp_path, "queries.jsonl", content)
    assert read_queries(jsonl) == [("42", "q one"), ("b", "q two")]


def test_read_queries_refuses_empty_and_duplicates(tmp_path):
    with pytest.raises(RetrieverError, match=r"queries.txt: no queries"):
        read_queries(write(tmp_path, "queries.txt", "\n \n"))
    with pytest.raises(RetrieverError, match=r"duplicate ids: 'q' \(lines 1 and 2\)"):
        read_queries(write(tmp_path, "queries.jsonl", '{"_id": "q", "text": "a"}\n{"_id": "q", "text": "b"}\n'))


# --- bad input: every message names the file and, where there is one, the line ---


def test_a_missing_file_or_folder_is_named_so_whatever_its_name(tmp_path):
    # a missing folder has no extension: that is not a format's fault
    for path in (tmp_path / "nope.txt", tmp_path / "notes", tmp_path / "notes.d"):
        assert error_of(path) == f"{path}: no such file or folder"


def test_unknown_extension(tmp_path):
    path = write(tmp_path, "corpus.xml", "<doc/>")
    assert error_of(path) == f"{path}: unsupported format '.xml'; use .txt, .jsonl, .csv, .tsv (or .gz of them)"


def test_directory_is_not_a_file(tmp_path):
    for name in ("dir.txt", "folder"):  # named like a corpus file or not: a folder, said so
        (tmp_path / name).mkdir()
        assert error_of(tmp_path / name) == (f"{tmp_path / name}: a folder, where one corpus file is read (.txt, "
                                             ".jsonl, .csv, .tsv, or .gz of them)")


@pytest.mark.parametrize(
    "name, content", [("corpus.txt", ""), ("corpus.txt", "\n  \n\t\n"), ("corpus.jsonl", "\n"), ("corpus.csv", "")]
)
def test_empty_corpus(tmp_path, name, content):
    path = write(tmp_path, name, content)
    assert error_of(path) == f"{path}: no documents (the file is empty or all blank lines)"


def test_undecodable_bytes_name_line_and_column(tmp_path):
    lines = [b"ok line"] * 11 + [b"abcd\xffef"]
    path = write(tmp_path, "corpus.txt", b"\n".join(lines) + b"\n")
    assert error_of(path) == f"{path} line 12: not valid utf-8 (byte 0xff at column 5); pass encoding"


def test_undecodable_bytes_in_csv(tmp_path):
    path = write(tmp_path, "corpus.csv", b"id,text\n1,fine\n2,caf\xe9\n")
    assert error_of(path) == f"{path} line 3: not valid utf-8 (byte 0xe9 at column 6); pass encoding"


def test_unknown_encoding(tmp_path):
    path = write(tmp_path, "corpus.txt", "x\n")
    assert error_of(path, encoding="no-such-codec") == f"{path}: unknown encoding 'no-such-codec'"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
        ('["a list"]', "expected a JSON object, got list"),
        ('{"text": "no id"}', 'missing "_id" (or "id")'),
        ('{"_id": "d"}', 'missing "text"'),
        ('{"_id": "d", "text": "   "}', "empty text (document 'd')"),
        ('{"_id": "d", "title": "  ", "text": ""}', "empty text (document 'd')"),  # a blank title is no title
        ('{"_id": "d", "text": 5}', '"text" must be a string, got 5'),
        ('{"_id": true, "text": "t"}', "id must be a string or an integer, got true"),
        ('{"_id": "", "text": "t"}', "empty id"),
        ('{"_id": "  ", "text": "t"}', "an id of whitespace only"),
        # JSON would keep the last of a repeated key silently; metadata is kept as given.
        ('{"_id": "d", "text": "t", "a": 1, "a": 2}', 'not valid JSON (the key "a" is given twice in one object)'),
        ('{"_id": "d", "text": "t", "m": {"x": [{"k": 1, "k": 1}]}}',
         'not valid JSON (the key "k" is given twice in one object)'),
        ('{"_id": "d", "text": "t", "title": 3}', '"title" must be a string, got 3'),
        # json blames the '}' after a trailing comma ("Expecting property name ... at column 26"): name the comma
        ('{"_id": "b", "text": "x",}', "not valid JSON (trailing comma at column 25)"),
        ('{"_id": "b", "text": "x", "tags": [1, 2 , ]}', "not valid JSON (trailing comma at column 41)"),
        ('{"_id": "b" "text": "x"}', "not valid JSON (Expecting ',' delimiter at column 13)"),
        # a record cut short: faulted at its own end, not at "column 1" of the line end after it (a CLI QA run)
        ('{"_id": "b", "text": "two"', "not valid JSON (Expecting ',' delimiter at column 27)"),
        # json's message ends in "at" here: not "starting at at column" (a QA run)
        ('{"_id": "b", "text": "two', "not valid JSON (Unterminated string starting at column 22)"),
        # Non-string fields are named by their kind: a list may be megabytes, or nested too deeply to write back.
        ('{"_id": [1, 2], "text": "t"}', "id must be a string or an integer, got a list"),
        ('{"_id": {"a": 1}, "text": "t"}', "id must be a string or an integer, got an object"),
        ('{"_id": 1.5, "text": "t"}', "id must be a string or an integer, got 1.5"),
        ('{"_id": null, "text": "t"}', "id must be a string or an integer, got null"),
        ('{"_id": "d", "text": {"nested": [1]}}', '"text" must be a string, got an object'),
        ('{"_id": "d", "text": "t", "title": ["a"]}', '"title" must be a string, got a list'),
        # JSON escapes of half a UTF-16 pair decode to lone surrogates: refused, never stored or tokenized.
        ('{"_id": "d", "text": "a \\ud800 b"}',
         '"text" holds an invalid character (a lone surrogate U+D800 at character 3); send valid UTF-8'),
        ('{"_id": "d\\udfff", "text": "t"}',
         "the id holds an invalid character (a lone surrogate U+DFFF at character 2); send valid UTF-8"),
        ('{"_id": "d", "text": "t", "title": "\\udc80"}',
         '"title" holds an invalid character (a lone surrogate U+DC80 at character 1); send valid UTF-8'),
        # What Python's own limits make of hostile lines: RecursionError and ValueError, as one line each.
        ('{"_id": "d", "text": "t", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
         "not valid JSON (nested too deeply to read)"),
        ('{"_id": ' + "1" * 5000 + ', "text": "t"}',
         "an integer of more than 4,300 digits; write long numbers, such as ids, as strings"),
    ],
)
def test_bad_jsonl_line(tmp_path, line, expected):
    path = write(tmp_path, "corpus.jsonl", '{"_id": "ok", "text": "fine"}\n\n' + line + "\n")
    assert error_of(path) == f"{path} line 3: {expected}"


def test_an_integer_id_within_the_limit_is_kept_as_its_digits(tmp_path):
    digits = "9" * 4000
    path = write(tmp_path, "corpus.jsonl", '{"_id": %s, "text": "t"}\n' % digits)
    assert read_corpus(path)[0].doc_id == digits


def test_a_lone_surrogate_from_a_codec_is_refused_in_a_txt_line(tmp_path):
    """unicode_escape decodes a written "\\ud800" to a lone surrogate without an undecodable byte in sight."""
    path = write(tmp_path, "corpus.txt", "fine\nbad \\ud800 here\n")
    assert error_of(path, encoding="unicode_escape") == (
        f"{path} line 2: the text holds an invalid character (a lone surrogate U+D800 at character 5); send valid UTF-8")


def test_a_file_name_that_is_not_utf8_is_refused(tmp_path):
    """A .txt file's name is part of every id, and every document stores its file's path."""
    path = tmp_path / os.fsdecode(b"caf\xe9.txt")
    path.write_text("text\n")
    message = error_of(path)
    assert message == (f"{tmp_path}/caf\\xe9.txt: the file's path is not valid UTF-8 (byte 0xe9 at character "
                       f"{len(str(tmp_path)) + 5}); rename it")


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"_id": "a", "text": "x \ud800"}, '"text" holds an invalid character (a lone surrogate U+D800'),
        ({"_id": 10**5000, "text": "t"}, "an integer of more than 4,300 digits"),
        ({"_id": "a", "text": 10**5000}, '"text" must be a string, got an integer too long to show'),
    ],
)
def test_records_are_checked_like_lines(record, expected):
    """The server's add requests go through the same checks, naming the record."""
    with pytest.raises(RetrieverError) as caught:
        documents_from_records([{"_id": "ok", "text": "fine"}, record])
    assert str(caught.value).startswith(f"request record 2: {expected}")


def test_csv_without_required_columns(tmp_path):
    path = write(tmp_path, "corpus.csv", "doc,body\n1,x\n")
    assert error_of(path) == f"{path} line 1: header lacks column 'id' and 'text' (found 'doc', 'body')"


def test_csv_row_with_wrong_field_count_and_empty_text(tmp_path):
    path = write(tmp_path, "corpus.csv", "id,text\n1,a\n2,b,extra\n")
    assert error_of(path) == f"{path} line 3: 3 fields, the header has 2"
    path = write(tmp_path, "corpus.tsv", "id\ttext\n1\ta\n2\t  \n")
    assert error_of(path) == f"{path} line 3: empty text (document '2')"


def test_a_record_with_a_title_and_no_text_is_a_document_of_its_title(tmp_path):
    """A paper without its abstract (BEIR corpora hold them) is read, not refused with its whole file."""
    path = write(tmp_path, "corpus.jsonl", '{"_id": "a", "title": "Swept wings", "text": ""}\n'
                                           '{"_id": "b", "text": "a body"}\n')
    first, second = read_corpus(path)
    assert (first.doc_id, first.title, first.text) == ("a", "Swept wings", "")
    assert document_text(first) == "Swept wings " and second.title is None
    path = write(tmp_path, "corpus.csv", "id,title,text\n1,Swept wings,\n")
    assert [(doc.title, doc.text) for doc in read_corpus(path)] == [("Swept wings", "")]


def test_documents_given_in_python_need_a_title_or_a_text():
    given = given_documents([Document("a", "", "Swept wings"), {"_id": "b", "title": "Heat", "text": " "}])
    assert [(doc.title, doc.text) for doc in given] == [("Swept wings", ""), ("Heat", " ")]
    for untitled in (Document("a", "  "), Document("a", "", "  ")):
        with pytest.raises(RetrieverError, match="document 1 of 1: text must be a non-empty string where there "
                                                 "is no title"):
            given_documents([untitled])


def test_duplicate_ids_listed_with_lines(tmp_path):
    rows = ["id,text"] + [f"{i % 7},text {i}" for i in range(14)]
    path = write(tmp_path, "corpus.csv", "\n".join(rows) + "\n")
    # ids 0..6 then 0..6 again on lines 9..15: seven repeats, five shown.
    assert error_of(path) == (
        f"{path}: duplicate ids: '0' (lines 2 and 9), '1' (lines 3 and 10), '2' (lines 4 and 11), "
        "'3' (lines 5 and 12), '4' (lines 6 and 13) and 2 more"
    )


def test_check_unique_ids_against_existing(tmp_path):
    docs = [Document(str(i), "t", None, "new.jsonl", i) for i in range(1, 4)]
    check_unique_ids(docs, existing={"9"})
    with pytest.raises(RetrieverError) as caught:
        check_unique_ids(docs, existing={"2", "3", "x"})
    assert str(caught.value) == "new.jsonl: 2 ids are already in the index: '2' (line 2), '3' (line 3)"


def test_gzipped_corpora_read_as_a_stream(tmp_path):
    import gzip

    for name, content in {
        "corpus.jsonl.gz": '{"_id": "a", "title": "T", "text": "first"}\n{"_id": "b", "text": "second"}\n',
        "corpus.txt.gz": "first\n\nsecond\n",
        "corpus.tsv.gz": "id\ttext\na\tfirst\nb\tsecond\n",
    }.items():
        path = tmp_path / name
        with gzip.open(path, "wt", encoding="utf-8") as file:
            file.write(content)
        docs = read_corpus(path)
        assert [d.text for d in docs] == ["first", "second"], name
    assert [d.doc_id for d in read_corpus(tmp_path / "corpus.txt.gz")] == ["corpus.txt.gz:1", "corpus.txt.gz:3"]
    assert read_queries(tmp_path / "corpus.txt.gz") == [("1", "first"), ("3", "second")]


def test_a_damaged_or_unknown_gzip_is_one_line(tmp_path):
    import gzip

    whole = gzip.compress(b'{"_id": "a", "text": "first"}\n' * 1000)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "plain.jsonl.gz").write_text('{"_id": "a", "text": "not compressed"}\n')
    (tmp_path / "corpus.xml.gz").write_bytes(gzip.compress(b"<doc/>"))
    with pytest.raises(RetrieverError, match="cut.jsonl.gz: not a complete gzip file"):
        read_corpus(tmp_path / "cut.jsonl.gz")
    with pytest.raises(RetrieverError, match="plain.jsonl.gz: not a complete gzip file"):
        read_corpus(tmp_path / "plain.jsonl.gz")
    with pytest.raises(RetrieverError, match=r"unsupported format '.xml.gz'"):
        read_corpus(tmp_path / "corpus.xml.gz")
