"""Issue 35 item 4: a policy key is declared once (its field in policy/model.py) and the schema, the loader's
conversion, the Ansible role's early checks and docs/policy-reference.md are all made from that table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cachepilot.policy import DEFAULT_POLICY, parse_policy
from cachepilot.policy.fields import SETTINGS, TOP, leaves, role_checks, role_json
from cachepilot.policy.model import Selector, VolumePolicy
from cachepilot.policy.reference import render, shown
from cachepilot.policy.schema import SCHEMA
from cachepilot.policy.values import META

ROOT = Path(__file__).resolve().parents[2]
GENERATED = {  # committed file -> what the table makes (`make generated` writes them)
    "policies/schema.json": lambda: json.dumps(SCHEMA, indent=2) + "\n",
    "playbooks/roles/cachepilot/files/policy_fields.json": role_json,
    "docs/policy-reference.md": render,
}


@pytest.mark.parametrize("path", sorted(GENERATED))
def test_committed_file_is_what_the_table_makes(path: str) -> None:
    assert (ROOT / path).read_text() == GENERATED[path](), f"{path} is stale: run `make generated`"


def _model_fields(cls: type) -> list[tuple[str, dataclasses.Field[Any]]]:
    out = []
    for f in dataclasses.fields(cls):
        out.append((f"{cls.__name__}.{f.name}", f))
        if dataclasses.is_dataclass(f.type) or (f.default_factory is not dataclasses.MISSING
                                                and dataclasses.is_dataclass(f.default_factory)):
            out += _model_fields(f.default_factory)  # type: ignore[arg-type]
    return out


def test_every_field_of_a_volume_policy_and_a_selector_is_a_declared_key() -> None:
    # a field without a declaration would be a setting no policy file could set (nor the schema, role or docs know)
    undeclared = [name for cls in (VolumePolicy, Selector) for name, f in _model_fields(cls) if META not in f.metadata]
    assert undeclared == []


def _schema_leaves(props: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for key, sub in props.items():
        if sub.get("type") == "object" and "properties" in sub:
            out |= _schema_leaves(sub["properties"], (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def test_the_roles_checks_cover_every_key_of_the_schema() -> None:
    # the role's own list had drifted (no max_hold, refresh_interval, max_cutoff, window): now it is the schema's keys
    props = SCHEMA["properties"]
    rule = props["volumes"]["items"]["properties"]
    want = {
        "top": _schema_leaves({k: v for k, v in props.items() if k not in ("version", "defaults", "volumes")}),
        "settings": _schema_leaves(props["defaults"]["properties"]),
        "match": _schema_leaves(rule["match"]["properties"]),
    }
    assert want["settings"] == _schema_leaves({k: v for k, v in rule.items() if k not in ("name", "match")})
    got: dict[str, set[tuple[str, ...]]] = {"top": set(), "settings": set(), "match": set()}
    for c in role_checks():
        got[c["scope"]].add(tuple(c["path"].split(".")))
    assert got == want
    assert {("lifetime_hold", "max_hold"), ("promotion", "refresh_interval"), ("sequential_steering", "max_cutoff"),
            ("sequential_steering", "window")} <= got["settings"]


def _every_key_at_its_default() -> dict[str, Any]:
    """A policy file naming every key, each written as the reference shows its default."""
    doc: dict[str, Any] = {"version": 1}

    def put(where: dict[str, Any], path: tuple[str, ...], text: str) -> None:
        for k in path[:-1]:
            where = where.setdefault(k, {})
        where[path[-1]] = yaml.safe_load(text)

    for table, where in ((TOP, doc), (SETTINGS, doc.setdefault("defaults", {}))):
        for path, row in leaves(table):
            if path[0] != "pin":  # pins have no default (paths and max_bytes are required together)
                put(where, path, shown(row))
    return doc


def test_every_key_written_as_its_documented_default_loads_as_the_built_in_default() -> None:
    # each key goes through its row's conversion (a size written "64MiB" must become 67108864, a duration "10m" 600)
    doc = _every_key_at_its_default()
    assert doc["defaults"]["exposure"]["max_dirty"] == "64MiB" and doc["hotness"]["half_life"] == "10m"
    pol = parse_policy(yaml.safe_dump(doc), "all.yaml")
    assert dataclasses.replace(pol, source=DEFAULT_POLICY.source) == DEFAULT_POLICY


def test_a_rule_overrides_only_what_it_names_and_adds_knobs() -> None:
    pol = parse_policy("version: 1\ndefaults: {knobs: {writeback_delay: 5}, promotion: {rate: 8MiB}}\n"
                       "volumes:\n  - match: {kind: bcache}\n    knobs: {writeback_percent: 10}\n"
                       "    promotion: {large_files: {max_size: 16MiB}}\n", "r.yaml")
    vp = pol.rules[0].policy
    assert vp.knobs == {"writeback_delay": "5", "writeback_percent": "10"}
    assert vp.promotion.rate == 8 << 20 and vp.promotion.large_files.max_size == 16 << 20
    assert vp.promotion.large_files.min_reads == 2.0 and vp.exposure == pol.defaults.exposure
