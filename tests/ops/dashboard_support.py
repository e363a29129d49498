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
VARIABLES = {"$instance": ".*", "$volume": ".*", "$__rate_interval": "1m"}


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expand(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def queries() -> list[tuple[str, str]]:
    """(panel title / refId, expr with Grafana's variables replaced by what an 'All' selection sends)."""
    return [(f"{p['title']}/{t['refId']}", expand(t["expr"])) for p in panels() for t in p["targets"]]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 — our own http://127.0.0.1 URL
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def wait_for_every_query(base: str, timeout: float) -> tuple[dict[str, list[Any]], list[str]]:
    """Instant query of every panel target until each returns at least one series: (results, still empty)."""
    pending = dict(queries())
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
    `targets` (address -> instance label) as job="cachepilot" and evaluating `rules`, both every `interval`."""

    def __init__(self, tmp: Path, targets: dict[str, str], rules: Path = RULES, interval: str = "1s") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp, self.port = tmp, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "cachepilot", "static_configs": [
                      {"targets": [address], "labels": {"instance": name}} for address, name in targets.items()]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen([need_tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)

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
