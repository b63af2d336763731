"""Text at the edges: what may come in (valid Unicode, no lone surrogates) and what may go out to a terminal.

Python strings can hold lone surrogates (U+D800-U+DFFF): JSON's "\\ud800", an undecodable command-line byte, a
corpus byte kept by errors="surrogateescape". A tokenizer, SQLite and an HTTP response all fail on them, so they
are refused where text enters, with the position, instead of failing later inside someone else's batch.

Stored documents can hold control characters (ESC sequences that clear a screen or write the clipboard through
OSC 52); `terminal_safe` shows them as visible escapes so printing a document never drives the terminal, and
`terminal_json` does the same inside JSON strings while keeping the JSON exact.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence

from retriever.errors import RetrieverError

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 controls except tab and newline, DEL, and the C1 controls (U+0080-U+009F: CSI, OSC, ... on 8-bit terminals);
# also the bidi overrides that reorder what is shown (Trojan Source).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# What JSON output escapes besides: the format characters (Unicode's Cf: zero-width spaces and joiners, marks of
# direction, the byte-order mark, tags) and the line and paragraph separators, which str.splitlines() and
# JavaScript read as line ends: one JSON line stays one line, and nothing invisible is printed raw.
_INVISIBLE = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
                        "\u2028\u2029\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                        "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
                        "\U000e0020-\U000e007f]")
# How much of a refused command-line argument an error shows (a query can be long).
_SHOWN_CHARACTERS = 60


def invalid_character(text: str) -> int | None:
    """The position of the first lone surrogate in TEXT, or None when TEXT is valid Unicode."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def check_text(text: str, what: str = "text") -> str:
    """TEXT itself when it is valid Unicode; else a RetrieverError naming WHAT and where the bad character is."""
    position = invalid_character(text)
    if position is not None:
        raise RetrieverError(f"{what} holds an invalid character (a lone surrogate U+{ord(text[position]):04X} at "
                             f"character {position + 1}); send valid UTF-8")
    return text


def check_argument(argument: str, number: int) -> str:
    """ARGUMENT (command-line argument NUMBER) itself when it is valid Unicode. Python decodes argv with
    errors="surrogateescape", so a byte the locale cannot decode (`retriever search $'\\xff'`) arrives as U+DCFF;
    refused here, naming the byte, before it reaches a tokenizer, SQLite or a print to stdout."""
    position = invalid_character(argument)
    if position is None:
        return argument
    shown = escape_undecodable(argument)
    shown = shown if len(shown) <= _SHOWN_CHARACTERS else shown[: _SHOWN_CHARACTERS - 1] + "…"
    raise RetrieverError(f"command-line argument {number} ({shown}) is not valid UTF-8 "
                         f"({describe_invalid(argument[position])} at character {position + 1})")


def describe_invalid(character: str) -> str:
    """A lone surrogate for an error message: "byte 0xNN" where it stands for an undecodable byte kept by
    errors="surrogateescape" (U+DC80-U+DCFF), else "a lone surrogate U+NNNN"."""
    code = ord(character)
    return f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"


def escape_undecodable(text: str) -> str:
    """TEXT decoded with errors="surrogateescape" (a command-line argument, a file name) shown on one line as the
    user typed it: undecodable bytes as \\xNN, other lone surrogates as \\uNNNN, control characters (newline and tab
    too) escaped."""
    return terminal_safe(_SURROGATE.sub(_escape_byte, text)).replace("\n", "\\n").replace("\t", "\\t")


def _escape_byte(found: re.Match) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def _listed(items, what: str) -> list:
    """ITEMS (a list of WHAT, strings) as a list; what is not a list (a number, bytes, a dict) refused in one line."""
    if isinstance(items, (bytes, bytearray, dict)) or not isinstance(items, Iterable):
        raise RetrieverError(f"{what} are a string or a list of strings, not {type(items).__name__}")
    return list(items)


def query_list(queries) -> list:
    """QUERIES, a list of query texts, as a list; what is not one refused in one line."""
    return _listed(queries, "queries")


def id_list(doc_ids) -> list[str]:
    """DOC_IDS as a list of document ids: one string is one id (not its characters, each taken for an id)."""
    if isinstance(doc_ids, str):
        return [doc_ids]
    doc_ids = _listed(doc_ids, "document ids")
    wrong = next((doc_id for doc_id in doc_ids if not isinstance(doc_id, str)), None)
    if wrong is not None:
        raise RetrieverError(f"document ids are strings; got {wrong!r} ({type(wrong).__name__})")
    return doc_ids


def is_blank(text: str) -> bool:
    """Whether TEXT shows nothing: whitespace, control and format characters alone (a zero-width space, a byte-order
    mark, NUL), which neither side of search reads as a word (each ranked every document alike)."""
    return all(character.isspace() or unicodedata.category(character) in ("Cc", "Cf") for character in text)


def check_queries(queries: Sequence[str], parameter: str | None = None) -> None:
    """Refuse what would rank documents arbitrarily, or fail inside the tokenizer: no query at all, one that is not
    text, an empty or blank one, or one holding a lone surrogate. PARAMETER: where the queries were given (a
    request's field), named as the parameter at fault."""
    if not queries:
        raise RetrieverError("no query given", parameter=parameter)
    for number, query in enumerate(queries, start=1):
        where = "" if len(queries) == 1 else f" (query {number} of {len(queries)})"
        if not isinstance(query, str):
            raise RetrieverError(f"a query is text, not {type(query).__name__}{where}", parameter=parameter)
        if is_blank(query):
            raise RetrieverError(f"empty query{where}: give some text to search for", parameter=parameter)
        check_text(query, f"the query{where}")


def terminal_safe(text: str) -> str:
    """TEXT with control characters (ESC, BEL, C1, bidi overrides, lone surrogates) shown as \\xNN / \\uNNNN
    escapes, so stored text cannot move the cursor, clear the screen or set the clipboard when printed. A line's
    CR LF ending (text from Windows) is shown as the line break it is."""
    text = _CONTROL.sub(_escape, text.replace("\r\n", "\n"))
    return _SURROGATE.sub(_escape, text)


def _escape(found: re.Match) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_json(value: object, ascii: bool = False, **dumps) -> str:
    """VALUE as JSON for a terminal: exactly what json.dumps(ensure_ascii=False) gives, except that the characters
    `terminal_safe` escapes, which json.dumps leaves raw (DEL, the C1 controls, the bidi overrides, lone
    surrogates), and the invisible ones (`_INVISIBLE`) are written as \\uNNNN escapes. They can only occur inside
    strings, so the JSON decodes to the same value; only what reaches the terminal changes. ASCII: every non-ASCII
    character escaped, for an output that cannot encode them."""
    text = json.dumps(value, ensure_ascii=ascii, **dumps)
    return _SURROGATE.sub(_json_escape, _INVISIBLE.sub(_json_escape, _CONTROL.sub(_json_escape, text)))


def _json_escape(found: re.Match) -> str:
    code = ord(found.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON writes a character past the BMP as its UTF-16 surrogate pair
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def counted(number: int, noun: str) -> str:
    """'1 document', '2,000 documents': every count a message shows goes through here (NOUN takes an s)."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def counted_queries(record: dict) -> str:
    """"250 of 2,000 pseudo-queries" (a check settled on its first rounds) or "2,000 pseudo-queries", from a check
    or hybrid evidence RECORD; records written before rounds hold no "planned"."""
    read, planned = record["pseudo_queries"], record.get("planned", record["pseudo_queries"])
    noun = "pseudo-query" if planned == 1 else "pseudo-queries"
    return f"{read:,} of {planned:,} {noun}" if read < planned else f"{read:,} {noun}"


def did_you_mean(wrong: str, known: Sequence[str]) -> str:
    """" (did you mean 'x'?)" naming the KNOWN string closest to WRONG where one is close (difflib's ratio 0.6 and
    up: a typo, a letter swapped or dropped), else ""."""
    import difflib

    close = difflib.get_close_matches(wrong, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict (`json.loads`' object_pairs_hook), refusing a key given twice: JSON would keep
    the last silently (a record's metadata is kept as given; a filter's `{"year": 2001, "year": 2002}` would read
    2002)."""
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise RepeatedKeyError(f"the key {json.dumps(key)} is given twice in one object", "", 0)
        found[key] = value
    return found


class RepeatedKeyError(json.JSONDecodeError):
    """A JSON object holding a key twice (`unique_keys`); its message is whole, with no position."""
