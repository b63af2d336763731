"""User-facing errors, with what went wrong as data.

Anything a user can cause (bad input, missing model, missing index) raises ``RetrieverError`` with a message
that fits on one line; the CLI prints it and exits non-zero instead of showing a traceback. A long word in it (a
path, an id the user typed) is `shortened` to its start and end.

A message names a parameter through ``param``, never as a command-line flag, so that each caller reads it in its
own terms: ``str(error)`` spells it as Python does (``fit_sample``, ``runtime='torch'``), the CLI renders it with
its flags (``--fit-sample``, ``--runtime torch``). ``error.code`` is the kind of problem and ``error.parameter``
the parameter at fault, for a program to act on::

    raise RetrieverError(f"{param('fit_sample')} must be at least 2 (got {fit_sample})")
    raise RetrieverError(f"the onnx runtime runs on the CPU; use {param('runtime', 'torch')} on a GPU")
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class _NoValue:
    def __repr__(self) -> str:
        return "NO_VALUE"

    def __reduce__(self) -> str:
        return "NO_VALUE"  # pickled by name: one NO_VALUE in every process


NO_VALUE = _NoValue()  # a parameter named without a value to suggest

# A parameter inside a message: the mark, the parameter as JSON, NUL. The mark's random part keeps text that the
# message quotes (a file name, a document id) from passing for a parameter.
_MARK = f"\x00param-{secrets.token_hex(4)}:"
_MARKED = re.compile(re.escape(_MARK) + "(.*?)\x00")


# The most characters a message shows of one word (a path, an id, a value as typed): a longer one keeps its start
# and end around an ellipsis, so a 5,000-character argument echoed back cannot bury the message. And of one
# message's text, for a long value with spaces in it.
SHOWN_WORD = 200
SHOWN_TEXT = 1_000
_LONG_WORD = re.compile(r"\S{%d,}" % (SHOWN_WORD + 1))


def shortened(text: str, limit: int = SHOWN_WORD) -> str:
    """TEXT itself, or where it is longer than LIMIT characters its start and its end around "…", LIMIT in all."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def shortened_words(text: str) -> str:
    """TEXT, a message, with each word longer than SHOWN_WORD characters `shortened`, then the whole to SHOWN_TEXT."""
    return shortened(_LONG_WORD.sub(lambda found: shortened(found.group()), text), SHOWN_TEXT)


def param(name: str, value: Any = NO_VALUE) -> str:
    """Parameter NAME, and VALUE for it when one is suggested (a str, number, bool or None), to write inside a
    RetrieverError's message (an f-string); the error spells it for whoever reads it."""
    return _MARK + json.dumps([name] if value is NO_VALUE else [name, value]) + "\x00"


@dataclass(frozen=True)
class Param:
    """A parameter a message names, with the value it suggests (or NO_VALUE)."""

    name: str
    value: Any = NO_VALUE

    def spelled(self, names: Mapping[str, str] | None = None, between: str = " ") -> str:
        """As NAMES spells it (see `RetrieverError.render`), else as Python does: name, or name='value'."""
        names = names or {}
        setting = f"{self.name}={self.value!r}"
        if self.value is not NO_VALUE and setting in names:
            return names[setting]  # a switch: allow_without_key=True -> --no-key
        if self.name in names:
            return names[self.name] + ("" if self.value is NO_VALUE else f"{between}{self.value}")
        return self.name if self.value is NO_VALUE else setting


class RetrieverError(Exception):
    """An error caused by input or environment, reported to the user as one clear line.

    ``code``: its kind, for a program ("bad_input"; each subclass has its own). ``parameter``: the parameter at
    fault (PARAMETER, else the first one the message names, else None). ``parameters``: every one it names."""

    code = "bad_input"

    def __init__(self, message: object = "", *, parameter: str | None = None):
        pieces = _MARKED.split(str(message))  # text, parameter, text, parameter, ...
        # Shortened here, not where it is shown: the CLI, the server's answer and str() all read these parts.
        self.parts: list[str | Param] = [Param(*json.loads(piece)) if number % 2 else shortened_words(piece)
                                         for number, piece in enumerate(pieces) if number % 2 or piece]
        self.parameters = tuple(part for part in self.parts if isinstance(part, Param))
        self.parameter = parameter or next((part.name for part in self.parameters), None)
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] | None = None, between: str = " ") -> str:
        """The message with its parameters spelled the caller's way. NAMES maps a Python name to the caller's
        ("fit_sample": "--fit-sample"), and may map a whole setting ("allow_without_key=True": "--no-key");
        BETWEEN joins a name to a value. A parameter NAMES lacks is spelled as in Python, as `str` spells all."""
        return "".join(part.spelled(names, between) if isinstance(part, Param) else part for part in self.parts)


class NotFoundError(RetrieverError):
    """What was asked for does not exist: an index, or a document id (the server answers 404)."""

    code = "not_found"


class ConflictError(RetrieverError):
    """The request clashes with the index's state: an id already in it, or another writer at work (409)."""

    code = "conflict"


class DamagedIndexError(RetrieverError):
    """An index's files fail their checks (a checksum, a parse, a count): that index cannot be used until it is
    restored or rebuilt; the others can (the server answers 503 for it alone)."""

    code = "damaged"


class UnavailableError(RetrieverError):
    """This machine lacks what is needed (CUDA, an optional package, disk space), whatever the input (the server
    answers 503)."""

    code = "unavailable"
