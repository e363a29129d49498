"""Read a YAML document keeping the line of every key and value, and report problems as ``FILE:LINE: key: message``
(shared by the policy loader and the daemon's configuration).

PyYAML's event stream carries a mark (line, column) on every node; we build plain Python values and a map from each
value's path to its line, and point every schema error at the offending key. Duplicate keys are errors.

Hostile input is bounded before anything is built: the event stream is checked as it is walked (no anchors or
aliases -- an alias bomb expands exponentially --, nesting at most :data:`MAX_DEPTH`, at most :data:`MAX_NODES`
nodes, :data:`MAX_ITEMS` in one list or mapping), merge keys are refused, numbers are finite and in range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from cachepilot.errors import UserError
from cachepilot.policy.schemacheck import Schema, is_valid
from cachepilot.policy.values import MAX_SIZE

PathT = tuple[str | int, ...]

MAX_DEPTH = 32  # the schema needs 5 levels
MAX_NODES = 300_000  # 10 000 rules of 30 nodes; a million took 200 MB to refuse (a 4 MiB file can hold two)
# items in one list or mapping, counted as they are parsed (before the schema, whose error for a long list quoted
# all of it: a 4 MiB pin.paths list was an error line of 4 MiB). The longest list a policy has is its volume rules.
MAX_ITEMS = 10_000
MAX_MESSAGE = 160  # characters of one schema message (it may quote the offending value)
MAX_NUMBER_CHARS = 40  # longer digit strings are not sizes or durations (and int() of them is slow)


@dataclass
class Doc:
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


def _scalar(node: yaml.ScalarNode, doc: Doc) -> Any:
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


def _place(stack: list[_Frame], doc: Doc, value: Any, line: int) -> PathT:
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


def _key(top: _Frame, ev: yaml.ScalarEvent, doc: Doc, line: int) -> None:
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


def _walk(text: str, doc: Doc) -> None:
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


def read_yaml(text: str, source: str, what: str = "policy file") -> Doc:
    """Parse YAML keeping the line of every key and value (shared by the policy and the daemon's config)."""
    doc = Doc(source, None, {}, {})
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


def schema_errors(doc: Doc, schema: Schema) -> list[UserError]:
    """Schema violations as ``FILE:LINE: key: message`` errors, in file order. A valid document is told apart without
    jsonschema (policy/schemacheck.py: ~6 MiB of the daemon's RSS); only an invalid one imports it, for its words."""
    if is_valid(doc.value, schema):
        return []
    import jsonschema  # noqa: PLC0415 -- lazy on purpose (above)

    out: list[tuple[int, UserError]] = []
    for e in jsonschema.Draft202012Validator(schema).iter_errors(doc.value):
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


def raise_first(errors: list[UserError]) -> None:
    """One line: the first error, and how many more (with up to three of them)."""
    if errors:
        if len(errors) == 1:
            raise errors[0]
        more = "; ".join(str(e) for e in errors[1:4])
        raise UserError(f"{errors[0]} (and {len(errors) - 1} more: {more})")
