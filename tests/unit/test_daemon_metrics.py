"""The exporter's side (daemon/metrics.py, daemon/status.py): the textfile, one snapshot for the socket and the
exporter, built by the scrape that wants it, labels, error counts; the live sizing advisor's answers and points."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot.daemon.volumes import Found
from cachepilot.errors import UserError
from cachepilot.events import Delete, FileKey, HotnessDelta, kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample, VolumeState
from tests.unit.daemon_rig import (
    DEV,
    VOL,
    FakeBackend,
    FakeFiles,
    Rig,
    metrics,
)


def test_metrics_textfile_carries_the_daemons_snapshot(tmp_path: Path) -> None:
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    r.backends["bcache0"].dirty = 8 << 20
    r.tick(1)
    r.tick(2)
    text = (tmp_path / "m.prom").read_text()
    assert "cachepilot_ready 1.0" in text
    assert 'cachepilot_decisions_total{kind="set_write_policy"} 1.0' in text
    assert "cachepilot_volume_dirty_bytes{device=\"bcache0\",volume=\"bcache0\"} 8.388608e+06" in text
    # the stock cache's bypass counters, as the backend sampled them
    assert 'cachepilot_volume_cache_bypasses_total{device="bcache0",volume="bcache0"} 3.0' in text
    assert 'cachepilot_volume_cache_bypassed_bytes_total{device="bcache0",volume="bcache0"} 12288.0' in text
    r.d.shutdown()


def test_one_snapshot_serves_the_socket_and_the_exporter(tmp_path: Path) -> None:
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    r.backends["bcache0"].dirty = 8 << 20
    r.d._feed(Delete(FileKey(DEV, 5, 1), 0, 0))
    r.ctl().promotions_skipped["inserted"] = 2
    r.tick(1)
    snap = r.d.snapshot
    assert snap is not None
    s = r.status()
    assert s["volumes"][0]["promotions_skipped"] == {"inserted": 2}
    assert list(s) == ["version", "pid", "started", "uptime_s", "dry_run", "observe_only", "actuators", "config",
                       "policy", "probe", "drops", "last_tick", "tracked_files", "counters", "state_file", "volumes",
                       "unmanaged", "detached"]
    assert s["drops"] == {"ringbuf_full": 0, "hotness_map_full": 0, "other": 0} and "metrics" not in s["volumes"][0]
    assert s["last_tick"]["n"] == 1 and s["counters"]["decisions.set_write_policy"] == 1
    # the exporter's counts by kind are the ones counted, not the flat names parsed back
    assert snap.counts is not None and snap.counts.decisions == {"set_write_policy": 1}
    assert snap.counts.events == {"Delete": 1}
    assert snap.volumes[0].metrics is not None and snap.volumes[0].metrics.dirty_bytes == 8 << 20
    assert r.d.metrics is not None
    box = r.d.metrics.box.latest()
    assert box is not None
    assert box.decisions == {"set_write_policy": 1} and box.events == {"delete": 1} and box.ticks == 1
    assert box.volumes[0].dirty_bytes == 8 << 20 and box.drops == {}
    r.d.shutdown()


def test_the_exporters_snapshot_is_built_by_the_scrape_that_wants_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a textfile, a tick hands the exporter how to build its snapshot; a scrape builds it once (a daemon
    scraped every 15 s built 15 for nothing)."""
    from cachepilot import exporter
    from cachepilot.daemon import metrics as metrics_mod
    from cachepilot.exporter.exposition import text

    r = Rig(tmp_path)
    r.d.start()
    r.tick(1)
    built: list[int] = []
    real = metrics_mod.exporter_snapshot
    monkeypatch.setattr(metrics_mod, "exporter_snapshot", lambda *a: (built.append(1), real(*a))[-1])
    m = metrics_mod.Metrics(exporter, "")
    for _ in range(5):
        m.publish(r.d.snapshot, 10**6, 0.0, lambda msg: None)
    assert built == []
    snap = m.box.latest()
    assert snap is not None and snap.ticks == 1 and snap.tick_duration.count == 5 and len(built) == 1
    assert m.box.latest() is snap and "cachepilot_ready 1.0" in text(m.registry.collect()).decode()
    assert len(built) == 1  # built once, served twice
    r.d.shutdown()


def test_metric_labels_volume_is_the_dm_name_device_the_kernel_name(tmp_path: Path) -> None:
    from cachepilot.backends.host import Host

    (tmp_path / "block" / "dm-3" / "dm").mkdir(parents=True)
    (tmp_path / "block" / "dm-3" / "dm" / "name").write_text("lab-cached\n")
    assert Host(sysfs=tmp_path).dm_name("dm-3") == "lab-cached"
    assert Host(sysfs=tmp_path).dm_name("bcache0") == ""
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.found = [Found(VolumeInfo(dev=DEV, name="dm-3", kind="dm-cache", fs_uuid="u-1", mountpoint="/mnt/x",
                                cache_bytes=1 << 30), dm_name="lab-cached")]
    r.d.start()
    r.tick(1)
    text = (tmp_path / "m.prom").read_text()
    # as node_exporter's node_disk_*{device="dm-3"}: the two join on device
    assert 'cachepilot_volume_info{device="dm-3",kind="dm-cache",volume="lab-cached"} 1.0' in text, text
    r.d.shutdown()


def test_a_new_cache_device_counts_its_own_errors_from_nothing() -> None:
    st = VolumeState(VOL)
    for ts, (errors, cache) in enumerate(((5, "a"), (6, "a"), (2, "b"))):
        st.update(VolumeSample(DEV, ts + 1, "writeback", 0, 0, 0, errors, cache_id=cache))
    assert st.io_errors_risen == 5 + 1 + 2


class ErrorsBackend(FakeBackend):
    """A cache whose error count decays between samples, as bcache's does."""

    def __init__(self, info: VolumeInfo, **kw: object) -> None:
        super().__init__(info, **kw)
        self.errors = 0

    def sample(self, now_ns: int) -> VolumeSample:
        s = super().sample(now_ns)
        return VolumeSample(s.dev, s.ts_ns, s.mode, s.dirty_bytes, s.hits, s.misses, self.errors, s.failed, s.knobs)


def test_the_daemon_exports_errors_as_a_counter_and_none_for_dm_cache(tmp_path: Path) -> None:
    backends: dict[str, ErrorsBackend] = {}
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}",
            backend_factory=lambda info: backends.setdefault(info.name, ErrorsBackend(info)))
    dm = VolumeInfo(dev=kdev(253, 3), name="dm-3", kind="dm-cache", mountpoint="/mnt/y", cache_bytes=1 << 30)
    r.found = [Found(VOL), Found(dm, dm_name="lab-cached")]
    r.d.start()
    seen = []
    for t, errors in enumerate((0, 4, 2, 1), start=1):
        backends["bcache0"].errors = errors
        r.tick(t)
        line = next(x for x in metrics(r).splitlines() if x.startswith("cachepilot_volume_cache_io_errors_total{"))
        seen.append(float(line.split()[-1]))
    assert seen == [0, 4, 4, 4]
    assert 'device="dm-3"' not in "".join(x for x in metrics(r).splitlines() if "cache_io_errors" in x)
    text = metrics(r)
    assert 'cachepilot_build_info{bpf_object="none",kernel="' in text  # no probe here
    assert 'cachepilot_capture_info{path="none"} 1.0' in text  # no probe, no capture path
    assert "cachepilot_process_resident_memory_bytes " in text
    r.d.shutdown()


def test_advise_answers_from_the_live_drains_and_the_metrics_carry_the_curve(tmp_path: Path) -> None:
    """The drains the daemon feeds reach the advisor; `advise` answers from the snapshot (any cache size asked);
    bad requests are one UserError; the exporter publishes the points."""
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}", advisor=True)
    r.d.start()
    for rnd in range(3):  # 100 files of 1 MiB read three times: 1/3 cold, 2/3 hits once the cache holds 100 MiB
        for f in range(100):
            r.d._feed(HotnessDelta(FileKey(DEV, 100 + f, 1), 1, 0, 1 << 20, 0, rnd, 1 << 20))
    r.tick(1)
    a = r.d.answer({"cmd": "advise", "volume": "bcache0"})
    assert a["volume"] == "bcache0" and a["cache_bytes"] == 1 << 30 and a["samples"] == 300
    by_size = {p["size_bytes"]: p for p in a["points"]}
    assert by_size[1 << 30]["hit_ratio"] == pytest.approx(2 / 3, abs=1e-3)
    assert a["size_for_90pct"] <= 110 << 20
    small = r.d.answer({"cmd": "advise", "volume": "bcache0", "cache_bytes": 50 << 20})
    assert {p["size_bytes"]: p["hit_ratio"] for p in small["points"]}[50 << 20] == 0.0  # LRU loops: all miss
    for bad, words in (({"volume": "nope"}, "unknown volume 'nope'"), ({"volume": "bcache0", "cache_bytes": -1},
                       "cache_bytes must be a positive integer"), ({"volume": "bcache0", "cache_bytes": "1G"},
                       "cache_bytes must be")):
        with pytest.raises(UserError, match=words):
            r.d.answer({"cmd": "advise", **bad})
    r.tick(2)
    text = (tmp_path / "m.prom").read_text()
    assert ('cachepilot_advisor_hit_ratio{device="bcache0",size_bytes="1073741824",volume="bcache0"} 0.666'
            in text), [line for line in text.splitlines() if "advisor" in line]
    assert 'cachepilot_advisor_hit_ratio_error{device="bcache0",size_bytes="536870912",volume="bcache0"} 0.0' in text
    r.d.shutdown()


def test_the_live_advisor_is_opt_in_and_off_it_costs_nothing(tmp_path: Path) -> None:
    """Off by default (its samplers cost Python work per file touched each tick): the engine feeds none, `advise`
    says how to turn it on, no advisor metric is published."""
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    assert r.d.engine.sizing is None
    r.d._feed(HotnessDelta(FileKey(DEV, 100, 1), 1, 0, 1 << 20, 0, 0, 1 << 20))
    r.tick(1)
    with pytest.raises(UserError, match="advisor: true"):
        r.d.answer({"cmd": "advise", "volume": "bcache0"})
    r.tick(2)
    assert "cachepilot_advisor_hit_ratio{" not in (tmp_path / "m.prom").read_text()
    r.d.shutdown()


def test_status_shows_the_promoters_pace_and_the_caches_refusals(tmp_path: Path) -> None:
    """The alloc-failure count and the promoter's rate reach `cachepilot status --json` (W5 and an operator read them
    there; before, they were only in the exporter's snapshot, which the JSON leaves out)."""

    class Backoff:
        failures_total = 7

    class Promoting(FakeFiles):
        def __init__(self, info: VolumeInfo, discard_rate: int, promote_rate: int) -> None:
            super().__init__(info, discard_rate, promote_rate)
            self.promoter = type("P", (), {"backoff": Backoff(), "rate": 1 << 20})()

    r = Rig(tmp_path, files=Promoting)
    r.d.start()
    r.tick(1)
    assert r.status()["volumes"][0]["promotion"] == {"alloc_failures": 7, "promotion_rate": float(1 << 20)}
    r.d.shutdown()
    (tmp_path / "plain").mkdir()
    plain = Rig(tmp_path / "plain")
    plain.d.start()
    plain.tick(1)
    assert plain.status()["volumes"][0]["promotion"] is None
    plain.d.shutdown()
