"""Our exposition is prometheus_client's, byte for byte (issue 32: the daemon no longer imports it, 4 MiB of RSS).

The reference is the exporter as it was: the same collectors (collectors.py and registry.py, loaded afresh with
prometheus_client's metric family classes in place of ours), prometheus_client's ``ProcessCollector`` and registry,
and its ``generate_latest`` / OpenMetrics ``generate_latest`` / ``choose_encoder``. Both sides get one snapshot with
every metric family we export, label values no snapshot lets through (quotes, backslashes, newlines), values Go
writes differently from Python (``1e+06``, ``+Inf``, ``NaN``, integers as ``1.0``), a fixture /proc and one clock."""

from __future__ import annotations

import importlib.util
import itertools
import math
import socket
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import prometheus_client
import prometheus_client.core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_support import free_port, snapshot
from prometheus_client import exposition as pc_exposition
from prometheus_client.openmetrics import exposition as pc_openmetrics
from prometheus_client.registry import CollectorRegistry

from cachepilot.exporter import DaemonSnapshot, Registry, SnapshotBox, families, make_registry, serve
from cachepilot.exporter.exposition import negotiate, openmetrics, text
from cachepilot.exporter.process import ProcessMetrics

EXPORTER = Path(families.__file__).parent
HOSTILE = ('a"b', "c\\d", "e\nf", '\\"\n', "ü\u2028\t")
# Prometheus 2 and 3 as they ask, curl, and what each negotiation rule turns on
ACCEPTS = (
    "",
    "*/*",
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=underscores",
    "text/plain;version=1.0.0;escaping=dots",
    "text/plain;version=1.0.0;escaping=values",
    "text/plain;version=1.0.0;escaping=nonsense",
    "text/plain; version=1.1.0",
    "application/openmetrics-text",
    "application/openmetrics-text;version=0.0.1",
    "application/openmetrics-text;version=0.0.1, text/plain;version=1.0.0",
    "application/openmetrics-text; version=2.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "application/openmetrics-text;escaping=dots",
    "application/json, text/html",
)


def clock() -> Iterator[float]:
    return itertools.count(0.25, 0.0037).__next__  # type: ignore[return-value]


def fixture_proc(tmp: Path) -> str:
    """A /proc with a process whose name holds a space and a parenthesis (stat is split after the last one)."""
    me = tmp / "proc" / "self"
    (me / "fd").mkdir(parents=True)
    for fd in range(7):
        (me / "fd" / str(fd)).touch()
    (tmp / "proc" / "stat").write_text("cpu  1 2 3\nbtime 1764300000\nprocesses 9\n")
    fields = "S 1 1 0 0 -1 4194560 30000 0 0 0 1234 567 0 0 20 0 3 0 98765 1234567890 23456 18446744073709551615"
    (me / "stat").write_text(f"4242 (cache (pilot) d) {fields} 0 0 0\n")
    (me / "limits").write_text("Limit                     Soft Limit           Hard Limit           Units\n"
                               "Max cpu time              unlimited            unlimited            seconds\n"
                               "Max open files            1048576              1048576              files\n")
    return str(tmp / "proc")


def hostile(s: DaemonSnapshot) -> DaemonSnapshot:
    """Every label value that is not a fixed word made hostile, and the values formatting must get right. The
    snapshot refuses such labels (check_label_value) but for version and kernel; the encoder must not rely on it."""
    s = replace(s, version=HOSTILE[0], kernel=HOSTILE[1], bpf_object=HOSTILE[2], capture=HOSTILE[4],
                stage_seconds={"sample": 1e6, "between": 123456789012.5, "decide": 1e22, "act": 2.0**70},
                stage_cpu_seconds={"sample": 1e-05, "decide": -1234567.5, "act": 0.1 + 0.2})
    for name, table in (("events", s.events), ("drops", s.drops), ("decisions", s.decisions)):
        object.__setattr__(s, name, {**table, HOSTILE[3]: 7})
    bcache, dmcache = s.volumes
    for v, name in ((bcache, HOSTILE[0]), (dmcache, HOSTILE[2])):
        object.__setattr__(v, "volume", name)
        object.__setattr__(v, "device", HOSTILE[1] + name)
    object.__setattr__(bcache, "cache_set", HOSTILE[4])
    object.__setattr__(bcache, "dirty_age_seconds", math.nan)
    object.__setattr__(bcache, "clean_eta_seconds", math.inf)
    object.__setattr__(bcache, "promotion_rate", -math.inf)
    object.__setattr__(bcache, "cache_bytes", 10**6)
    object.__setattr__(dmcache, "cache_bytes", 1 << 40)
    object.__setattr__(s.unmanaged[0], "device", HOSTILE[3])
    return s


def fixture_box() -> SnapshotBox:
    box = SnapshotBox()
    box.publish(hostile(snapshot(step=10)))
    return box


def reference_registry(box: SnapshotBox, proc: str) -> CollectorRegistry:
    """The exporter before our encoder: our collectors building prometheus_client's families, its process collector
    and registry. collectors.py and registry.py are loaded afresh, reading prometheus_client's classes as
    ``cachepilot.exporter.families``; the real modules are untouched."""
    shim = types.ModuleType("cachepilot.exporter.families")
    for name in ("GaugeMetricFamily", "CounterMetricFamily", "HistogramMetricFamily", "Metric"):
        setattr(shim, name, getattr(prometheus_client.core, name))

    def load(name: str) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(f"cachepilot.exporter.{name}", EXPORTER / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    with mock.patch.dict(sys.modules, {"cachepilot.exporter.families": shim}):
        collectors = load("collectors")
        with mock.patch.dict(sys.modules, {"cachepilot.exporter.collectors": collectors}):
            registry = load("registry")
    assert registry.GaugeMetricFamily is prometheus_client.core.GaugeMetricFamily
    ours = CollectorRegistry(auto_describe=False)
    ours.register(registry.SnapshotCollector(box, clock=clock()))
    prometheus_client.ProcessCollector(namespace="cachepilot", proc=proc, registry=ours)
    return ours


def both(tmp_path: Path, box: SnapshotBox | None = None) -> tuple[Registry, CollectorRegistry]:
    box = box or fixture_box()
    proc = fixture_proc(tmp_path)
    return make_registry(box, proc=proc, clock=clock()), reference_registry(box, proc)


@pytest.mark.parametrize("accept", ACCEPTS)
def test_every_family_is_prometheus_clients_bytes_in_the_format_the_scraper_asks_for(tmp_path: Path,
                                                                                      accept: str) -> None:
    ours, theirs = both(tmp_path)
    encode, ctype = negotiate(accept)
    their_encode, their_ctype = pc_exposition.choose_encoder(accept)
    assert ctype == their_ctype
    mine, reference = encode(ours.collect()), their_encode(theirs)
    assert mine == reference


def test_the_fixture_has_every_family_hostile_labels_and_hard_values(tmp_path: Path) -> None:
    ours, _ = both(tmp_path)
    body = text(ours.collect()).decode()
    for needle in (r'version="a\"b"', r'kernel="c\\d"', r'bpf_object="e\nf"', r'kind="\\\"\n"',
                   "cachepilot_volume_cache_size_bytes{", "1e+06", "1.099511627776e+12", "1.234567890125e+11",
                   "1e+22", "1e-05", "-1234567.5", "NaN", "+Inf", "-Inf", "cachepilot_ready 1.0",
                   "cachepilot_volume_epoch_size_bytes_bucket{", 'le="+Inf"', "cachepilot_advisor_hit_ratio{",
                   "cachepilot_volume_unmanaged{", "cachepilot_process_open_fds 7.0",
                   "cachepilot_process_max_fds 1.048576e+06", "cachepilot_exporter_collector_duration_seconds{"):
        assert needle in body, needle
    # every family the ops tests' contract lists (tests/ops/test_exporter.py EXPECTED) is in the comparison
    from test_exporter import EXPECTED  # type: ignore[import-not-found]

    assert {m.name for m in ours.collect()} == set(EXPECTED)


def test_before_the_first_tick_and_without_volumes(tmp_path: Path) -> None:
    observe = SnapshotBox()
    observe.publish(DaemonSnapshot(timestamp=2.0, start_time=1.0, ready=True, dry_run=False, observe_only=True))
    for box in (SnapshotBox(), observe):
        ours, theirs = both(tmp_path / str(id(box)), box)
        assert text(ours.collect()) == pc_exposition.generate_latest(theirs)
        assert openmetrics(ours.collect()) == pc_openmetrics.generate_latest(theirs)


def test_the_textfile_is_the_text_format(tmp_path: Path) -> None:
    from cachepilot.exporter import write_textfile

    ours, theirs = both(tmp_path)
    write_textfile(tmp_path / "cachepilot.prom", ours)
    assert (tmp_path / "cachepilot.prom").read_bytes() == pc_exposition.generate_latest(theirs)


def test_the_http_endpoint_answers_prometheus_with_prometheus_clients_bytes_and_type(tmp_path: Path) -> None:
    ours, theirs = both(tmp_path)
    server = serve(f"127.0.0.1:{free_port()}", ours)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            c.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {ACCEPTS[2]}\r\n\r\n".encode())
            answer = b"".join(iter(lambda: c.recv(65536), b""))
    finally:
        server.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    encode, ctype = pc_exposition.choose_encoder(ACCEPTS[2])
    assert f"Content-Type: {ctype}\r\n".encode() in head and body == encode(theirs)
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")


def test_the_two_deliberate_differences() -> None:
    """A version that is not a number (prometheus_client raises: no answer) gets text 0.0.4; OpenMetrics with
    escaping=values leaves legal names alone (prometheus_client renames the samples but not their HELP/TYPE)."""
    fam = families.GaugeMetricFamily("cachepilot_ready", "Ready.", value=1)
    with pytest.raises(TypeError):
        pc_exposition.choose_encoder("text/plain;version=1.x")
    assert negotiate("text/plain;version=1.x")[1] == "text/plain; version=0.0.4; charset=utf-8"
    accept = "application/openmetrics-text;version=1.0.0;escaping=values"
    encode, ctype = negotiate(accept)
    assert ctype == pc_exposition.choose_encoder(accept)[1]
    assert encode([fam]) == (b"# HELP cachepilot_ready Ready.\n# TYPE cachepilot_ready gauge\ncachepilot_ready 1.0\n"
                             b"# EOF\n")


# ------------------------------------------------------------------ any family, any label value, any float
# any character but a lone surrogate (neither side encodes one), the ones that need escaping often
chars = st.one_of(st.sampled_from('"\\\n'), st.characters(exclude_categories=["Cs"]))
label_values = st.text(chars, max_size=12)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**80), 2**80))
docs = st.text(chars, max_size=20)


@st.composite
def a_family(draw: st.DrawFn) -> tuple[str, str, str, list[str], list[tuple[list[str], object]]]:
    kind = draw(st.sampled_from(["gauge", "counter", "histogram"]))
    name = draw(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True))
    labels = draw(st.lists(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,6}", fullmatch=True).filter(lambda n: n != "le"),
                           max_size=3, unique=True))
    rows: list[tuple[list[str], object]] = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.lists(label_values, min_size=len(labels), max_size=len(labels)))
        if kind == "histogram":
            bounds = sorted(set(draw(st.lists(st.floats(0, 1e12), max_size=4))))
            counts = sorted(draw(st.lists(st.integers(0, 10**9), min_size=len(bounds) + 1, max_size=len(bounds) + 1)))
            buckets = [(repr(b), float(c)) for b, c in zip(bounds, counts, strict=False)]
            buckets.append(("+Inf", float(counts[-1])))
            rows.append((key, (buckets, draw(st.one_of(st.none(), values)))))
        else:
            rows.append((key, draw(values)))
    return kind, name, draw(docs), labels, rows


def build(module: types.ModuleType, kind: str, name: str, doc: str, labels: list[str],
          rows: list[tuple[list[str], object]]) -> object:
    cls = {"gauge": module.GaugeMetricFamily, "counter": module.CounterMetricFamily,
           "histogram": module.HistogramMetricFamily}[kind]
    family = cls(name, doc, labels=labels)
    for key, value in rows:
        family.add_metric(key, *value) if kind == "histogram" else family.add_metric(key, value)  # type: ignore
    return family


class _Fixed:
    def __init__(self, fams: list[object]) -> None:
        self.fams = fams

    def collect(self) -> list[object]:
        return self.fams


@settings(max_examples=300, deadline=None)
@given(st.lists(a_family(), min_size=1, max_size=3), st.sampled_from(["underscores", "dots", "allow-utf-8"]))
def test_any_family_with_any_labels_and_values_encodes_as_prometheus_client(specs: list, escaping: str) -> None:
    mine = [build(families, *spec) for spec in specs]
    theirs = CollectorRegistry(auto_describe=False)
    theirs.register(_Fixed([build(prometheus_client.core, *spec) for spec in specs]))  # type: ignore[arg-type]
    assert text(mine, escaping) == pc_exposition.generate_latest(theirs, escaping)  # type: ignore[arg-type]
    assert openmetrics(mine, escaping) == pc_openmetrics.generate_latest(theirs, escaping)  # type: ignore[arg-type]


def test_process_metrics_on_the_real_proc_are_prometheus_clients_families() -> None:
    """The same families in the same order with values of the same size (the real /proc moves between two reads)."""
    mine = ProcessMetrics("cachepilot").collect()
    theirs = list(prometheus_client.ProcessCollector(namespace="cachepilot", registry=None).collect())
    assert [(m.name, m.type, m.documentation) for m in mine] == [(m.name, m.type, m.documentation) for m in theirs]
    for m, t in zip(mine, theirs, strict=True):
        assert m.samples[0].value == pytest.approx(t.samples[0].value, rel=0.5, abs=5), m.name


def test_names_that_would_need_quoting_are_refused() -> None:
    for bad in ("cachepilot:ready", "9lives", "a.b", ""):
        with pytest.raises(ValueError, match="invalid metric name"):
            families.GaugeMetricFamily(bad, "x")
    with pytest.raises(ValueError, match="invalid label name"):
        families.GaugeMetricFamily("ok", "x", labels=["__reserved"])
    with pytest.raises(ValueError, match="at most one"):
        families.CounterMetricFamily("ok", "x", value=1, labels=["a"])
    assert families.CounterMetricFamily("ok_total", "x", value=1).samples == [families.Sample("ok_total", {}, 1)]


def test_help_texts_with_quotes_backslashes_and_newlines() -> None:
    """Each format escapes HELP its own way (text: backslash and newline; OpenMetrics: the quote too)."""
    doc = 'say "x" \\ then\nmore'
    specs = [(kind, "cachepilot_x", doc, ["kind"], [(["a"], 1.0)]) for kind in ("gauge", "counter")]
    mine = [build(families, *spec) for spec in specs]
    theirs = CollectorRegistry(auto_describe=False)
    theirs.register(_Fixed([build(prometheus_client.core, *spec) for spec in specs]))  # type: ignore[arg-type]
    assert text(mine) == pc_exposition.generate_latest(theirs)  # type: ignore[arg-type]
    assert openmetrics(mine) == pc_openmetrics.generate_latest(theirs)  # type: ignore[arg-type]
    assert rb'# HELP cachepilot_x say \"x\" \\ then\nmore' in openmetrics(mine)  # type: ignore[arg-type]
