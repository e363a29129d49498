"""The daemon's counters: one flat table (``events.Barrier``, ``decisions.drain``, ``ticks``...) as the status and
the state file show it, and the grouped ones (events, decisions, failures by kind) kept as they are counted, so the
exporter reads them by kind and never parses the flat names back."""

from __future__ import annotations

from collections import Counter


class Counters(Counter[str]):
    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, Counter[str]] = {}

    def add(self, group: str, kind: str, n: int = 1) -> None:
        """Count ``n`` of ``kind`` in ``group``: the flat ``group.kind`` and the group's own table."""
        self[f"{group}.{kind}"] += n
        table = self.groups.get(group)
        if table is None:  # not setdefault: that builds a Counter on every call, and this runs per event
            table = self.groups[group] = Counter()
        table[kind] += n

    def group(self, name: str) -> dict[str, int]:
        return dict(self.groups.get(name, {}))
