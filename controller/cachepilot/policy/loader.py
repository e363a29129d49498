"""Load a policy file: read it (``policy/reader.py``: YAML with the line of every key, bounded against hostile
input), validate it against the schema and the kinds' capabilities, convert it (``policy/convert.py``) and refuse
overlapping rules (``policy/overlaps.py``). Errors are one line: ``FILE:LINE: key: message``.
"""

from __future__ import annotations

from pathlib import Path

from cachepilot.errors import UserError
from cachepilot.policy import capcheck, convert
from cachepilot.policy.model import Policy, Rule, Selector, VolumePolicy
from cachepilot.policy.overlaps import MAX_RULES, check_overlaps
from cachepilot.policy.reader import raise_first, read_yaml, schema_errors
from cachepilot.policy.schema import SCHEMA
from cachepilot.safeio import read_text

MAX_POLICY_BYTES = 4 << 20  # a policy with 10 000 rules is about 1 MiB



def parse_policy(text: str, source: str = "<string>") -> Policy:
    doc = read_yaml(text, source)
    if not isinstance(doc.value, dict):
        raise UserError(f"{source}:{doc.line(())}: a policy file is a mapping (version, defaults, volumes)")
    vols = doc.value.get("volumes")
    if isinstance(vols, list) and len(vols) > MAX_RULES:  # before the schema walks them all
        raise doc.err(("volumes",), f"{len(vols)} volume rules (at most {MAX_RULES})")
    raise_first(schema_errors(doc, SCHEMA))
    raw = doc.value
    capcheck.check(raw, doc.err)
    defaults = convert.settings(raw.get("defaults", {}), VolumePolicy(), doc, ("defaults",))
    rules: list[Rule] = []
    for i, r in enumerate(raw.get("volumes", [])):
        sel = Selector(**r["match"])
        name = r.get("name") or f"volumes[{i}]"
        settings = {k: v for k, v in r.items() if k not in ("name", "match")}
        vp = convert.settings(settings, defaults, doc, ("volumes", i))
        rules.append(Rule(name=name, selector=sel, policy=vp, line=doc.line(("volumes", i, "match"))))
    check_overlaps(doc, rules)
    return Policy(
        source=source,
        defaults=defaults,
        rules=tuple(rules),
        half_life_s=convert.half_life(raw, doc),
        dry_run=convert.dry_run(raw),
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
