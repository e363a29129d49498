"""The headline benchmark, W1: a fileserver with a documented lifetime mix on bcache, stock against cachepilot.

Geometry and origin model, configurations, metrics and goals: README, Benchmarks, "Headline: W1". Rounds of every
configuration (one lab boot each, the same seed within a round), ratios pair by pair within a round, cells median
(min–max) over the rounds.

.venv/bin/python tests/bench/bench_lab_headline_fileserver.py [--reps N] [--quick] [--out DIR] [--report]
    [--configs wt,wb,...] [--warmup S] [--window S] [--cpu-tax-pct P]
--quick: one round, 10 s warm-up, 40 s window (a development check, not a result; the full set: 3 rounds, 20 s
warm-up, 120 s window); --report with --out: rebuild the tables from that directory's finished runs;
$SOAK_PYSPY=<py-spy binary>: the daemon profiled over each window (daemon-profile.txt);
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
from labbench import (  # noqa: E402
    Job,
    LabSpec,
    Runner,
    all_rounds,
    cell,
    console,
    header,
    md_table,
    pair_ratios,
    plot,
    repro,
    save,
    values,
    verdict,
    wait_for_file,
)

NAME = "headline_fileserver"
GUEST = "tests/bench/guest/headline_fileserver.py"
# cachepilot's destructive run first in each round (the CPU-tax control waits for its share), the control last
CONFIGS = {
    "cp-destructive": "cachepilot, shipped default policy (destructive)",
    "wt": "stock write-through",
    "wb": "stock write-back (defaults: writeback_percent 10)",
    "discard": "stock write-back + ext4 -o discard",
    "tuned": "hand-tuned stock: -o discard + writeback_percent 40",
    "cp-recoverable": "cachepilot, default policy with failure_model: recoverable",
    "cpu-tax": "stock write-back + a busy loop at cachepilot's CPU share",
}
# A 7200 rpm disk: ~8.3 ms per random read (4.2 ms half a turn + seek), writes absorbed by its write cache but
# destaged at the same ~150 random IOPS, a flush of an almost empty write cache under a millisecond.
SPEC = LabSpec(recipe="bcache", mode="writeback", origin_delay_ms=8, read_delay_ms=8, write_delay_ms=4,
               flush_delay_ms=1, origin_iops=150, origin_size_mb=2048, cache_size_mb=256, timeout=900)
BOUND_DIRTY_MIB, BOUND_AGE_S = 64.0, 30.0  # policies/default.yaml's exposure bound
DEFAULT_TAX_PCT = 15.0  # used only if the round's destructive run failed (the daemon's share measured before)
KIB = 1024


def options(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--window", type=float, default=None)
    ap.add_argument("--cpu-tax-pct", type=float, default=None)
    a = ap.parse_args(argv)
    bad = [c for c in a.configs.split(",") if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {','.join(bad)}: choose from {','.join(CONFIGS)}")
    a.reps = 1 if a.quick else a.reps
    a.warmup = a.warmup if a.warmup is not None else (10.0 if a.quick else 20.0)
    a.window = a.window if a.window is not None else (40.0 if a.quick else 120.0)
    return a


def guest_cmd(config: str, a: argparse.Namespace, rnd: int, tax: float = 0.0) -> list[str]:
    cmd = [GUEST, config, f"{a.warmup:g}", f"{a.window:g}", "--seed", str(rnd)]
    return cmd + (["--cpu-tax-pct", f"{tax:.2f}"] if config == "cpu-tax" else [])


def tax_prepare(runner: Runner, a: argparse.Namespace, rnd: int) -> Callable[[], Sequence[str]]:
    """The CPU-tax control's command, built when it starts: the daemon's CPU share from this round's destructive
    run (waited for), or --cpu-tax-pct, or the fallback."""
    def prepare() -> Sequence[str]:
        if a.cpu_tax_pct is not None:
            return guest_cmd("cpu-tax", a, rnd, a.cpu_tax_pct)
        f = runner.out / "runs" / f"cp-destructive-{rnd}" / f"{NAME}.json"
        tax = DEFAULT_TAX_PCT
        if wait_for_file(f, SPEC.timeout + 180):
            tax = float(json.loads(f.read_text()).get("daemon_cpu_pct", DEFAULT_TAX_PCT))
        return guest_cmd("cpu-tax", a, rnd, tax)
    return prepare


def spec() -> LabSpec:
    """SPEC, with $SOAK_PYSPY (a py-spy binary the guest can run) passed on: the daemon profiled over the window."""
    spy = os.environ.get("SOAK_PYSPY")
    return dataclasses.replace(SPEC, env=(*SPEC.env, f"SOAK_PYSPY={Path(spy).resolve()}")) if spy else SPEC


def run(a: argparse.Namespace, configs: list[str]) -> tuple[Runner, dict[str, list[dict]]]:
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    runner = Runner("headline W1 fileserver", 0 if a.report else a.reps * len(configs),
                    **({"out": a.out} if a.out else {}))
    jobs = []
    try:
        for rnd in range(1, a.reps + 1):
            for c in configs:
                if a.report:
                    f = runner.out / "runs" / f"{c}-{rnd}" / f"{NAME}.json"
                    rows[c].append(json.loads(f.read_text()) if f.exists() else {"error": "missing"})
                    continue
                prep = tax_prepare(runner, a, rnd) if c == "cpu-tax" and "cp-destructive" in configs else None
                tax = a.cpu_tax_pct if a.cpu_tax_pct is not None else DEFAULT_TAX_PCT
                jobs.append(Job(c, f"{c}-{rnd}", spec(), guest_cmd(c, a, rnd, tax), NAME, prep))
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    return runner, rows


def to_discard(rs: list[dict]) -> str:
    """delete -> discard p50 and the discards' reach, or a dash where no discard reached a deleted file."""
    got = [x for x in rs if x.get("discarded")]
    if not got:
        return "–"
    return f"{cell(values(got, 'delete_discard_p50_s'), '{:.2f}')} / {cell(values(got, 'discard_reach'), '{:.0%}')}"


def config_rows(ok: dict[str, list[dict]]) -> list[list[str]]:
    out = []
    for c, rs in ok.items():
        kib = [x / KIB for x in values(rs, "origin_bytes_per_op")]
        debt = [x / KIB for x in values(rs, "debt_bytes_per_op")]
        out.append([CONFIGS[c], cell(values(rs, "ops_s")), cell(kib), cell(values(rs, "dirty_owed_mib")), cell(debt),
                    cell(values(rs, "origin_busy_ms_per_op"), "{:.2f}"),
                    f"{cell(values(rs, 'read_p50_ms'))} / {cell(values(rs, 'read_p99_ms'))}",
                    f"{cell(values(rs, 'fsync_p50_ms'))} / {cell(values(rs, 'fsync_p99_ms'))}",
                    cell(values(rs, "hit_ratio"), "{:.3f}"),
                    f"{cell(values(rs, 'exposure_max_dirty_mib'))} / {cell(values(rs, 'exposure_oldest_dirty_s'))}",
                    f"{cell(values(rs, 'daemon_cpu_pct'))} / {cell(values(rs, 'daemon_rss_mib'), '{:.0f}')}"
                    if c.startswith("cp-") else (f"tax {cell(values(rs, 'cpu_tax_measured_pct'))}"
                                                  if c == "cpu-tax" else "–"),
                    to_discard(rs), str(len(rs))])
    return out


def ratio_line(goal: str, xs: list[float], ok: Callable[[float], bool], fmt: str = "{:.2f}×") -> list[str]:
    return [goal, cell(xs, fmt), verdict(xs, ok)]


def goal_rows(rows: dict[str, list[dict]]) -> list[list[str]]:
    """Every goal of issue 23 that W1 carries, pair by pair within a round (rows keep failed runs, so a failure
    drops only its own pairs)."""
    def r(a: str, b: str, key: str) -> list[float]:
        return pair_ratios(rows.get(a, []), rows.get(b, []), key)

    d = [x for x in rows.get("cp-destructive", []) if "error" not in x]
    rec = [x for x in rows.get("cp-recoverable", []) if "error" not in x]
    cp = d + rec
    exposure = [max(x["exposure_max_dirty_mib"] / BOUND_DIRTY_MIB, x["exposure_oldest_dirty_s"] / BOUND_AGE_S)
                for x in d if "exposure_oldest_dirty_s" in x]
    out = [
        ratio_line("destructive vs stock write-through: ops/s ≥ 1.5×", r("cp-destructive", "wt", "ops_s"),
                   lambda x: x >= 1.5),
        ratio_line("destructive vs write-through: origin bytes per op ≤ 0.6×",
                   r("cp-destructive", "wt", "origin_bytes_per_op"), lambda x: x <= 0.6),
        ratio_line("destructive vs write-through: fsync p99 ≤ 1×", r("cp-destructive", "wt", "fsync_p99_ms"),
                   lambda x: x <= 1.0),
        ["destructive: exposure within 64 MiB / 30 s in every run (witness / bound, the larger)",
         cell(exposure, "{:.2f}"), all_rounds(exposure, lambda x: x <= 1.0)],
        ratio_line("recoverable vs stock write-back: debt per op ≤ 0.7×",
                   r("cp-recoverable", "wb", "debt_bytes_per_op"), lambda x: x <= 0.7),
        ratio_line("recoverable vs hand-tuned stock: debt per op ≤ 1.0×",
                   r("cp-recoverable", "tuned", "debt_bytes_per_op"), lambda x: x <= 1.0),
        ratio_line("cachepilot: delete → discard p50 ≤ 1 s", values(cp, "delete_discard_p50_s"), lambda x: x <= 1.0,
                   "{:.2f} s"),
        ratio_line("cachepilot: discards reach ≥ 95% of deleted files not reused first", values(cp, "discard_reach"),
                   lambda x: x >= 0.95, "{:.1%}"),
        ratio_line("daemon CPU ≤ 3% of the vCPU (issue 23 item 5)", values(cp, "daemon_cpu_pct"), lambda x: x <= 3.0,
                   "{:.1f}%"),
    ]
    tax, dest = r("cpu-tax", "wb", "ops_s"), r("cp-destructive", "wb", "ops_s")
    out.append(["CPU-tax control: ops/s vs stock write-back (busy loop alone; destructive)",
                f"{cell(tax, '{:.2f}×')}; {cell(dest, '{:.2f}×')}", "(control)"])
    return out


def plots(runner: Runner, ok: dict[str, list[dict]]) -> list[Path]:
    out = []
    for key, label, ylabel in (("origin_mib", "origin_writes", "MiB written to the origin"),
                               ("dirty_mib", "dirty", "dirty MiB in the cache")):
        series = {c: [(p["t"], p[key]) for p in rs[0]["timeline"]] for c, rs in ok.items() if rs}
        png = plot(runner.out, f"{NAME}_{label}", f"W1 fileserver: {ylabel} (round 1, warm-up + window)", ylabel,
                   series)
        if png:
            out.append(png)
    return out


def report(a: argparse.Namespace, runner: Runner, rows: dict[str, list[dict]]) -> str:
    ok = {c: [x for x in rs if "error" not in x] for c, rs in rows.items()}
    md = header("Headline W1: fileserver with a lifetime mix, bcache", SPEC,
                f"{a.warmup:g} s warm-up, then a {a.window:g} s measured window per run, every run from a clean "
                f"(settled) cache; median (min–max) of {a.reps} round(s).")
    md += "\n" + md_table(["configuration", "ops/s", "origin KiB/op (window)", "dirty owed at end, MiB",
                           "debt KiB/op", "origin busy ms/op", "read p50 / p99 ms", "fsync p50 / p99 ms",
                           "workload hit ratio", "exposure: max dirty MiB / oldest dirty s",
                           "daemon CPU % / RSS MiB", "delete → discard p50 s / reach", "runs"], config_rows(ok))
    goals = goal_rows(rows)
    md += "\n\nGoals (issue 23), per-round pairs:\n\n" + md_table(["goal", "measured", "verdict"], goals)
    rnd1 = ["cp-destructive", *([] if "cp-destructive" in rows else list(rows)[:1])][0]
    md += "\n\nReproduce one row (round 1):\n\n```sh\n" + repro(SPEC, guest_cmd(rnd1, a, 1)) + "\n```\n"
    for png in plots(runner, ok):
        md += f"\n![{png.stem}]({png.name})\n"
    save(runner.out, NAME, md, {"recipe": "bcache", "configs": CONFIGS, "warmup_s": a.warmup, "window_s": a.window,
                                "goals": goals, "rows": rows})
    return md


def main() -> None:
    a = options(sys.argv[1:])
    configs = [c for c in CONFIGS if c in a.configs.split(",")]
    runner, rows = run(a, configs)
    md = report(a, runner, rows)
    console.print(md)


if __name__ == "__main__":
    main()
