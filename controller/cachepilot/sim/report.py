"""The simulator's standard evaluation: four workloads x {lru, smq, opt} x {stock, +controller}, with the
issue's quality bars checked and printed as PASS/FAIL (used by `cachepilot simulate` and `make bench`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachepilot import workloads as W
from cachepilot.sim.prepare import Prepared, prepare
from cachepilot.sim.runner import POLICIES, SimResult, _NextRead, next_uses, recovery_ticks, run

MiB = 1 << 20


@dataclass
class Scenario:
    key: str
    make: Callable[[], W.Workload]
    cache_fraction: float  # of the workload's peak live data
    writeback_percent: float = 10.0
    tick_s: float = 1.0  # engine tick (and measurement resolution)
    label: str = ""  # table label (default: the workload's name)


SCENARIOS = {
    "fileserver": Scenario("fileserver", lambda: W.fileserver(iterations=8000, op_interval_ms=10), 2.0, 40.0),
    # the same, with the dirty data a stock bcache keeps by default: how much the result depends on it
    "fileserver-wb10": Scenario("fileserver-wb10", lambda: W.fileserver(iterations=8000, op_interval_ms=10),
                                1.0, 10.0, label="fileserver, stock wb 10%"),
    "webserver": Scenario("webserver", lambda: W.webserver_backup(nfiles=20000, hot_files=2000,
                                                                  reads=100000), 0.25, tick_s=0.25),
    "varmail": Scenario("varmail", lambda: W.varmail(), 0.5, 40.0),
    "warm-restart": Scenario("warm-restart", lambda: W.warm_restart(), 0.25),
}


@dataclass
class Evaluation:
    scenario: Scenario
    prepared: Prepared
    capacity: int
    results: dict[str, SimResult] = field(default_factory=dict)


def evaluate(key: str, policies: tuple[str, ...] = POLICIES, scale: float = 1.0) -> Evaluation:
    sc = SCENARIOS[key]
    w = sc.make()
    p = prepare(w, tick_s=sc.tick_s)
    cap = max(16, int(p.data_blocks_peak * sc.cache_fraction))
    ev = Evaluation(sc, p, cap)
    aux = (next_uses(p), _NextRead(p)) if "opt" in policies else None
    for pol in policies:
        for ctl in (False, True):
            r = run(p, pol, ctl, cap, sc.writeback_percent, opt_aux=aux)
            ev.results[r.label] = r
    return ev


def table(evs: list[Evaluation]) -> str:
    lines = [
        f"{'workload':24} {'policy':9} {'read hit':>8} {'zipf hit':>8} {'origin written':>15} {'origin read':>12} "
        f"{'promoted':>9} {'dirty mean':>11} {'dirty max':>10} {'discarded':>10} {'cpu s':>6}",
    ]
    for ev in evs:
        name = ev.scenario.label or ev.prepared.workload.name
        for label, r in ev.results.items():
            lines.append(
                f"{name:24} {label:9} {r.hit_ratio:8.3f} {r.zipf_hit_ratio:8.3f} "
                f"{r.origin_write_bytes / MiB:11.1f} MiB "
                f"{r.origin_read_bytes / MiB:8.1f} MiB {r.promoted_bytes / MiB:5.1f} MiB "
                f"{r.dirty_mean_bytes / MiB:7.1f} MiB {r.dirty_max_bytes / MiB:6.1f} MiB "
                f"{r.discarded_blocks:10d} {r.cpu_s:6.1f}"
            )
            name = ""
        sc, p = ev.scenario, ev.prepared
        lines.append(f"{'':24} (cache {ev.capacity} blocks = {sc.cache_fraction:.0%} of peak live data "
                     f"{p.data_blocks_peak}, "
                     f"writeback_percent {sc.writeback_percent:g}, {len(p.blk)} block accesses, "
                     f"params {p.workload.params})")
    return "\n".join(lines)


def bars(evs: dict[str, Evaluation]) -> list[tuple[str, bool | None, str]]:
    """(bar, PASS/FAIL/None=not applicable, detail)."""
    out: list[tuple[str, bool | None, str]] = []
    for key in ("fileserver", "fileserver-wb10"):
        fs = evs.get(key)
        if not fs:
            continue
        for pol in ("lru", "smq"):
            a, b = fs.results.get(pol), fs.results.get(pol + "+ctl")
            if a and b:
                ratio = b.origin_write_bytes / max(1, a.origin_write_bytes)
                ok: bool | None = ratio <= 0.5 and b.hit_ratio >= a.hit_ratio
                if key != "fileserver":
                    ok = None  # sensitivity run, not the bar
                out.append((f"{key} {pol}: origin writes with discard <= 0.5x, hit ratio >= without", ok,
                            f"ratio {ratio:.2f}, hit {b.hit_ratio:.3f} vs {a.hit_ratio:.3f}"))
    ws = evs.get("webserver")
    if ws and ws.prepared.workload.scan:
        tick_ops = ws.prepared.tick_ns // ws.prepared.workload.op_interval_ns
        s0, s1 = ws.prepared.workload.scan
        t0, t1 = s0 // tick_ops, s1 // tick_ops + 1
        for pol in ("lru", "smq"):
            a, b = ws.results.get(pol), ws.results.get(pol + "+ctl")
            if not (a and b):
                continue
            pre = (max(0, t0 - int(20 / ws.scenario.tick_s)), t0)
            ra = recovery_ticks(a, t1, pre)
            rb = recovery_ticks(b, t1, pre)
            name = f"webserver+backup {pol}: hot set back to 90% in <= 1/5 of the stock time"
            if ra is None or rb is None:
                out.append((name, False, f"did not recover (stock {ra}, ctl {rb} ticks)"))
            elif ra == 0:
                out.append((name, None, f"stock never fell below 90% (ctl {rb * ws.scenario.tick_s:g} s): "
                            "bar not applicable"))
            else:
                out.append((name, rb <= ra / 5, f"ctl {rb * ws.scenario.tick_s:g} s vs stock "
                            f"{ra * ws.scenario.tick_s:g} s after the scan ended"))
    for key in ("webserver", "warm-restart"):
        ev = evs.get(key)
        if not ev or "opt" not in ev.results:
            continue
        opt = ev.results["opt"]
        for pol in ("lru", "smq"):
            r = ev.results.get(pol + "+ctl")
            if r:
                gap = (opt.zipf_hit_ratio - r.zipf_hit_ratio) * 100
                all_gap = (opt.hit_ratio - r.hit_ratio) * 100
                detail = f"{r.zipf_hit_ratio:.3f} vs OPT {opt.zipf_hit_ratio:.3f} ({gap:.1f} points)"
                if r.scan_reads:
                    detail += (f"; all reads incl. backup scan: {r.hit_ratio:.3f} vs {opt.hit_ratio:.3f} "
                               f"({all_gap:.1f} points)")
                out.append((f"{key} {pol}+ctl within 10 points of OPT (Zipf reads)", gap <= 10, detail))
    return out


def format_bars(b: list[tuple[str, bool | None, str]]) -> str:
    word = {True: "PASS", False: "FAIL", None: "INFO"}
    return "\n".join(f"[{word[ok]}] {name}: {detail}" for name, ok, detail in b)
