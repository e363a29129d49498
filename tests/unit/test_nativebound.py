"""The exposure bound delegated to dm-writecache's own max_age and watermarks (engine.nativebound): the table
arguments the engine asks for (put back on exit), no periodic flush while the table holds them, a flush on a
measured breach only (the backend's reload and put-back of an argument the table did not set: test_backends)."""

from __future__ import annotations

from pathlib import Path

from cachepilot.actions import DONE, Drain, PutBackKnobs, SetKnob, SetKnobs
from cachepilot.backends import open_backend
from cachepilot.backends.base import Backend
from cachepilot.backends.host import Host
from cachepilot.backends.operation import split
from cachepilot.backends.writecache import WritecacheTable
from cachepilot.daemon.volumes import Found
from cachepilot.engine import Engine
from cachepilot.engine.nativebound import _Written, wanted
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from tests.unit.daemon_rig import Rig, write
from tests.unit.test_backends import WC_TABLE, FakeDm, dm_tree

NS = 1_000_000_000
MIB = 1 << 20
DEV = kdev(252, 0)
DESTRUCTIVE = """version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 64MiB, max_age: 30s}
"""
STOCK = {"high_watermark": "50", "low_watermark": "45"}
HELD = {"high_watermark": "18", "low_watermark": "13", "max_age": "30000", "pause_writeback": "0"}
WC = VolumeInfo(dev=DEV, name="dm-2", kind="dm-writecache", cache_bytes=256 * MIB)


def run(e: Engine, seconds: int, knobs: dict[str, str], dirty: int = 40 * MIB, rate: int = 4 * MIB,
        start: int = 0) -> list[object]:
    """A sample and a tick every second: ``dirty`` bytes dirty (never clean), ``rate`` bytes/s written."""
    out: list[object] = []
    for t in range(start, start + seconds):
        e.sample(VolumeSample(DEV, t * NS + 1, "writeback", dirty, 0, 0, 0, False, dict(knobs),
                              written_bytes=t * rate))
        out += e.tick(t * NS + 2)
    return out


def knob_asks(acts: list[object]) -> list[tuple[str, str]]:
    """Every (knob, value) asked for, one by one or together."""
    out: list[tuple[str, str]] = []
    for a in acts:
        if isinstance(a, SetKnob):
            out.append((a.knob, a.value))
        elif isinstance(a, SetKnobs):
            out += a.values
    return out


def test_destructive_writecache_asks_for_max_age_and_watermarks_together() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    acts = run(e, 2, STOCK)
    [ask] = [a for a in acts if isinstance(a, SetKnob | SetKnobs)]  # one action: one table reload
    assert isinstance(ask, SetKnobs) and ask.put_back_on_exit
    assert ask.values == (("low_watermark", "13"), ("high_watermark", "18"), ("max_age", "30000"),
                          ("pause_writeback", "0"))
    assert "delegated to the kernel" in ask.reason and "15/16" in ask.reason
    assert "75% of it" in ask.reason and "writecache_map_flush" in ask.reason
    assert ask.reason.count("% of the cache; write-back from") == 1  # the watermarks' one reason, said once
    assert "was low_watermark 45, high_watermark 50, max_age unknown" in ask.reason


def test_the_table_without_pause_writeback_0_does_not_keep_the_bound() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    paused = {k: v for k, v in HELD.items() if k != "pause_writeback"}  # fsync flushes would hold write-back off
    assert [a for a in run(e, 120, paused) if isinstance(a, Drain)]


def test_the_drain_of_data_of_unknown_age_waits_two_ticks_for_the_reloads() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    first = run(e, 1, STOCK)  # never seen clean: dirty data of unknown age
    assert knob_asks(first) and not [a for a in first if isinstance(a, Drain)]
    assert not [a for a in run(e, 3, HELD, start=1) if isinstance(a, Drain)]  # the table holds: none at all
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    later = run(e2, 4, STOCK)  # the reloads were refused: the drain comes, two ticks late
    assert [a for a in later if isinstance(a, Drain)] and "unknown age" in str(later)


def test_a_pinned_knob_is_not_delegated_and_recoverable_asks_nothing() -> None:
    e = Engine(parse_policy(DESTRUCTIVE + "  knobs: {max_age: 60000}\n", "t.yaml"), [WC])
    asks = knob_asks(run(e, 2, STOCK))
    assert ("max_age", "60000") in asks and ("max_age", "30000") not in asks
    e2 = Engine(parse_policy(DESTRUCTIVE.replace("destructive", "recoverable"), "t.yaml"), [WC])
    acts = run(e2, 2, STOCK)
    assert not [k for k in knob_asks(acts) if k[0] != "high_watermark"]
    assert not [a for a in acts if isinstance(a, PutBackKnobs)]  # nothing was delegated: nothing to put back


def test_no_periodic_flush_while_the_table_keeps_the_bound() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    acts = run(e, 120, HELD)  # dirty 40 MiB for two minutes, never clean: the kernel writes back oldest first
    assert not [a for a in acts if isinstance(a, Drain)]
    # the same volume with the stock table: the daemon keeps the bound by flushing every block
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    assert [a for a in run(e2, 120, STOCK) if isinstance(a, Drain)]


def test_a_measured_breach_is_a_flush() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    run(e, 5, HELD)
    [d] = [a for a in run(e, 1, HELD, dirty=65 * MIB, start=5) if isinstance(a, Drain)]
    assert "over max_dirty" in d.reason and "delegated bound breached" in d.reason
    # age: 40 MiB dirty while only 0.5 MiB/s was written for the last 30 s: 25 MiB are provably older
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    acts = run(e2, 29, HELD, rate=MIB // 2)
    assert not [a for a in acts if isinstance(a, Drain)]  # no mark 30 s old yet: nothing measured
    [d2] = [a for a in run(e2, 3, HELD, rate=MIB // 2, start=29) if isinstance(a, Drain)][:1]
    assert "older than max_age" in d2.reason


def test_written_marks_restart_with_the_counter_and_stay_bounded() -> None:
    w = _Written()
    for t in range(100):
        w.note(t * NS, t * MIB, 30 * NS)
    assert len(w.marks) <= 32 and w.since(99 * NS, 30 * NS) == 30 * MIB
    w.note(100 * NS, 5, 30 * NS)  # a reload restarted the statistics
    assert w.since(100 * NS, 30 * NS) is None


def test_wanted_leaves_the_watermarks_for_a_bound_above_half_the_cache() -> None:
    assert [x.knob for x in wanted(30.0, 200 * MIB, 256 * MIB)] == ["max_age", "pause_writeback"]


def test_a_model_change_by_reload_puts_the_delegated_arguments_back_together() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    run(e, 3, HELD)
    e.set_policy(parse_policy(DESTRUCTIVE.replace("destructive", "recoverable"), "t.yaml"))
    acts = run(e, 3, HELD, start=3)
    [back] = [a for a in acts if isinstance(a, PutBackKnobs)]  # once, not every tick
    assert back.knobs == ("low_watermark", "high_watermark", "max_age", "pause_writeback")
    assert "failure model recoverable" in back.reason and "no longer delegated" in back.reason
    assert not knob_asks(acts)
    e.set_policy(parse_policy(DESTRUCTIVE, "t.yaml"))  # back: asked again at once, not REQUEST_RETRY_NS later
    again = [a for a in run(e, 1, STOCK, start=6) if isinstance(a, SetKnobs)]
    assert [len(a.values) for a in again] == [4]


def test_a_latched_volume_keeps_the_delegated_arguments() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    run(e, 2, HELD)
    e.restore_latch(DEV, "cache device failed", 2 * NS, "")
    assert not [a for a in run(e, 2, HELD, start=2) if isinstance(a, PutBackKnobs | SetKnob | SetKnobs)]


def dm_writecache(tmp_path: Path) -> tuple[object, FakeDm]:
    dm_tree(tmp_path)
    fake = FakeDm(WC_TABLE)
    info = VolumeInfo(dev=DEV, name="dm-2", kind="dm-writecache", cache_bytes=256 * MIB)
    return open_backend(info, host=Host(sysfs=tmp_path, dm=fake)), fake


def tick_through(e: Engine, b: object, fake: FakeDm, t: int) -> list[object]:
    """A tick on the fake table: the backend's sample to the engine, its actions to the backend."""
    s = b.sample(t * NS)  # type: ignore[attr-defined]
    e.sample(VolumeSample(DEV, t * NS + 1, "writeback", 40 * MIB, 0, 0, 0, False, s.knobs, written_bytes=t * MIB))
    acts = e.tick(t * NS + 2)
    for a in acts:
        if not isinstance(a, Drain):
            assert b.apply(a).status == DONE, a  # type: ignore[attr-defined]
    return acts


def test_adoption_is_one_reload_read_back_and_a_model_change_one_more(tmp_path: Path) -> None:
    b, fake = dm_writecache(tmp_path)
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    for t in range(3):
        tick_through(e, b, fake, t)
    reloads = [c for c in fake.calls if c[0] == "reload"]
    assert len(reloads) == 1 and [c[0] for c in fake.calls].count("suspend") == 1  # was 4 of each
    live = WritecacheTable.parse(fake.live)
    assert {k: live.get(k) for k in HELD} == HELD
    assert fake.calls[fake.calls.index(reloads[0]) + 3] == ("table", "lab-cached")  # read back after the resume
    assert b.steered_knobs() == {"high_watermark": ("50", "18"), "low_watermark": ("45", "13"),  # type: ignore
                                 "max_age": ("", "30000"), "pause_writeback": ("", "0")}
    e.set_policy(parse_policy(DESTRUCTIVE.replace("destructive", "recoverable"), "t.yaml"))
    n = len(fake.calls)
    tick_through(e, b, fake, 3)
    assert [c[0] for c in fake.calls[n:]].count("reload") == 1
    assert fake.live == WC_TABLE.replace("high_watermark 50 low_watermark 45", "low_watermark 45 high_watermark 50")
    assert b.steered_knobs() == {} and b.restore() == []  # type: ignore[attr-defined]


def test_restore_on_exit_is_one_reload_and_leaves_what_someone_else_changed(tmp_path: Path) -> None:
    b, fake = dm_writecache(tmp_path)
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    tick_through(e, b, fake, 0)
    fake.live = fake.live.replace("max_age 30000", "max_age 9000")  # an operator's own reload
    n = len(fake.calls)
    [out] = b.restore()  # type: ignore[attr-defined]
    assert out.status == DONE and isinstance(out.action, PutBackKnobs)
    assert [c[0] for c in fake.calls[n:]].count("reload") == 1
    assert "max_age (reads 9000)" in out.detail and "left alone" in out.detail
    live = WritecacheTable.parse(fake.live)
    assert (live.get("max_age"), live.get("pause_writeback"), live.get("high_watermark")) == ("9000", None, "50")
    assert split(out.writes[0].readback) == {"low_watermark": "45", "high_watermark": "50", "pause_writeback": ""}


# ------------------------------------------------------------------ the daemon: a SIGHUP reload changes the model
WCV = VolumeInfo(dev=DEV, name="dm-2", kind="dm-writecache", fs_uuid="u-1", mountpoint="/mnt/x", cache_bytes=256 * MIB)


class WcRig(Rig):
    """The daemon on the real dm-writecache backend over the fake dmsetup."""

    def __init__(self, tmp: Path, policy: str, fake: FakeDm | None = None) -> None:
        if fake is None:
            dm_tree(tmp)
        self.fake = fake or FakeDm(WC_TABLE)
        self.wc: Backend | None = None
        super().__init__(tmp, policy)
        self.found = [Found(WCV)]

    def backend(self, info: VolumeInfo) -> Backend:  # type: ignore[override]
        if self.wc is None:
            self.wc = open_backend(info, host=Host(sysfs=self.tmp, dm=self.fake))
        return self.wc


def test_the_daemon_puts_the_delegated_arguments_back_on_a_reload_and_says_so(tmp_path: Path) -> None:
    r = WcRig(tmp_path, DESTRUCTIVE)
    r.d.start()
    try:
        for t in range(1, 4):
            r.tick(t)
        assert [c[0] for c in r.fake.calls].count("reload") == 1
        [ask] = [d for d in r.d.decisions if d["action"].startswith("set_knob dm-2 low_watermark=13")]
        assert ask["status"] == "done" and "delegated to the kernel" in ask["reason"]
        assert ask["writes"][0]["readback"] == "low_watermark=13 high_watermark=18 max_age=30000 pause_writeback=0"
        write(tmp_path / "p.yaml", DESTRUCTIVE.replace("destructive", "recoverable"))
        r.d.request_reload()
        n = len(r.fake.calls)
        for t in range(4, 7):
            r.tick(t)
        assert [c[0] for c in r.fake.calls[n:]].count("reload") == 1
        [back] = [d for d in r.d.decisions if " put back " in d["action"]]
        assert back["status"] == "done" and "failure model recoverable" in back["reason"]
        assert "high_watermark=50" in back["writes"][0]["readback"]
        shown = r.d.answer({"cmd": "explain", "volume": "dm-2"})["decisions"]  # the snapshot of the last tick
        assert any(d["action"] == back["action"] for d in shown) and "max_age" not in r.fake.live
    finally:
        r.d.shutdown()
    assert "max_age" not in r.fake.live and [c[0] for c in r.fake.calls[n:]].count("reload") == 1  # nothing left


def test_after_a_kill_the_next_start_puts_the_delegated_arguments_back_in_one_reload(tmp_path: Path) -> None:
    """A SIGKILL leaves the table as the bound had it; the state file keeps what was found (max_age and
    pause_writeback unset), and the next start puts all four back in one reload, the unset ones taken out."""
    r = WcRig(tmp_path, DESTRUCTIVE)
    r.d.start()
    for t in range(1, 3):
        r.tick(t)
    r.d._save_state()
    r.d.control.stop()
    r.d.lock.release()  # killed: no restore()
    assert "max_age 30000" in r.fake.live
    r2 = WcRig(tmp_path, DESTRUCTIVE.replace("destructive", "recoverable"), r.fake)
    n = len(r.fake.calls)
    r2.d.start()
    try:
        assert [c[0] for c in r.fake.calls[n:]].count("reload") == 1
        live = WritecacheTable.parse(r.fake.live)
        assert {k: live.get(k) for k in HELD} == {"high_watermark": "50", "low_watermark": "45", "max_age": None,
                                                  "pause_writeback": None}
        [d] = [d for d in r2.d.decisions if "unclean stop" in d["reason"]]
        assert d["status"] == "done" and "max_age 30000" in d["reason"]
    finally:
        r2.d.shutdown()


def test_a_volume_dropped_and_adopted_again_has_nothing_to_put_back() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    run(e, 2, HELD)
    e.remove_volume(DEV)
    e.set_policy(parse_policy(DESTRUCTIVE.replace("destructive", "recoverable"), "t.yaml"))
    e.add_volume(WC)
    assert not [a for a in run(e, 2, HELD, start=2) if isinstance(a, PutBackKnobs)]
