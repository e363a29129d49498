"""Metric families: a name, a help text, a type and samples (name, labels, value), as the exposition formats carry
them (exposition.py writes them out).

The constructors and ``add_metric`` are prometheus_client's (``GaugeMetricFamily``, ``CounterMetricFamily``,
``HistogramMetricFamily``: the same arguments give the same samples), so the collectors read as they did and the
tests build the same families with prometheus_client's classes and compare the bytes
(tests/unit/test_exposition.py). The daemon no longer imports prometheus_client: it pulls in http.server, email,
urllib and ssl, 4 MiB of the daemon's RSS with 1 M tracked files (issue 32). What we never use is left out:
timestamps, exemplars, ``_created`` samples, units, the other metric types.

Names are checked here, not where they are written: a metric or label name is a legacy Prometheus name without a
colon (``[a-zA-Z_][a-zA-Z0-9_]*``; a label name not starting with ``__``), so no name ever needs quoting and the
escaping schemes a scraper may ask for are simple (exposition.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def check_name(what: str, name: str) -> str:
    if not NAME.match(name) or (what == "label" and name.startswith("__")):
        raise ValueError(f"invalid {what} name {name!r}")
    return name


class Metric:
    """One family: its samples in the order they were added."""

    type: ClassVar[str]

    def __init__(self, name: str, documentation: str, labels: Sequence[str] | None) -> None:
        self.name = check_name("metric", name)
        self.documentation = documentation
        self._labelnames = tuple(check_name("label", n) for n in labels or ())
        self.samples: list[Sample] = []

    def _add(self, suffix: str, labels: Sequence[str], value: float, extra: tuple[tuple[str, str], ...] = ()) -> None:
        # zip, as prometheus_client does: a short or long label list is cut to the shorter, not refused
        self.samples.append(Sample(self.name + suffix, dict([*zip(self._labelnames, labels, strict=False), *extra]),
                                   value))


def _one_of(value: object, labels: object) -> None:
    if labels is not None and value is not None:
        raise ValueError("Can only specify at most one of value and labels.")


class GaugeMetricFamily(Metric):
    type = "gauge"

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None) -> None:
        _one_of(value, labels)
        super().__init__(name, documentation, labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self._add("", labels, value)


class CounterMetricFamily(Metric):
    """The family's name is without ``_total`` (a name given with it loses it); its samples carry it."""

    type = "counter"

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None) -> None:
        _one_of(value, labels)
        super().__init__(name.removesuffix("_total"), documentation, labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self._add("_total", labels, value)


class HistogramMetricFamily(Metric):
    type = "histogram"

    def __init__(self, name: str, documentation: str, *, labels: Sequence[str] | None = None) -> None:
        super().__init__(name, documentation, labels)

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float | None) -> None:
        """``buckets``: (upper bound as text, cumulative count), ``+Inf`` last; its count is the ``_count``."""
        for bound, count in buckets:
            self._add("_bucket", labels, count, (("le", bound),))
        if float(buckets[0][0]) >= 0 and sum_value is not None:  # prometheus_client: no sum with negative buckets
            self._add("_count", labels, buckets[-1][1])
            self._add("_sum", labels, sum_value)
