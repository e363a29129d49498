"""The lab scripts' daemon (tests/vm/labdaemon.py) against a stand-in `cachepilot run` (a small process that does
what the daemon's start does for the helper: reads its config, makes its socket, says ready, exits 0 on SIGTERM):
the config it is given, ready, the log, stop's `exit`/`traceback` lines, and fail's exit; and the benchmarks' guest
Daemon (tests/bench/guest/common.py), which starts one on policy files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
import labdaemon  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

STAND_IN = '''import signal, sys, time
from pathlib import Path
conf = Path(sys.argv[sys.argv.index("--config") + 1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pol = conf.parent / "policy.yaml"  # the benchmarks' daemons load policy files instead
if pol.exists() and "crash" in pol.read_text():
    print("Traceback (most recent call last): boom", file=sys.stderr, flush=True)
    sys.exit(3)
(conf.parent / "ctl.sock").touch()
print("cachepilot: ready", file=sys.stderr, flush=True)
while True:
    time.sleep(0.05)
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    cli = tmp_path / "cachepilot"
    cli.write_text(f"#!{sys.executable}\n" + STAND_IN)
    cli.chmod(0o755)
    monkeypatch.setattr(labdaemon, "CLI", str(cli))
    started: list[subprocess.Popen[bytes]] = []
    popen = labdaemon.subprocess.Popen

    def keep(*args: Any, **kw: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kw))
        return started[-1]

    monkeypatch.setattr(labdaemon.subprocess, "Popen", keep)
    yield cli
    for p in started:  # a test that failed before its stop leaves no stand-in running
        p.kill()
        p.wait()


def test_a_lab_daemon_starts_on_its_config_is_ready_and_says_how_it_stopped(
        tmp_path: Path, stand_in: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    d = LabDaemon(run, "version: 1\n", tick="500ms", rescan="2s", metrics="127.0.0.1:9854")
    assert (run / "c.yaml").read_text() == (
        "version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 500ms\nrescan: 2s\n"
        "state_interval: 5s\nmetrics: {listen: '127.0.0.1:9854'}\n")
    assert (run / "policy.yaml").read_text() == "version: 1\n"
    assert d.ready(30) and d.socket == run / "ctl.sock"
    log = d.stop()
    assert "ready" in log and capsys.readouterr().out == "exit=0\ntraceback=no\n"


def test_a_lab_daemon_that_died_is_not_ready_and_fail_prints_its_log_and_exits_1(
        tmp_path: Path, stand_in: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = LabDaemon(tmp_path, "crash\n")
    assert not d.ready(2)
    with pytest.raises(SystemExit) as e:
        d.fail("more")
    out = capsys.readouterr().out
    assert e.value.code == 1 and "Traceback (most recent call last): boom" in out and "daemon exited 3, " in out
    d.stop(timeout=5)
    assert capsys.readouterr().out == "exit=3\ntraceback=yes\n"


def test_the_benchmarks_daemon_is_a_lab_daemon_on_policy_files_with_their_config_and_keeps_its_log(
        tmp_path: Path, stand_in: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "labdaemon_guest_common", Path(__file__).resolve().parents[1] / "bench" / "guest" / "common.py")
    assert spec and spec.loader
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    monkeypatch.setattr(common, "OUT", tmp_path)
    monkeypatch.setattr(common.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    d = common.Daemon([Path("/p/default.yaml"), Path("/p/extra.yaml")], metrics_listen="127.0.0.1:9854")
    # what the benchmarks' own start wrote before it was a LabDaemon (json-quoted listener; the same YAML)
    assert yaml.safe_load((tmp_path / "run" / "c.yaml").read_text()) == yaml.safe_load(
        "version: 1\npolicies: [/p/default.yaml, /p/extra.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 1s\n"
        'rescan: 10s\nstate_interval: 30s\nmetrics: {listen: "127.0.0.1:9854"}\n')
    assert not (tmp_path / "run" / "policy.yaml").exists() and d.tmp == tmp_path / "run"
    assert d.ready_s < 30 and d.cpu_s() >= 0 and d.rss() > 0
    assert d.stop(keep_log="a") == 0 and "ready" in (tmp_path / "a-daemon.log").read_text()
    assert capsys.readouterr().out == ""  # its exit goes to the benchmark's result, not to the host's key=value lines
