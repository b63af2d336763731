"""What the commands print for programs: one JSON line on stdout."""

from __future__ import annotations

import sys

from retriever.text import terminal_json


def print_json(value) -> None:
    """One JSON line on stdout: exact, terminal-safe (`terminal_json`), and all ASCII where stdout cannot encode
    every character (PYTHONIOENCODING=ascii, a legacy console code page), so it never fails half-written."""
    try:
        "\u00e9\U0010ffff".encode(sys.stdout.encoding or "ascii")
        takes_unicode = True
    except (UnicodeEncodeError, LookupError):
        takes_unicode = False
    print(terminal_json(value, ascii=not takes_unicode))
