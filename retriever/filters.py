"""Filters on documents: a small JSON language compiled to parameterised SQL over a segment's document table.

    {"lang": "en"}                                   equality (a string, number, true/false or null)
    {"year": {"$gte": 2019, "$lt": 2023}}            $gt $gte $lt $lte: numbers with numbers, strings with strings
    {"lang": {"$ne": "en"}}                          not equal (documents without the field match)
    {"tag": {"$in": ["a", "b"]}}, {"$nin": [...]}    one of / none of
    {"tags": {"$all": ["a", "b"]}}                   every one of
    {"tags": {"$size": 2}}                           a list of that many elements (a list inside it is a list too)
    {"year": {"$exists": true}}                      the field is there (even as null) / is not
    {"$and": [{...}, {...}]}, {"$or": [...]}         several conditions; several keys in one object are all required
    {"$not": {...}}                                  every document the condition does not select

A field is a metadata path (`retriever.metadata`: keys joined by dots, `origin.site`, `metadata.` in front
optional) or one of the document's own fields: `doc_id`, `title`, `source` (the corpus file it came from) and
`text`. Where a path holds a list, a condition holds when one of its elements satisfies it, as in MongoDB and
Qdrant: `{"tags": "x"}` finds the documents tagged x, `$ne` and `$nin` those with no such element, and each
operator of a field may be satisfied by a different element. Values compare exactly, code point by code point (a
NUL is a character like any other). Values and field names travel as bound parameters, never as SQL text: the
server takes filters from clients. A filter that cannot be compiled is one line naming the problem
(`FilterError`, a RetrieverError).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Callable, Collection

from retriever.errors import RetrieverError, param
from retriever.metadata import (ADAPTER_KEYS, BOOLEAN, LIST, MAX_DEPTH as MAX_METADATA_DEPTH, MAX_KEY_CHARS, MAX_VALUES,
                                NULL, NUMBER, PREFIX, RESERVED, STRING, check_value, field_path, kind_of,
                                listed_fields)
from retriever.text import RepeatedKeyError, check_text, did_you_mean, unique_keys

COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
OPERATORS = ("$eq", "$ne", "$in", "$nin", "$all", *COMPARISONS, "$exists", "$size")
MAX_CONDITIONS = 100
MAX_DEPTH = 8
MAX_LISTED = 1000  # values all $in / $nin / $all lists of one filter hold together
MAX_CHARS = 20_000
MAX_PATH_CHARS = len(PREFIX) + (MAX_METADATA_DEPTH + 1) * (MAX_KEY_CHARS + 1)
# The document's own fields, as SQL over `documents d LEFT JOIN sources s`.
_OWN = {"doc_id": "d.doc_id", "title": "d.title", "text": "d.text", "source": "s.path"}

# A condition on one value: SQL over its kind and value (`retriever.metadata.flattened`), given their expressions.
Condition = Callable[[str, str], str]


class FilterError(RetrieverError):
    """A filter that cannot be compiled."""

    def __init__(self, message: str):
        super().__init__(f"{param('where')}: {message}", parameter="where")


@dataclass(frozen=True)
class Filter:
    """A compiled filter: SQL for a WHERE clause over `documents d LEFT JOIN sources s` (metadata conditions read
    the segment's `fields` table), its parameters, the filter as given, and the metadata paths it names. Two
    filters are equal when their canonical JSON (KEY) is: it keys caches and batches."""

    key: str
    sql: str = field(compare=False)
    parameters: tuple = field(compare=False)
    source: dict = field(compare=False, repr=False)
    paths: tuple[str, ...] = field(default=(), compare=False)
    # Those of PATHS a document must hold a value at to be selected (not those only $ne, $nin, $exists false or a
    # $not read, which a document without the path meets): a misspelt one of them selects nothing.
    required_paths: tuple[str, ...] = field(default=(), compare=False)
    fields: tuple[str, ...] = field(default=(), compare=False)  # every field it names, as written
    # (path, kind, value) of each value a metadata path is compared with: what `kind_mismatch_note` reads.
    compared: tuple[tuple[str, int, object], ...] = field(default=(), compare=False, repr=False)


def parse_where(where: str | dict | Filter | None) -> Filter | None:
    """WHERE (a JSON text or an already parsed object) compiled; None for no filter (a Filter is already one)."""
    if where is None or isinstance(where, Filter):
        return where
    if isinstance(where, str):
        if len(where) > MAX_CHARS:
            raise FilterError(f"{len(where):,} characters; at most {MAX_CHARS:,}")
        try:
            where = json.loads(where, object_pairs_hook=unique_keys)
        except RepeatedKeyError as error:  # JSON keeps the last silently: {"year": 2001, "year": 2002} is 2002
            raise FilterError(error.msg) from None
        except (json.JSONDecodeError, RecursionError) as error:
            reason = f"{error.msg} at column {error.colno}" if isinstance(error, json.JSONDecodeError) else "too deep"
            raise FilterError(f"not valid JSON ({reason})") from None
        except ValueError:  # the only other one: an integer past Python's int-string conversion limit
            raise FilterError("not valid JSON (an integer too long to read)") from None
    if not isinstance(where, dict):
        raise FilterError(f"must be a JSON object such as {{\"lang\": \"en\"}}, got {_kind(where)}")
    compiler = _Compiler()
    sql = compiler.all_of(where, 1)
    return Filter(json.dumps(where, sort_keys=True), sql, tuple(compiler.parameters), where,
                  paths=tuple(dict.fromkeys(compiler.paths)), compared=tuple(compiler.compared),
                  required_paths=tuple(sorted(_required_paths(where))), fields=tuple(dict.fromkeys(compiler.fields)))


def _required_paths(clause: dict) -> set[str]:
    """The metadata paths a document must hold a value at for CLAUSE (compiled: well formed) to select it: every
    condition's of $and, those of every branch of $or; none of $ne, $nin, $exists false, or a $not (a document
    without the path meets them: Haystack's `== None` is such an $or)."""
    required: set[str] = set()
    for key, value in clause.items():
        if key == "$and":
            required |= set().union(*(_required_paths(item) for item in value))
        elif key == "$or":
            required |= set.intersection(*(_required_paths(item) for item in value))
        elif key != "$not" and key not in _OWN:
            operators = value if isinstance(value, dict) else {"$eq": value}
            if any(op not in ("$ne", "$nin", "$exists") or (op == "$exists" and bound)
                   for op, bound in operators.items()):
                required.add(field_path(key))
    return required


class _Compiler:
    def __init__(self):
        self.parameters: list = []
        self.paths: list[str] = []
        self.compared: list[tuple[str, int, object]] = []
        self.fields: list[str] = []  # every field named, as written (a document's own, metadata paths)
        self.conditions = 0
        self.listed = 0

    def all_of(self, clause: dict, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise FilterError(f"nested more than {MAX_DEPTH} deep")
        if not clause:
            raise FilterError("an empty object: give at least one condition")
        parts = []
        for key, value in clause.items():
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise FilterError(f"{key} takes a non-empty list of conditions, got {_kind(value)}")
                if not all(isinstance(item, dict) for item in value):
                    raise FilterError(f"{key} takes a list of objects")
                joiner = " AND " if key == "$and" else " OR "
                parts.append("(" + joiner.join(self.all_of(item, depth + 1) for item in value) + ")")
            elif key == "$not":
                # Every condition compiles to SQL that is true or false, never NULL (`some`), so NOT is its
                # complement: what a framework's NOT (Haystack's) means.
                if not isinstance(value, dict):
                    raise FilterError(f"$not takes one object of conditions, got {_kind(value)}")
                parts.append(f"(NOT {self.all_of(value, depth + 1)})")
            elif isinstance(key, str) and key.startswith("$"):
                raise FilterError(f"unknown operator {key!r} at the top of a condition; known there: $and, $or, $not "
                                  f"(a metadata key that starts with $ is reached as {PREFIX}{key})")
            else:
                parts.append(self.field(key, value))
        return "(" + " AND ".join(parts) + ")"

    def field(self, name: str, condition: object) -> str:
        if not isinstance(name, str) or not field_path(name) or len(name) > MAX_PATH_CHARS:
            shown = repr(name[:80]) if isinstance(name, str) else f"the {type(name).__name__} {str(name)[:80]}"
            raise FilterError(f"{shown} is not a field name (metadata keys joined by dots, or one of "
                              f"{', '.join(sorted(RESERVED))})")
        try:
            check_text(name, "a field name")
        except RetrieverError as error:
            raise FilterError(str(error)) from None
        self.fields.append(name)
        if not isinstance(condition, dict):
            return self.operator(name, "$eq", condition)
        if not condition:
            raise FilterError(f"field {name!r}: an empty object; give a value or an operator such as $eq")
        unknown = [op for op in condition if op not in OPERATORS]
        if unknown:
            raise FilterError(f"field {name!r}: unknown operator {unknown[0]!r}; known: {', '.join(OPERATORS)}")
        return "(" + " AND ".join(self.operator(name, op, value) for op, value in condition.items()) + ")"

    def operator(self, name: str, op: str, value: object) -> str:
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise FilterError(f"more than {MAX_CONDITIONS} conditions")
        where = f"field {name!r}"
        if op == "$exists":
            if not isinstance(value, bool):
                raise FilterError(f"{where}: $exists takes true or false, got {_kind(value)}")
            return self.some(name, None, negated=not value)
        if op == "$size":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VALUES:
                raise FilterError(f"{where}: $size takes a whole number of elements from 0 to {MAX_VALUES:,} (no "
                                  f"list holds more), got {_kind(value)}")
            return self.some(name, lambda kind, stored: f"{kind} = {self.bind(LIST)} AND {stored} = {self.bind(value)}")
        if op in ("$in", "$nin", "$all"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{where}: {op} takes a non-empty list of values, got {_kind(value)}")
            self.listed += len(value)
            if self.listed > MAX_LISTED:
                raise FilterError(f"$in, $nin and $all list {self.listed:,} values; at most {MAX_LISTED:,} in one "
                                  "filter")
            values = [self.scalar(item, where) for item in value]
            self.note_compared(name, values)
            if op == "$all":  # each value once, of its kind: true is not 1 (Python's dict would take them as one)
                distinct = dict.fromkeys((kind_of(value), value) for value in values)
                return _balanced([self.some(name, self.equal(item)) for _, item in distinct], " AND ")
            return self.some(name, self.one_of(values), negated=op == "$nin")
        if op in ("$eq", "$ne"):
            value = self.scalar(value, where)
            self.note_compared(name, [value])
            return self.some(name, self.equal(value), negated=op == "$ne")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FilterError(f"{where}: {op} compares with a number or a string, got {_kind(value)}")
        self.scalar(value, where)
        self.note_compared(name, [value])
        kind = STRING if isinstance(value, str) else NUMBER
        return self.some(name, lambda k, v: f"{k} = {self.bind(kind)} AND {v} {COMPARISONS[op]} {self.bind(value)}")

    def note_compared(self, name: str, values: list) -> None:
        if name not in _OWN:
            self.compared.extend((field_path(name), kind_of(value), value) for value in values if value is not None)

    def some(self, name: str, condition: Condition | None, negated: bool = False) -> str:
        """SQL true for a document where one value at NAME satisfies CONDITION (None: any value is there), or,
        NEGATED, where none does."""
        if name in _OWN:
            column = _OWN[name]
            if condition is None:
                return f"({column} IS {'' if negated else 'NOT '}NULL)"
            # A document's own field is one string, or null where it has none (a title).
            held = f"coalesce({condition(f'(CASE WHEN {column} IS NULL THEN {NULL} ELSE {STRING} END)', column)}, 0)"
            return f"(NOT {held})" if negated else f"({held})"
        path = field_path(name)
        self.paths.append(path)
        rows = f"SELECT doc FROM fields WHERE path = (SELECT id FROM paths WHERE path = {self.bind(path)})"
        if condition is not None:
            rows += f" AND {condition('kind', 'value')}"
        return f"(d.rowid {'NOT IN' if negated else 'IN'} ({rows}))"

    def equal(self, value: object) -> Condition:
        if value is None:
            return lambda kind, stored: f"{kind} = {self.bind(NULL)}"
        if isinstance(value, bool):
            return lambda kind, stored: f"{kind} = {self.bind(BOOLEAN)} AND {stored} = {self.bind(int(value))}"
        value_kind = kind_of(value)
        return lambda kind, stored: f"{kind} = {self.bind(value_kind)} AND {stored} = {self.bind(value)}"

    def one_of(self, values: list) -> Condition:
        """Equal to one of VALUES, each kind compared with its own kind (true is not 1, "1" is not 1)."""
        def condition(kind: str, stored: str) -> str:
            parts = []
            for group_kind, group in ((STRING, [v for v in values if isinstance(v, str)]),
                                      (NUMBER, [v for v in values if isinstance(v, (int, float))
                                                and not isinstance(v, bool)])):
                if group:
                    same_kind = f"{kind} = {self.bind(group_kind)}"  # bound before the values: parameters go in order
                    listed = ", ".join(self.bind(v) for v in dict.fromkeys(group))
                    parts.append(f"({same_kind} AND {stored} IN ({listed}))")
            parts += [f"({self.equal(v)(kind, stored)})"
                      for v in dict.fromkeys(v for v in values if v is None or isinstance(v, bool))]
            return "(" + " OR ".join(parts) + ")"
        return condition

    def scalar(self, value: object, where: str) -> object:
        if isinstance(value, (list, dict)):
            raise FilterError(f"{where}: compares with a string, number, true/false or null, got {_kind(value)} "
                              "(a list's elements are matched one by one: use $in or $all)")
        try:
            return check_value(value, "value", where)
        except RetrieverError as error:
            raise FilterError(str(error).replace("metadata 'value'", "the value")) from None

    def bind(self, value: object) -> str:
        self.parameters.append(value)
        return "?"


class FilterWarning(UserWarning):
    """A filter requires a field no document has, or compares values of a kind the field never holds: it runs, and
    selects nothing (`filter_notes` says which)."""


def unknown_fields_note(where: Filter | None, fields: list[str], shown: int = 20, required_only: bool = False,
                        own: Collection[str] = RESERVED) -> str | None:
    """One line naming the metadata paths WHERE reads that no document has (FIELDS: the index's, as its manifest
    records them), with the fields there are (and OWN, the document's own fields the caller filters on); None when
    every path is known. Such a filter still runs (it may
    select nothing, or everything through $ne), but a misspelt field is the likeliest cause of an empty answer."""
    known = set(fields)
    paths = () if where is None else where.required_paths if required_only else where.paths
    # An adapter's own keys (a Haystack store's embeddings) are its filters' business, and no field to offer.
    unknown = [path for path in paths if path not in known and path.split(".", 1)[0] not in ADAPTER_KEYS]
    fields = listed_fields(fields)
    if not unknown:
        return None
    listed = ", ".join(fields[:shown]) + (f" and {len(fields) - shown:,} more" if len(fields) > shown else "")
    named = ", ".join(f"{path!r}{did_you_mean(path, fields)}" for path in unknown)
    return (f"no document has the field{'s' if len(unknown) > 1 else ''} {named}; the "
            f"index's metadata fields: {listed or 'none'} (and the document's own: {', '.join(sorted(own))})")


_KIND_NAMES = {BOOLEAN: "true/false", NUMBER: "numbers", STRING: "text"}


def filter_notes(where: Filter | None, fields: list[str], kinds: Callable[[list[str]], dict[str, set[int]]],
                 required_only: bool = False, own: Collection[str] = RESERVED) -> list[str]:
    """What a search's answer should say of WHERE over an index with metadata FIELDS and value KINDS: the notes of
    `unknown_fields_note` and `kind_mismatch_note` that apply (the CLI, the server and the MCP tools all say them;
    REQUIRED_ONLY, the library's warnings: only of a field the filter requires, as it then selects nothing; OWN: the
    document's own fields offered, as `unknown_fields_note` takes them)."""
    return [note for note in (unknown_fields_note(where, fields, required_only=required_only, own=own),
                              kind_mismatch_note(where, kinds)) if note]


def kind_mismatch_note(where: Filter | None, kinds: Callable[[list[str]], dict[str, set[int]]]) -> str | None:
    """One line naming a value WHERE compares a metadata path with whose kind no document's value there has, while
    they hold values of another kind (`{"year": "2020"}` where years are numbers): such a condition selects
    nothing, quietly. KINDS(paths): the kinds of value each path holds in the index (`Snapshot.field_kinds`);
    asked only when WHERE compares values. None when every compared value's kind is there."""
    if where is None or not where.compared:
        return None
    held = kinds(sorted({path for path, _, _ in where.compared}))
    for path, kind, value in where.compared:
        scalars = held.get(path, set()) & set(_KIND_NAMES)
        if scalars and kind not in held[path] and kind in _KIND_NAMES:
            names = " and ".join(_KIND_NAMES[k] for k in sorted(scalars))
            return (f"field {path!r} holds {names} in this index, and the filter compares it with {_kind(value)} "
                    f"({_KIND_NAMES[kind]}): that condition matches no value there"
                    + (f"; write {_as_kind(value, min(scalars))}" if _as_kind(value, min(scalars)) else ""))
    return None


def _as_kind(value: object, kind: int) -> str | None:
    """VALUE written as KIND, where it reads as one ("2020" as 2020, 2020 as "2020"), for the note's fix."""
    if kind == NUMBER and isinstance(value, str):
        try:
            return json.dumps(int(value) if value.strip().lstrip("-").isdigit() else float(value))
        except ValueError:
            return None
    if kind == STRING and isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(str(value))
    if kind == BOOLEAN and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower()
    return None


def _balanced(parts: list[str], joiner: str) -> str:
    """PARTS joined as a balanced tree: SQLite refuses an expression 1,000 deep, which a flat chain of as many
    conditions is."""
    if len(parts) == 1:
        return parts[0]
    middle = len(parts) // 2
    return f"({_balanced(parts[:middle], joiner)}{joiner}{_balanced(parts[middle:], joiner)})"


def _kind(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return "a number too large"  # not printed: past 4,300 digits Python refuses to
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return json.dumps(value) if isinstance(value, (bool, int, float, str)) or value is None else type(value).__name__
