"""The search for the best stock configuration (issue 31): bcache on W1's workload, dm-writecache on W4's (--kind);
every point of the kind's grid in stockgrid.py on a short window, in an order shuffled per round, seeds drawn per
round and printed; the best point within the exposure bound and the best overall, written (--write) to
tests/bench/results/stock_grid_KIND.json, which the headline W1 (W4) then runs against.

.venv/bin/python tests/bench/bench_lab_stock_grid.py [--kind bcache|writecache] [--reps N] [--quick] [--out DIR]
    [--write] [--points "P;P..."]
--quick: one round of three points, 5 s warm-up, 20 s window (checks that the search runs; proves nothing)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402
import stockgrid  # noqa: E402
from headline import spec as headline_spec  # noqa: E402

# per kind: the lab recipe, the workload, the guest's result name, the guest's command for (point, warm-up, window,
# seed)
KINDS = {
    "bcache": ("bcache", "W1's workload", "headline_fileserver",
               lambda p, wu, win, seed: ["tests/bench/guest/headline_fileserver.py", p, wu, win, "--seed", seed]),
    "writecache": ("writecache", "W4's workload", "wcfiles",
                   lambda p, wu, win, seed: ["tests/bench/guest/wcfiles.py", p, win, "--warmup", wu, "--seed", seed]),
}


def options(argv: Sequence[str]) -> argparse.Namespace:
    ap = lb.parser(reps=2)
    ap.add_argument("--kind", choices=sorted(KINDS), default="bcache")
    ap.add_argument("--write", action="store_true", help="write the result to tests/bench/results/stock_grid_KIND.json")
    ap.add_argument("--points", default="", help="a subset of the grid (stock:... names separated by ;)")
    lb.add_windows(ap)
    a = ap.parse_args(argv)
    grid = stockgrid.grid(a.kind)
    a.points = [p for p in grid if p in a.points.split(";")] if a.points else grid
    if a.quick:
        a.reps, a.points = 1, a.points[:3]
    lb.windows(a, quick=(5.0, 20.0), full=(15.0, 45.0))
    return a


def main() -> None:
    a = options(sys.argv[1:])
    recipe, workload, result_name, command = KINDS[a.kind]
    spec = headline_spec(recipe)
    name = f"stock_grid_{a.kind}"
    seeds = lb.draw_seeds(a.reps)
    lb.console.print(f"stock grid: {len(a.points)} points x {a.reps} round(s), seeds {seeds} (drawn for this run)")
    rows: dict[str, list[dict]] = {p: [] for p in a.points}
    jobs = []
    for rnd, seed in enumerate(seeds, 1):
        order = list(a.points)
        random.Random(seed).shuffle(order)  # noqa: S311 - an order, not a secret
        jobs += [lb.Job(p, f"{p.removeprefix('stock:').replace(',', '-').replace('=', '').replace('/', '-')}-{rnd}",
                        spec, command(p, f"{a.warmup:g}", f"{a.window:g}", str(seed)), result_name)
                 for p in order]
    runner = lb.run_jobs(f"stock grid ({a.kind}, {workload})", jobs, rows, a.out)
    found = stockgrid.best(rows)
    table = [[p, lb.cellof(rs, "ops_s"), lb.cellof(rs, "exposure_max_dirty_mib"),
              lb.cellof(rs, "exposure_oldest_dirty_s"),
              "yes" if rs and all(stockgrid.within_bound(r) for r in rs if "error" not in r) else "no",
              lb.cellof(rs, "fsync_p99_ms"), str(len([r for r in rs if "error" not in r]))]
             for p, rs in rows.items()]
    md = lb.header(f"Stock grid: {a.kind} settings on {workload}", spec,
                   f"{a.warmup:g} s warm-up, {a.window:g} s window, seeds {seeds}, order shuffled per round.")
    md += "\n" + lb.md_table(["configuration", "ops/s", "max dirty MiB", "oldest dirty s", "within 64 MiB / 30 s",
                              "fsync p99 ms", "runs"], table)
    md += (f"\n\nBest within the bound: {found['best_bounded']} ({found['best_bounded_ops_s']} ops/s); best overall:"
           f" {found['best_overall']} ({found['best_overall_ops_s']} ops/s).\n")
    lb.save(runner.out, name, md, {"points": a.points, "seeds": seeds, "rows": rows, **found})
    lb.console.print(md)
    if a.write:
        if found["best_bounded"] is None or found["best_overall"] is None:
            raise SystemExit("no point qualified: the result is not written")
        doc = {**found, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seeds": seeds,
               "warmup_s": a.warmup, "window_s": a.window, "reps": a.reps, "points": len(a.points),
               "command": " ".join(["tests/bench/bench_lab_stock_grid.py", *sys.argv[1:]])}
        stockgrid.result(a.kind).write_text(json.dumps(doc, indent=1) + "\n")
        lb.console.print(f"written: {stockgrid.result(a.kind)}")


if __name__ == "__main__":
    main()
