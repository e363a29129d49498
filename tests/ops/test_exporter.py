"""The exporter from a hand-built snapshot: names, types, units, label sets, no paths, promtool's lint, HTTP,
the textfile writer and node_exporter carrying our metrics."""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from ops_support import free_port, need_tool, promtool, snapshot
from prometheus_client.parser import text_string_to_metric_families

from cachepilot.errors import UserError
from cachepilot.exporter import (
    TICK_BUCKETS,
    DaemonSnapshot,
    Histogram,
    HistogramAccumulator,
    Registry,
    SnapshotBox,
    SnapshotCollector,
    make_registry,
    parse_listen,
    serve,
    write_textfile,
)
from cachepilot.exporter.collectors import COLLECTORS
from cachepilot.exporter.exposition import text as render

pytestmark = pytest.mark.ops

V, VK, K = ("device", "volume"), ("device", "kind", "volume"), ("kind",)
# name -> (type, label names). The contract the rules, the dashboard and the table in docs/metrics.md rely on.
EXPECTED = {
    "cachepilot_start_time_seconds": ("gauge", ()),
    "cachepilot_ready": ("gauge", ()),
    "cachepilot_dry_run": ("gauge", ()),
    "cachepilot_observe_only": ("gauge", ()),
    "cachepilot_snapshot_timestamp_seconds": ("gauge", ()),
    "cachepilot_last_tick_timestamp_seconds": ("gauge", ()),
    "cachepilot_ticks": ("counter", ()),
    "cachepilot_tick_duration_seconds": ("histogram", ()),
    "cachepilot_tick_stage_seconds": ("counter", K),
    "cachepilot_tick_stage_cpu_seconds": ("counter", K),
    "cachepilot_volumes": ("gauge", ()),
    "cachepilot_events": ("counter", K),
    "cachepilot_event_drops": ("counter", K),
    "cachepilot_decisions": ("counter", K),
    "cachepilot_action_failures": ("counter", K),
    "cachepilot_policy_reloads": ("counter", ()),
    "cachepilot_policy_reload_failures": ("counter", ()),
    "cachepilot_policy_last_reload_success": ("gauge", ()),
    "cachepilot_state_writes": ("counter", ()),
    "cachepilot_state_write_failures": ("counter", ()),
    "cachepilot_volume_info": ("gauge", VK),
    "cachepilot_volume_mode": ("gauge", VK),
    "cachepilot_volume_target_mode": ("gauge", VK),
    "cachepilot_volume_health": ("gauge", V),
    "cachepilot_volume_latched": ("gauge", V),
    "cachepilot_volume_draining": ("gauge", V),
    "cachepilot_volume_cache_size_bytes": ("gauge", V),
    "cachepilot_volume_cache_io_errors": ("counter", V),
    "cachepilot_volume_dirty_bytes": ("gauge", V),
    "cachepilot_volume_dirty_age_seconds": ("gauge", V),
    "cachepilot_volume_dirty_bound_bytes": ("gauge", V),
    "cachepilot_volume_dirty_age_bound_seconds": ("gauge", V),
    "cachepilot_volume_drains": ("counter", V),
    "cachepilot_volume_exposure_breaches": ("counter", V),
    "cachepilot_volume_operator_drain_remaining_bytes": ("gauge", V),
    "cachepilot_volume_operator_drain_rate_bytes": ("gauge", V),
    # write-back's progress (issue 36): a stall the daemon judged, how long, dm-cache all dirty, the time to clean
    "cachepilot_volume_writeback_stalled": ("gauge", V),
    "cachepilot_volume_writeback_stalled_seconds": ("gauge", V),
    "cachepilot_volume_all_dirty": ("gauge", V),
    "cachepilot_volume_clean_eta_seconds": ("gauge", V),
    "cachepilot_volume_cache_hits": ("counter", V),
    "cachepilot_volume_cache_misses": ("counter", V),
    "cachepilot_volume_cache_bypasses": ("counter", V),
    "cachepilot_volume_cache_bypassed_bytes": ("counter", V),
    "cachepilot_volume_promoted_bytes": ("counter", V),
    "cachepilot_volume_discard_issued_bytes": ("counter", V),
    "cachepilot_volume_discard_landed_bytes": ("counter", V),
    "cachepilot_volume_barriers": ("counter", V),
    "cachepilot_volume_epoch_size_bytes": ("histogram", V),
    "cachepilot_exporter_collector_success": ("gauge", K),
    "cachepilot_exporter_collector_duration_seconds": ("gauge", K),
    "cachepilot_build_info": ("gauge", ("bpf_object", "kernel", "version")),
    "cachepilot_capture_info": ("gauge", ("path",)),
    "cachepilot_volume_unmanaged": ("gauge", ("device", "reason", "volume")),
    "cachepilot_volume_detached": ("gauge", ("device", "kind", "reason", "volume")),
    "cachepilot_volume_cache_set_info": ("gauge", ("device", "uuid", "volume")),
    # bcache's refused read-miss inserts and the promoter's rate that follows them (issue 23)
    "cachepilot_bcache_alloc_failures": ("counter", V),
    "cachepilot_volume_promotion_rate_bytes": ("gauge", V),
    # the sizing advisor's points (issue 25), by cache size in bytes
    "cachepilot_advisor_hit_ratio": ("gauge", ("device", "size_bytes", "volume")),
    "cachepilot_advisor_hit_ratio_error": ("gauge", ("device", "size_bytes", "volume")),
    "cachepilot_advisor_origin_read_bytes": ("gauge", ("device", "size_bytes", "volume")),
    # the daemon's own process (as prometheus_client's ProcessCollector has them, prefixed: node_exporter has its own
    # process_*)
    "cachepilot_process_cpu_seconds": ("counter", ()),
    "cachepilot_process_max_fds": ("gauge", ()),
    "cachepilot_process_open_fds": ("gauge", ()),
    "cachepilot_process_resident_memory_bytes": ("gauge", ()),
    "cachepilot_process_start_time_seconds": ("gauge", ()),
    "cachepilot_process_virtual_memory_bytes": ("gauge", ()),
}


def exposition(box: SnapshotBox | None = None) -> str:
    if box is None:
        box = SnapshotBox()
        box.publish(snapshot(step=10))
    return render(make_registry(box).collect()).decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_names_types_and_label_sets() -> None:
    fams = families(exposition())
    assert {n: (f.type, ) for n, f in fams.items()} == {n: (t, ) for n, (t, _) in EXPECTED.items()}
    for name, fam in fams.items():
        labels = {tuple(sorted(set(s.labels) - {"le"})) for s in fam.samples}
        assert labels == {EXPECTED[name][1]}, name


def test_units_and_counter_suffixes() -> None:
    text = exposition()
    sample_names = {m.group(1) for m in re.finditer(r"^([a-z_:]+)[{ ]", text, re.M)}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.type == "counter":
                assert s.name == fam.name + "_total", s.name
            assert not re.search(r"_(milli|micro|nano)?seconds_seconds|_(ms|us|ns|kib|mib|gib|kb|mb)(_|$)", s.name)
    # bytes and seconds are the only units; no family is named after a rate or a percentage
    assert not [n for n in sample_names if re.search(r"percent|per_second|_rate$", n)]
    assert "cachepilot_volume_dirty_bytes" in sample_names and "cachepilot_tick_duration_seconds_bucket" in sample_names


def test_no_label_value_is_a_path_and_values_match_the_snapshot() -> None:
    fams = families(exposition())
    for fam in fams.values():
        for s in fam.samples:
            for k, v in s.labels.items():
                assert "/" not in v, (s.name, k, v)
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    vol = (("device", "bcache0"), ("volume", "bcache0"))
    assert by[("cachepilot_volume_cache_hits_total", vol)] == 9000
    assert by[("cachepilot_volume_cache_bypasses_total", vol)] == 50
    assert by[("cachepilot_volume_cache_bypassed_bytes_total", vol)] == 50 * 128 << 10
    assert by[("cachepilot_volume_dirty_bound_bytes", vol)] == 64 << 20
    assert by[("cachepilot_volume_mode", (*vol[:1], ("kind", "writeback"), vol[1]))] == 1
    assert by[("cachepilot_volume_mode", (*vol[:1], ("kind", "bypass"), vol[1]))] == 0
    dm = (("device", "dm-3"), ("volume", "lab-cached"))
    # unknown to the backend -> absent, not 0
    assert ("cachepilot_volume_cache_bypasses_total", dm) not in by
    assert ("cachepilot_volume_cache_bypassed_bytes_total", dm) not in by
    assert ("cachepilot_volume_dirty_bound_bytes", dm) not in by
    assert ("cachepilot_volume_cache_io_errors_total", dm) not in by  # dm-cache keeps no error count
    assert by[("cachepilot_volume_cache_io_errors_total", vol)] == 0
    assert by[("cachepilot_volume_unmanaged", (("device", "bcache1"), ("reason", "policy"), ("volume", "bcache1")))] \
        == 1
    assert by[("cachepilot_volume_detached", (("device", "dm-4"), ("kind", "dm-writecache"), ("reason", "operator"),
                                              ("volume", "lab-wc")))] == 1
    assert by[("cachepilot_build_info", (("bpf_object", "0123456789ab"), ("kernel", "6.1.0-lab"),
                                         ("version", "1.2.3")))] == 1
    assert by[("cachepilot_capture_info", (("path", "bcc"),))] == 1
    assert by[("cachepilot_process_resident_memory_bytes", ())] > 1 << 20
    assert by[("cachepilot_tick_duration_seconds_count", ())] == 10
    assert by[("cachepilot_tick_duration_seconds_bucket", (("le", "+Inf"),))] == 10
    assert by[("cachepilot_events_total", (("kind", "freed_extent"),))] == 60


def test_promtool_check_metrics_is_clean() -> None:
    r = promtool("check", "metrics", stdin=exposition())
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_label_values_refuse_paths() -> None:
    s = snapshot()
    with pytest.raises(ValueError, match="label value"):
        type(s.volumes[0])(**{**{f: getattr(s.volumes[0], f) for f in s.volumes[0].__slots__}, "device": "/dev/x"})
    with pytest.raises(ValueError, match="label value"):
        type(s)(**{**{f: getattr(s, f) for f in s.__slots__}, "events": {"/etc/passwd": 1}})


def test_histogram_accumulator_is_cumulative_and_validated() -> None:
    acc = HistogramAccumulator(TICK_BUCKETS)
    for v in (0.001, 0.005, 0.2, 99.0):
        acc.observe(v)
    h = acc.freeze()
    assert h.counts[0] == 2 and h.counts[-1] == 3 and h.count == 4 and h.sum == pytest.approx(99.206)
    with pytest.raises(ValueError):
        Histogram((1.0, 2.0), (2, 1), 2)
    with pytest.raises(ValueError):
        Histogram((2.0, 1.0), (0, 0), 0)


def test_before_the_first_tick_only_not_ready() -> None:
    fams = families(exposition(SnapshotBox()))
    ours = [n for n in fams if not n.startswith("cachepilot_process_")]  # the process is there from the start
    assert ours == ["cachepilot_ready"] and fams["cachepilot_ready"].samples[0].value == 0


def test_a_failing_collector_is_reported_and_the_others_still_export() -> None:
    def broken(_s: object) -> list:
        raise RuntimeError("boom")

    box = SnapshotBox()
    box.publish(snapshot())
    registry = Registry()
    registry.register(SnapshotCollector(box, {**COLLECTORS, "events": broken}))
    fams = families(render(registry.collect()).decode())
    assert "cachepilot_events" not in fams and "cachepilot_volume_dirty_bytes" in fams
    ok = {s.labels["kind"]: s.value for s in fams["cachepilot_exporter_collector_success"].samples}
    assert ok["events"] == 0 and ok["daemon"] == 1 and set(ok) == set(COLLECTORS)


def test_listen_address_parsing() -> None:
    assert parse_listen("127.0.0.1:9854") == ("127.0.0.1", 9854)
    assert parse_listen("[::1]:9854") == ("::1", 9854)
    for bad in ("9854", "localhost:9854", "127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:x", ""):
        with pytest.raises(UserError, match="metrics listen address"):
            parse_listen(bad)


def test_http_serves_on_loopback_and_a_slow_scrape_never_blocks_publish() -> None:
    box = SnapshotBox()
    box.publish(snapshot(step=1))
    entered = threading.Event()

    def slow(s: object) -> list:  # a scrape stuck inside a collector for 1 s
        entered.set()
        time.sleep(1.0)
        return []

    registry = Registry()
    registry.register(SnapshotCollector(box, {"slow": slow, **COLLECTORS}))
    server = serve(f"127.0.0.1:{free_port()}", registry)
    try:
        assert server.host == "127.0.0.1"
        body: list[str] = []
        t = threading.Thread(target=lambda: body.append(
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()))
        t.start()
        assert entered.wait(5)
        start = time.monotonic()
        box.publish(snapshot(step=2))  # the loop's side: must not wait for the scrape
        assert time.monotonic() - start < 0.05
        t.join(10)
        # the scrape that started before the publish saw the old snapshot, whole
        assert "cachepilot_ticks_total 1.0" in body[0] and "cachepilot_ticks_total 2.0" not in body[0]
        with pytest.raises(UserError, match="metrics listen address"):
            serve(f"127.0.0.1:{server.port}", registry)  # taken: one line, no traceback
    finally:
        server.close()


def test_textfile_is_written_atomically(tmp_path: Path) -> None:
    box = SnapshotBox()
    box.publish(snapshot(step=3))
    registry = make_registry(box)
    target = tmp_path / "cachepilot.prom"
    write_textfile(target, registry)
    assert families(target.read_text())["cachepilot_ticks"].samples[0].value == 3
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    # a failed write leaves the previous file whole and no temporary behind
    (tmp_path / "sub").mkdir()
    box.publish(snapshot(step=4))
    with pytest.raises(OSError):
        write_textfile(tmp_path / "missing" / "cachepilot.prom", registry)
    write_textfile(target, registry)
    assert families(target.read_text())["cachepilot_ticks"].samples[0].value == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cachepilot.prom", "sub"]


def test_node_exporter_textfile_collector_carries_our_metrics(tmp_path: Path) -> None:
    box = SnapshotBox()
    box.publish(snapshot(step=5))
    write_textfile(tmp_path / "cachepilot.prom", make_registry(box))
    port = free_port()
    exe = need_tool("prometheus-node-exporter")
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                             "--collector.textfile", f"--collector.textfile.directory={tmp_path}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        text = ""
        for _ in range(100):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else "node_exporter exited"
                time.sleep(0.1)
        fams = families(text)
        assert fams["node_textfile_scrape_error"].samples[0].value == 0
        assert fams["cachepilot_volume_cache_hits"].type == "counter"
        hits = {s.labels["volume"]: s.value for s in fams["cachepilot_volume_cache_hits"].samples}
        assert hits == {"bcache0": 4500, "lab-cached": 2500}
        assert set(EXPECTED) - {"cachepilot_exporter_collector_success",
                                "cachepilot_exporter_collector_duration_seconds"} <= set(fams)
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_metric_table_lists_exactly_the_exported_metrics() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    section = doc.split("# Metrics and alerts")[1].split("**Rules**")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `cachepilot_")]
    documented = {n for line in rows for n in re.findall(r"`(cachepilot_[a-z_]+)`", line.split("|")[1])}
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in families(exposition()).values()}
    assert documented == exported, (sorted(documented - exported), sorted(exported - documented))


def test_an_observe_only_daemon_exports_clean_metrics_without_volumes() -> None:
    box = SnapshotBox()
    box.publish(DaemonSnapshot(timestamp=2.0, start_time=1.0, ready=True, dry_run=False, observe_only=True))
    text = exposition(box)
    r = promtool("check", "metrics", stdin=text)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    fams = families(text)
    assert fams["cachepilot_observe_only"].samples[0].value == 1
    assert fams["cachepilot_volumes"].samples[0].value == 0
    assert not [s for f in fams.values() for s in f.samples if "volume" in s.labels]


def test_every_decision_kind_and_failure_class_is_exported_from_the_start() -> None:

    from cachepilot import actions
    from cachepilot.errors import CachepilotError
    from cachepilot.exporter.snapshot import DECISION_KINDS, FAILURE_KINDS

    # the lists are the code's own kinds: every action class's and every error class's
    kinds = set()
    for cls in vars(actions).values():
        if isinstance(cls, type) and cls.__module__ == actions.__name__ and isinstance(getattr(cls, "kind", None),
                                                                                      property):
            kinds.add(cls.kind.fget(object.__new__(cls)))  # the property returns a constant
    assert kinds == set(DECISION_KINDS)
    classes, todo = set(), [CachepilotError]
    while todo:
        for sub in todo.pop().__subclasses__():
            classes.add(sub)
            todo.append(sub)
    assert {c.kind for c in classes if "kind" in vars(c)} == set(FAILURE_KINDS)  # (a base declares none)
    # a daemon that has decided nothing yet still exports a 0 per kind (rate() has a series from the start)
    fams = families(exposition())
    by = {(s.name, s.labels.get("kind")): s.value for f in fams.values() for s in f.samples}
    for kind in DECISION_KINDS:
        assert ("cachepilot_decisions_total", kind) in by, kind
    for kind in FAILURE_KINDS:
        assert ("cachepilot_action_failures_total", kind) in by, kind
    assert by[("cachepilot_action_failures_total", "fatal")] == 0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_and_ready_answer_on_the_metrics_listener() -> None:
    """Issue 34 item 8: liveness (the loop ticks) and readiness (probe attached, volumes adopted) for load balancers
    and orchestrators, on the same listener as /metrics, from the same snapshot."""
    box = SnapshotBox()
    server = serve(f"127.0.0.1:{free_port()}", make_registry(box), box)
    try:
        assert _get(server.port, "/healthz") == (200, "ok: starting\n")  # no tick yet: alive, not ready
        assert _get(server.port, "/ready") == (503, "not ready\n")
        now = time.time()
        box.publish(replace(snapshot(step=3, now=now), last_tick_timestamp=now))
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/ready") == (200, "ready\n")
        box.publish(replace(snapshot(step=3, now=now), ready=False, last_tick_timestamp=now - 61))
        code, text = _get(server.port, "/healthz")
        assert code == 503 and text.startswith("loop stalled: last tick 6"), text
        assert _get(server.port, "/ready") == (503, "not ready\n")
        assert _get(server.port, "/metrics")[0] == 200
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.close()
