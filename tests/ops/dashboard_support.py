"""The Grafana dashboard's panel queries, run against a real Prometheus (Debian's): shared by the dashboard check
on the exporter code (tests/ops/test_dashboard.py) and the one on running daemons in the lab
(tests/vm/test_fleet_lab.py)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from ops_support import DASHBOARDS, free_port, need_tool

DASHBOARD = DASHBOARDS / "grafana" / "cachepilot.json"
RULES = DASHBOARDS / "prometheus" / "cachepilot.rules.yml"
# What Grafana sends for an 'All' selection and a short range.
VARIABLES = {"$job": ".*", "$instance": ".*", "$volume": ".*", "$__rate_interval": "1m"}
# Panels of node_exporter's metrics beside ours: data only where node_exporter is scraped too.
NODE_PANEL = "(node_exporter)"


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def queries(node: bool = True) -> list[tuple[str, str]]:
    """(panel title / refId, expr with Grafana's variables replaced by what an 'All' selection sends); without the
    node_exporter panels if not ``node``."""
    return [(f"{p['title']}/{t['refId']}", expand(t["expr"])) for p in panels() for t in p["targets"]
            if node or NODE_PANEL not in p["title"]]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 — our own http://127.0.0.1 URL
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def wait_for_every_query(base: str, timeout: float, node: bool = True,
                         leave_out: tuple[str, ...] = ()) -> tuple[dict[str, list[Any]], list[str]]:
    """Instant query of every panel target (``node``: also node_exporter's; none whose panel title starts with one
    of ``leave_out``) until each returns at least one series: (results, still empty)."""
    pending = {where: expr for where, expr in queries(node) if not where.startswith(leave_out)}
    results: dict[str, list[Any]] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        try:
            for where, expr in list(pending.items()):
                data = api(base, "query", query=expr)
                if data["result"]:
                    results[where] = data["result"]
                    del pending[where]
        except OSError:
            pass  # not up yet
        if pending:
            time.sleep(1)
    return results, sorted(pending)


class Prometheus:
    """Debian's prometheus on an ephemeral 127.0.0.1 port with its own data directory under `tmp`, scraping
    `targets` (address -> instance label) as job="cachepilot" (and `jobs`: job -> such targets) and evaluating
    `rules`, both every `interval`; or run with the configuration file `config_file` as it is."""

    def __init__(self, tmp: Path, targets: dict[str, str], rules: Path = RULES, interval: str = "1s",
                 jobs: dict[str, dict[str, str]] | None = None, config_file: Path | None = None) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp, self.port = tmp, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if config_file is None:
            config_file = tmp / "prometheus.yml"
            self._write_config(config_file, targets, rules, interval, jobs)
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen([need_tool("prometheus"), f"--config.file={config_file}",
                                      f"--storage.tsdb.path={tmp / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)

    @staticmethod
    def _write_config(path: Path, targets: dict[str, str], rules: Path, interval: str,
                      jobs: dict[str, dict[str, str]] | None) -> None:
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": job, "static_configs": [
                      {"targets": [address], "labels": {"instance": name}} for address, name in where.items()]}
                      for job, where in {"cachepilot": targets, **(jobs or {})}.items()]}
        path.write_text(yaml.safe_dump(config))

    def alive(self) -> str:
        """'' while running, else the end of its log."""
        return "" if self.proc.poll() is None else (self.tmp / "prometheus.log").read_text()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def range_results(base: str, start: float, end: float, step: float) -> dict[str, Any]:
    """Every panel's series over [start, end], in the shape dashboards/grafana/render_preview.py draws."""
    out: dict[str, Any] = {"start": start, "end": end, "panels": []}
    for p in panels():
        series = []
        for t in p["targets"]:
            data = api(base, "query_range", query=expand(t["expr"]), start=str(start), end=str(end), step=str(step))
            for s in data["result"]:
                series.append({"legend": legend(t.get("legendFormat", ""), s["metric"]),
                               "points": [[float(x), float(v)] for x, v in s["values"]]})
        out["panels"].append({"title": p["title"], "type": p["type"], "unit": p.get("fieldConfig", {}).get(
            "defaults", {}).get("unit", ""), "gridPos": p["gridPos"], "series": series})
    return out


def node_fixture(root: Path, cache_set: str) -> Path:
    """A /proc and /sys for node_exporter (diskstats, bcache collectors): bcache0 and dm-3 in diskstats, one bcache
    cache set with backing device vdb (bdev0) and cache device vdc (cache0), laid out as the kernel does."""
    s = root / "sys" / "fs" / "bcache" / cache_set
    bdev, cdev = root / "sys" / "block" / "vdb" / "bcache", root / "sys" / "block" / "vdc" / "bcache"
    files = {"average_key_size": "0.5k", "btree_cache_size": "1.0M", "cache_available_percent": "97", "congested": "0",
             "root_usage_percent": "1", "tree_depth": "0", "internal/active_journal_entries": "1",
             "internal/btree_nodes": "3", "internal/btree_read_average_duration_us": "100",
             "internal/cache_read_races": "0"}
    stats = {"bypassed": "1.5M", "cache_bypass_hits": "2", "cache_bypass_misses": "9", "cache_hits": "50",
             "cache_miss_collisions": "0", "cache_misses": "7", "cache_readaheads": "0"}
    for name, value in files.items():
        (s / name).parent.mkdir(parents=True, exist_ok=True)
        (s / name).write_text(value + "\n")
    for d in (s, bdev):  # the set's and the backing device's own
        for period in ("total", "five_minute", "hour", "day"):
            (d / f"stats_{period}").mkdir(parents=True)
            for name, value in stats.items():
                (d / f"stats_{period}" / name).write_text(value + "\n")
    (bdev / "dirty_data").write_text("24.0M\n")
    (bdev / "writeback_rate_debug").write_text("rate:\t\t4.0k/sec\ndirty:\t\t24.0M\ntarget:\t\t10.0M\n"
                                              "proportional:\t0\nintegral:\t0\nchange:\t\t0/sec\nnext io:\t10ms\n")
    cdev.mkdir(parents=True)
    for name, value in (("io_errors", "0"), ("metadata_written", "1.0M"), ("written", "64.0M")):
        (cdev / name).write_text(value + "\n")
    (s / "bdev0").symlink_to("../../../block/vdb/bcache")
    (s / "cache0").symlink_to("../../../block/vdc/bcache")
    (root / "proc").mkdir()
    (root / "proc" / "diskstats").write_text(
        " 254       0 bcache0 120 0 9600 50 300 0 24000 200 0 250 250 0 0 0 0 10 5\n"
        " 253       3 dm-3 80 0 6400 40 60 0 4800 30 0 70 70 0 0 0 0 0 0\n")
    return root


class NodeExporter:
    """Debian's prometheus-node-exporter on 127.0.0.1 with only its diskstats and bcache collectors, reading the
    /proc and /sys of ``node_fixture``."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([need_tool("prometheus-node-exporter"), f"--path.procfs={root / 'proc'}",
                                      f"--path.sysfs={root / 'sys'}", "--collector.disable-defaults",
                                      "--collector.diskstats", "--collector.bcache",
                                      f"--web.listen-address={self.address}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def metrics(self, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as r:  # noqa: S310
                    return str(r.read().decode())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
