"""policy/schemacheck.py says valid exactly where jsonschema does, for the policy and the config schema (the reader
then imports jsonschema only for an invalid document, issue 32), and a valid configuration and policy load without
importing jsonschema at all."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from cachepilot.daemon.config import SCHEMA as CONFIG_SCHEMA
from cachepilot.policy.schema import SCHEMA as POLICY_SCHEMA
from cachepilot.policy.schemacheck import SchemaUnsupported, equal, is_valid

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [*sorted((ROOT / "policies").glob("*.yaml")), ROOT / "controller/cachepilot/data/config.yaml"]
# values put in place of every node in turn: each type, the edges of the schemas' bounds, strings that match and do
# not match the size/duration patterns, the enums' words
PROBES: list[Any] = [None, True, False, 0, -1, 1.0, 0.5, 1.5, 63, 64, (1 << 26) + 1, "", "x", "1MiB", "1.5 GiB",
                     "500ms", "2.5 h", "1x", "-1s", "/mnt/data", "0123abcd-ef", "destructive", "dm-cache", [], ["a"],
                     ["", "b"], {}, {"x": 1}]


def generate(s: Any, root: dict[str, Any]) -> Any:
    """A document with every property the schema names (valid or not: only the two answers are compared)."""
    if "$ref" in s:
        return generate(root["$defs"][s["$ref"].split("/")[-1]], root)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return s["enum"][0]
    if "oneOf" in s:
        return generate(s["oneOf"][-1], root)
    t = s.get("type")
    if t == "object":
        return {k: generate(v, root) for k, v in s.get("properties", {}).items()}
    if t == "array":
        return [generate(s.get("items", {}), root)]
    if t in ("integer", "number"):
        return s.get("minimum", 0)
    if t == "string" and "pattern" in s:
        return next(p for p in PROBES if isinstance(p, str) and re.search(s["pattern"], p))
    return {"boolean": True, "string": "x"}.get(t, None)


def paths(x: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(x, dict):
        for k, v in x.items():
            yield from paths(v, (*at, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from paths(v, (*at, i))


def put(doc: Any, at: tuple[Any, ...], value: Any) -> Any:
    if not at:
        return value
    out = copy.deepcopy(doc)
    node = out
    for k in at[:-1]:
        node = node[k]
    node[at[-1]] = value
    return out


def mutations(doc: Any) -> Iterator[Any]:
    """Every node replaced by every probe; every mapping with a key more and with each key less."""
    for at in list(paths(doc)):
        for p in PROBES:
            yield put(doc, at, p)
        node = doc
        for k in at:
            node = node[k]
        if isinstance(node, dict):
            yield put(doc, at, {**node, "unknown_key": 1})
            for k in node:
                yield put(doc, at, {kk: v for kk, v in node.items() if kk != k})


def agree(doc: Any, schema: dict[str, Any], validator: jsonschema.Draft202012Validator) -> bool:
    """Both answers are the same; that answer."""
    valid = validator.is_valid(doc)
    assert is_valid(doc, schema) == valid, doc
    return valid


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_files_are_valid_for_both(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    schema = CONFIG_SCHEMA if path.name == "config.yaml" else POLICY_SCHEMA
    assert is_valid(doc, schema)
    assert jsonschema.Draft202012Validator(schema).is_valid(doc)


@pytest.mark.parametrize(("name", "schema"), [("policy", POLICY_SCHEMA), ("config", CONFIG_SCHEMA)])
def test_every_mutation_of_a_full_document_gets_jsonschemas_answer(name: str, schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    full = generate(schema, schema)
    if name == "policy":  # a rule's settings are the defaults' schemas (mutated there): its selector, name and one
        rule = full["volumes"][0]
        full["volumes"] = [{k: rule[k] for k in ("name", "match", "failure_model")}, {"match": {"kind": "dm-cache"}}]
    docs = [full, *mutations(full)]
    if name == "config":  # (the full policy has every key the shipped ones have)
        docs += mutations(yaml.safe_load(SHIPPED[-1].read_text()))
    invalid = 0
    for doc in docs:
        invalid += not agree(doc, schema, validator)
    assert 0.2 * len(docs) < invalid < 0.9 * len(docs)  # both answers are well represented


def test_equality_is_jsonschemas() -> None:
    assert equal(1, 1.0) and not equal(True, 1) and not equal(0, False) and equal(False, False)
    assert equal([1, {"a": True}], [1.0, {"a": True}]) and not equal([True], [1]) and not equal({"a": 1}, {"b": 1})
    assert not equal([1], {"a": 1}) and not equal("1", 1)


def test_a_keyword_it_does_not_implement_is_refused() -> None:
    with pytest.raises(SchemaUnsupported, match="uniqueItems"):
        is_valid([1], {"type": "array", "uniqueItems": True})
    with pytest.raises(SchemaUnsupported, match="only references within"):
        is_valid(1, {"$ref": "https://example.invalid/x.json"})


def test_a_valid_configuration_and_policy_load_without_jsonschema(tmp_path: Path) -> None:
    """What the daemon does at start and on a reload; an invalid policy still gets jsonschema's words."""
    (tmp_path / "c.yaml").write_text(f"version: 1\npolicies: [{ROOT}/policies/examples-database.yaml]\n")
    (tmp_path / "bad.yaml").write_text("version: 1\ndefaults:\n  failure_model: sometimes\n")
    code = (
        "import sys\n"
        "from cachepilot.daemon.config import load_config\n"
        "from cachepilot.errors import UserError\n"
        f"load_config({str(tmp_path / 'c.yaml')!r})\n"
        "print('jsonschema' in sys.modules)\n"
        "from cachepilot.policy.loader import load_policy\n"
        f"try: load_policy({str(tmp_path / 'bad.yaml')!r})\n"
        "except UserError as e: print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded, error = r.stdout.splitlines()
    assert loaded == "False"
    assert error == (f"{tmp_path / 'bad.yaml'}:3: defaults.failure_model: 'sometimes' is not one of "
                     "['recoverable', 'destructive', 'auto']")
