"""Filters on documents: a small JSON language compiled to parameterised SQL over a segment's document table.

    {"lang": "en"}                                   equality (a string, number, true/false or null)
    {"year": {"$gte": 2019, "$lt": 2023}}            $gt $gte $lt $lte: numbers with numbers, strings with strings
    {"lang": {"$ne": "en"}}                          not equal (documents without the field match)
    {"tag": {"$in": ["a", "b"]}}, {"$nin": [...]}    one of / none of
    {"year": {"$exists": true}}                      the field is there (even as null) / is not
    {"$and": [{...}, {...}]}, {"$or": [...]}         several conditions; several keys in one object are all required

A field is a metadata key (`retriever.metadata`) or one of the document's own fields: `doc_id`, `title`,
`source` (the corpus file it came from) and `text`. Values and field names travel as bound parameters, never as
SQL text: the server takes filters from clients. A filter that cannot be compiled is one line naming the problem
(`FilterError`, a RetrieverError).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from retriever.errors import RetrieverError, param
from retriever.metadata import KEY, check_value

COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
OPERATORS = ("$eq", "$ne", "$in", "$nin", *COMPARISONS, "$exists")
MAX_CONDITIONS = 100
MAX_DEPTH = 8
MAX_LISTED = 1000  # values all $in / $nin lists of one filter hold together (each list is one bound JSON array)
MAX_CHARS = 20_000
# The document's own fields, as SQL over `documents d LEFT JOIN sources s`.
_OWN = {"doc_id": "d.doc_id", "title": "d.title", "text": "d.text", "source": "s.path"}


class FilterError(RetrieverError):
    """A filter that cannot be compiled."""

    def __init__(self, message: str):
        super().__init__(f"{param('where')}: {message}", parameter="where")


@dataclass(frozen=True)
class Filter:
    """A compiled filter: SQL for a WHERE clause over `documents d LEFT JOIN sources s`, its parameters, and the
    filter as given. Two filters are equal when their canonical JSON (KEY) is: it keys caches and batches."""

    key: str
    sql: str = field(compare=False)
    parameters: tuple = field(compare=False)
    source: dict = field(compare=False, repr=False)


def parse_where(where: str | dict | Filter | None) -> Filter | None:
    """WHERE (a JSON text or an already parsed object) compiled; None for no filter (a Filter is already one)."""
    if where is None or isinstance(where, Filter):
        return where
    if isinstance(where, str):
        if len(where) > MAX_CHARS:
            raise FilterError(f"{len(where):,} characters; at most {MAX_CHARS:,}")
        try:
            where = json.loads(where)
        except (json.JSONDecodeError, RecursionError) as error:
            reason = f"{error.msg} at column {error.colno}" if isinstance(error, json.JSONDecodeError) else "too deep"
            raise FilterError(f"not valid JSON ({reason})") from None
    if not isinstance(where, dict):
        raise FilterError(f"must be a JSON object such as {{\"lang\": \"en\"}}, got {_kind(where)}")
    compiler = _Compiler()
    sql = compiler.all_of(where, 1)
    return Filter(json.dumps(where, sort_keys=True), sql, tuple(compiler.parameters), where)


class _Compiler:
    def __init__(self):
        self.parameters: list = []
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
            elif key.startswith("$"):
                raise FilterError(f"unknown operator {key!r} at the top of a condition; known there: $and, $or")
            else:
                parts.append(self.field(key, value))
        return "(" + " AND ".join(parts) + ")"

    def field(self, name: str, condition: object) -> str:
        if not isinstance(name, str) or not KEY.fullmatch(name):
            raise FilterError(f"{str(name)[:80]!r} is not a field name")
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
            return f"({self.present(name)} {'IS NOT' if value else 'IS'} NULL)"
        if op in ("$in", "$nin"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{where}: {op} takes a non-empty list of values, got {_kind(value)}")
            self.listed += len(value)
            if self.listed > MAX_LISTED:
                raise FilterError(f"$in and $nin list {self.listed:,} values; at most {MAX_LISTED:,} in one filter")
            anyone = self.one_of(name, [self.scalar(item, where) for item in value])
            return anyone if op == "$in" else f"(NOT coalesce({anyone}, 0))"
        if op in ("$eq", "$ne"):
            equal = self.equal(name, self.scalar(value, where))
            return equal if op == "$eq" else f"(NOT coalesce({equal}, 0))"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FilterError(f"{where}: {op} compares with a number or a string, got {_kind(value)}")
        self.scalar(value, where)
        kind = "('integer', 'real')" if not isinstance(value, str) else "('text')"
        return f"({self.type_of(name)} IN {kind} AND {self.value_of(name)} {COMPARISONS[op]} {self.bind(value)})"

    def one_of(self, name: str, values: list) -> str:
        """NAME equal to one of VALUES, each kind compared with its own kind (true is not 1, "1" is not 1): one
        membership test per kind against a bound JSON array, however many values there are."""
        parts = []
        texts = [value for value in values if isinstance(value, str)]
        numbers = [value for value in values if not isinstance(value, (str, bool)) and value is not None]
        if texts:
            parts.append(f"({self.type_of(name)} IN ('text') AND {self.value_of(name)} IN "
                         f"(SELECT value FROM json_each({self.bind(json.dumps(texts))})))")
        if numbers:
            parts.append(f"({self.type_of(name)} IN ('integer', 'real') AND {self.value_of(name)} IN "
                         f"(SELECT value FROM json_each({self.bind(json.dumps(numbers))})))")
        parts += [self.equal(name, value) for value in dict.fromkeys(v for v in values if v is None or
                                                                      isinstance(v, bool))]
        return "(" + " OR ".join(parts) + ")"

    def equal(self, name: str, value: object) -> str:
        if value is None:
            return f"({self.type_of(name)} = 'null')" if name not in _OWN else f"({_OWN[name]} IS NULL)"
        if isinstance(value, bool):
            return f"({self.type_of(name)} = {self.bind('true' if value else 'false')})"
        kind = "('text')" if isinstance(value, str) else "('integer', 'real')"
        return f"({self.type_of(name)} IN {kind} AND {self.value_of(name)} = {self.bind(value)})"

    def scalar(self, value: object, where: str) -> object:
        if isinstance(value, (list, dict)):
            raise FilterError(f"{where}: compares with a string, number, true/false or null, got {_kind(value)}")
        try:
            return check_value(value, "value", where)
        except RetrieverError as error:
            raise FilterError(str(error).replace("metadata 'value'", "the value")) from None

    def bind(self, value: object) -> str:
        self.parameters.append(value)
        return "?"

    def path(self, name: str) -> str:
        return self.bind(f'$."{name}"')

    def value_of(self, name: str) -> str:
        return _OWN[name] if name in _OWN else f"json_extract(d.metadata, {self.path(name)})"

    def type_of(self, name: str) -> str:
        # json_type of a document's own field: a text column, or NULL where the document has none (a title).
        return (f"(CASE WHEN {_OWN[name]} IS NULL THEN NULL ELSE 'text' END)" if name in _OWN
                else f"json_type(d.metadata, {self.path(name)})")

    def present(self, name: str) -> str:
        return _OWN[name] if name in _OWN else f"json_type(d.metadata, {self.path(name)})"


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value) if isinstance(value, (bool, int, float, str)) or value is None else type(value).__name__

