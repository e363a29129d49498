"""Turn a schema-valid policy document into the typed policy: each key converted by its row of the field table
(``policy/fields.py``: sizes and durations parsed and ranged, a rule's knobs added to the defaults'), then the checks
that span keys (a large-file class above the sieve, a rate that lets an extent through, pins that can be read).

A rule's settings start from the file's defaults: a key it does not name keeps the defaults' value. Errors name the
file, line and key (``Doc.err``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cachepilot.policy.fields import SETTINGS, TOP, Row, by_key
from cachepilot.policy.model import Pin, Promotion, SequentialSteering, VolumePolicy
from cachepilot.policy.pinpaths import pattern_error
from cachepilot.policy.reader import Doc, PathT

_SETTINGS = by_key(SETTINGS)
_TOP = by_key(TOP)


def _value(row: Row, raw: Any, base: Any, doc: Doc, path: PathT) -> Any:
    """One key's model value: a section converted key by key over ``base``; a value through its kind's parser."""
    if row.is_section:
        return _section(row.rows, raw, base, doc, path)
    assert row.value is not None
    try:  # the schema checked shapes; ranges and units are checked here
        new = row.value.convert(raw) if row.value.convert else raw
    except ValueError as exc:
        raise doc.err(path, str(exc)) from None
    return {**base, **new} if row.value.merge else new


def _section(table: tuple[Row, ...], raw: dict[str, Any], base: Any, doc: Doc, path: PathT) -> Any:
    """The keys the document names (in its order), each over ``base``'s value; the rest as ``base`` has them."""
    rows = by_key(table)
    changes = {rows[k].attr: _value(rows[k], v, getattr(base, rows[k].attr), doc, (*path, k)) for k, v in raw.items()}
    return replace(base, **changes)


def _large_files(promotion: Promotion, doc: Doc, path: PathT) -> None:
    large = promotion.large_files
    if large.enabled and large.max_size <= promotion.sieve_size:
        raise doc.err((*path, "large_files", "max_size"), f"max_size {large.max_size} is not above sieve_size "
                      f"{promotion.sieve_size}: the large-file class would be empty")


def _window(steering: SequentialSteering, doc: Doc, path: PathT) -> None:
    if steering.enabled and steering.window_s <= 0:
        raise doc.err((*path, "window"), "the steering window must be > 0")


# checks of one section, made as soon as it is converted (before the sections after it)
_SECTION_CHECKS: dict[str, Callable[[Any, Doc, PathT], None]] = {
    "promotion": _large_files, "sequential_steering": _window,
}


def _across(vp: VolumePolicy, doc: Doc, path: PathT) -> None:
    """The checks that span sections (before ``pin``, which needs the promotion settings)."""
    promotion, discard, hold = vp.promotion, vp.discard_on_delete, vp.lifetime_hold
    if promotion.enabled and promotion.rate == 0:
        raise doc.err((*path, "promotion", "rate"), "promotion is enabled but its rate is 0")
    burst_s = max(1.0, discard.interval_s)  # the engine's discard budget holds this long of max_rate
    if discard.enabled and discard.max_rate * burst_s < max(1, discard.min_extent):
        raise doc.err((*path, "discard_on_delete", "max_rate"),
                      f"max_rate x {burst_s:g} s ({discard.max_rate} B/s) is below "
                      f"min_extent ({discard.min_extent} B): no extent could ever be released")
    if vp.exposure.max_age_s <= 0:
        raise doc.err((*path, "exposure", "max_age"), "the exposure age bound must be > 0")
    if hold.share <= 0 or hold.max_hold_s <= 0:
        key = "share" if hold.share <= 0 else "max_hold"
        raise doc.err((*path, "lifetime_hold", key), f"lifetime_hold {key} must be > 0")


def _pin(pin: Pin, promotion: Promotion, doc: Doc, path: PathT) -> None:
    """``pin:`` (paths and max_bytes required by the schema); the cap against the cache's room is checked when
    a volume is adopted (Pin.check_room), where the cache's size is known."""
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


def settings(raw: dict[str, Any], base: VolumePolicy, doc: Doc, path: PathT) -> VolumePolicy:
    """``defaults`` (over the built-in policy) or one rule's settings (over the file's defaults). Sections are
    converted in the table's order, whatever the file's, so the first error reported does not depend on it."""
    changes: dict[str, Any] = {}
    for row in SETTINGS:
        if row.key == "pin" or row.key not in raw:
            continue
        here = (*path, row.key)
        changes[row.attr] = value = _value(row, raw[row.key], getattr(base, row.attr), doc, here)
        if row.key in _SECTION_CHECKS:
            _SECTION_CHECKS[row.key](value, doc, here)
    vp = replace(base, **changes)
    _across(vp, doc, path)
    if "pin" in raw:
        pin_path = (*path, "pin")
        vp = replace(vp, pin=_value(_SETTINGS["pin"], raw["pin"], base.pin, doc, pin_path))
        _pin(vp.pin, vp.promotion, doc, pin_path)
    return vp


def half_life(raw: dict[str, Any], doc: Doc) -> float:
    """``hotness.half_life`` in seconds (the table's default where the file has none)."""
    row, path = _TOP["hotness.half_life"], ("hotness", "half_life")
    given = raw.get("hotness", {}).get("half_life")
    value: float = row.default if given is None else _value(row, given, row.default, doc, path)
    if value < 1:
        raise doc.err(path, "half-life must be at least 1 s (counters decay per tick)")
    return value


def dry_run(raw: dict[str, Any]) -> bool:
    return bool(raw.get("dry_run", _TOP["dry_run"].default))
