"""The kinds of value a policy key takes (a size, a duration, a fraction ...): for each, its JSON-Schema piece, the
parser that turns the YAML value into the model's, how the Ansible role's early check tests it and how the reference
names it -- and :func:`setting` / :func:`section`, which declare a policy key on the model's dataclass field.

A key is declared once, on its field in ``policy/model.py`` (its default is the field's default); ``policy/fields.py``
reads those declarations into the one table that the schema, the loader's conversion, the role's check list and
``docs/policy-reference.md`` are made from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cachepilot import units

T = TypeVar("T")

MAX_SIZE = 1 << 60  # 1 EiB
MAX_DURATION_S = 366 * 86400.0  # a year
MIN_DURATION_S = 0.001  # below a millisecond a duration is a typo (and divides ticks into nothing)
SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)? ?(B|K|M|G|T|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$"
DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)? ?(ms|s|m|h|d)$"
_DUR = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

META = "cachepilot.policy"  # the dataclass field metadata key that holds a key's declaration


def parse_size(v: int | str) -> int:
    if isinstance(v, bool):
        raise ValueError("not a size")
    if isinstance(v, int):
        n = v
    else:
        n = units.parse_size(v)
    if n < 0:
        raise ValueError("negative size")
    if n > MAX_SIZE:
        raise ValueError(f"size {v!r} is larger than 1 EiB")
    return n


def parse_duration(v: float | int | str) -> float:
    """Seconds; 0 (= off, where a setting allows it) or between 1 ms and a year."""
    if isinstance(v, bool):
        raise ValueError("not a duration")
    if isinstance(v, int | float):
        d = float(v)
    else:
        m = re.fullmatch(r"([0-9]{1,30}(?:\.[0-9]{1,9})?) ?(ms|s|m|h|d)", v.strip())
        if not m:
            raise ValueError(f"not a duration: {v!r}")
        d = float(m.group(1)) * _DUR[m.group(2)]
    if not math.isfinite(d):
        raise ValueError(f"duration {v!r} is not a finite number")
    if d < 0:
        raise ValueError("negative duration")
    if d > MAX_DURATION_S:
        raise ValueError(f"duration {v!r} is longer than a year")
    if 0 < d < MIN_DURATION_S:
        raise ValueError(f"duration {v!r} is shorter than 1 ms")
    return d


@dataclass(frozen=True, slots=True)
class Value:
    """One kind of value. ``schema`` is its JSON-Schema piece (a description is added after it); ``convert`` makes the
    model's value of a schema-valid YAML value (None: taken as it is; ValueError: out of range, with why); ``role`` is
    the kind the role's early check (tasks/validate.yml) tests, ``role_args`` what that test needs; ``name`` is how
    the reference names it."""

    name: str
    schema: dict[str, Any]
    role: str
    convert: Callable[[Any], Any] | None = None
    role_args: dict[str, Any] = field(default_factory=dict)
    merge: bool = False  # a rule's mapping adds to the one it overrides (knobs) instead of replacing it


SIZE = Value("size", {"$ref": "#/$defs/size"}, "size", parse_size)
DURATION = Value("duration", {"$ref": "#/$defs/duration"}, "duration", parse_duration)
FRACTION = Value("fraction (0 to 1)", {"$ref": "#/$defs/fraction"}, "fraction")
BOOLEAN = Value("boolean", {"type": "boolean"}, "boolean")
GLOB = Value("glob", {"type": "string", "minLength": 1}, "glob")


def integer(minimum: int) -> Value:
    return Value(f"integer >= {minimum}", {"type": "integer", "minimum": minimum}, "integer", None,
                 {"minimum": minimum})


def number(minimum: float) -> Value:
    return Value(f"number >= {minimum:g}", {"type": "number", "minimum": minimum}, "number", None,
                 {"minimum": minimum})


def enum(choices: tuple[str, ...]) -> Value:
    return Value("one of " + ", ".join(choices), {"enum": list(choices)}, "enum", None, {"choices": list(choices)})


def strings(max_items: int, max_length: int) -> Value:
    """A list of non-empty strings (the model keeps a tuple)."""
    return Value(f"list of at most {max_items} strings",
                 {"type": "array", "maxItems": max_items,
                  "items": {"type": "string", "minLength": 1, "maxLength": max_length}},
                 "strings", tuple, {"max_items": max_items})


def pattern(regex: str, name: str) -> Value:
    return Value(name, {"type": "string", "pattern": regex}, "pattern", None, {"pattern": regex})


def knobs(names: tuple[str, ...]) -> Value:
    """Knob name to value (string or number); kept as strings, each checked against its knob by policy/capcheck."""
    return Value("mapping of knob name to value",
                 {"type": "object", "propertyNames": {"enum": list(names)},
                  "additionalProperties": {"type": ["string", "integer", "number"]}},
                 "knobs", _knob_strings, {"choices": list(names)}, merge=True)


def _knob_strings(v: dict[str, Any]) -> dict[str, str]:
    return {k: str(x) for k, x in v.items()}


@dataclass(frozen=True, slots=True)
class Declared:
    """A policy key as declared on its model field: its YAML ``key`` (None: the field's name), its value (None: a
    section, whose keys are the fields of the field's dataclass), what it means, and the section's schema extras
    (``required`` keys, ``minProperties``)."""

    key: str | None
    value: Value | None
    doc: str
    extras: dict[str, Any]


def setting(default: T, value: Value, doc: str, *, key: str | None = None) -> T:
    """A policy key with this default (a dataclass field; typed as its default for the checker)."""
    decl = Declared(key, value, doc, {})
    return field(default=default, metadata={META: decl})


def setting_from(factory: Callable[[], T], value: Value, doc: str, *, key: str | None = None) -> T:
    """A policy key whose default is made by ``factory`` (a mutable one: a mapping)."""
    return field(default_factory=factory, metadata={META: Declared(key, value, doc, {})})


def section(cls: Callable[[], T], doc: str, **extras: Any) -> T:
    """A nested section of keys: the fields of ``cls``, defaulting to ``cls()``."""
    return field(default_factory=cls, metadata={META: Declared(None, None, doc, extras)})
