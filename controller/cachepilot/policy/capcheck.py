"""Capability checks of a policy: every knob value typed and ranged for its knob, and no rule asking for a knob or a
mode that a kind of cache it can match cannot take (the declarative half of the table of kinds, capabilities.py, is
the one source).

Which kinds a rule can match: its ``kind`` selector if set; else what its ``device`` glob allows (bcache volumes are
named ``bcacheN``, device-mapper ones ``dm-N``); ``fs_uuid`` and ``mountpoint`` do not narrow it. ``defaults`` apply
to every kind, so their knobs are applied to the kinds that have them (and only type- and range-checked here).
``failure_model: auto`` means ``destructive`` on a kind without write-through (dm-writecache); a rule that can match
only such kinds may not ask for it.

Runs on the validated document (after the schema), before the policy is built; errors name the file and line.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

from cachepilot.capabilities import CAPABILITIES, KINDS, KNOBS, WRITETHROUGH, capabilities
from cachepilot.errors import UserError

PathT = tuple[str | int, ...]
ErrFn = Callable[[PathT, str], UserError]


def glob_can_start_with(glob: str, prefix: str) -> bool:
    """Could some name that starts with ``prefix`` match the fnmatch ``glob``? (Simulates the glob on the prefix.)"""
    tokens = _tokens(glob)
    states = _closure({0}, tokens)
    for ch in prefix:
        nxt: set[int] = set()
        for i in states:
            if i == len(tokens):
                continue
            tok = tokens[i]
            if tok == "*":
                nxt.add(i)
            elif tok == "?" or (tok.startswith("[") and fnmatch.fnmatchcase(ch, tok)) or tok == ch:
                nxt.add(i + 1)
        states = _closure(nxt, tokens)
        if not states:
            return False
    return bool(states)


def _tokens(glob: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "[":
            j = glob.find("]", i + 2)
            if j > 0:
                out.append(glob[i:j + 1])
                i = j + 1
                continue
        out.append(c)
        i += 1
    return out


def _closure(states: set[int], tokens: list[str]) -> set[int]:
    """A '*' may match nothing: add the states after it."""
    out = set(states)
    todo = list(states)
    while todo:
        i = todo.pop()
        if i < len(tokens) and tokens[i] == "*" and i + 1 not in out:
            out.add(i + 1)
            todo.append(i + 1)
    return out


def matchable_kinds(match: dict[str, Any]) -> tuple[str, ...]:
    kind = match.get("kind")
    if kind is not None:
        return (kind,)
    glob = match.get("device")
    if glob is None:
        return KINDS
    return tuple(k for k, c in CAPABILITIES.items() if glob_can_start_with(glob, c.device_prefix))


def _knob_values(knobs: dict[str, Any], path: PathT, err: ErrFn) -> None:
    for name, value in knobs.items():
        try:
            KNOBS[name].parse(value)
        except UserError as exc:
            raise err((*path, name), str(exc)) from None


def _rule(rule: dict[str, Any], path: PathT, err: ErrFn) -> None:
    kinds = matchable_kinds(rule.get("match", {}))
    can_match = ", ".join(kinds) or "none"
    knobs = KNOBS
    for name in rule.get("knobs", {}):
        lacking = [k for k in kinds if k not in knobs[name].kinds]
        if lacking:
            has = ", ".join(sorted(knobs[name].kinds))
            raise err((*path, "knobs", name), (
                f"knob {name} exists only on {has}, but this rule can match {can_match}"
                f" ({', '.join(lacking)} cannot take it): narrow it with match.kind"))
    if rule.get("failure_model") == "auto" and kinds and all(WRITETHROUGH not in capabilities(k).modes
                                                              for k in kinds):
        raise err((*path, "failure_model"), (
            f"auto chooses between write-through and write-back, but {can_match} does not have write-through:"
            " use destructive or recoverable"))


def check(raw: dict[str, Any], err: ErrFn) -> None:
    """Raise the first capability error of a schema-valid policy document."""
    _knob_values(raw.get("defaults", {}).get("knobs", {}), ("defaults", "knobs"), err)
    for i, rule in enumerate(raw.get("volumes", [])):
        _knob_values(rule.get("knobs", {}), ("volumes", i, "knobs"), err)
        _rule(rule, ("volumes", i), err)
