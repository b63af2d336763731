"""Per-document metadata: an object of named values, as users export them, stored beside the text and filtered
on (`retriever.filters`).

A document's metadata comes from a BEIR record's `metadata` object, or from a csv/tsv file's columns other than
id, title and text. Values are strings, numbers (finite; integers within 64 bits), booleans, null, lists and
nested objects, stored exactly and returned as given. csv/tsv fields are typed as a reader expects: a field that
reads as an integer or a decimal number is that number ("2019" -> 2019, "0.5" -> 0.5), except digits a number
would change ("02139", 19-digit ids), an empty field is absent, anything else stays text.

Filters name a value by its path: the keys from the top down, joined by dots (`origin.site`). A list's elements
stand at the list's own path, so `tags` names every tag and `authors.name` every author's name. A key that holds a
dot is the same field as the nested path it spells (`{"a.b": 1}` and `{"a": {"b": 1}}` are both `a.b`), as in
Elasticsearch. Keys named like the document's own fields (`doc_id`, `title`, `text`, `source`) are kept; filters
reach them as `metadata.title` and the like, since a bare `title` is the document's own (`metadata.` may prefix
any path).

Limits, so that one record cannot weigh on every filter: keys of 1 to 256 characters with no control characters;
strings of at most 10,000 characters; at most 8 levels of lists and objects; at most 1,000 values in all (each
list element, object and list counts); at most 100,000 characters as JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

from retriever.errors import RetrieverError
from retriever.text import check_text

# The metadata key the Haystack adapter keeps for itself (each document's embedding exactly as given:
# `retriever.integrations.haystack`): stored and filtered on like any other key, never listed as an index's fields.
HAYSTACK_KEY = "_haystack"
ADAPTER_KEYS = (HAYSTACK_KEY,)


def listed_fields(paths: list[str] | tuple[str, ...]) -> list[str]:
    """An index's metadata PATHS as a person or an agent is shown them: without the adapters' own."""
    return [path for path in paths if path.split(".", 1)[0] not in ADAPTER_KEYS]

RESERVED = frozenset({"doc_id", "title", "text", "source"})  # the document's own fields, filterable by these names
PREFIX = "metadata."  # a path under it is always metadata, so a key named like a document field is reachable
MAX_KEY_CHARS = 256
MAX_VALUE_CHARS = 10_000
MAX_DEPTH = 8
MAX_VALUES = 1_000
MAX_JSON_CHARS = 100_000
INT64 = (-(2**63), 2**63 - 1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INTEGER = re.compile(r"[+-]?\d{1,18}")
_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")

Scalar = str | int | float | bool | None

# The kind of a stored value, as the fields table records it (`retriever.store.documents`): numbers compare with
# numbers, strings with strings, and true is not 1.
NULL, BOOLEAN, NUMBER, STRING, LIST, OBJECT = range(6)


def check_key(key: object, where: str) -> str:
    """KEY as a metadata key, or one line saying what is wrong with it."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or _CONTROL.search(key):
        shown = repr(key)[:80]
        raise RetrieverError(f"{where}: metadata key {shown} is not a key (1 to {MAX_KEY_CHARS} characters, no "
                             "control characters)")
    return check_text(key, f"{where}: metadata key")


def check_value(value: object, key: str, where: str) -> Scalar:
    """VALUE as a scalar metadata value: a string, finite number within 64 bits, boolean or null."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise RetrieverError(f"{where}: metadata {key!r} is an integer outside 64 bits (-2^63 to 2^63-1); "
                                 "write it as a string")
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
    raise RetrieverError(f"{where}: metadata {key!r} is {type(value).__name__}; values are strings, numbers, "
                         "true/false, null, lists and objects")


def check_metadata(metadata: object, where: str) -> dict | None:
    """A record's `metadata` checked against the limits above (None and {} both mean none)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise RetrieverError(f'{where}: "metadata" must be an object of named values, got '
                             f"{'a list' if isinstance(metadata, list) else type(metadata).__name__}")
    counted = [0]
    checked = {check_key(key, where): _checked(value, key, where, 1, counted) for key, value in metadata.items()}
    if not checked:
        return None
    size = len(json.dumps(checked, ensure_ascii=False))
    if size > MAX_JSON_CHARS:
        raise RetrieverError(f'{where}: "metadata" is {size:,} characters as JSON; at most {MAX_JSON_CHARS:,}')
    return checked


def _checked(value: object, path: str, where: str, depth: int, counted: list[int]) -> object:
    counted[0] += 1
    if counted[0] > MAX_VALUES:
        raise RetrieverError(f'{where}: "metadata" holds more than {MAX_VALUES:,} values (list elements count)')
    if isinstance(value, (list, tuple, dict)):
        if depth > MAX_DEPTH:
            raise RetrieverError(f"{where}: metadata {path!r} nests lists and objects more than {MAX_DEPTH} deep")
        if isinstance(value, dict):
            return {check_key(key, where): _checked(item, f"{path}.{key}", where, depth + 1, counted)
                    for key, item in value.items()}
        return [_checked(item, path, where, depth + 1, counted) for item in value]
    return check_value(value, path, where)


def field_path(name: str) -> str:
    """A filter's field NAME as a metadata path: the name itself, less a leading `metadata.`."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def flattened(metadata: dict | None) -> Iterator[tuple[str, str, object]]:
    """(path, kind, value) for every value in METADATA, the filters' view of it: a list's elements (and theirs)
    at the list's own path, beside one entry for the list (its value: its length) and one for each object, so that
    `$exists` finds containers and `$size` counts. Strings stay str, booleans are 0/1, and where the kind says all
    (null, an object) the value is 0: never NULL, which a key of the fields table cannot hold."""
    for key, value in (metadata or {}).items():
        yield from _flattened(key, value)


def _flattened(path: str, value: object) -> Iterator[tuple[str, str, object]]:
    if isinstance(value, dict):
        yield path, OBJECT, 0
        for key, item in value.items():
            yield from _flattened(f"{path}.{key}", item)
    elif isinstance(value, list):
        yield path, LIST, len(value)
        for item in value:
            yield from _flattened(path, item)
    else:
        yield path, kind_of(value), 0 if value is None else int(value) if isinstance(value, bool) else value


def kind_of(value: Scalar) -> int:
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOLEAN
    return STRING if isinstance(value, str) else NUMBER


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
