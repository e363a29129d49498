"""The headline benchmark, W1: a fileserver with a documented lifetime mix on bcache, stock against cachepilot.

Geometry and origin model, configurations, metrics and goals: docs/benchmarks.md, "Headline W1". Rounds of every
configuration (one lab boot each, the same seed within a round), ratios pair by pair within a round, cells median
(min–max) over the rounds.

.venv/bin/python tests/bench/bench_lab_headline_fileserver.py [--reps N] [--quick] [--out DIR] [--report]
    [--configs wt,wb,...] [--warmup S] [--window S] [--burst S] [--cpu-tax-pct P] [--seeds N,N,...]
--quick: one round, 10 s warm-up, 30 s window, 8 s burst (a development check, not a result; the full set: 5 rounds,
20 s warm-up, 60 s window, 15 s burst); seeds are drawn per run and printed (--seeds replays a run's), the order of
the configurations shuffled per round; best-bounded and best-overall are the stock grid's finds
(tests/bench/results/stock_grid_bcache.json, bench_lab_stock_grid.py); --report with --out: rebuild the tables
from that directory's finished runs;
$SOAK_PYSPY=<py-spy binary>: the daemon profiled over each window (daemon-profile.txt; $SOAK_PYSPY_ONCPU=1 on-CPU
samples only, $SOAK_PYSPY_RATE samples a second, passed on to the guest);
--cpu-tax-pct: a fixed share for the CPU-tax control (default: the share the same round's cachepilot destructive
run measured)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402
import stockgrid  # noqa: E402
from headline import spec as headline_spec  # noqa: E402

NAME = "headline_fileserver"
GUEST = "tests/bench/guest/headline_fileserver.py"
# The order is shuffled per round (the CPU-tax control, which waits for the destructive run's share, goes last)
CONFIGS = {
    "cp-destructive": "cachepilot, shipped default policy (destructive)",
    "wt": "stock write-through",
    "wb": "stock write-back (defaults: writeback_percent 10, writeback_delay 30)",
    "best-bounded": "best stock within 64 MiB / 30 s (the grid's find)",
    "best-overall": "best stock overall (the grid's find)",
    "discard": "stock write-back + ext4 -o discard",
    "tuned": "stock: -o discard + writeback_percent 40",
    "cp-recoverable": "cachepilot, default policy with failure_model: recoverable",
    "cp-paced": "cachepilot, default policy with exposure.pace: true (periodic drains at half the full rate)",
    "cpu-tax": "stock write-back + a busy loop at cachepilot's CPU share",
}
DEFAULT_CONFIGS = ("cp-destructive", "wt", "wb", "best-bounded", "best-overall")  # make bench's (<= 60 min)
# The headline geometry (headline.py): a 7200 rpm disk's latencies, 150 IOPS and 150 MB/s, a request counting once
# per MiB it carries.
SPEC = headline_spec("bcache")
BOUND_DIRTY_MIB, BOUND_AGE_S = 64.0, 30.0  # policies/default.yaml's exposure bound
DEFAULT_TAX_PCT = 15.0  # used only if the round's destructive run failed (the daemon's share measured before)
KIB = 1024


def options(argv: Sequence[str]) -> argparse.Namespace:
    ap = lb.parser(reps=5)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    lb.add_windows(ap)
    ap.add_argument("--burst", type=float, default=None)
    lb.add_seeds(ap)
    ap.add_argument("--cpu-tax-pct", type=float, default=None)
    a = ap.parse_args(argv)
    a.configs = lb.chosen(ap, a.configs, CONFIGS)
    lb.windows(a, quick=(10.0, 30.0), full=(20.0, 60.0))
    a.burst = a.burst if a.burst is not None else (8.0 if a.quick else 15.0)
    lb.seeds(ap, a)
    a.stock = {}
    if {"best-bounded", "best-overall"} & set(a.configs):
        found = stockgrid.load()
        a.stock = {"best-bounded": found["best_bounded"], "best-overall": found["best_overall"]}
    return a


def round_order(configs: Sequence[str], seed: int) -> list[str]:
    """The configurations in an order shuffled by the round's seed; the CPU-tax control last (it waits for the
    destructive run's CPU share)."""
    return lb.shuffled([c for c in configs if c != "cpu-tax"], seed) + [c for c in configs if c == "cpu-tax"]


def guest_cmd(config: str, a: argparse.Namespace, rnd: int, tax: float = 0.0) -> list[str]:
    """The guest's command for a configuration in round ``rnd`` (1-based): the round's seed, the grid's stock
    settings for best-*, the burst."""
    guest_config = a.stock.get(config, config)
    cmd = [GUEST, guest_config, f"{a.warmup:g}", f"{a.window:g}", "--seed", str(a.seeds[rnd - 1]),
           "--burst", f"{a.burst:g}"]
    return cmd + (["--cpu-tax-pct", f"{tax:.2f}"] if config == "cpu-tax" else [])


def tax_prepare(runner: lb.Runner, a: argparse.Namespace, rnd: int) -> Callable[[], Sequence[str]]:
    """The CPU-tax control's command, built when it starts: the daemon's CPU share from this round's destructive
    run (waited for), or --cpu-tax-pct, or the fallback."""
    def prepare() -> Sequence[str]:
        if a.cpu_tax_pct is not None:
            return guest_cmd("cpu-tax", a, rnd, a.cpu_tax_pct)
        f = runner.out / "runs" / f"cp-destructive-{rnd}" / f"{NAME}.json"
        tax = DEFAULT_TAX_PCT
        if lb.wait_for_file(f, SPEC.timeout + 180):
            tax = float(json.loads(f.read_text()).get("daemon_cpu_pct", DEFAULT_TAX_PCT))
        return guest_cmd("cpu-tax", a, rnd, tax)
    return prepare


def spec() -> lb.LabSpec:
    """SPEC, with $SOAK_PYSPY (a py-spy binary the guest can run) passed on: the daemon profiled over the window."""
    spy = os.environ.get("SOAK_PYSPY")
    if not spy:
        return SPEC
    extra = tuple(f"{k}={os.environ[k]}" for k in ("SOAK_PYSPY_ONCPU", "SOAK_PYSPY_RATE") if os.environ.get(k))
    return dataclasses.replace(SPEC, env=(*SPEC.env, f"SOAK_PYSPY={Path(spy).resolve()}", *extra))


def run(a: argparse.Namespace, configs: list[str]) -> tuple[lb.Runner, dict[str, list[dict]]]:
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    runner = lb.Runner("headline W1 fileserver", 0 if a.report else a.reps * len(configs),
                       **({"out": a.out} if a.out else {}))
    jobs = []
    lb.console.print(f"W1: seeds {a.seeds} (drawn for this run; --seeds {','.join(map(str, a.seeds))} replays it),"
                     f" best stock found: {a.stock or 'not asked for'}")
    try:
        for rnd in range(1, a.reps + 1):
            for c in round_order(configs, a.seeds[rnd - 1]) if not a.report else configs:
                if a.report:
                    f = runner.out / "runs" / f"{c}-{rnd}" / f"{NAME}.json"
                    rows[c].append(json.loads(f.read_text()) if f.exists() else {"error": "missing"})
                    continue
                prep = tax_prepare(runner, a, rnd) if c == "cpu-tax" and "cp-destructive" in configs else None
                tax = a.cpu_tax_pct if a.cpu_tax_pct is not None else DEFAULT_TAX_PCT
                jobs.append(lb.Job(c, f"{c}-{rnd}", spec(), guest_cmd(c, a, rnd, tax), NAME, prep))
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    return runner, rows


def to_discard(rs: list[dict]) -> str:
    """delete -> discard p50 and the discards' reach, or a dash where no discard reached a deleted file."""
    got = [x for x in rs if x.get("discarded")]
    if not got:
        return "–"
    return f"{lb.cellof(got, 'delete_discard_p50_s', '{:.2f}')} / {lb.cellof(got, 'discard_reach', '{:.0%}')}"


def config_rows(ok: dict[str, list[dict]]) -> list[list[str]]:
    out = []
    for c, rs in ok.items():
        kib = [x / KIB for x in lb.values(rs, "origin_bytes_per_op")]
        debt = [x / KIB for x in lb.values(rs, "debt_bytes_per_op")]
        out.append([CONFIGS[c], lb.cellof(rs, "ops_s"), lb.cell(kib), lb.cellof(rs, "dirty_owed_mib"), lb.cell(debt),
                    lb.cellof(rs, "origin_busy_ms_per_op", "{:.2f}"),
                    f"{lb.cellof(rs, 'read_p50_ms')} / {lb.cellof(rs, 'read_p99_ms')}",
                    f"{lb.cellof(rs, 'fsync_p50_ms')} / {lb.cellof(rs, 'fsync_p99_ms')}",
                    lb.cellof(rs, "hit_ratio", "{:.3f}"),
                    f"{lb.cellof(rs, 'exposure_max_dirty_mib')} / {lb.cellof(rs, 'exposure_oldest_dirty_s')}",
                    f"{lb.cellof(rs, 'daemon_cpu_pct')} / {lb.cellof(rs, 'daemon_rss_mib', '{:.0f}')}"
                    if c.startswith("cp-") else (f"tax {lb.cellof(rs, 'cpu_tax_measured_pct')}"
                                                  if c == "cpu-tax" else "–"),
                    to_discard(rs),
                    f"{lb.cellof(rs, 'burst_max_dirty_mib')} / {lb.cellof(rs, 'burst_oldest_dirty_s')}",
                    str(len(rs))])
    return out


def ratio_line(goal: str, xs: list[float], ok: Callable[[float], bool], fmt: str = "{:.2f}×") -> list[str]:
    return [goal, lb.cell(xs, fmt), lb.verdict(xs, ok)]


def spread(xs: list[float]) -> list[float]:
    """max/min of the rounds (the stability goal), as a one-value list for a goal line."""
    return [max(xs) / min(xs)] if len(xs) >= 2 and min(xs) > 0 else []


def witness(rs: list[dict], dirty: str, age: str) -> list[float]:
    """Per run: the exposure witness over the bound (the larger of dirty / 64 MiB and age / 30 s)."""
    return [max(x[dirty] / BOUND_DIRTY_MIB, x[age] / BOUND_AGE_S) for x in rs if dirty in x and age in x]


def goal_rows(rows: dict[str, list[dict]]) -> list[list[str]]:
    """Every goal of issue 31 that W1 carries (and issue 23's that still stand), pair by pair within a round (rows
    keep failed runs, so a failure drops only its own pairs)."""
    def r(a: str, b: str, key: str) -> list[float]:
        return lb.pair_ratios(rows.get(a, []), rows.get(b, []), key)

    def ok(c: str) -> list[dict]:
        return [x for x in rows.get(c, []) if "error" not in x]

    d, rec = ok("cp-destructive"), ok("cp-recoverable")
    cp = d + rec
    out = [
        ratio_line("destructive vs best stock within the bound: ops/s ≥ 1.1×",
                   r("cp-destructive", "best-bounded", "ops_s"), lambda x: x >= 1.1),
        ["destructive vs best stock overall: ops/s (no goal: that point keeps no bound)",
         lb.cell(r("cp-destructive", "best-overall", "ops_s"), "{:.2f}×"), "(shown)"],
        ratio_line("destructive vs stock write-through: ops/s ≥ 1.5× (issue 23)", r("cp-destructive", "wt", "ops_s"),
                   lambda x: x >= 1.5),
        ratio_line("destructive vs write-through: fsync p99 ≤ 1.2×", r("cp-destructive", "wt", "fsync_p99_ms"),
                   lambda x: x <= 1.2),
        ["destructive: exposure within 64 MiB / 30 s in every run's window (witness / bound, the larger)",
         lb.cell(witness(d, "exposure_max_dirty_mib", "exposure_oldest_dirty_s"), "{:.2f}"),
         lb.all_rounds(witness(d, "exposure_max_dirty_mib", "exposure_oldest_dirty_s"), lambda x: x <= 1.0)],
        ["destructive: exposure within the bound in every burst phase",
         lb.cell(witness(d, "burst_max_dirty_mib", "burst_oldest_dirty_s"), "{:.2f}"),
         lb.all_rounds(witness(d, "burst_max_dirty_mib", "burst_oldest_dirty_s"), lambda x: x <= 1.0)],
    ]
    for c in ("best-bounded", "wb", "best-overall"):
        w = witness(ok(c), "burst_max_dirty_mib", "burst_oldest_dirty_s")
        out.append([f"{CONFIGS[c]}: its burst phase's witness / bound (no goal: what stock knobs give)",
                    lb.cell(w, "{:.2f}"), "(shown)"])
    out += [
        ratio_line("stable: the shipped default's ops/s max/min across rounds ≤ 1.15×", spread(lb.values(d, "ops_s")),
                   lambda x: x <= 1.15),
        ratio_line("recoverable vs stock write-back: debt per op ≤ 0.7× (issue 23)",
                   r("cp-recoverable", "wb", "debt_bytes_per_op"), lambda x: x <= 0.7),
        ratio_line("cachepilot: delete → discard p50 ≤ 1 s", lb.values(cp, "delete_discard_p50_s"), lambda x: x <= 1.0,
                   "{:.2f} s"),
        ratio_line("cachepilot: discards reach ≥ 95% of deleted files not reused first", lb.values(cp, "discard_reach"),
                   lambda x: x >= 0.95, "{:.1%}"),
        ratio_line("daemon CPU ≤ 3% of the vCPU (issue 32)", lb.values(cp, "daemon_cpu_pct"), lambda x: x <= 3.0,
                   "{:.1f}%"),
    ]
    if "cpu-tax" in rows:
        tax, dest = r("cpu-tax", "wb", "ops_s"), r("cp-destructive", "wb", "ops_s")
        out.append(["CPU-tax control: ops/s vs stock write-back (busy loop alone; destructive)",
                    f"{lb.cell(tax, '{:.2f}×')}; {lb.cell(dest, '{:.2f}×')}", "(control)"])
    return out


def plots(runner: lb.Runner, ok: dict[str, list[dict]]) -> list[Path]:
    out = []
    traces = {c: [tuple(p) for p in rs[0]["fsync_trace"]] for c, rs in ok.items() if rs and rs[0].get("fsync_trace")}
    cp = ok.get("cp-destructive") or []
    # the destructive run's drains and switches on the same clock (the window's start): where the tail comes from
    marks = [(t, f"{'drain' if kind == 'drain' else 'mode'} {status}") for t, kind, status, _ in
             (cp[0].get("control_trace", []) if cp else []) if 0 <= t]
    png = lb.plot(runner.out, f"{NAME}_fsync", "W1 fileserver: each fsync's latency (round 1, window; marks: the"
                  " destructive run's drains and switches)", "fsync ms", traces, marks)
    if png:
        out.append(png)
    for key, label, ylabel in (("origin_mib", "origin_writes", "MiB written to the origin"),
                               ("dirty_mib", "dirty", "dirty MiB in the cache")):
        series = {c: [(p["t"], p[key]) for p in rs[0]["timeline"]] for c, rs in ok.items() if rs}
        png = lb.plot(runner.out, f"{NAME}_{label}", f"W1 fileserver: {ylabel} (round 1, warm-up + window)", ylabel,
                      series)
        if png:
            out.append(png)
    return out


def report(a: argparse.Namespace, runner: lb.Runner, rows: dict[str, list[dict]]) -> str:
    ok = {c: [x for x in rs if "error" not in x] for c, rs in rows.items()}
    md = lb.header("Headline W1: fileserver with a lifetime mix, bcache", SPEC,
                   f"{a.warmup:g} s warm-up, then a {a.window:g} s measured window per run, every run from a clean "
                   f"(settled) cache; median (min–max) of {a.reps} round(s).")
    md += "\n" + lb.md_table(["configuration", "ops/s", "origin KiB/op (window)", "dirty owed at end, MiB",
                              "debt KiB/op", "origin busy ms/op", "read p50 / p99 ms", "fsync p50 / p99 ms",
                              "workload hit ratio", "exposure: max dirty MiB / oldest dirty s",
                              "daemon CPU % / RSS MiB", "delete → discard p50 s / reach",
                              "burst: max dirty MiB / oldest dirty s", "runs"], config_rows(ok))
    goals = goal_rows(rows)
    md += f"\n\nSeeds {a.seeds}; best stock found by the grid: {a.stock or 'not run'}.\n"
    md += "\n\nGoals (issue 31), per-round pairs:\n\n" + lb.md_table(["goal", "measured", "verdict"], goals)
    rnd1 = ["cp-destructive", *([] if "cp-destructive" in rows else list(rows)[:1])][0]
    md += "\n\nReproduce one row (round 1):\n\n```sh\n" + lb.repro(SPEC, guest_cmd(rnd1, a, 1)) + "\n```\n"
    for png in plots(runner, ok):
        md += f"\n![{png.stem}]({png.name})\n"
    lb.save(runner.out, NAME, md, {"recipe": "bcache", "configs": CONFIGS, "warmup_s": a.warmup, "window_s": a.window,
                                   "burst_s": a.burst, "seeds": a.seeds, "stock": a.stock, "goals": goals,
                                   "rows": rows})
    return md


def main() -> None:
    a = options(sys.argv[1:])
    configs = [c for c in CONFIGS if c in a.configs]
    if "cpu-tax" in configs and "cp-destructive" not in configs and a.cpu_tax_pct is None:
        lb.console.print("cpu-tax without cp-destructive: the tax is the fallback share")
    runner, rows = run(a, configs)
    md = report(a, runner, rows)
    lb.console.print(md)


if __name__ == "__main__":
    main()
