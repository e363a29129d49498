"""``docs/policy-reference.md``, made from the policy's field table (``policy/fields.py``):

    python -m cachepilot.policy.reference > docs/policy-reference.md

(``make generated``; a unit test keeps the committed file identical to this).
"""

from __future__ import annotations

from typing import Any

from cachepilot.policy.fields import SELECTOR, SETTINGS, TOP, Row, leaves
from cachepilot.policy.values import DURATION, SIZE

_SIZES = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DURATIONS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def shown(row: Row) -> str:
    """A default as an operator would write it in the policy (``64MiB``, ``10m``, ``true``)."""
    v: Any = row.default
    if v is None:
        return "(none)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if row.value is SIZE and v:
        return next((f"{v // n}{unit}" for unit, n in _SIZES if v % n == 0), str(v))
    if row.value is DURATION and v:
        whole = next((f"{int(v // n)}{unit}" for unit, n in _DURATIONS if v % n == 0), None)
        return whole or f"{v * 1000:g}ms"
    if isinstance(v, tuple | list):
        return "[]" if not v else str(list(v))
    if isinstance(v, dict):
        return "{}" if not v else str(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def _table(table: tuple[Row, ...], prefix: tuple[str, ...] = ()) -> list[str]:
    out = ["| key | value | default | meaning |", "|---|---|---|---|"]
    for path, row in leaves(table, prefix):
        assert row.value is not None
        out.append(f"| `{'.'.join(path)}` | {row.value.name} | `{shown(row)}` | {row.doc} |")
    return out


def _sections(table: tuple[Row, ...]) -> list[str]:
    """The section-less keys in one table, then each section under a heading of its own."""
    plain = tuple(r for r in table if not r.is_section)
    out = _table(plain)
    for r in table:
        if r.is_section:
            required = r.extras.get("required")
            needs = f" (required within it: {', '.join(f'`{k}`' for k in required)})" if required else ""
            out += ["", f"### `{r.key}`", "", f"{r.doc[0].upper()}{r.doc[1:]}{needs}.", "", *_table(r.rows, (r.key,))]
    return out


def render() -> str:
    lines = [
        "# Policy reference",
        "",
        "<!-- Generated from the policy's field table (controller/cachepilot/policy/model.py) by `make generated`;",
        "     do not edit: tests/unit/test_policy_table.py fails when this file differs from what the table makes. -->",
        "",
        "A policy file is YAML; its schema is `policies/schema.json`, made from the same table, and",
        "`cachepilot policy check FILE` checks a file (errors name `FILE:LINE: key`). Unknown and duplicate keys are",
        "errors. Sizes are bytes or a number with a unit (`64KiB`, `4MiB`, `1GiB`, `10MB`); durations are seconds or a",
        "number with a unit (`250ms`, `30s`, `5m`, `1h`, `1d`); a fraction is a number from 0 to 1.",
        "",
        "## The file",
        "",
        "| key | value | default | meaning |",
        "|---|---|---|---|",
        "| `version` | 1 | (required) | the policy format |",
        *_table(TOP)[2:],
        "| `defaults` | settings | | what every volume gets unless a rule says otherwise (below) |",
        "| `volumes` | list of rules | `[]` | each rule: `name`, `match` (a selector, below) and settings (below) |",
        "",
        "## Settings: `defaults` and each rule in `volumes`",
        "",
        "A rule's settings start from `defaults`: a key the rule does not name keeps the defaults' value (a rule's",
        "`knobs` add to the defaults' knobs).",
        "",
        *_sections(SETTINGS),
        "",
        "## Selectors: a rule's `match`",
        "",
        "At least one key; a volume matches when every key given matches, and may match at most one rule (rules",
        "that overlap are refused, also across the policy files one daemon reads).",
        "",
        *_table(SELECTOR),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
