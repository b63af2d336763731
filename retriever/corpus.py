"""Reading corpora and query files.

Formats, picked by extension:

- ``.txt``: one document per non-blank line; the id is ``FILE:LINE`` (file name, 1-based line number), so
  documents added later from another ``.txt`` file do not clash with the first file's.
- ``.jsonl``: one JSON object per line, BEIR layout: ``_id`` (or ``id``), ``text``, optional ``title``, optional
  ``metadata`` (an object of named strings, numbers, booleans or nulls: `retriever.metadata`).
- ``.csv`` / ``.tsv``: a header row naming ``id`` and ``text`` (optional ``title``); every other column is
  metadata, typed (numbers stay numbers, an empty field is absent). ``.tsv`` fields are not quoted (a tab or
  newline cannot occur inside one), ``.csv`` follows the usual quoting rules.
- Any of these gzipped (``corpus.jsonl.gz``), decompressed as a stream.

Ids are always strings (a JSON id ``7`` becomes ``"7"``). Every problem with the input raises
``RetrieverError`` with one line naming the file and, where there is one, the line: undecodable bytes (with the
byte and column), a lone surrogate from a JSON ``"\ud800"`` escape, JSON nested too deeply for the parser, an
integer too long to convert, a field of the wrong type. So every Document holds valid Unicode: a tokenizer and
SQLite (and a terminal's UTF-8 output) never see a lone surrogate.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from retriever.errors import RetrieverError, param
from retriever.metadata import check_key, check_metadata, typed_field
from retriever.text import (RepeatedKeyError, check_text, describe_invalid, escape_undecodable, invalid_character,
                            unique_keys)

CORPUS_FORMATS = (".txt", ".jsonl", ".csv", ".tsv")
COMPRESSED = ".gz"

# How many offending ids an error message lists before "and N more".
_SHOWN = 5

# Files are decoded with errors="surrogateescape": an undecodable byte 0xNN becomes the lone surrogate
# U+DCNN, so a line can be checked for bad bytes (and the exact line and column reported) while the
# file is still read as a stream.
_BAD_BYTE = re.compile("[\udc80-\udcff]")

# csv refuses fields over 128 KiB by default; long documents are legitimate.
csv.field_size_limit(2**31 - 1)


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str | None = None
    source: str = "records"  # the file the document was read from ("records": given in Python)
    line: int = 0  # 1-based line where the document starts in that file (0: given in Python, numbered there)
    metadata: dict | None = None  # named scalar values to filter on (`retriever.metadata`); None: none


def document_text(document: Document) -> str:
    """What gets encoded for a document: the title joined to the text, as BEIR models do."""
    return f"{document.title} {document.text}" if document.title else document.text


def read_corpus(path: str | Path, encoding: str = "utf-8") -> list[Document]:
    """All documents of a corpus file; refuses an empty corpus and duplicate ids."""
    docs = list(iter_corpus(path, encoding))
    if not docs:
        raise RetrieverError(f"{path}: no documents (the file is empty or all blank lines)")
    check_unique_ids(docs)
    return docs


def read_queries(path: str | Path, encoding: str = "utf-8") -> list[tuple[str, str]]:
    """(query_id, text) pairs from a ``.txt`` file (id = line number) or BEIR ``queries.jsonl``.

    ``.csv``/``.tsv`` with ``id`` and ``text`` columns are read too. Titles, metadata and other columns play no
    part in search, so they are ignored, never refused (BEIR queries files carry metadata such as evidence ids).
    """
    queries = list(iter_corpus(path, encoding, queries=True))
    if not queries:
        raise RetrieverError(f"{path}: no queries (the file is empty or all blank lines)")
    check_unique_ids(queries)
    # Query ids only label output lines, so a .txt file's are plain line numbers (documents carry the file name).
    if corpus_format(path)[0] == ".txt":
        return [(str(q.line), q.text) for q in queries]
    return [(q.doc_id, q.text) for q in queries]


def iter_corpus(path: str | Path, encoding: str = "utf-8", start: int = 0, first_line: int = 1,
                queries: bool = False) -> Iterator[Document]:
    """Documents of a corpus file in file order, streamed; no duplicate-id or empty-corpus checks. QUERIES: the
    file holds queries, read for their ids and texts only (titles and metadata are left unread).

    START, FIRST_LINE: read from byte offset START, the beginning of line FIRST_LINE (a piece of a large .jsonl or
    .txt file, see `splittable`), so ids and error messages name the lines of the whole file."""
    path = Path(path)
    check_exists(path)
    suffix, compressed = corpus_format(path)
    _check_file_name(path)
    if not path.is_file():
        raise RetrieverError(f"{path}: not a file")
    # utf-8-sig reads plain utf-8 too and drops a BOM at the start of the file.
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    # csv wants newline="" (quoted fields may hold newlines); elsewhere only "\n" ends a line, so a
    # stray "\r" inside a line does not split it and shift every later line number.
    newline = "" if suffix in (".csv", ".tsv") else "\n"
    try:
        with _open_text(path, compressed, codec, newline) as file:
            if start:
                if not splittable(path, encoding):
                    raise RetrieverError(f"{path}: only plain utf-8 .jsonl and .txt files are read from an offset")
                file.seek(start)  # utf-8 decodes without state, so a byte offset at a line start is a valid cookie
            lines = _checked_lines(file, path, encoding, first_line)
            if suffix == ".txt":
                yield from _read_txt(lines, path, first_line)
            elif suffix == ".jsonl":
                yield from _read_jsonl(lines, path, first_line, queries)
            else:
                yield from _read_table(lines, path, delimiter="\t" if suffix == ".tsv" else ",", queries=queries)
    except LookupError:
        raise RetrieverError(f"{path}: unknown encoding {encoding!r}", parameter="encoding") from None
    except UnicodeError as error:  # a decoding error surrogateescape cannot absorb, e.g. truncated utf-16
        raise RetrieverError(f"{path}: not valid {encoding} ({error}); pass {param('encoding')}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RetrieverError(f"{path}: not a complete gzip file ({error})") from None
    except OSError as error:
        raise RetrieverError(f"{path}: cannot read ({error.strerror or error})") from None


def splittable(path: str | Path, encoding: str = "utf-8") -> bool:
    """Whether a file can be read in pieces from line offsets: uncompressed .jsonl or .txt (one document per line)
    in utf-8. A .csv row may span lines, and gzip cannot seek."""
    suffix, compressed = corpus_format(path)
    return not compressed and suffix in (".jsonl", ".txt") and encoding.lower().replace("_", "-") in ("utf-8", "utf8")


def check_exists(path: str | Path) -> None:
    """Refuse a corpus PATH that names nothing (before its name's format is judged: a missing folder has no
    extension, and is no format's fault)."""
    if not Path(path).exists():
        raise RetrieverError(f"{path}: no such file or folder")


def corpus_format(path: str | Path) -> tuple[str, bool]:
    """(the corpus format's suffix, whether the file is gzipped): (".jsonl", True) for corpus.jsonl.gz."""
    path = Path(path)
    if path.is_dir():
        raise RetrieverError(f"{path}: a folder, where one corpus file is read ({', '.join(CORPUS_FORMATS)}, or .gz "
                             "of them)")
    suffixes = [suffix.lower() for suffix in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] == COMPRESSED
    suffix = (suffixes[-2] if len(suffixes) > 1 else "") if compressed else path.suffix.lower()
    if suffix not in CORPUS_FORMATS:
        formats = ", ".join(CORPUS_FORMATS)
        shown = suffix + COMPRESSED if compressed else suffix
        raise RetrieverError(f"{path}: unsupported format {shown or '(no extension)'!r}; use {formats} (or .gz of them)")
    return suffix, compressed


def _open_text(path: Path, compressed: bool, codec: str, newline: str) -> TextIO:
    if not compressed:
        return open(path, encoding=codec, errors="surrogateescape", newline=newline)
    # Decompressed as a stream, so a corpus of any size reads in constant memory.
    return io.TextIOWrapper(gzip.open(path, "rb"), encoding=codec, errors="surrogateescape", newline=newline)


def given_documents(items: Sequence[Document | dict]) -> list[Document]:
    """Documents given in Python (`Index.build`, `Index.add`): `Document`s, or plain records as a .jsonl corpus
    holds them (`{"_id": ..., "text": ..., "title": ..., "metadata": {...}}`, read with the same checks), checked
    as `check_documents` checks them."""
    documents = []
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict):
            item = _record_document(item, f"record {number}", Path("records"), number)
        elif isinstance(item, Document):  # its metadata checked as a record's; numbered where it has no line
            item = replace(item, line=item.line or number,
                           metadata=check_metadata(item.metadata, f"document {number} ({item.doc_id!r})"))
        documents.append(item)
    check_documents(documents)
    return documents


def check_documents(documents: Sequence[Document]) -> None:
    """Documents given in Python (`Index.build`, `Index.add`) get the checks a corpus file's get: each a
    `Document` with a non-empty id, a title or a non-empty text, both of valid Unicode (`retriever.text.check_text`),
    ids unique."""
    for number, document in enumerate(documents, start=1):
        where = f"document {number} of {len(documents)}"
        if not isinstance(document, Document):
            raise RetrieverError(f"{where} is a {type(document).__name__}, not a record (a dict with \"_id\" and "
                                 "\"text\") or a retriever.corpus.Document")
        for field_name in ("doc_id", "text", "title"):
            value = getattr(document, field_name)
            if value is None and field_name == "title":
                continue
            if not isinstance(value, str) or (field_name == "doc_id" and not value.strip()):
                raise RetrieverError(f"{where}: {field_name} must be a non-empty string")
            check_text(value, f"{where}'s {field_name}")
        if not document.text.strip() and not (document.title or "").strip():
            raise RetrieverError(f"{where}: text must be a non-empty string where there is no title")
    check_unique_ids(documents)


def check_unique_ids(docs: Iterable[Document], existing: set[str] | frozenset[str] | None = None) -> None:
    """Refuse ids repeated within ``docs`` or already in ``existing`` (e.g. the ids of an index being added to)."""
    first_seen: dict[str, Document] = {}
    repeated: list[str] = []
    clashing: list[Document] = []
    for doc in docs:
        earlier = first_seen.get(doc.doc_id)
        if earlier is not None:
            repeated.append(f"{doc.doc_id!r} (lines {earlier.line} and {doc.line})")
            continue
        first_seen[doc.doc_id] = doc
        if existing and doc.doc_id in existing:
            clashing.append(doc)
    if repeated:
        source = next(iter(first_seen.values())).source
        raise RetrieverError(f"{source}: duplicate ids: {_first_few(repeated)}")
    if clashing:
        source = clashing[0].source
        listed = _first_few([f"{d.doc_id!r} (line {d.line})" for d in clashing])
        noun = "id is" if len(clashing) == 1 else "ids are"
        raise RetrieverError(f"{source}: {len(clashing)} {noun} already in the index: {listed}")


def _first_few(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown if len(items) <= _SHOWN else f"{shown} and {len(items) - _SHOWN} more"


def _check_file_name(path: Path) -> None:
    """Refuse a path that is not valid Unicode (a file name with bytes the locale cannot decode arrives with
    surrogate escapes): it becomes every document's source, and a .txt file's name is in every id."""
    name = str(path)
    position = invalid_character(name)
    if position is not None:
        raise RetrieverError(f"{escape_undecodable(name)}: the file's path is not valid UTF-8 "
                             f"({describe_invalid(name[position])} at character {position + 1}); rename it")


def _checked_lines(file: TextIO, path: Path, encoding: str, first_line: int = 1) -> Iterator[str]:
    """The file's lines as read (line endings kept), refusing undecodable bytes with their line and column."""
    for number, line in enumerate(file, start=first_line):
        bad = _BAD_BYTE.search(line)
        if bad:
            byte = ord(bad.group()) - 0xDC00
            raise RetrieverError(
                f"{path} line {number}: not valid {encoding} (byte 0x{byte:02x} at column {bad.start() + 1}); "
                f"pass {param('encoding')}"
            )
        yield line


def _read_txt(lines: Iterator[str], path: Path, first_line: int = 1) -> Iterator[Document]:
    for number, line in enumerate(lines, start=first_line):
        text = check_text(line.strip(), f"{path} line {number}: the text")
        if text:
            yield Document(doc_id=f"{path.name}:{number}", text=text, title=None, source=str(path), line=number)


def _read_jsonl(lines: Iterator[str], path: Path, first_line: int = 1, queries: bool = False) -> Iterator[Document]:
    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            # Without its line end: a record cut short is then faulted at its own end, not at "column 1" past it.
            record = _JSON_RECORD.decode(line.rstrip("\r\n"))
        except json.JSONDecodeError as error:
            raise RetrieverError(f"{where}: not valid JSON ({_json_problem(error)})") from None
        except RecursionError:
            raise RetrieverError(f"{where}: not valid JSON (nested too deeply to read)") from None
        except ValueError:  # the only other one: an integer past Python's int-string conversion limit
            raise RetrieverError(f"{where}: {_too_long_integer()}") from None
        yield _record_document(record, where, path, number, queries)


RECORD_KEYS = frozenset({"_id", "id", "title", "text", "metadata"})  # what a record's keys are read for


def unread_keys(records: Iterable[object]) -> list[str]:
    """The keys of RECORDS (dicts among them) that `_record_document` does not read, in sorted order."""
    return sorted({key for record in records if isinstance(record, dict) for key in record
                   if key not in RECORD_KEYS}, key=str)


def _record_document(record: object, where: str, path: Path, number: int, queries: bool = False) -> Document:
    """A BEIR record (`_id` or `id`, `text`, optional `title`) as a Document, or one line saying what is wrong;
    a query's title and metadata are not read (QUERIES)."""
    if not isinstance(record, dict):
        raise RetrieverError(f"{where}: expected a JSON object, got {type(record).__name__}")
    key = "_id" if "_id" in record else "id"
    if key not in record:
        raise RetrieverError(f'{where}: missing "_id" (or "id")')
    if "text" not in record:
        raise RetrieverError(f'{where}: missing "text"')
    if queries:
        return _document(record[key], record["text"], None, where, path, number)
    return _document(record[key], record["text"], record.get("title"), where, path, number,
                     check_metadata(record.get("metadata"), where))


def _json_problem(error: json.JSONDecodeError) -> str:
    """json's message, except for a trailing comma (`{"a": 1,}`): json reports the '}' after it as a missing
    property name or value, which points past the real mistake; name the comma and its column instead."""
    if isinstance(error, RepeatedKeyError):
        return error.msg
    document, position = error.doc, error.pos
    if position < len(document) and document[position] in "}]":
        before = document[:position].rstrip()
        if before.endswith(","):
            comma = len(before) - 1
            return f"trailing comma at column {comma - document.rfind(chr(10), 0, comma)}"
    # json's own message may end in "at" ("Unterminated string starting at"): the column follows it once
    return f"{error.msg.removesuffix(' at')} at column {error.colno}"


def documents_from_records(records: Iterable[object], source: str = "request") -> list[Document]:
    """Documents from BEIR-style records already parsed from JSON (the server's add requests): the same
    checks as a .jsonl corpus, with errors naming the record ("request record 3") instead of a line. A key the
    record is not read for is refused, as the API refuses an unknown field: a misspelt "metdata" was dropped,
    and with it the metadata; "_id" and "id" both given, one of them was."""
    documents = []
    for number, record in enumerate(records, start=1):
        where = f"{source} record {number}"
        if isinstance(record, dict):
            unread = unread_keys([record]) + (["id"] if "_id" in record and "id" in record else [])
            if unread:
                raise RetrieverError(f'{where}: {", ".join(repr(key) for key in unread[:5])} '
                                     f'{"is" if len(unread) == 1 else "are"} not read: a record holds "_id" (or "id"), '
                                     '"text", "title" and "metadata", which holds its values to filter on')
        documents.append(_record_document(record, where, Path(source), number))
    if not documents:
        raise RetrieverError(f"{source}: no documents")
    return documents


def _read_table(lines: Iterator[str], path: Path, delimiter: str, queries: bool = False) -> Iterator[Document]:
    # TSV as IR collections write it (e.g. MS MARCO): no quoting, so a '"' in a text is just a character.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
    try:
        header = next(reader, None)
        if header is None:
            return
        columns = [name.strip().lower() for name in header]
        missing = [name for name in ("id", "text") if name not in columns]
        if missing:
            lacking = " and ".join(repr(c) for c in missing)
            found = ", ".join(repr(c) for c in columns)
            raise RetrieverError(f"{path} line 1: header lacks column {lacking} (found {found})")
        id_at, text_at = columns.index("id"), columns.index("text")
        title_at = columns.index("title") if "title" in columns and not queries else None
        # Every other column is metadata, under its header as written (stripped); a query has none.
        extra = [] if queries else [(at, check_key(header[at].strip(), f"{path} line 1"))
                                    for at, name in enumerate(columns) if name not in ("id", "text", "title")]
        if len({key for _, key in extra}) != len(extra):
            raise RetrieverError(f"{path} line 1: two columns have the same name")

        start = reader.line_num + 1  # a quoted field can span lines; report the line a row starts on
        for row in reader:
            number, start = start, reader.line_num + 1
            if not any(field.strip() for field in row):
                continue
            where = f"{path} line {number}"
            if len(row) != len(columns):
                fields = f"{len(row)} field{'' if len(row) == 1 else 's'}"
                raise RetrieverError(f"{where}: {fields}, the header has {len(columns)}")
            title = row[title_at] if title_at is not None else None
            metadata = {key: value for at, key in extra if (value := typed_field(row[at])) is not None}
            yield _document(row[id_at], row[text_at], title, where, path, number,
                            check_metadata(metadata, where) if metadata else None)
    except csv.Error as error:
        kind = "tsv" if delimiter == "\t" else "csv"
        raise RetrieverError(f"{path} line {reader.line_num}: malformed {kind} ({error})") from None


# One decoder for every line (`json.loads` with options builds a new one each call). strict=False lets raw tabs and
# other control characters inside strings through: real dumps have them.
_JSON_RECORD = json.JSONDecoder(strict=False, object_pairs_hook=unique_keys)


def _document(raw_id: object, raw_text: object, raw_title: object, where: str, path: Path, line: int,
              metadata: dict | None = None) -> Document:
    # bool is an int subclass; true/false as an id is almost certainly a mistake.
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise RetrieverError(f"{where}: id must be a string or an integer, got {_shown(raw_id)}")
    # Ids and texts are kept as given, outer whitespace too: ids are compared code point by code point (`dup` and
    # `dup ` are two documents), and a text comes back as it was written.
    try:
        doc_id = check_text(str(raw_id), f"{where}: the id")
    except ValueError:  # an int past Python's int-string conversion limit (a record built in Python)
        raise RetrieverError(f"{where}: {_too_long_integer()}") from None
    if not doc_id.strip():
        raise RetrieverError(f"{where}: empty id" if not doc_id else f"{where}: an id of whitespace only")
    if not isinstance(raw_text, str):
        raise RetrieverError(f'{where}: "text" must be a string, got {_shown(raw_text)}')
    text = check_text(raw_text, f'{where}: "text"')
    if raw_title is not None and not isinstance(raw_title, str):
        raise RetrieverError(f'{where}: "title" must be a string, got {_shown(raw_title)}')
    title = check_text(raw_title, f'{where}: "title"') if raw_title and raw_title.strip() else None
    if not text.strip() and title is None:  # a title alone is something to find (a paper without its abstract)
        raise RetrieverError(f"{where}: empty text (document {doc_id!r})")
    return Document(doc_id=doc_id, text=text, title=title, source=str(path), line=line, metadata=metadata)


def _shown(value: object) -> str:
    """A JSON value of the wrong type, for an error line: a scalar as JSON, a list or object by its kind only
    (it may be megabytes, or nested too deeply to write back)."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    try:
        return json.dumps(value)
    except ValueError:  # an int past the conversion limit
        return "an integer too long to show"


def _too_long_integer() -> str:
    """Python refuses to convert integers longer than this to or from text (a guard against slow conversions)."""
    return (f"an integer of more than {sys.get_int_max_str_digits():,} digits; write long numbers, such as ids, "
            "as strings")
