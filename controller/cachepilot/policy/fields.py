"""The policy's field table: every key declared on the model (``policy/model.py``, :func:`~.values.setting`), read
into rows -- the one source of the schema (``policy/schema.py``), the loader's conversion (``policy/convert.py``),
``docs/policy-reference.md`` (``policy/reference.py``) and the Ansible role's early check list:

    python -m cachepilot.policy.fields > playbooks/roles/cachepilot/files/policy_fields.json

(``make generated`` writes all three files; unit tests keep each identical to what the table makes).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from cachepilot.policy.model import Policy, Selector, VolumePolicy
from cachepilot.policy.values import META, Declared, Value


@dataclass(frozen=True, slots=True)
class Row:
    """One declared key: its YAML ``key`` within its section, the model's ``attr``, its ``value`` kind (None: a
    section, whose keys are ``rows``), default, meaning and the section's schema extras."""

    key: str
    attr: str
    value: Value | None
    default: Any
    doc: str
    extras: dict[str, Any]
    rows: tuple[Row, ...] = ()

    @property
    def is_section(self) -> bool:
        return self.value is None


def rows(cls: type) -> tuple[Row, ...]:
    """The declared keys of one model dataclass, in declaration order (fields without a declaration are not keys)."""
    out = []
    for f in dataclasses.fields(cls):
        decl: Declared | None = f.metadata.get(META)
        if decl is None:
            continue
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        sub = rows(type(default)) if decl.value is None else ()
        out.append(Row(decl.key or f.name, f.name, decl.value, default, decl.doc, decl.extras, sub))
    return tuple(out)


SETTINGS = rows(VolumePolicy)  # the keys of ``defaults`` and of each volume rule
SELECTOR = rows(Selector)  # a rule's ``match``
TOP = rows(Policy)  # the file's own keys (a dotted key sits in a section of its own: hotness.half_life)


def by_key(table: tuple[Row, ...]) -> dict[str, Row]:
    return {r.key: r for r in table}


def leaves(table: tuple[Row, ...], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Row]]:
    """Every key that takes a value, with its path from the table's top (sections walked)."""
    out: list[tuple[tuple[str, ...], Row]] = []
    for r in table:
        path = (*prefix, *r.key.split("."))
        if r.is_section:
            out.extend(leaves(r.rows, path))
        else:
            out.append((path, r))
    return out


# What the role says a value should have been, by its check (tasks/validate.yml: "NAME: VALUE is not EXPECTED").
_EXPECTED = {
    "size": "a size (bytes, or a number with B, KiB, MiB, GiB, TiB, K, M, G, KB, MB, GB ...)",
    "duration": "a duration (seconds, or a number with ms, s, m, h, d)",
    "fraction": "a number from 0 to 1",
    "boolean": "true or false",
    "glob": "a non-empty string",
    "pattern": "a string matching {pattern}",
    "integer": "an integer of at least {minimum}",
    "number": "a number of at least {minimum}",
    "enum": "one of {choices}",
    "strings": "a list of at most {max_items} non-empty strings",
    "knobs": "a mapping of knob names ({choices}) to values",
}


def _role_item(scope: str, path: tuple[str, ...], value: Value) -> dict[str, Any]:
    args = value.role_args
    shown = {k: ", ".join(v) if isinstance(v, list) else v for k, v in args.items()}
    return {"scope": scope, "path": ".".join(path), "kind": value.role, **args,
            "expected": _EXPECTED[value.role].format(**shown)}


def role_checks() -> list[dict[str, Any]]:
    """The role's early check list: each key with the check its value gets, by scope (``top``: the file's keys,
    ``settings``: defaults' and each rule's, ``match``: each rule's selector)."""
    out = []
    for scope, table in (("top", TOP), ("settings", SETTINGS), ("match", SELECTOR)):
        for path, row in leaves(table):
            assert row.value is not None
            out.append(_role_item(scope, path, row.value))
    return out


def role_json() -> str:
    """The committed file: one check a line (a new key is a one-line diff)."""
    return "[\n" + ",\n".join(json.dumps(c) for c in role_checks()) + "\n]\n"


if __name__ == "__main__":
    print(role_json(), end="")
