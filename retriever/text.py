"""Text at the edges: what may come in (valid Unicode, no lone surrogates) and what may go out to a terminal.

Python strings can hold lone surrogates (U+D800-U+DFFF): JSON's "\\ud800", an undecodable command-line byte, a
corpus byte kept by errors="surrogateescape". A tokenizer, SQLite and an HTTP response all fail on them, so they
are refused where text enters, with the position, instead of failing later inside someone else's batch.

Stored documents can hold control characters (ESC sequences that clear a screen or write the clipboard through
OSC 52); `terminal_safe` shows them as visible escapes so printing a document never drives the terminal.
"""

from __future__ import annotations

import re

from retriever.errors import RetrieverError

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 controls except tab and newline, DEL, and the C1 controls (U+0080-U+009F: CSI, OSC, ... on 8-bit terminals);
# also the bidi overrides that reorder what is shown (Trojan Source).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


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


def terminal_safe(text: str) -> str:
    """TEXT with control characters (ESC, BEL, C1, bidi overrides, lone surrogates) shown as \\xNN / \\uNNNN
    escapes, so stored text cannot move the cursor, clear the screen or set the clipboard when printed."""
    text = _CONTROL.sub(_escape, text)
    return _SURROGATE.sub(_escape, text)


def _escape(found: re.Match) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
