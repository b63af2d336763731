"""Per-document metadata: a flat object of named scalar values, stored beside the text and filtered on
(`retriever.filters`).

A document's metadata comes from a BEIR record's `metadata` object, or from a csv/tsv file's columns other than
id, title and text. Values are strings, numbers (finite), booleans or null; csv/tsv fields are typed as a
reader expects: a field that reads as an integer or a decimal number is that number ("2019" -> 2019, "0.5" ->
0.5), except digits a number would change ("02139", 19-digit ids), an empty field is absent, anything else stays
text. Keys name fields in filters, so they are short and
plain: letters, digits, spaces, `_`, `-` and `.`, at most 64 characters; `doc_id`, `title`, `text` and `source`
are the document's own fields and cannot be metadata keys.
"""

from __future__ import annotations

import math
import re

from retriever.errors import RetrieverError
from retriever.text import check_text

KEY = re.compile(r"[\w .-]{1,64}")
RESERVED = frozenset({"doc_id", "title", "text", "source"})  # the document's own fields, filterable by these names
MAX_KEYS = 64
MAX_VALUE_CHARS = 10_000
_INTEGER = re.compile(r"[+-]?\d{1,18}")
_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")

Scalar = str | int | float | bool | None


def check_key(key: object, where: str) -> str:
    """KEY as a metadata field name, or one line saying what is wrong with it."""
    if not isinstance(key, str) or not KEY.fullmatch(key) or key != key.strip():
        shown = repr(key)[:80]
        raise RetrieverError(f"{where}: metadata key {shown} is not a field name (letters, digits, spaces, _ - and ., "
                             "at most 64 characters, no space at either end)")
    if key in RESERVED:
        raise RetrieverError(f"{where}: metadata key {key!r} is one of the document's own fields "
                             f"({', '.join(sorted(RESERVED))}); rename it")
    return key


def check_value(value: object, key: str, where: str) -> Scalar:
    """VALUE as a metadata value: a string, finite number, boolean or null."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) >= 2**63:
            raise RetrieverError(f"{where}: metadata {key!r} is an integer outside 64 bits; write it as a string")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RetrieverError(f"{where}: metadata {key!r} is {value}; numbers must be finite")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise RetrieverError(f"{where}: metadata {key!r} has {len(value):,} characters; at most "
                                 f"{MAX_VALUE_CHARS:,}")
        return check_text(value, f"{where}: metadata {key!r}")
    kind = "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__
    raise RetrieverError(f"{where}: metadata {key!r} is {kind}; values are strings, numbers, true/false or null")


def check_metadata(metadata: object, where: str) -> dict[str, Scalar] | None:
    """A record's `metadata` checked: a flat object (None and {} both mean none)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise RetrieverError(f'{where}: "metadata" must be an object of named values, got '
                             f"{'a list' if isinstance(metadata, list) else type(metadata).__name__}")
    if len(metadata) > MAX_KEYS:
        raise RetrieverError(f'{where}: "metadata" has {len(metadata)} keys; at most {MAX_KEYS}')
    checked = {check_key(key, where): check_value(value, key, where) for key, value in metadata.items()}
    return checked or None


def typed_field(field: str) -> Scalar:
    """A csv/tsv field as the value a reader means: an integer, a decimal number, or the text (None if empty).
    Digits that a number would change stay text: a leading zero ("02139", a code), or more than 18 digits (an
    id a float would round)."""
    stripped = field.strip()
    if not stripped:
        return None
    digits = stripped.lstrip("+-")
    if digits[:1] == "0" and len(digits) > 1 and digits[1:2].isdigit():
        return field
    if _INTEGER.fullmatch(stripped):
        return int(stripped)
    if _DECIMAL.fullmatch(stripped) and any(mark in stripped for mark in ".eE"):
        number = float(stripped)
        return number if math.isfinite(number) else field
    return field
