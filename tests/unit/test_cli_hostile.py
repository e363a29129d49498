"""The CLI's own hostile cases (issue 21): absurd numbers, clients that must reach a daemon whose policy on disk is
broken, names and daemon words that would drive the terminal, and the small lies (a latch "cleared" that was not
set, an unknown volume that exits 0, an error ending in "None").

The client cases talk to a real daemon (`cachepilot run --no-probe --dry-run`, root, observe-only on this host's
root filesystem), started once for the module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachepilot.cli import build_parser
from cachepilot.commands import explain, status, top
from cachepilot.commands.probe import device_node
from cachepilot.daemon.lock import HOST_LOCK_ENV
from cachepilot.display import escape, path_of
from cachepilot.sim.report import WORKLOADS

CLI = str(Path(sys.executable).parent / "cachepilot")
OPERATE = Path(__file__).parents[2] / "docs" / "operate.md"
HOSTILE = "evil\u202egnp.exe\u200b\u2066x\x1b[31m\u2028\udcff"


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def one_line(r: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert lines[0].startswith("cachepilot") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def safe(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running daemon; yields its configuration (policies: [p.yaml], socket ctl.sock beside it)."""
    d = tmp_path_factory.mktemp("daemon")
    (d / "p.yaml").write_text("version: 1\ndefaults:\n  failure_model: recoverable\n")
    cfg = d / "c.yaml"
    cfg.write_text(f"version: 1\npolicies: [p.yaml]\nstate_dir: st\nsocket: ctl.sock\nmetrics: {{listen: ''}}\n"
                   f"observe: [{json.dumps(str(d))}]\n")
    # a host lock of its own: the suite's autouse fixture that moves it is function-scoped, set up after this one
    env = {**os.environ, HOST_LOCK_ENV: str(d / "host.lock")}
    p = subprocess.Popen([CLI, "run", "--config", str(cfg), "--no-probe", "--dry-run"], stderr=subprocess.PIPE,
                         text=True, env=env)
    deadline = time.monotonic() + 60
    while cli("status", "--config", str(cfg)).returncode != 0:
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, "the daemon never answered"
        time.sleep(0.2)
    yield cfg
    p.terminate()
    p.communicate(timeout=30)


def volume_name(cfg: Path) -> str:
    return str(json.loads(cli("status", "--config", str(cfg), "--json").stdout)["volumes"][0]["name"])


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "0", "1e300"])
def test_top_interval_must_be_finite_and_positive(daemon: Path, value: str) -> None:
    """Before: -1 and nan a ValueError traceback, inf an OverflowError, 0 a busy loop (this test's time-out)."""
    one_line(cli("top", "--config", str(daemon), f"--interval={value}", timeout=20), f"--interval '{value}'")


@pytest.mark.parametrize("option, value", [("duration", "nan"), ("duration", "1e300"), ("duration", "-1"),
                                           ("tick", "0"), ("tick", "-1"), ("tick", "inf")])
def test_record_numbers_are_checked_before_anything(option: str, value: str) -> None:
    """Before: accepted, then a traceback (int(nan), an overflow) or a loop without a tick once the probe ran."""
    r = cli("record", "--out", "/nonexistent/t.cptrace", "--volume", "/nonexistent", f"--{option}={value}")
    one_line(r, f"--{option} '{value}'", "must be a finite number")


@pytest.mark.parametrize("line", ["tick: 1000000000", "tick: 1.0e+300", "rescan: 300d", "state_interval: .nan"])
def test_run_with_an_absurd_number_in_its_config_is_one_line(tmp_path: Path, line: str) -> None:
    """Before: `tick: 1000000000` was a ValueError traceback from the duration parser."""
    (tmp_path / "c.yaml").write_text(f"version: 1\n{line}\n")
    one_line(cli("run", "--config", str(tmp_path / "c.yaml"), "--check"), "c.yaml:2:")


# ------------------------------------------------------------------ clients need only the socket path
def test_clients_reach_the_daemon_after_a_broken_policy_lands_on_disk(daemon: Path) -> None:
    (daemon.parent / "p.yaml").write_text("version: 1\ndefaults:\n  failure_model: reckless\n")
    for args in (["status"], ["top", "--once"], ["explain"]):
        r = cli(*args, "--config", str(daemon))
        assert r.returncode == 0 and r.stderr == "", (args, r.stderr)
    r = cli("run", "--config", str(daemon), "--check")  # the daemon's own check still sees it
    one_line(r, "p.yaml:3: defaults.failure_model")


def test_socket_from_a_config_without_a_mapping_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("- just\n- a list\n")
    one_line(cli("status", "--config", str(tmp_path / "c.yaml")), "c.yaml:1:", "control socket")


# ------------------------------------------------------------------ what the client says
def test_explain_of_an_unknown_volume_exits_2_as_top_does(daemon: Path) -> None:
    one_line(cli("explain", "--config", str(daemon), "--volume", "nosuch"), "unknown volume 'nosuch'")
    one_line(cli("top", "--config", str(daemon), "--volume", "nosuch", "--once"), "unknown volume 'nosuch'")
    assert cli("explain", "--config", str(daemon), "--volume", volume_name(daemon)).returncode == 0


def test_clear_latch_on_an_unlatched_volume_says_so(daemon: Path) -> None:
    name = volume_name(daemon)
    r = cli("clear-latch", "--config", str(daemon), name)
    assert r.returncode == 0 and r.stdout == f"{name}: was not latched; nothing to clear\n", r.stdout + r.stderr


def test_a_socket_path_too_long_is_named_not_none() -> None:
    line = one_line(cli("status", "--socket", "/tmp/" + "a" * 200), "cannot reach the daemon")
    assert line.endswith("AF_UNIX path too long"), line


# ------------------------------------------------------------------ record and simulate take what they list
def test_record_volume_is_required_and_says_so() -> None:
    r = cli("record", "--out", "/tmp/x.cptrace")
    assert r.returncode == 2 and "the following arguments are required: --volume" in r.stderr
    usage = cli("record", "--help").stdout
    assert "--volume DEV|DIR" in usage and "[--volume" not in usage, usage


def test_record_takes_a_mountpoint_as_probe_does(tmp_path: Path) -> None:
    node = device_node(str(tmp_path))  # probe --dev accepts this directory; record now resolves it the same way
    assert os.stat(node).st_rdev == os.stat(tmp_path).st_dev
    assert device_node(node) == node
    one_line(cli("record", "--out", str(tmp_path / "t"), "--volume", "/proc"), "/proc", "has no block device")


def test_simulate_takes_every_workload_the_readme_lists() -> None:
    row = next(line for line in OPERATE.read_text().splitlines() if line.startswith("| `cachepilot simulate"))
    listed = re.search(r"--workload ([^\]]+)\]", row).group(1).split("\\|")  # type: ignore[union-attr]
    names = set()
    for name in listed:  # fileserver-{0.5,1,2}x-wb{10,40}: the shell's brace expansion
        parts = [[""]]
        for literal, alts in re.findall(r"([^{]*)(?:\{([^}]*)\})?", name):
            parts.append([literal])
            if alts:
                parts.append(alts.split(","))
        expanded = [""]
        for options in parts:
            expanded = [e + o for e in expanded for o in options]
        names.update(expanded)
    assert names == set(WORKLOADS)
    parser = build_parser("simulate")
    for name in names:
        assert parser.parse_args(["simulate", "--workload", name]).workload == name


def test_simulate_says_where_it_is_on_a_terminal_and_nothing_to_a_script(tmp_path: Path) -> None:
    import pty

    parent, child = pty.openpty()  # stderr a terminal: a line per phase
    try:
        proc = subprocess.run([CLI, "simulate", "--workload", "warm-restart", "--policies", "lru"],
                              stdout=subprocess.DEVNULL, stderr=child, timeout=120)
        os.close(child)
        said = b""
        while chunk := _read_pty(parent):
            said += chunk
    finally:
        os.close(parent)
    lines = said.decode().splitlines()
    assert proc.returncode == 0
    assert lines[0] == "cachepilot simulate: [1/1] warm-restart ..."
    assert re.fullmatch(r"cachepilot simulate: \[1/1\] warm-restart done in [0-9.]+ s", lines[1])
    r = cli("simulate", "--workload", "warm-restart", "--policies", "lru", timeout=120)
    assert r.returncode == 0 and r.stderr == ""  # a pipe: only errors


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO once the other side is closed and drained
        return b""


# ------------------------------------------------------------------ nothing reaches the terminal raw
def test_escape_leaves_no_control_or_format_character() -> None:
    out = escape(HOSTILE)
    assert safe(out) and "\\u202e" in out and "\\u200b" in out and "\\x1b" in out and "\\xff" in out, out
    assert escape("plain name.txt") == "plain name.txt"


def test_a_hostile_file_name_is_escaped_by_top(tmp_path: Path) -> None:
    import fcntl
    import struct

    f = tmp_path / "evil\u202egnp.exe\u200b"
    f.write_bytes(b"x")
    with open(f) as fh:
        gen = struct.unpack("l", fcntl.ioctl(fh.fileno(), 0x80087601, b"\0" * 8))[0]  # FS_IOC_GETVERSION
    shown = path_of("/", f.stat().st_ino, gen)
    assert shown.endswith("evil\\u202egnp.exe\\u200b") and safe(shown), shown


def test_status_top_explain_escape_what_the_daemon_sends() -> None:
    """The daemon repeats names it read (mountpoints, dm names, reasons): every field shown goes through escape."""
    vol = {"name": HOSTILE, "kind": HOSTILE, "mode": HOSTILE, "target_mode": HOSTILE, "dirty_bytes": 1,
           "max_dirty_bytes": 2, "hit_ratio": None, "health": HOSTILE, "latched": False, "mountpoint": HOSTILE,
           "pending": [HOSTILE], "observe_only": False}
    s = {"pid": 1, "uptime_s": 1, "dry_run": False, "observe_only": False,
         "policy": {"source": HOSTILE, "generation": 1, "last_error": HOSTILE},
         "last_tick": {"time": time.time(), "duration_s": 0.0, "n": 1, "skipped": 0}, "tracked_files": 0,
         "drops": {"ringbuf_full": 0, "hotness_map_full": 0, "other": 0},
         "state_file": {"writes": 0, "failed_writes": 0}, "probe": {"summary": HOSTILE}, "volumes": [vol]}
    assert safe(status.render(s))
    d = {"ts": 0, "volume": HOSTILE, "kind": HOSTILE, "status": HOSTILE, "reason": HOSTILE, "error": HOSTILE,
         "error_kind": HOSTILE, "detail": HOSTILE,
         "writes": [{"target": HOSTILE, "before": HOSTILE, "value": HOSTILE, "readback": HOSTILE}]}
    assert safe(explain.render(d))
    from rich.console import Console

    console = Console(record=True, width=200, force_terminal=False)
    console.print(top.table({"volumes": [{"name": HOSTILE, "dev": HOSTILE, "mountpoint": HOSTILE, "files": []}]}))
    assert safe(console.export_text())


def test_the_error_line_escapes_too() -> None:
    line = one_line(cli("status", "--socket", "/nonexistent/\u202eevil\nline"))
    assert "\\u202eevil\\x0aline" in line and safe(line), line
