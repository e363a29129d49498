"""Workloads no one here wrote (issue 31): Debian's dbench and fio job files on the headline geometry, each against
stock write-through, stock write-back, the best stock configuration within the bound (the stock grid's find) and
cachepilot's shipped default. Rounds with seeds drawn per run and printed, the order shuffled per round; ratios
pair by pair within a round; a tool whose write-through row leaves the origin idle is bound by the guest's CPU and
says so (origin busy share), rather than claiming a cache result.

.venv/bin/python tests/bench/bench_lab_outside.py [--tools dbench-fsync,...] [--reps N] [--quick] [--out DIR]
    [--configs wt,wb,best-bounded,cp-destructive] [--warmup S] [--window S] [--seeds N,...]
--quick: one round, 5 s warm-up, 20 s window (checks that it runs; proves nothing)."""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402
import stockgrid  # noqa: E402
from headline import spec as headline_spec  # noqa: E402

NAME = "outside"
GUEST = "tests/bench/guest/outside.py"
TOOLS = ("dbench-fsync", "dbench", "fio-fileset", "fio-db")
CONFIGS = {"wt": "stock write-through", "wb": "stock write-back (defaults)",
           "best-bounded": "best stock within 64 MiB / 30 s (the grid's find)",
           "cp-destructive": "cachepilot, shipped default policy"}
ORIGIN_BOUND_PCT = 80.0  # write-through's origin busier than this: the origin is the bottleneck


def options(argv: Sequence[str]) -> argparse.Namespace:
    ap = lb.parser(reps=5)
    ap.add_argument("--tools", default="dbench-fsync")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    lb.add_windows(ap)
    lb.add_seeds(ap)
    a = ap.parse_args(argv)
    a.tools = lb.chosen(ap, a.tools, dict.fromkeys(TOOLS, ""), "tool")
    a.configs = lb.chosen(ap, a.configs, CONFIGS)
    lb.windows(a, quick=(5.0, 20.0), full=(15.0, 60.0))
    lb.seeds(ap, a)
    a.stock = {"best-bounded": stockgrid.load()["best_bounded"]} if "best-bounded" in a.configs else {}
    return a


def goal_rows(tool: str, rows: dict[str, list[dict]]) -> list[list[str]]:
    def r(x: str, y: str) -> list[float]:
        return lb.pair_ratios(rows.get(x, []), rows.get(y, []), "throughput_mb_s")

    wt_busy = lb.values([x for x in rows.get("wt", []) if "error" not in x], "origin_busy_pct")
    bound = bool(wt_busy) and min(wt_busy) >= ORIGIN_BOUND_PCT
    cp = lb.values([x for x in rows.get("cp-destructive", []) if "error" not in x], "throughput_mb_s")
    where = "" if bound else " — the origin is not the bottleneck here (write-through's origin busy " \
        f"{lb.cell(wt_busy, '{:.0f}')}%): no goal"
    spread = [max(cp) / min(cp)] if len(cp) >= 2 and min(cp) > 0 else []
    return [
        [f"{tool}: cachepilot vs write-through ≥ 1.3×{where}", lb.cell(r("cp-destructive", "wt"), "{:.2f}×"),
         lb.verdict(r("cp-destructive", "wt"), lambda x: x >= 1.3) if bound else "(CPU-bound)"],
        [f"{tool}: cachepilot vs best stock within the bound ≥ 1.0×{where}",
         lb.cell(r("cp-destructive", "best-bounded"), "{:.2f}×"),
         lb.verdict(r("cp-destructive", "best-bounded"), lambda x: x >= 1.0) if bound else "(CPU-bound)"],
        [f"{tool}: stable, cachepilot's max/min across rounds ≤ 1.15×", lb.cell(spread, "{:.2f}×"),
         lb.verdict(spread, lambda x: x <= 1.15)],
    ]


def main() -> None:
    a = options(sys.argv[1:])
    spec = headline_spec("bcache")
    lb.console.print(f"outside workloads {a.tools}: seeds {a.seeds} (drawn for this run), stock {a.stock}")
    rows: dict[tuple[str, str], list[dict]] = {(t, c): [] for t in a.tools for c in a.configs}
    jobs = []
    for rnd, seed in enumerate(a.seeds, 1):
        for tool in a.tools:
            order = list(a.configs)
            random.Random(seed + TOOLS.index(tool)).shuffle(order)  # noqa: S311 - an order, not a secret
            jobs += [lb.Job((tool, c), f"{tool}-{c}-{rnd}", spec,
                            [GUEST, tool, a.stock.get(c, c), f"{a.warmup:g}", f"{a.window:g}", "--seed", str(seed)],
                            NAME) for c in order]
    runner = lb.run_jobs("outside workloads", jobs, rows, a.out)
    md = lb.header("Outside workloads: dbench and fio on bcache", spec,
                   f"{a.warmup:g} s warm-up, {a.window:g} s window, seeds {a.seeds}, order shuffled per round.")
    goals = []
    for tool in a.tools:
        by = {c: rows[(tool, c)] for c in a.configs}
        ok = {c: [x for x in rs if "error" not in x] for c, rs in by.items()}
        md += f"\n### {tool}\n\n" + lb.md_table(
            ["configuration", "MB/s", "origin busy %", "origin MiB written", "max dirty MiB / since clean s",
             "daemon CPU %", "mode switches", "runs"],
            [[CONFIGS[c], lb.cellof(rs, "throughput_mb_s", "{:.2f}"), lb.cellof(rs, "origin_busy_pct", "{:.0f}"),
              lb.cellof(rs, "origin_written_mib"),
              f"{lb.cellof(rs, 'exposure_max_dirty_mib')} / {lb.cellof(rs, 'exposure_dirty_since_clean_max_s')}",
              lb.cellof(rs, "daemon_cpu_pct") if c.startswith("cp-") else "–",
              lb.cell([float(len(x.get("switches", []))) for x in rs], "{:.0f}") if c.startswith("cp-") else "–",
              str(len(rs))] for c, rs in ok.items()]) + "\n"
        goals += goal_rows(tool, by)
    md += "\nGoals (issue 31), per-round pairs:\n\n" + lb.md_table(["goal", "measured", "verdict"], goals) + "\n"
    lb.save(runner.out, NAME, md, {"tools": a.tools, "seeds": a.seeds, "stock": a.stock, "goals": goals,
                                   "rows": {f"{t}/{c}": rs for (t, c), rs in rows.items()}})
    lb.console.print(md)


if __name__ == "__main__":
    main()
