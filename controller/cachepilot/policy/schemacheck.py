"""Is a document valid against the policy or config schema? A yes/no answer without jsonschema.

jsonschema (with referencing, rpds, attrs and the bundled meta-schemas) is ~6 MiB of the daemon's RSS for the
whole of its life (issue 32: RSS <= 100 MiB with 1 M tracked files), though the daemon needs it only to word what is
wrong with a file that is invalid -- rare: a reload of a bad file, `policy check` of one. So the reader asks this
module first and imports jsonschema only when the answer is no, for its messages (policy/reader.schema_errors): a
valid configuration never loads it, and an invalid one gets exactly the errors it got before.

This is Draft 2020-12 for the keywords those two schemas use, with jsonschema's semantics: types as its type checker
has them (a bool is no number, 1.0 is an integer), const/enum compare as its ``equal`` (a bool equals only a bool),
``pattern`` is ``re.search``, each keyword applies only to its own type of instance, ``$ref`` only within the
document (``#/$defs/...``). A keyword outside that set raises :class:`SchemaUnsupported` when the schema is first
checked, so a schema change that needs more fails loudly rather than passing documents jsonschema would refuse;
tests/unit/test_schemacheck.py holds the answers to jsonschema's on the shipped files and on many mutations of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from cachepilot.errors import CachepilotError

Schema = dict[str, Any]
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})


class SchemaUnsupported(CachepilotError):
    """The schema uses a keyword this check does not implement."""


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": _num,
    "integer": lambda x: _num(x) and (isinstance(x, int) or float(x).is_integer()),
}


def equal(a: Any, b: Any) -> bool:
    """jsonschema's equality: a bool equals only a bool; lists and objects element by element; 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return False
    return bool(a == b)


class _Check:
    """One walk of a document against one root schema (``$ref`` resolves in the root)."""

    def __init__(self, root: Schema) -> None:
        self.root = root

    def valid(self, x: Any, s: Schema) -> bool:
        return all(self._keyword(k, v, x, s) for k, v in s.items() if k not in ANNOTATIONS)

    def _keyword(self, k: str, v: Any, x: Any, s: Schema) -> bool:  # noqa: PLR0911 -- one return a keyword
        if k == "type":
            return any(TYPES[t](x) for t in ([v] if isinstance(v, str) else v))
        if k == "$ref":
            return self.valid(x, self._ref(v))
        if k == "const":
            return equal(x, v)
        if k == "enum":
            return any(equal(x, e) for e in v)
        if k == "oneOf":
            return sum(self.valid(x, one) for one in v) == 1
        if isinstance(x, dict):
            return self._object(k, v, x, s)
        if isinstance(x, list):
            return self._array(k, v, x)
        if isinstance(x, str):
            return self._string(k, v, x)
        if _num(x):
            return self._number(k, v, x)
        return True  # the keyword does not apply to this type of value

    def _object(self, k: str, v: Any, x: dict[str, Any], s: Schema) -> bool:
        if k == "properties":
            return all(self.valid(x[p], sub) for p, sub in v.items() if p in x)
        if k == "additionalProperties":
            extra = [p for p in x if p not in s.get("properties", {})]
            return not extra if v is False else all(self.valid(x[p], v) for p in extra)
        if k == "required":
            return all(p in x for p in v)
        if k == "minProperties":
            return len(x) >= v
        if k == "propertyNames":
            return all(self.valid(p, v) for p in x)
        return True

    def _array(self, k: str, v: Any, x: list[Any]) -> bool:
        if k == "items":
            return all(self.valid(i, v) for i in x)
        if k == "minItems":
            return len(x) >= v
        if k == "maxItems":
            return len(x) <= v
        return True

    def _string(self, k: str, v: Any, x: str) -> bool:
        if k == "pattern":
            return re.search(v, x) is not None
        if k == "minLength":
            return len(x) >= v
        if k == "maxLength":
            return len(x) <= v
        return True

    def _number(self, k: str, v: Any, x: float) -> bool:
        if k == "minimum":
            return bool(x >= v)
        if k == "maximum":
            return bool(x <= v)
        return True

    def _ref(self, ref: str) -> Schema:
        node: Any = self.root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        if not isinstance(node, dict):
            raise SchemaUnsupported(f"$ref {ref!r} is not a schema")
        return node


KNOWN = frozenset({"type", "$ref", "const", "enum", "oneOf", "properties", "additionalProperties", "required",
                   "minProperties", "propertyNames", "items", "minItems", "maxItems", "pattern", "minLength",
                   "maxLength", "minimum", "maximum"}) | ANNOTATIONS


def _keywords(s: Any) -> set[str]:
    """Every keyword of a schema and its subschemas (not the property names under ``properties``/``$defs``)."""
    if not isinstance(s, dict):
        return set()
    out = set(s)
    for k, v in s.items():
        if k in ("properties", "$defs"):
            out |= set().union(*(_keywords(sub) for sub in v.values()))
        elif k in ("oneOf",):
            out |= set().union(*(_keywords(sub) for sub in v))
        elif k in ("items", "additionalProperties", "propertyNames"):
            out |= _keywords(v)
        elif k == "$ref" and not str(v).startswith("#/"):
            raise SchemaUnsupported(f"$ref {v!r}: only references within the schema")
    return out


def is_valid(doc: Any, schema: Schema) -> bool:
    """True if ``doc`` is valid against ``schema`` (as jsonschema's Draft202012Validator would say)."""
    unknown = _keywords(schema) - KNOWN
    if unknown:
        raise SchemaUnsupported(f"schema keywords not implemented here: {', '.join(sorted(unknown))}")
    return _Check(schema).valid(doc, schema)
