"""Policy reloads (daemon/reloads.py): a broken policy keeps the running one, a slow parse runs beside the loop,
`cachepilot reload` waits for the verdict, a reload nobody answers is refused in bounded time."""

from __future__ import annotations

import threading
import time

import pytest

from tests.unit.daemon_rig import (
    POLICY_DESTRUCTIVE,
    Rig,
    write,
)


def test_sighup_with_a_broken_policy_keeps_the_running_one(rig: Rig) -> None:
    rig.d.start()
    write(rig.tmp / "p.yaml", "version: 1\ndefaults:\n  exposure: {max_dirty: lots}\n")
    rig.d.request_reload()
    rig.tick(1)
    s = rig.status()  # the running policy kept: its generation, the volume's bound under it
    assert s["policy"]["generation"] == 1 and s["volumes"][0]["max_dirty_bytes"] == 1 << 20
    assert s["counters"]["reloads_failed"] == 1 and s["policy"]["last_error"].startswith(f"{rig.tmp}/p.yaml:3: ")
    write(rig.tmp / "p.yaml", POLICY_DESTRUCTIVE.replace("1MiB", "2MiB"))
    rig.d.request_reload()
    rig.tick(2)
    s = rig.status()
    assert s["volumes"][0]["max_dirty_bytes"] == 2 << 20 and s["policy"]["last_error"] is None


def test_a_slow_reload_is_parsed_beside_the_loop_and_applied_at_a_later_tick(rig: Rig) -> None:
    """The soak's ticks over 1 s were its SIGHUP reloads, parsed on the loop thread: now a tick that starts one waits
    at most 0.1 s for the parse, the loop goes on, and a later tick applies it."""
    rig.d.start()
    load, gate = rig.d._load, threading.Event()

    def slow_load():  # type: ignore[no-untyped-def]
        gate.wait(10)
        return load()

    rig.d._load = slow_load  # type: ignore[method-assign]
    write(rig.tmp / "p.yaml", POLICY_DESTRUCTIVE.replace("1MiB", "2MiB"))
    rig.d.request_reload()
    t0 = time.monotonic()
    rig.tick(1)
    rig.tick(2)
    assert time.monotonic() - t0 < 1.0 and rig.status()["policy"]["generation"] == 1  # the parse still running
    gate.set()
    time.sleep(0.2)
    rig.tick(3)
    s = rig.status()
    assert s["policy"]["generation"] == 2 and s["volumes"][0]["max_dirty_bytes"] == 2 << 20
    rig.d.shutdown()


def test_reload_command_waits_for_the_verdict_and_fails_on_a_refused_policy(
        rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    """`cachepilot reload` (the unit's ExecReload) asks over the control socket and exits with the loop's verdict:
    non-zero with the refusal line for a broken policy (the old one keeps running), 0 once a good one is in."""
    from cachepilot.cli import main

    rig.d.start()
    loop = threading.Thread(target=rig.d.run)
    loop.start()
    try:
        before = rig.d.engine.policy
        sock = str(rig.socket)
        write(rig.tmp / "p.yaml", "version: 1\ndefaults:\n  exposure: {max_dirty: lots}\n")
        assert main(["reload", "--socket", sock]) == 2
        err = capsys.readouterr().err
        assert f"reload refused, the running policy is kept: {rig.tmp}/p.yaml:3: " in err and err.count("\n") == 1
        assert rig.d.engine.policy is before and rig.d.counters["reloads_failed"] == 1
        # as the unit's ExecReload says it: the socket from the configuration, whose policy is the broken one
        assert main(["reload", "--config", str(rig.cfg_path)]) == 2
        assert rig.d.counters["reloads_failed"] == 2  # the daemon was asked (not refused by the client itself)
        assert "reload refused, the running policy is kept" in capsys.readouterr().err
        write(rig.tmp / "p.yaml", POLICY_DESTRUCTIVE.replace("1MiB", "2MiB"))
        assert main(["reload", "--config", str(rig.cfg_path)]) == 0  # the socket's path from the configuration
        assert rig.d.engine.policy.defaults.exposure.max_dirty == 2 << 20 and rig.d.policy_error is None
    finally:
        rig.d.request_stop()
        loop.join(10)


def test_a_reload_nobody_answers_is_refused_in_bounded_time() -> None:
    from cachepilot.daemon.reloads import ReloadRequests

    r = ReloadRequests()
    t0 = time.monotonic()
    v = r.ask(0.2)
    assert not v.ok and "did not reload within 0.2 s" in v.message and time.monotonic() - t0 < 2
    assert r.pending() and len(r.take()) == 1 and not r.pending()
