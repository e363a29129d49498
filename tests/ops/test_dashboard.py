"""The Grafana dashboard: every panel query is valid PromQL (parsed by promtool) and uses only metrics the exporter
produces or the recording rules define; and a real Prometheus (Debian's), scraping the real exporter code and
evaluating the real rules, returns data for every panel query.

The exporter here is fed a synthetic, hand-built snapshot (tests/ops/ops_support.py), published every 0.2 s with
growing counters, so exact values can be asserted; the same queries against running daemons in two lab guests are
checked by tests/vm/test_fleet_lab.py."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dashboard_support import (
    DASHBOARD,
    RULES,
    NodeExporter,
    Prometheus,
    api,
    node_fixture,
    panels,
    queries,
    wait_for_every_query,
)
from ops_support import CACHE_SET, free_port, promtool, snapshot
from prometheus_client.parser import text_string_to_metric_families

from cachepilot.exporter import SnapshotBox, make_registry, serve
from cachepilot.exporter.exposition import text as render

pytestmark = pytest.mark.ops

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)  # label matchers, ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        if not m.group(2) and m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


def node_names(tmp: Path) -> set[str]:
    """What node_exporter's diskstats and bcache collectors export (from the fixture /proc and /sys)."""
    node = NodeExporter(node_fixture(tmp / "node", CACHE_SET))
    try:
        text = node.metrics()
    finally:
        node.stop()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("node_")}


def exporter_names() -> set[str]:
    box = SnapshotBox()
    box.publish(snapshot())
    text = render(make_registry(box).collect()).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def recorded_names() -> set[str]:
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}


def test_panels_are_complete() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "job", "instance", "volume"}
    titles = [p["title"] for p in panels()]
    assert len(titles) == len(set(titles))
    for p in panels():
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    # what issue 11 asks the dashboard to show
    text = DASHBOARD.read_text()
    for needed in ("hit_ratio", "dirty_bound_bytes", "epoch_size_bytes", "barriers", "discard_landed", "promoted",
                   "volume_mode:code", "cachepilot_ready", "tick_duration"):
        assert needed in text, needed
    # and issue 24: the controller's own state, and the stock cache's metrics from node_exporter beside ours
    # (issue 25: the sizing advisor's curve)
    for needed in ("exposure_breaches_total", "drains_total", "target_mode:code", "cachepilot_dry_run",
                   "cachepilot_observe_only", "cachepilot_volume_unmanaged", "cachepilot_volume_detached",
                   "process_resident_memory_bytes",
                   "cachepilot_build_info", "node_disk_", "node_bcache_", "cachepilot_advisor_hit_ratio"):
        assert needed in text, needed


def test_the_job_is_a_variable_in_every_query() -> None:
    # the job carrying the metrics (cachepilot's exporter, or node_exporter with the textfile) is chosen, not assumed
    dash = json.loads(DASHBOARD.read_text())
    assert 'job="' not in DASHBOARD.read_text()
    for v in dash["templating"]["list"]:
        if v["name"] in ("instance", "volume"):
            assert 'job=~"$job"' in v["query"]["query"], v["name"]
    for p in panels():
        for t in p["targets"]:
            for m in re.finditer(r"(?<![\w:])((?:[a-z]+:)?cachepilot_[a-z0-9_:]+|up)(\{[^}]*\})?", t["expr"]):
                assert m.group(2) and 'job=~"$job"' in m.group(2), (p["title"], m.group(0))


def test_every_query_parses_and_uses_only_known_metrics(tmp_path: Path) -> None:
    # promtool is the real PromQL parser: each query becomes a recording rule of a throw-away rules file
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries())]}]}
    (tmp_path / "q.yml").write_text(yaml.safe_dump(rules))
    r = promtool("check", "rules", str(tmp_path / "q.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    known = exporter_names() | recorded_names() | {"up"} | node_names(tmp_path)
    for where, expr in queries():
        assert metric_names(expr), where
        assert metric_names(expr) <= known, f"{where}: unknown metrics {metric_names(expr) - known}"
    assert metric_names('rate(a_total{x="b c"}[5m]) / on (v) group_left b offset 5m and sum by (k) (c)') == {
        "a_total", "b", "c"}


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """Debian's prometheus on 127.0.0.1, scraping the real exporter (fed a growing synthetic snapshot) every second
    and evaluating the real rules every second. Yields its base URL."""
    box, stop, step = SnapshotBox(), threading.Event(), [1]

    def loop() -> None:  # stands in for the daemon's ticks
        while not stop.is_set():
            box.publish(snapshot(step=step[0], now=time.time()))
            step[0] += 1
            stop.wait(0.2)

    publisher = threading.Thread(target=loop, daemon=True)
    publisher.start()
    server = serve(f"127.0.0.1:{free_port()}", make_registry(box))
    # node_exporter of the same host under the same instance label, so its metrics join ours
    node = NodeExporter(node_fixture(tmp_path / "node", CACHE_SET))
    instance = f"127.0.0.1:{server.port}"
    prom = Prometheus(tmp_path, {instance: instance}, jobs={"node": {node.address: instance}})
    try:
        yield prom.base
        assert not prom.alive(), prom.alive()
    finally:
        prom.stop()
        node.stop()
        stop.set()
        publisher.join(5)
        server.close()


def test_every_panel_returns_data_from_a_real_prometheus(prometheus: str) -> None:
    results, pending = wait_for_every_query(prometheus, 45)
    assert not pending, f"no data for: {sorted(pending)}"
    rules = api(prometheus, "rules")
    assert all(r["health"] == "ok" for g in rules["groups"] for r in g["rules"]), rules
    assert "cachepilot" in {g["name"].split(".")[0] for g in rules["groups"]}
    # the template variables' queries list what the exporter exported
    assert api(prometheus, "label/volume/values", **{"match[]": "cachepilot_volume_info"}) == ["bcache0", "lab-cached"]
    # values a person would read off the panels, computed by Prometheus from the exporter's numbers
    hit = {r["metric"]["volume"]: float(r["value"][1]) for r in results["Hit ratio/A"]}
    assert hit == pytest.approx({"bcache0": 0.9, "lab-cached": 0.5})
    mode = {r["metric"]["volume"]: r["value"][1] for r in results["Write mode/A"]}
    assert mode == {"bcache0": "1", "lab-cached": "2"}
    unmanaged = {r["metric"]["volume"]: r["metric"]["reason"] for r in results["Unmanaged volumes/A"]}
    assert unmanaged == {"bcache1": "policy"}
    detached = {r["metric"]["volume"]: r["metric"]["reason"] for r in results["Unmanaged volumes/B"]}
    assert detached == {"lab-wc": "operator"}
    # node_exporter's metrics, named by our volumes through the labels they share
    disk = results["Disk throughput of the cached devices (node_exporter)/A"]
    assert {r["metric"]["volume"] for r in disk} == {"bcache0", "lab-cached"}
    bcache_set = results["bcache cache sets (node_exporter)/A"]
    assert [(r["metric"]["volume"], float(r["value"][1])) for r in bcache_set] == [("bcache0", 24 << 20)]
    assert api(prometheus, "label/job/values", **{"match[]": "cachepilot_ready"}) == ["cachepilot"]
