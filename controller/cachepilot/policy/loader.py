"""Load a policy file: YAML with line numbers, JSON-Schema validation, errors as ``FILE:LINE: key: message``.

PyYAML's ``compose`` keeps a mark (line, column) on every node; we build plain Python values and a map
from each value's path to its line, validate with jsonschema, and point every error at the offending key.
Unknown keys and duplicate keys are errors.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cachepilot.errors import UserError
from cachepilot.policy import capcheck
from cachepilot.policy.model import (
    DiscardOnDelete,
    Exposure,
    HealthPolicy,
    Hysteresis,
    Policy,
    Promotion,
    Rule,
    Selector,
    VolumePolicy,
)
from cachepilot.policy.schema import SCHEMA

PathT = tuple[str | int, ...]

_UNITS = {
    "": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KiB": 1 << 10, "M": 1 << 20, "MB": 1000**2, "MiB": 1 << 20,
    "G": 1 << 30, "GB": 1000**3, "GiB": 1 << 30, "T": 1 << 40, "TB": 1000**4, "TiB": 1 << 40,
}  # fmt: skip
_DUR = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(v: int | str) -> int:
    if isinstance(v, bool):
        raise ValueError("not a size")
    if isinstance(v, int):
        if v < 0:
            raise ValueError("negative size")
        return v
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) ?([A-Za-z]*)", v.strip())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"not a size: {v!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_duration(v: float | int | str) -> float:
    if isinstance(v, bool):
        raise ValueError("not a duration")
    if isinstance(v, int | float):
        if v < 0:
            raise ValueError("negative duration")
        return float(v)
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) ?(ms|s|m|h|d)", v.strip())
    if not m:
        raise ValueError(f"not a duration: {v!r}")
    return float(m.group(1)) * _DUR[m.group(2)]


@dataclass
class _Doc:
    source: str
    value: Any
    lines: dict[PathT, int]  # path -> line of the value (1-based)
    key_lines: dict[PathT, int]  # path -> line of the key naming it

    def line(self, path: PathT) -> int:
        p = tuple(path)
        while p:
            if p in self.key_lines:
                return self.key_lines[p]
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)

    def err(self, path: PathT, msg: str) -> UserError:
        key = ".".join(str(x) for x in path) or "(top level)"
        return UserError(f"{self.source}:{self.line(path)}: {key}: {msg}")


def _build(node: yaml.Node, path: PathT, doc: _Doc) -> Any:
    doc.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for knode, vnode in node.value:
            key = _build(knode, (*path, "<key>"), doc)
            if not isinstance(key, str):
                raise UserError(f"{doc.source}:{knode.start_mark.line + 1}: keys must be strings: {key!r}")
            if key in out:
                raise UserError(f"{doc.source}:{knode.start_mark.line + 1}: {key}: duplicate key")
            doc.key_lines[(*path, key)] = knode.start_mark.line + 1
            out[key] = _build(vnode, (*path, key), doc)
        doc.lines.pop((*path, "<key>"), None)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(n, (*path, i), doc) for i, n in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def read_yaml(text: str, source: str, what: str = "policy file") -> _Doc:
    """Parse YAML keeping the line of every key and value (shared by the policy and the daemon's config)."""
    doc = _Doc(source, None, {}, {})
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UserError(f"{source}:{line}: YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}:1: YAML error: {exc}") from None
    if node is None:
        raise UserError(f"{source}:1: empty {what}")
    doc.value = _build(node, (), doc)
    return doc


_validator = jsonschema.Draft202012Validator(SCHEMA)


def schema_errors(doc: _Doc, validator: jsonschema.Draft202012Validator = _validator) -> list[UserError]:
    """Schema violations as ``FILE:LINE: key: message`` errors, in file order."""
    out: list[tuple[int, UserError]] = []
    for e in validator.iter_errors(doc.value):
        path: PathT = tuple(e.absolute_path)
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            allowed = set(e.schema.get("properties", {}))
            for k in e.instance:
                if k not in allowed:
                    ue = doc.err((*path, k), f"unknown key (allowed: {', '.join(sorted(allowed))})")
                    out.append((doc.line((*path, k)), ue))
            continue
        if "propertyNames" in e.schema_path:
            bad = e.instance
            ue = doc.err((*path, bad), f"unknown knob (allowed: {', '.join(e.schema.get('enum', []))})")
            out.append((doc.line((*path, bad)), ue))
            continue
        if e.validator == "oneOf":
            desc = e.schema.get("description") or "value of the wrong type"
            msg = f"{e.instance!r} is not valid: expected {desc}"
        elif e.validator == "const" and path == ("version",):
            msg = f"unsupported version {e.instance!r} (this cachepilot reads version 1)"
        else:
            msg = e.message
        out.append((doc.line(path), doc.err(path, msg)))
    out.sort(key=lambda x: x[0])
    return [u for _, u in out]


def _section(cls: type, raw: dict[str, Any], base: Any, conv: dict[str, tuple[str, Any]]) -> Any:
    kwargs = {f: getattr(base, f) for f in cls.__dataclass_fields__}
    for key, value in raw.items():
        field, fn = conv.get(key, (key, None))
        kwargs[field] = fn(value) if fn else value
    return cls(**kwargs)


def _settings(raw: dict[str, Any], base: VolumePolicy, doc: _Doc, path: PathT) -> VolumePolicy:
    try:
        exposure = _section(
            Exposure, raw.get("exposure", {}), base.exposure,
            {"max_dirty": ("max_dirty", parse_size), "max_age": ("max_age_s", parse_duration)},
        )  # fmt: skip
        promotion = _section(
            Promotion, raw.get("promotion", {}), base.promotion,
            {"rate": ("rate", parse_size), "sieve_size": ("sieve_size", parse_size),
             "refresh_interval": ("refresh_interval_s", parse_duration)},
        )  # fmt: skip
        discard = _section(
            DiscardOnDelete, raw.get("discard_on_delete", {}), base.discard_on_delete,
            {"interval": ("interval_s", parse_duration), "min_extent": ("min_extent", parse_size),
             "max_rate": ("max_rate", parse_size)},
        )  # fmt: skip
        hysteresis = _section(
            Hysteresis, raw.get("hysteresis", {}), base.hysteresis,
            {"min_switch_interval": ("min_switch_interval_s", parse_duration)},
        )  # fmt: skip
        health = _section(HealthPolicy, raw.get("health", {}), base.health, {})
    except ValueError as exc:  # the schema already checked shapes; this is belt and braces
        raise doc.err(path, str(exc)) from None
    knobs = dict(base.knobs)
    knobs.update({k: str(v) for k, v in raw.get("knobs", {}).items()})
    if promotion.enabled and promotion.rate == 0:
        raise doc.err((*path, "promotion", "rate"), "promotion is enabled but its rate is 0")
    if discard.enabled and discard.interval_s <= 0:
        raise doc.err((*path, "discard_on_delete", "interval"), "batching interval must be > 0")
    return VolumePolicy(
        failure_model=raw.get("failure_model", base.failure_model),
        exposure=exposure,
        promotion=promotion,
        discard_on_delete=discard,
        hysteresis=hysteresis,
        health=health,
        knobs=knobs,
    )


def _covers(a: Selector, b: Selector) -> bool:
    """Every volume b selects is also selected by a (a conservative, decidable check)."""
    for attr in ("device", "fs_uuid", "mountpoint", "kind"):
        av, bv = getattr(a, attr), getattr(b, attr)
        if av is None:
            continue
        if bv is None:
            return False
        if attr == "device":
            if not fnmatch.fnmatchcase(bv, av):
                return False
        elif attr == "fs_uuid":
            if av.lower() != bv.lower():
                return False
        elif av.rstrip("/") != bv.rstrip("/"):
            return False
    return True


def _check_overlaps(doc: _Doc, rules: Sequence[Rule]) -> None:
    for i, r in enumerate(rules):
        for other in rules[:i]:
            if _covers(r.selector, other.selector) or _covers(other.selector, r.selector):
                raise UserError(
                    f"{doc.source}:{r.line}: volumes.{i}.match: selector {r.selector} of rule {r.name!r} "
                    f"overlaps rule {other.name!r} (line {other.line})"
                )


def raise_first(errors: list[UserError]) -> None:
    """One line: the first error, and how many more (with up to three of them)."""
    if errors:
        if len(errors) == 1:
            raise errors[0]
        more = "; ".join(str(e) for e in errors[1:4])
        raise UserError(f"{errors[0]} (and {len(errors) - 1} more: {more})")


def parse_policy(text: str, source: str = "<string>") -> Policy:
    doc = read_yaml(text, source)
    if not isinstance(doc.value, dict):
        raise UserError(f"{source}:{doc.line(())}: a policy file is a mapping (version, defaults, volumes)")
    raise_first(schema_errors(doc))
    raw = doc.value
    capcheck.check(raw, doc.err)
    defaults = _settings(raw.get("defaults", {}), VolumePolicy(), doc, ("defaults",))
    rules: list[Rule] = []
    for i, r in enumerate(raw.get("volumes", [])):
        sel = Selector(**r["match"])
        name = r.get("name") or f"volumes[{i}]"
        settings = {k: v for k, v in r.items() if k not in ("name", "match")}
        vp = _settings(settings, defaults, doc, ("volumes", i))
        rules.append(Rule(name=name, selector=sel, policy=vp, line=doc.line(("volumes", i, "match"))))
    _check_overlaps(doc, rules)
    half_life = parse_duration(raw.get("hotness", {}).get("half_life", 600))
    if half_life <= 0:
        raise doc.err(("hotness", "half_life"), "half-life must be > 0")
    return Policy(
        source=source,
        defaults=defaults,
        rules=tuple(rules),
        half_life_s=half_life,
        dry_run=bool(raw.get("dry_run", False)),
    )


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{p}: no such policy file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read policy file: {exc}") from None
    return parse_policy(text, str(p))


class PolicyStore:
    """Holds the active policy; a failed reload keeps the last good one."""

    def __init__(self, path: str | Path, initial: Policy | None = None) -> None:
        self.path = Path(path)
        self.policy = initial if initial is not None else load_policy(self.path)
        self.last_error: str | None = None
        self.generation = 1

    def reload(self) -> bool:
        try:
            new = load_policy(self.path)
        except UserError as exc:
            self.last_error = str(exc)
            return False
        self.policy = new
        self.last_error = None
        self.generation += 1
        return True
