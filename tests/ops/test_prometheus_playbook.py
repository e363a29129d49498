"""playbooks/prometheus.yml, run for real on this host against a Prometheus layout in a temp directory: the rules and
a scrape job of the inventory's cachepilot hosts land in an existing prometheus.yml (its other jobs and rules kept),
`promtool check config` passes, a real prometheus loads it; a configuration promtool refuses is never put in place."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_support import Prometheus, api
from ops_support import DASHBOARDS, promtool
from test_ansible import POLICY, playbook, recap

pytestmark = pytest.mark.ops

JOB = "cp-http"
SYSTEM_CONFIG = Path("/etc/prometheus/prometheus.yml")
OTHER_RULES = {"groups": [{"name": "site", "rules": [{"record": "site:up:sum", "expr": "sum(up)"}]}]}


def layout(tmp: Path, rule_files: list[str]) -> tuple[Path, dict[str, dict]]:
    """An existing Prometheus configuration under tmp (a job of its own, a job named like ours, a rules file of its
    own) and the Prometheus host's variables pointing the playbook at it."""
    etc = tmp / "etc" / "prometheus"
    etc.mkdir(parents=True)
    (etc / "site.rules.yml").write_text(yaml.safe_dump(OTHER_RULES))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(etc / "site.rules.yml"), *rule_files],
              "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": ["old:1"]}]},
                                 {"job_name": "node", "static_configs": [{"targets": ["127.0.0.1:9100"]}]}]}
    (etc / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = {"cachepilot_prometheus_config": str(etc / "prometheus.yml"),
            "cachepilot_prometheus_rules_dir": str(etc / "rules"), "cachepilot_prometheus_job": JOB,
            "cachepilot_prometheus_service": ""}
    return etc, {"prom": prom}


# the daemons: one at its listen port (the address from ansible_host), one with an explicit target, one without an
# HTTP exporter (left out)
HOSTS = {"a": {"cachepilot_policy": POLICY, "cachepilot_metrics_listen": "0.0.0.0:19854", "ansible_host": "127.0.0.1"},
         "b": {"cachepilot_policy": POLICY, "cachepilot_prometheus_target": "10.9.9.9:9999"},
         "c": {"cachepilot_policy": POLICY, "cachepilot_metrics_listen": ""}}


def test_rules_and_scrape_job_land_in_prometheus_and_a_real_prometheus_loads_them(tmp_path: Path) -> None:
    etc, prom = layout(tmp_path, [])
    host_config = SYSTEM_CONFIG.read_bytes() if SYSTEM_CONFIG.exists() else None
    rc, out = playbook(tmp_path, HOSTS, prometheus=prom, book="prometheus.yml")
    assert rc == 0 and recap(out)["prom"]["changed"] == 3, out  # rules directory, rules, configuration
    assert "a" not in recap(out), out  # only the Prometheus host is touched
    r = promtool("check", "config", str(etc / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    config = yaml.safe_load((etc / "prometheus.yml").read_text())
    rules = str(etc / "rules" / "cachepilot.rules.yml")
    assert config["rule_files"] == [str(etc / "site.rules.yml"), rules]
    assert config["global"] == {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert config["scrape_configs"] == [  # ours in place of the old job of that name; the others kept
        {"job_name": JOB, "static_configs": [{"targets": ["127.0.0.1:19854", "10.9.9.9:9999"]}]},
        {"job_name": "node", "static_configs": [{"targets": ["127.0.0.1:9100"]}]}]
    # the rules for that job are the mixin build's (build_rules.py --job), not a second rewrite that may drift
    built = subprocess.run([sys.executable, str(DASHBOARDS / "prometheus" / "build_rules.py"), "--job", JOB],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert Path(rules).read_text() == built
    assert f'up{{job="{JOB}"}}' in built

    # the inventory's paths win over the role's defaults: this host's own Prometheus configuration is not touched
    assert (SYSTEM_CONFIG.read_bytes() if SYSTEM_CONFIG.exists() else None) == host_config
    before = {p: p.read_text() for p in etc.rglob("*") if p.is_file()}
    rc, out = playbook(tmp_path, HOSTS, prometheus=prom, book="prometheus.yml")
    assert rc == 0 and recap(out)["prom"]["changed"] == 0, out  # idempotent
    assert {p: p.read_text() for p in etc.rglob("*") if p.is_file()} == before

    server = Prometheus(tmp_path / "server", {}, config_file=etc / "prometheus.yml")
    try:
        groups = wait_for(server, lambda: api(server.base, "rules")["groups"])
        assert {"cachepilot.records", "site"} <= {g["name"] for g in groups}, groups
        down = [r for g in groups for r in g["rules"] if r["name"] == "CachepilotDaemonDown"]
        assert down and f'up{{job="{JOB}"}}' in down[0]["query"], down
        targets = wait_for(server, lambda: api(server.base, "targets")["activeTargets"])
        assert {(t["scrapePool"], t["scrapeUrl"]) for t in targets} == {
            (JOB, "http://127.0.0.1:19854/metrics"), (JOB, "http://10.9.9.9:9999/metrics"),
            ("node", "http://127.0.0.1:9100/metrics")}, targets
    finally:
        server.stop()


def wait_for(server: Prometheus, get: Callable[[], list[Any]], timeout: float = 30) -> list[Any]:
    """get()'s first non-empty answer from the starting server."""
    deadline = time.monotonic() + timeout
    while True:
        assert not server.alive(), server.alive()
        try:
            if got := get():
                return got
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, "prometheus did not answer in time"
        time.sleep(0.5)


def test_a_configuration_promtool_refuses_is_not_put_in_place(tmp_path: Path) -> None:
    etc, prom = layout(tmp_path, [str(tmp_path / "gone.rules.yml")])  # a rules file that is not there
    before = (etc / "prometheus.yml").read_text()
    rc, out = playbook(tmp_path, HOSTS, prometheus=prom, book="prometheus.yml")
    assert rc != 0 and recap(out)["prom"]["failed"] == 1, out
    assert "Write the configuration with the rules and the scrape job" in out and "gone.rules.yml" in out, out
    assert (etc / "prometheus.yml").read_text() == before
