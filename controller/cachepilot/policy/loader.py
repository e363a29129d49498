"""Load a policy file: YAML with line numbers, JSON-Schema validation, errors as ``FILE:LINE: key: message``.

PyYAML's ``compose`` keeps a mark (line, column) on every node; we build plain Python values and a map
from each value's path to its line, validate with jsonschema, and point every error at the offending key.
Unknown keys and duplicate keys are errors.

Hostile input is bounded before anything is built: at most :data:`MAX_POLICY_BYTES` are read, the event
stream is checked first (no anchors or aliases -- an alias bomb expands exponentially --, nesting at most
:data:`MAX_DEPTH`, at most :data:`MAX_NODES` nodes), merge keys are refused, numbers are finite and in
range, and the overlap check between rules is indexed rather than pairwise.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cachepilot import units
from cachepilot.errors import UserError
from cachepilot.policy import capcheck
from cachepilot.policy.model import (
    DiscardOnDelete,
    Exposure,
    HealthPolicy,
    Hysteresis,
    LargeFiles,
    LifetimeHold,
    Pin,
    Policy,
    Promotion,
    Rule,
    Selector,
    SequentialSteering,
    VolumePolicy,
)
from cachepilot.policy.pinpaths import pattern_error
from cachepilot.policy.schema import SCHEMA
from cachepilot.safeio import read_text

PathT = tuple[str | int, ...]

_DUR = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

MAX_POLICY_BYTES = 4 << 20  # a policy with 10 000 rules is about 1 MiB
MAX_DEPTH = 32  # the schema needs 5 levels
MAX_NODES = 300_000  # 10 000 rules of 30 nodes; a million took 200 MB to refuse (a 4 MiB file can hold two)
# items in one list or mapping, counted as they are parsed (before the schema, whose error for a long list quoted
# all of it: a 4 MiB pin.paths list was an error line of 4 MiB). The longest list a policy has is its volume rules.
MAX_ITEMS = 10_000
MAX_MESSAGE = 160  # characters of one schema message (it may quote the offending value)
MAX_NUMBER_CHARS = 40  # longer digit strings are not sizes or durations (and int() of them is slow)
MAX_SIZE = 1 << 60  # 1 EiB
MAX_DURATION_S = 366 * 86400.0  # a year
MIN_DURATION_S = 0.001  # below a millisecond a duration is a typo (and divides ticks into nothing)
MAX_RULES = 10_000
MAX_GLOB_RULES = 256  # rules whose device is a glob are compared with every rule (n x globs)


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


_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})
_constructor = yaml.constructor.SafeConstructor()


def _scalar(node: yaml.ScalarNode, doc: _Doc) -> Any:
    """One scalar with the safe constructor; only str, bool, null and bounded finite numbers."""
    if node.tag == _STR_TAG:
        return node.value
    line = node.start_mark.line + 1
    if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
        raise UserError(f"{doc.source}:{line}: number too long ({len(node.value)} characters)")
    try:
        v = _constructor.construct_object(node)
    except (yaml.YAMLError, ValueError) as exc:
        raise UserError(f"{doc.source}:{line}: bad value {node.value[:40]!r}: {exc}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise UserError(f"{doc.source}:{line}: {node.value!r} is not a finite number")
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_SIZE:
        raise UserError(f"{doc.source}:{line}: number {node.value!r} is out of range (at most 2^60)")
    if v is not None and not isinstance(v, str | int | float | bool):
        raise UserError(f"{doc.source}:{line}: unsupported value {node.value[:40]!r} "
                        f"(a YAML {type(v).__name__}; quote it if it is a string)")
    return v


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_resolver = yaml.resolver.Resolver()
_COLLECTION_TAGS = frozenset({None, "!", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
_NO_KEY = object()


class _Frame:
    """An open mapping or sequence while the event stream is walked."""

    __slots__ = ("value", "path", "key", "key_line")

    def __init__(self, value: dict[str, Any] | list[Any], path: PathT) -> None:
        self.value = value
        self.path = path
        self.key: Any = _NO_KEY
        self.key_line = 0


def _place(stack: list[_Frame], doc: _Doc, value: Any, line: int) -> PathT:
    """Put a value where the stream says (root, next list item, or the pending key); its path."""
    if not stack:
        doc.value = value
        doc.lines[()] = line
        return ()
    top = stack[-1]
    if len(top.value) >= MAX_ITEMS:
        where = ".".join(str(x) for x in top.path) or "(top level)"
        raise UserError(f"{doc.source}:{line}: {where}: too many items in one "
                        f"{'list' if isinstance(top.value, list) else 'mapping'} (at most {MAX_ITEMS})")
    if isinstance(top.value, list):
        path = (*top.path, len(top.value))
        top.value.append(value)
    else:
        path = (*top.path, top.key)
        top.value[top.key] = value
        doc.key_lines[path] = top.key_line
        top.key = _NO_KEY
    doc.lines[path] = line
    return path


def _key(top: _Frame, ev: yaml.ScalarEvent, doc: _Doc, line: int) -> None:
    node = yaml.ScalarNode(_tag(ev), ev.value, ev.start_mark, ev.end_mark, ev.style)
    if node.tag == _MERGE_TAG:
        raise UserError(f"{doc.source}:{line}: merge keys (<<) are not supported")
    key = _scalar(node, doc)
    if not isinstance(key, str):
        raise UserError(f"{doc.source}:{line}: keys must be strings: {key!r}")
    if key in top.value:
        raise UserError(f"{doc.source}:{line}: {key}: duplicate key")
    top.key, top.key_line = key, line


def _tag(ev: yaml.ScalarEvent) -> str:
    if ev.tag is None or ev.tag == "!":
        return str(_resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit))
    return str(ev.tag)


def _walk(text: str, doc: _Doc) -> None:
    """Build plain values (and the line map) straight from the parser's event stream, iteratively: no
    recursion, no node tree, one pass. Anchors and aliases are refused (an alias bomb expands
    exponentially), as are nesting beyond MAX_DEPTH, more than MAX_NODES nodes and a second document."""
    src = doc.source
    stack: list[_Frame] = []
    nodes = docs = 0
    for ev in yaml.parse(text, Loader=_LOADER):
        line = ev.start_mark.line + 1 if ev.start_mark else 1
        if isinstance(ev, yaml.AliasEvent):
            raise UserError(f"{src}:{line}: YAML aliases (*{ev.anchor}) are not allowed in a policy")
        if isinstance(ev, yaml.DocumentStartEvent):
            docs += 1
            if docs > 1:
                raise UserError(f"{src}:{line}: more than one YAML document")
        if not isinstance(ev, yaml.NodeEvent | yaml.CollectionEndEvent):
            continue
        if isinstance(ev, yaml.CollectionEndEvent):
            stack.pop()
            continue
        if ev.anchor is not None:
            raise UserError(f"{src}:{line}: YAML anchors (&{ev.anchor}) are not allowed in a policy")
        nodes += 1
        if nodes > MAX_NODES:
            raise UserError(f"{src}:{line}: more than {MAX_NODES} YAML nodes")
        top = stack[-1] if stack else None
        wants_key = top is not None and isinstance(top.value, dict) and top.key is _NO_KEY
        if isinstance(ev, yaml.ScalarEvent):
            if wants_key:
                _key(top, ev, doc, line)  # type: ignore[arg-type]
            else:
                node = yaml.ScalarNode(_tag(ev), ev.value, ev.start_mark, ev.end_mark, ev.style)
                _place(stack, doc, _scalar(node, doc), line)
            continue
        if wants_key:
            raise UserError(f"{src}:{line}: keys must be strings, not a mapping or a list")
        if ev.tag not in _COLLECTION_TAGS:
            raise UserError(f"{src}:{line}: unsupported YAML tag {ev.tag}")
        if len(stack) >= MAX_DEPTH:
            raise UserError(f"{src}:{line}: nested deeper than {MAX_DEPTH} levels")
        value: dict[str, Any] | list[Any] = {} if isinstance(ev, yaml.MappingStartEvent) else []
        stack.append(_Frame(value, _place(stack, doc, value, line)))


def read_yaml(text: str, source: str, what: str = "policy file") -> _Doc:
    """Parse YAML keeping the line of every key and value (shared by the policy and the daemon's config)."""
    doc = _Doc(source, None, {}, {})
    try:
        _walk(text, doc)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UserError(f"{source}:{line}: YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}:1: YAML error: {exc}") from None
    if doc.value is None:
        raise UserError(f"{source}:1: empty {what}")
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
            msg = f"{_short(repr(e.instance))} is not valid: expected {desc}"
        elif e.validator in ("maxItems", "minItems") and isinstance(e.instance, list):
            msg = f"{len(e.instance)} items (at {'most' if e.validator == 'maxItems' else 'least'} {e.validator_value})"
        elif e.validator == "const" and path == ("version",):
            msg = f"unsupported version {e.instance!r} (this cachepilot reads version 1)"
        else:
            msg = _short(e.message)
        out.append((doc.line(path), doc.err(path, msg)))
    out.sort(key=lambda x: x[0])
    return [u for _, u in out]


def _short(text: str) -> str:
    """One short line of a message that may quote a value of any size."""
    text = text.replace("\n", " ")
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}... ({len(text)} characters)"


def _section(cls: type, raw: dict[str, Any], base: Any, conv: dict[str, tuple[str, Any]], doc: _Doc,
             path: PathT) -> Any:
    kwargs = {f.name: getattr(base, f.name) for f in fields(cls)}
    for key, value in raw.items():
        field, fn = conv.get(key, (key, None))
        try:
            kwargs[field] = fn(value) if fn else value
        except ValueError as exc:  # the schema checked shapes; ranges and units are checked here
            raise doc.err((*path, key), str(exc)) from None
    return cls(**kwargs)


def _settings(raw: dict[str, Any], base: VolumePolicy, doc: _Doc, path: PathT) -> VolumePolicy:
    def sec(name: str, cls: type, b: Any, conv: dict[str, tuple[str, Any]]) -> Any:
        if name not in raw:
            return b
        return _section(cls, raw.get(name, {}), b, conv, doc, (*path, name))

    exposure = sec("exposure", Exposure, base.exposure,
                   {"max_dirty": ("max_dirty", parse_size), "max_age": ("max_age_s", parse_duration)})
    hold = sec("lifetime_hold", LifetimeHold, base.lifetime_hold, {"max_hold": ("max_hold_s", parse_duration)})
    large_path = (*path, "promotion", "large_files")
    promotion = sec("promotion", Promotion, base.promotion,
                    {"rate": ("rate", parse_size), "sieve_size": ("sieve_size", parse_size),
                     "refresh_interval": ("refresh_interval_s", parse_duration),
                     "large_files": ("large_files", lambda v: _section(
                         LargeFiles, v, base.promotion.large_files, {"max_size": ("max_size", parse_size)}, doc,
                         large_path))})
    if promotion.large_files.enabled and promotion.large_files.max_size <= promotion.sieve_size:
        raise doc.err((*large_path, "max_size"), f"max_size {promotion.large_files.max_size} is not above "
                      f"sieve_size {promotion.sieve_size}: the large-file class would be empty")
    discard = sec("discard_on_delete", DiscardOnDelete, base.discard_on_delete,
                  {"interval": ("interval_s", parse_duration), "min_extent": ("min_extent", parse_size),
                   "max_rate": ("max_rate", parse_size)})
    hysteresis = sec("hysteresis", Hysteresis, base.hysteresis,
                     {"min_switch_interval": ("min_switch_interval_s", parse_duration)})
    health = sec("health", HealthPolicy, base.health, {"stall_after": ("stall_after_s", parse_duration)})
    steering = sec("sequential_steering", SequentialSteering, base.sequential_steering,
                   {"max_cutoff": ("max_cutoff", parse_size), "window": ("window_s", parse_duration)})
    if steering.enabled and steering.window_s <= 0:
        raise doc.err((*path, "sequential_steering", "window"), "the steering window must be > 0")
    knobs = dict(base.knobs)
    knobs.update({k: str(v) for k, v in raw.get("knobs", {}).items()})
    if promotion.enabled and promotion.rate == 0:
        raise doc.err((*path, "promotion", "rate"), "promotion is enabled but its rate is 0")
    burst_s = max(1.0, discard.interval_s)  # the engine's discard budget holds this long of max_rate
    if discard.enabled and discard.max_rate * burst_s < max(1, discard.min_extent):
        raise doc.err((*path, "discard_on_delete", "max_rate"),
                      f"max_rate x {burst_s:g} s ({discard.max_rate} B/s) is below "
                      f"min_extent ({discard.min_extent} B): no extent could ever be released")
    if exposure.max_age_s <= 0:
        raise doc.err((*path, "exposure", "max_age"), "the exposure age bound must be > 0")
    if hold.share <= 0 or hold.max_hold_s <= 0:
        key = "share" if hold.share <= 0 else "max_hold"
        raise doc.err((*path, "lifetime_hold", key), f"lifetime_hold {key} must be > 0")
    pin = _pin(raw.get("pin"), base.pin, promotion, doc, (*path, "pin"))
    return VolumePolicy(
        failure_model=raw.get("failure_model", base.failure_model),
        exposure=exposure,
        lifetime_hold=hold,
        promotion=promotion,
        discard_on_delete=discard,
        hysteresis=hysteresis,
        health=health,
        knobs=knobs,
        sequential_steering=steering,
        pin=pin,
    )


def _pin(raw: dict[str, Any] | None, base: Pin, promotion: Promotion, doc: _Doc, path: PathT) -> Pin:
    """``pin:`` (paths and max_bytes required by the schema); the cap against the cache's room is checked when
    a volume is adopted (Pin.check_room), where the cache's size is known."""
    if raw is None:
        return base
    pin = _section(Pin, raw, base, {"paths": ("paths", tuple), "max_bytes": ("max_bytes", parse_size),
                                    "refresh": ("refresh_s", parse_duration)}, doc, path)
    for i, p in enumerate(pin.paths):
        why = pattern_error(p)
        if why is not None:
            raise doc.err((*path, "paths", i), why)
    if pin.paths and pin.max_bytes == 0:
        raise doc.err((*path, "max_bytes"), "pins need a cap above 0 bytes")
    if pin.paths and not promotion.enabled:
        raise doc.err(path, "pinned files are promoted by reading: promotion must be enabled")
    if pin.refresh_s == 0:
        raise doc.err((*path, "refresh"), "the refresh interval must be > 0")
    return pin


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


def _is_glob(sel: Selector) -> bool:
    return sel.device is not None and any(ch in sel.device for ch in "*?[")


def _items(sel: Selector) -> tuple[tuple[str, str], ...]:
    """The selector's set attributes, canonical (as _covers compares them)."""
    out = []
    if sel.device is not None:
        out.append(("device", sel.device))
    if sel.fs_uuid is not None:
        out.append(("fs_uuid", sel.fs_uuid.lower()))
    if sel.mountpoint is not None:
        out.append(("mountpoint", sel.mountpoint.rstrip("/")))
    if sel.kind is not None:
        out.append(("kind", sel.kind))
    return tuple(out)


def _subsets(items: tuple[tuple[str, str], ...]) -> list[tuple[tuple[str, str], ...]]:
    return [c for n in range(len(items) + 1) for c in itertools.combinations(items, n)]


def _first_overlap(rules: Sequence[Rule]) -> tuple[int, int] | None:
    """The first rule that covers or is covered by an earlier one (_covers), and that earlier rule (indices); in
    O(n x (16 + glob rules)) instead of O(n^2).

    A literal selector a covers b exactly when a's attributes are a subset of b's (with equal values), so
    each rule is looked up by its own attributes among the earlier rules' subsets and vice versa; glob
    selectors are compared with every rule."""
    by_items: dict[tuple[tuple[str, str], ...], int] = {}  # earlier literal rules, by their attributes
    by_subset: dict[tuple[tuple[str, str], ...], int] = {}  # earlier rules, by each subset of theirs
    earlier_globs: list[int] = []
    for i, r in enumerate(rules):
        items = _items(r.selector)
        glob = _is_glob(r.selector)
        other = next((by_items[s] for s in _subsets(items) if s in by_items), None)  # a literal covers r
        if other is None:
            other = next((g for g in earlier_globs if _covers(rules[g].selector, r.selector)), None)
        if other is None and not glob:
            other = by_subset.get(items)  # r covers an earlier rule
        elif other is None:
            other = next((j for j in range(i) if _covers(r.selector, rules[j].selector)), None)
        if other is not None:
            return i, other
        if glob:
            earlier_globs.append(i)
        else:
            by_items.setdefault(items, i)
        for s in _subsets(items):
            by_subset.setdefault(s, i)
    return None


def _check_size(rules: Sequence[Rule], err: Any, where: str = "") -> None:
    """The bounds that keep the overlap check linear (``err(msg)`` makes the error)."""
    if len(rules) > MAX_RULES:
        raise err(f"{len(rules)} volume rules{where} (at most {MAX_RULES})")
    globs = sum(1 for r in rules if _is_glob(r.selector))
    if globs > MAX_GLOB_RULES:
        raise err(f"{globs} rules with a device glob{where} (at most {MAX_GLOB_RULES})")


def _check_overlaps(doc: _Doc, rules: Sequence[Rule]) -> None:
    """No two rules of one file where one covers the other."""
    _check_size(rules, lambda msg: doc.err(("volumes",), msg))
    hit = _first_overlap(rules)
    if hit is not None:
        i, j = hit
        r, other = rules[i], rules[j]
        raise UserError(
            f"{doc.source}:{r.line}: volumes.{i}.match: selector {r.selector} of rule {r.name!r} "
            f"overlaps rule {other.name!r} (line {other.line})"
        )


def check_combined(policies: Sequence[Policy]) -> None:
    """Several policy files that one daemon combines (each valid alone): no rule of one file may overlap a rule of
    another, by the same definition as within a file -- else the daemon could only refuse the volume they both
    select. UserError naming both files and lines."""
    rules = [r for p in policies for r in p.rules]
    sources = [p.source for p in policies for _ in p.rules]
    _check_size(rules, lambda msg: UserError(f"{' + '.join(p.source for p in policies)}: {msg}"),
                " across the policy files")
    hit = _first_overlap(rules)
    if hit is not None:
        i, j = hit
        r, other = rules[i], rules[j]
        raise UserError(
            f"{sources[i]}:{r.line}: selector {r.selector} of rule {r.name!r} overlaps rule {other.name!r} "
            f"({sources[j]}:{other.line}); the daemon would leave the volumes both select unmanaged"
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
    vols = doc.value.get("volumes")
    if isinstance(vols, list) and len(vols) > MAX_RULES:  # before the schema walks them all
        raise doc.err(("volumes",), f"{len(vols)} volume rules (at most {MAX_RULES})")
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
    try:
        half_life = parse_duration(raw.get("hotness", {}).get("half_life", 600))
    except ValueError as exc:
        raise doc.err(("hotness", "half_life"), str(exc)) from None
    if half_life < 1:
        raise doc.err(("hotness", "half_life"), "half-life must be at least 1 s (counters decay per tick)")
    return Policy(
        source=source,
        defaults=defaults,
        rules=tuple(rules),
        half_life_s=half_life,
        dry_run=bool(raw.get("dry_run", False)),
    )


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    text = read_text(p, "policy file", MAX_POLICY_BYTES)  # never blocks on a FIFO, never slurps /dev/zero
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
