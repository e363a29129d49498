"""The daemon's configuration (daemon/config.py): defaults, relative paths, the policy files, errors by file
and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot.daemon.config import DEFAULT_METRICS, load_config, parse_config
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import (
    write,
)

POLICY_A = "version: 1\ndefaults: {failure_model: recoverable}\n"


POLICY_B = "version: 1\nvolumes:\n  - name: db\n    match: {device: bcache9}\n    failure_model: destructive\n"


def test_config_defaults_relative_paths_and_policy_combination(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", POLICY_A)
    write(tmp_path / "b.yaml", POLICY_B)
    c = load_config(write(tmp_path / "c.yaml", "version: 1\npolicies: [a.yaml, b.yaml]\nstate_dir: st\ntick: 250ms\n"))
    assert c.state_dir == tmp_path / "st" and c.tick_s == 0.25 and c.metrics_listen == DEFAULT_METRICS
    assert c.policy.defaults.failure_model == "recoverable" and [r.name for r in c.policy.rules] == ["db"]
    assert c.policy.resolve(VolumeInfo(dev=1, name="bcache9"))[0].failure_model == "destructive"
    assert not c.effective_dry_run


def test_shipped_default_config_is_valid() -> None:
    c = load_config(Path(__file__).parents[2] / "controller/cachepilot/data/config.yaml")
    assert c.policy.source == "<built-in>" and c.metrics_listen == "127.0.0.1:9854"


@pytest.mark.parametrize("text, expect", [
    ("version: 1\ntick: 1s\nbogus: 3\n", "c.yaml:3: bogus: unknown key"),
    ("version: 1\n\ntick: soon\n", "c.yaml:3: tick:"),
    ("version: 1\ntick: 10ms\n", "c.yaml:2: tick: must be at least 0.05 s"),
    # absurd numbers: a traceback (ValueError) or a daemon that never ticks, before
    ("version: 1\ntick: 1000000000\n", "c.yaml:2: tick: duration 1000000000 is longer than a year"),
    ("version: 1\ntick: 11s\n", "c.yaml:2: tick: must be at most 10 s, got 11 s"),
    ("version: 1\ntick: .inf\n", "c.yaml:2: '.inf' is not a finite number"),
    ("version: 1\nrescan: 300d\n", "c.yaml:2: rescan: must be at most 3600 s"),
    ("version: 1\nstate_interval: 1.0e+300\n", "c.yaml:2: state_interval: duration 1e+300 is longer than a year"),
    ("version: 1\nmax_files: 1e300\n", "c.yaml:2: max_files:"),
    ("version: 1\npolicies:\n  - nope.yaml\n", "c.yaml:3: policies.0:"),
    ("version: 1\nmetrics:\n  listen: localhost\n", "c.yaml:3: metrics.listen: expected IP:PORT"),
    # the exporter binds an IP: a host name passing here would only fail once the daemon runs
    ("version: 1\nmetrics:\n  listen: localhost:9854\n", "c.yaml:3: metrics.listen: expected IP:PORT"),
    ("version: 1\nmetrics:\n  listen: '[::1]:99999'\n", "c.yaml:3: metrics.listen: expected IP:PORT"),
    ("version: 2\n", "c.yaml:1: version: unsupported version 2"),
    ("version: 1\ntick: a: b\n", "c.yaml:2: YAML syntax error"),
    ("", "c.yaml:1: empty configuration file"),
])
def test_config_errors_name_file_and_line(tmp_path: Path, text: str, expect: str) -> None:
    with pytest.raises(UserError) as e:
        parse_config(text, "c.yaml", tmp_path)
    assert str(e.value).startswith(expect), str(e.value)
    assert "\n" not in str(e.value)


def test_config_names_the_policy_files_line(tmp_path: Path) -> None:
    write(tmp_path / "bad.yaml", "version: 1\ndefaults:\n  failure_model: reckless\n")
    with pytest.raises(UserError, match=r"bad.yaml:3: defaults.failure_model"):
        parse_config("version: 1\npolicies: [bad.yaml]\n", "c.yaml", tmp_path)
