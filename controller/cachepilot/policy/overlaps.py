"""Overlaps between volume rules: no two rules -- of one file, or of the files one daemon combines -- where one
selects every volume the other does (else the daemon could only refuse the volumes both select). The check is
indexed rather than pairwise, and bounded (:data:`MAX_RULES`, :data:`MAX_GLOB_RULES`) so it stays linear.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Sequence
from typing import Any

from cachepilot.errors import UserError
from cachepilot.policy.model import Policy, Rule, Selector
from cachepilot.policy.reader import Doc

MAX_RULES = 10_000
MAX_GLOB_RULES = 256  # rules whose device is a glob are compared with every rule (n x globs)


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


def check_overlaps(doc: Doc, rules: Sequence[Rule]) -> None:
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
