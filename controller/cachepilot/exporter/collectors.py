"""One collector per concern, each building its metrics from the last published snapshot (node_exporter's shape).

A collector here is a function ``DaemonSnapshot -> list of metric families``: it never touches the kernel, the
caches or the loop, so a scrape costs a few dictionary reads. :mod:`cachepilot.exporter.registry` runs them,
timing each and reporting whether it succeeded. Names follow Prometheus' conventions: ``cachepilot_`` prefix,
base units (bytes, seconds), ``_total`` on counters, labels ``volume``, ``device`` and ``kind`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter

from cachepilot.exporter.families import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from cachepilot.exporter.snapshot import (
    DECISION_KINDS,
    FAILURE_KINDS,
    MODES,
    DaemonSnapshot,
    Histogram,
    VolumeSnapshot,
    volume_metrics,
)

VOL = ["volume", "device"]
Collect = Callable[[DaemonSnapshot], list[Metric]]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _by_kind(name: str, doc: str, table: Mapping[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["kind"])
    for kind in sorted(table):
        family.add_metric([kind], table[kind])
    return family


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    return [(repr(float(b)), float(c)) for b, c in zip(h.bounds, h.counts, strict=True)] + [("+Inf", float(h.count))]


Family = type[GaugeMetricFamily] | type[CounterMetricFamily]


def _per_volume(kind: Family, name: str, doc: str, vols: Iterable[VolumeSnapshot],
                value: Callable[[VolumeSnapshot], float | None]) -> Metric:
    """One sample per volume; a volume whose value is None (unknown to its backend) is left out."""
    family = kind(name, doc, labels=VOL)
    for v in vols:
        x = value(v)
        if x is not None:
            family.add_metric([v.volume, v.device], float(x))
    return family


def daemon(s: DaemonSnapshot) -> list[Metric]:
    ticks = HistogramMetricFamily("cachepilot_tick_duration_seconds", "Duration of the daemon's ticks.")
    ticks.add_metric([], _buckets(s.tick_duration), s.tick_duration.sum)
    build = GaugeMetricFamily("cachepilot_build_info", "1, labelled with cachepilot's version, the kernel's release "
                              "and the loaded BPF object (a short hash of the file; none without the probe).",
                              labels=["version", "kernel", "bpf_object"])
    build.add_metric([s.version, s.kernel, s.bpf_object], 1)
    capture = GaugeMetricFamily("cachepilot_capture_info", "1, labelled with the probe's capture path: core (CO-RE, "
                                "the kernel has BTF), bcc (compiled against the kernel's headers), none (no probe).",
                                labels=["path"])
    capture.add_metric([s.capture], 1)
    return [
        build,
        capture,
        _gauge("cachepilot_start_time_seconds", "When the daemon started, Unix seconds.", s.start_time),
        _gauge("cachepilot_ready", "1 once the probe is attached and the volumes adopted.", int(s.ready)),
        _gauge("cachepilot_dry_run", "1 when decisions are only logged, never carried out.", int(s.dry_run)),
        _gauge("cachepilot_observe_only", "1 when the host has no cached volume (the daemon only watches).",
               int(s.observe_only)),
        _gauge("cachepilot_snapshot_timestamp_seconds", "When the exported snapshot was built, Unix seconds.",
               s.timestamp),
        _gauge("cachepilot_last_tick_timestamp_seconds", "When the last tick finished, Unix seconds.",
               s.last_tick_timestamp),
        _counter("cachepilot_ticks_total", "Ticks run.", s.ticks),
        ticks,
        _by_kind("cachepilot_tick_stage_seconds_total", "Wall-clock time of the daemon's loop, by stage of the tick "
                 "(between: waiting for the next tick, the probe's events taken meanwhile).", s.stage_seconds),
        _by_kind("cachepilot_tick_stage_cpu_seconds_total", "CPU time of the daemon's loop thread, by stage of the "
                 "tick.", s.stage_cpu_seconds),
        _gauge("cachepilot_volumes", "Cached volumes adopted.", len(s.volumes)),
    ]


def events(s: DaemonSnapshot) -> list[Metric]:
    return [
        _by_kind("cachepilot_events_total", "Events received from the kernel probe, by kind.", s.events),
        _by_kind("cachepilot_event_drops_total", "Events the kernel side lost, by kind of loss.", s.drops),
    ]


def decisions(s: DaemonSnapshot) -> list[Metric]:
    return [
        _by_kind("cachepilot_decisions_total", "Actions the engine decided, by action kind.",
                 {**dict.fromkeys(DECISION_KINDS, 0), **s.decisions}),
        _by_kind("cachepilot_action_failures_total", "Actions that failed, by error class.",
                 {**dict.fromkeys(FAILURE_KINDS, 0), **s.action_failures}),
    ]


def policy(s: DaemonSnapshot) -> list[Metric]:
    return [
        _counter("cachepilot_policy_reloads_total", "Policy reloads that took effect.", s.policy_reloads),
        _counter("cachepilot_policy_reload_failures_total", "Policy reloads refused (the last good policy stayed).",
                 s.policy_reload_failures),
        _gauge("cachepilot_policy_last_reload_success", "1 if the last policy reload succeeded.",
               int(s.policy_last_reload_success)),
    ]


def state(s: DaemonSnapshot) -> list[Metric]:
    return [
        _counter("cachepilot_state_writes_total", "State file writes that completed.", s.state_writes),
        _counter("cachepilot_state_write_failures_total", "State file writes that failed (e.g. a full disk).",
                 s.state_write_failures),
    ]


def _mode_set(name: str, doc: str, vols: Iterable[VolumeSnapshot], mode: Callable[[VolumeSnapshot], str]) -> Metric:
    """A state set: one series per mode, 1 for the volume's mode and 0 for the others (a timeline in Grafana)."""
    family = GaugeMetricFamily(name, doc, labels=[*VOL, "kind"])
    for v in vols:
        for m in MODES:
            family.add_metric([v.volume, v.device, m], int(mode(v) == m))
    return family


# Per-volume metrics as tables: (family, name, help, the VolumeSnapshot field), each collector's rows read off the
# snapshot's fields (snapshot.VolumeMetric): a metric is declared once, on its field. A field that is None for a
# volume (its backend has no such counter) leaves that volume out of the metric; a bool is exported as 0/1.
PerVolume = tuple[Family, str, str, str]
Gauge, Counter = GaugeMetricFamily, CounterMetricFamily


def _rows(collector: str) -> tuple[PerVolume, ...]:
    return tuple((Counter if m.counter else Gauge, m.name, m.help, attr) for attr, m in volume_metrics(collector))


VOLUME, EXPOSURE, CACHE, ACTUATION, EPOCHS = (_rows(c) for c in ("volume", "exposure", "cache", "actuation",
                                                                    "epochs"))


def _table(rows: Iterable[PerVolume], vols: Iterable[VolumeSnapshot]) -> list[Metric]:
    return [_per_volume(kind, name, doc, vols, attrgetter(attr)) for kind, name, doc, attr in rows]


def _table_collector(rows: tuple[PerVolume, ...]) -> Collect:
    def collect(s: DaemonSnapshot) -> list[Metric]:
        return _table(rows, s.volumes)
    return collect


def volume(s: DaemonSnapshot) -> list[Metric]:
    vols = s.volumes
    info = GaugeMetricFamily("cachepilot_volume_info", "Adopted cached volumes; kind is the cache kind.",
                             labels=[*VOL, "kind"])
    for v in vols:
        info.add_metric([v.volume, v.device, v.kind], 1)
    cache_set = GaugeMetricFamily("cachepilot_volume_cache_set_info", "1 per bcache volume, labelled with its cache "
                                  "set's UUID as node_exporter's node_bcache_*{uuid} carry it.", labels=[*VOL, "uuid"])
    for v in vols:
        if v.cache_set is not None:
            cache_set.add_metric([v.volume, v.device, v.cache_set], 1)
    unmanaged = GaugeMetricFamily("cachepilot_volume_unmanaged", "1 for a cached volume the daemon found but cannot "
                                  "manage, by reason (describe, backend, policy, watch); its cache runs unbounded.",
                                  labels=[*VOL, "reason"])
    for u in s.unmanaged:
        unmanaged.add_metric([u.volume, u.device, u.reason], 1)
    detached = GaugeMetricFamily("cachepilot_volume_detached", "1 for a cached device without its cache on purpose, "
                                 "not managed: reason operator (cachepilot detach; attach puts it back) or no_cache "
                                 "(found so).", labels=[*VOL, "kind", "reason"])
    for x in s.detached:
        detached.add_metric([x.volume, x.device, x.kind, x.reason], 1)
    return [
        info,
        _mode_set("cachepilot_volume_mode", "Current write mode (kind), 1 for the active one.", vols, lambda v: v.mode),
        _mode_set("cachepilot_volume_target_mode", "Write mode the engine wants (kind), 1 for the wanted one.", vols,
                  lambda v: v.target_mode),
        *_table(VOLUME, vols),
        cache_set,
        unmanaged,
        detached,
    ]


exposure, cache, actuation = (_table_collector(t) for t in (EXPOSURE, CACHE, ACTUATION))


def epochs(s: DaemonSnapshot) -> list[Metric]:
    vols = s.volumes
    sizes = HistogramMetricFamily("cachepilot_volume_epoch_size_bytes", "Bytes written per barrier epoch.",
                                  labels=VOL)
    for v in vols:
        sizes.add_metric([v.volume, v.device], _buckets(v.epoch_bytes), v.epoch_bytes.sum)
    return [*_table(EPOCHS, vols), sizes]


def advisor(s: DaemonSnapshot) -> list[Metric]:
    """The cache-sizing advisor's points (models/sizing.py): ½×, 1×, 2×, 4× the cache and the size reaching 90% of
    the achievable hits, each labelled with its size in bytes."""
    labels = [*VOL, "size_bytes"]
    ratio = GaugeMetricFamily("cachepilot_advisor_hit_ratio", "Estimated read hit ratio (LRU, sampled) of the "
                              "volume's workload at a cache of size_bytes.", labels=labels)
    error = GaugeMetricFamily("cachepilot_advisor_hit_ratio_error", "The estimate's error: half the spread of the "
                              "hit ratio across independent hash seeds.", labels=labels)
    origin = GaugeMetricFamily("cachepilot_advisor_origin_read_bytes", "Estimated bytes the origin would have "
                               "served (read misses) at a cache of size_bytes, over the advisor's window.",
                               labels=labels)
    for v in s.volumes:
        for size, hit, err, read, _written in v.advice:
            key = [v.volume, v.device, str(size)]
            ratio.add_metric(key, hit)
            error.add_metric(key, err)
            origin.add_metric(key, read)
    return [ratio, error, origin]


# name (the collector's `kind` label) -> collector; the order is the exposition's order.
COLLECTORS: dict[str, Collect] = {
    "daemon": daemon,
    "events": events,
    "decisions": decisions,
    "policy": policy,
    "state": state,
    "volume": volume,
    "exposure": exposure,
    "cache": cache,
    "actuation": actuation,
    "epochs": epochs,
    "advisor": advisor,
}
