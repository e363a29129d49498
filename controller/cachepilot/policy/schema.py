"""The policy file schema (JSON Schema 2020-12), made from the field table (``policy/fields.py``).
``policies/schema.json`` is generated from this module:

    python -m cachepilot.policy.schema > policies/schema.json

and a unit test keeps the two identical.
"""

from __future__ import annotations

import json
from typing import Any

from cachepilot.policy.fields import SELECTOR, SETTINGS, TOP, Row
from cachepilot.policy.values import DURATION_PATTERN, SIZE_PATTERN

_size: dict[str, Any] = {
    "description": "bytes: an integer or a string with a unit (KiB, MiB, GiB, K, M, G ...)",
    "oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}],
}
_duration: dict[str, Any] = {
    "description": "seconds: a number or a string with a unit (ms, s, m, h, d)",
    "oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}],
}
_fraction: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, **extra}


def properties(table: tuple[Row, ...]) -> dict[str, Any]:
    """The schema of a table's keys; a dotted key (``hotness.half_life``) nests in a section of its own."""
    props: dict[str, Any] = {}
    for r in table:
        if r.is_section:
            one = _obj(properties(r.rows), **r.extras, description=r.doc)
        else:
            assert r.value is not None
            one = {**r.value.schema, "description": r.doc}
        *outer, key = r.key.split(".")
        where = props
        for name in outer:
            where = where.setdefault(name, _obj({}))["properties"]
        where[key] = one
    return props


def build() -> dict[str, Any]:
    """The schema of a policy file (the kinds and knobs are the table's, cachepilot.capabilities)."""
    settings = properties(SETTINGS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://cachepilot.invalid/policy.schema.json",
        "title": "cachepilot policy",
        "type": "object",
        "additionalProperties": False,
        "required": ["version"],
        "properties": {
            "version": {"const": 1},
            **properties(TOP),
            "defaults": _obj(settings),
            "volumes": {
                "type": "array",
                "items": _obj(
                    {"name": {"type": "string"}, "match": _obj(properties(SELECTOR), minProperties=1), **settings},
                    required=["match"],
                ),
            },
        },
        "$defs": {"size": _size, "duration": _duration, "fraction": _fraction},
    }


SCHEMA: dict[str, Any] = build()


if __name__ == "__main__":
    print(json.dumps(SCHEMA, indent=2))
