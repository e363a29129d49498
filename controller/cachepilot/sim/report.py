"""The simulator's standard evaluation: the workloads x {lru, smq, opt} x {stock, + the controller under the
shipped default policy (``+ctl``), + the controller under the simulator-tuned policy (``+tuned``)}, and a
fileserver sweep over cache size x writeback_percent (stock and ``+ctl`` only), with the quality bars
checked and printed as PASS/FAIL for the shipped default first (used by `cachepilot simulate` and
`make bench`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachepilot import workloads as W
from cachepilot.policy.model import DEFAULT_POLICY, Policy
from cachepilot.sim.prepare import Prepared, prepare
from cachepilot.sim.runner import POLICIES, SIM_POLICY, SimResult, _NextRead, next_uses, recovery_ticks, run

MiB = 1 << 20


@dataclass
class Scenario:
    key: str
    make: Callable[[], W.Workload]
    cache_fraction: float  # of the workload's peak live data
    writeback_percent: float = 10.0
    tick_s: float = 1.0  # engine tick (and measurement resolution)
    label: str = ""  # table label (default: the workload's name)
    sweep: bool = False  # a sensitivity run: lru and smq, stock and the shipped default only


CONTROLLERS: dict[str, Policy] = {"ctl": DEFAULT_POLICY, "tuned": SIM_POLICY}
"""The controller policies the table shows: ``ctl`` = the shipped default (policies/default.yaml, the built-in
default), ``tuned`` = the simulator-tuned policy (see :func:`describe_controllers`)."""


def describe_controllers() -> str:
    out = []
    for name, pol in CONTROLLERS.items():
        d = pol.defaults
        pr, dc, ex = d.promotion, d.discard_on_delete, d.exposure
        what = "the shipped default, policies/default.yaml" if pol is DEFAULT_POLICY else "simulator-tuned"
        out.append(f"+{name} = {what}: failure_model {d.failure_model} (exposure <= {ex.max_dirty >> 20} MiB / "
                   f"{ex.max_age_s:g} s), promotion {pr.rate >> 20} MiB/s up to {pr.max_cache_fraction:g} of "
                   f"the cache, sieve {pr.sieve_size >> 10} KiB, refresh {pr.refresh_interval_s:g} s, discard "
                   f"every {dc.interval_s:g} s >= {dc.min_extent >> 10} KiB, half-life {pol.half_life_s:g} s")
    return "\n".join(out)


def _fs() -> W.Workload:
    return W.fileserver(iterations=8000, op_interval_ms=10)


SCENARIOS = {
    "fileserver": Scenario("fileserver", _fs, 2.0, 40.0, label="fileserver 2x wb40"),
    # the sweep: cache size x live data, and bcache's writeback_percent (stock 10)
    **{f"fileserver-{c:g}x-wb{wb}": Scenario(f"fileserver-{c:g}x-wb{wb}", _fs, c, float(wb),
                                             label=f"fileserver {c:g}x wb{wb}", sweep=True)
       for c in (0.5, 1.0, 2.0) for wb in (10, 40) if (c, wb) != (2.0, 40)},
    # W1's lifetime mix (40% of new files die 2-60 s old), the live set a third of the cache as in the lab's W1
    "lifetime-mix": Scenario("lifetime-mix", lambda: W.fileserver_lifetimes(), 3.0,
                             label="lifetime mix 3x"),
    "webserver": Scenario("webserver", lambda: W.webserver_backup(nfiles=20000, hot_files=2000,
                                                                  reads=100000), 0.25, tick_s=0.25),
    # Filebench's webserver: uniform picks; the log grows to ~8x the file set, so 0.05 of the peak live data
    # is about half of the files read
    "webserver-uniform": Scenario("webserver-uniform", lambda: W.webserver(reads=50000), 0.05,
                                  label="webserver uniform"),
    "varmail": Scenario("varmail", lambda: W.varmail(), 0.5, 40.0),
    "warm-restart": Scenario("warm-restart", lambda: W.warm_restart(), 0.25),
}
# Other names of a scenario: the sweep's own name for the main fileserver point (docs/operate.md lists the sweep as
# fileserver-{0.5,1,2}x-wb{10,40}), accepted but not run twice by "all".
ALIASES = {"fileserver-2x-wb40": "fileserver"}
WORKLOADS = ("all", *SCENARIOS, *ALIASES)
"""Every name `cachepilot simulate --workload` takes: the one list (docs/operate.md's is checked against it)."""


@dataclass
class Evaluation:
    scenario: Scenario
    prepared: Prepared
    capacity: int
    results: dict[str, SimResult] = field(default_factory=dict)


def evaluate(key: str, policies: tuple[str, ...] = POLICIES) -> Evaluation:
    sc = SCENARIOS[key]
    if sc.sweep:
        policies = tuple(p for p in policies if p != "opt")
    w = sc.make()
    p = prepare(w, tick_s=sc.tick_s)
    cap = max(16, int(p.data_blocks_peak * sc.cache_fraction))
    ev = Evaluation(sc, p, cap)
    aux = (next_uses(p), _NextRead(p)) if "opt" in policies else None
    ctls = ["ctl"] if sc.sweep else list(CONTROLLERS)
    for pol in policies:
        r = run(p, pol, False, cap, sc.writeback_percent, opt_aux=aux)
        ev.results[r.label] = r
        for name in ctls:
            r = run(p, pol, True, cap, sc.writeback_percent, ctl_policy=CONTROLLERS[name], opt_aux=aux,
                    ctl_name=name)
            ev.results[r.label] = r
    return ev


def table(evs: list[Evaluation]) -> str:
    lines = [
        f"{'workload':24} {'policy':9} {'read hit':>8} {'zipf hit':>8} {'origin written':>15} {'origin read':>12} "
        f"{'promoted':>9} {'dirty mean':>11} {'dirty max':>10} {'age max':>7} {'discarded':>10} {'cpu s':>6}",
    ]
    for ev in evs:
        name = ev.scenario.label or ev.prepared.workload.name
        for label, r in ev.results.items():
            lines.append(
                f"{name:24} {label:9} {r.hit_ratio:8.3f} {r.zipf_hit_ratio:8.3f} "
                f"{r.origin_write_bytes / MiB:11.1f} MiB "
                f"{r.origin_read_bytes / MiB:8.1f} MiB {r.promoted_bytes / MiB:5.1f} MiB "
                f"{r.dirty_mean_bytes / MiB:7.1f} MiB {r.dirty_max_bytes / MiB:6.1f} MiB {r.exposure_age_max_s:5.0f} s "
                f"{r.discarded_blocks:10d} {r.cpu_s:6.1f}"
            )
            name = ""
        sc, p = ev.scenario, ev.prepared
        lines.append(f"{'':24} (cache {ev.capacity} blocks = {sc.cache_fraction:.0%} of peak live data "
                     f"{p.data_blocks_peak}, "
                     f"writeback_percent {sc.writeback_percent:g}, {len(p.blk)} block accesses, "
                     f"params {p.workload.params})")
    return "\n".join(lines)


def _hot_ratio(r: SimResult, t0: int, t1: int) -> float | None:
    reads = sum(x[0] for x in r.hot_per_tick[t0:t1])
    return sum(x[1] for x in r.hot_per_tick[t0:t1]) / reads if reads else None


def _fileserver_bars(evs: dict[str, Evaluation]) -> list[tuple[str, bool | None, str]]:
    out: list[tuple[str, bool | None, str]] = []
    for key, fs in evs.items():
        if not key.startswith("fileserver"):
            continue
        for name in CONTROLLERS:
            for pol in ("lru", "smq"):
                a, b = fs.results.get(pol), fs.results.get(f"{pol}+{name}")
                if not (a and b):
                    continue
                ratio = b.origin_write_bytes / max(1, a.origin_write_bytes)
                ok: bool | None = ratio <= 0.5 and b.hit_ratio >= a.hit_ratio
                if fs.scenario.sweep:
                    ok = None  # sensitivity run, not the bar
                out.append((f"{fs.scenario.label} {pol}+{name}: origin writes with discard <= 0.5x, hit ratio >= "
                            "without", ok, f"ratio {ratio:.2f}, hit {b.hit_ratio:.3f} vs {a.hit_ratio:.3f}"))
    return out


def _scan_bars(ws: Evaluation) -> list[tuple[str, bool | None, str]]:
    out: list[tuple[str, bool | None, str]] = []
    w = ws.prepared.workload
    if not w.scan:
        return out
    tick_ops = ws.prepared.tick_ns // w.op_interval_ns
    s0, s1 = w.scan
    t0, t1 = s0 // tick_ops, s1 // tick_ops + 1
    tick_s = ws.scenario.tick_s
    pre = (max(0, t0 - int(20 / tick_s)), t0)
    post = (t1, t1 + int(20 / tick_s))
    for pol in ("lru", "smq"):
        a = ws.results.get(pol)
        if not a:
            continue
        ra = recovery_ticks(a, t1, pre)
        during, after = [], []
        for label in (pol, *(f"{pol}+{n}" for n in CONTROLLERS)):
            r = ws.results.get(label)
            if r:
                d, f = _hot_ratio(r, t0, t1), _hot_ratio(r, *post)
                during.append(f"{label} {d:.3f}" if d is not None else f"{label} -")
                after.append(f"{label} {f:.3f}" if f is not None else f"{label} -")
        out.append((f"webserver+backup {pol}: hot-set hit ratio during the scan / the 20 s after it", None,
                    f"during: {', '.join(during)}; after: {', '.join(after)}"))
        for name in CONTROLLERS:
            b = ws.results.get(f"{pol}+{name}")
            if not b:
                continue
            rb = recovery_ticks(b, t1, pre)
            bar = f"webserver+backup {pol}+{name}: hot set back to 90% in <= 1/5 of the stock time"
            if ra is None or rb is None:
                out.append((bar, False, f"did not recover (stock {ra}, {name} {rb} ticks)"))
            elif ra == 0:
                out.append((bar, None, f"stock never fell below 90% ({name} {rb * tick_s:g} s): not applicable"))
            else:
                out.append((bar, rb <= ra / 5, f"{name} {rb * tick_s:g} s vs stock {ra * tick_s:g} s after the scan"))
    return out


def bars(evs: dict[str, Evaluation]) -> list[tuple[str, bool | None, str]]:
    """(bar, PASS/FAIL/None=not applicable or informative, detail); the shipped default (+ctl) first."""
    out = _fileserver_bars(evs)
    ws = evs.get("webserver")
    if ws:
        out += _scan_bars(ws)
    for key in ("webserver", "warm-restart"):
        ev = evs.get(key)
        if not ev or "opt" not in ev.results:
            continue
        opt = ev.results["opt"]
        for name in CONTROLLERS:
            for pol in ("lru", "smq"):
                r = ev.results.get(f"{pol}+{name}")
                if not r:
                    continue
                gap = (opt.zipf_hit_ratio - r.zipf_hit_ratio) * 100
                all_gap = (opt.hit_ratio - r.hit_ratio) * 100
                detail = f"{r.zipf_hit_ratio:.3f} vs OPT {opt.zipf_hit_ratio:.3f} ({gap:.1f} points)"
                if r.scan_reads:
                    detail += (f"; all reads incl. backup scan: {r.hit_ratio:.3f} vs {opt.hit_ratio:.3f} "
                               f"({all_gap:.1f} points)")
                out.append((f"{key} {pol}+{name} within 10 points of OPT (Zipf reads)", gap <= 10, detail))
    return out


def format_bars(b: list[tuple[str, bool | None, str]]) -> str:
    word = {True: "PASS", False: "FAIL", None: "INFO"}
    return "\n".join(f"[{word[ok]}] {name}: {detail}" for name, ok, detail in b)
