"""W4 of the headline benchmark: dm-writecache against its own `max_age`. The same fileserver-like load with a
documented wall-clock lifetime mix (guest/wcfiles.py) on dm-writecache with the native age bound (`max_age` 30 s, a
table argument) -- at the kernel's other defaults, and at the best table arguments the stock grid found within the
shipped bound (bench_lab_stock_grid.py --kind writecache, tests/bench/results/stock_grid_writecache.json) -- against
stock dm-writecache (no max_age) kept by cachepilot under the shipped default policy (exposure <= 64 MiB / 30 s,
deleted files' extents discarded after the commit that freed them: dm-writecache drops dirty blocks a discard covers).
ops/s, origin bytes in the window (per 1000 ops) and the dirty data still owed (separately), the exposure witness.
Rounds with seeds drawn per run and printed (--seeds replays them), the order shuffled per round, one lab boot a run,
on the headline geometry (headline.py).

.venv/bin/python tests/bench/bench_lab_writecache.py [--reps N] [--quick] [--out DIR] [--configs C,...]
    [--seeds N,...] [--best-bounded stock:age=S,pause=MS,wm=H/L,discard=0|1]"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline  # noqa: E402
import stockgrid  # noqa: E402
from labbench import (  # noqa: E402
    Job,
    Runner,
    cell,
    console,
    header,
    md_table,
    med,
    pair_ratios,
    plot,
    repro,
    round_seeds,
    save,
    shuffled,
    values,
)

CONFIGS = {"max-age": "stock dm-writecache, max_age 30 s (the kernel's other defaults)",
           "best-bounded": "stock dm-writecache, the grid's best within 64 MiB / 30 s",
           "best-overall": "stock dm-writecache, the grid's best overall (max_age 30 s)",
           "cp-default": "stock dm-writecache + cachepilot, shipped default (30 s, 64 MiB)"}


def options(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one round, short windows (development only)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--configs", default="max-age,best-bounded,cp-default")
    ap.add_argument("--seeds", default="", help="the rounds' seeds (a run's printed ones); default: drawn now")
    ap.add_argument("--best-bounded", default="", metavar="SPEC",
                    help="measure this stock point (stock:age=S,pause=MS,wm=H/L,discard=0|1) as best-bounded instead"
                         " of the grid's find, e.g. when the find passes the bound over a full run")
    a = ap.parse_args(argv)
    a.configs = [c for c in a.configs.split(",") if c]
    if not a.configs or set(a.configs) - set(CONFIGS):
        ap.error(f"--configs: choose from {','.join(CONFIGS)}")
    try:
        a.seeds = round_seeds(a.seeds, 1 if a.quick else a.reps)
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected integers separated by commas")
    a.reps = len(a.seeds)
    a.stock = {}
    if {"best-bounded", "best-overall"} & set(a.configs):
        found = stockgrid.load(stockgrid.result("writecache"))
        a.stock = {"best-bounded": found["best_bounded"], "best-overall": found["best_overall"]}
    if a.best_bounded:
        if not re.fullmatch(r"stock:(age=\d+,)?pause=\d+,wm=\d+/\d+,discard=[01]", a.best_bounded):
            ap.error(f"--best-bounded {a.best_bounded!r}: expected stock:age=S,pause=MS,wm=H/L,discard=0|1")
        a.stock["best-bounded"] = a.best_bounded
    return a


def summary(rows: dict[str, list[dict]], reps: int, stock: dict[str, str]) -> list[list[str]]:
    table = []
    for c, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        name = CONFIGS[c] + (f" ({stock[c]})" if c in stock else "")
        table.append([name, cell(values(ok, "ops_s")), cell(values(ok, "origin_written_mib")),
                      cell(values(ok, "origin_mib_per_kop"), "{:.2f}"), cell(values(ok, "dirty_owed_mib")),
                      cell(values(ok, "max_dirty_mib")), cell(values(ok, "exposure_oldest_dirty_s"), "{:.0f}"),
                      cell(values(ok, "max_age_s"), "{:.0f}"),
                      cell(values(ok, "daemon_cpu_pct")), f"{len(ok)}/{reps}"])
    return table


def goals(rows: dict[str, list[dict]]) -> str:
    cp = rows["cp-default"]
    best = pair_ratios(cp, rows.get("best-bounded", []), "ops_s")
    ops = pair_ratios(cp, rows.get("max-age", []), "ops_s")
    org = pair_ratios(cp, rows.get("max-age", []), "origin_written_mib")
    per = pair_ratios(cp, rows.get("max-age", []), "origin_mib_per_kop")
    return (f"Goals, pair by pair within a round: against the best stock table arguments within the same bound"
            f" (issue 31) ops/s {cell(best, '{:.2f}')}× (≥ 1.0×) —"
            f" {headline.verdict(best, bool(best) and med(best) >= 1.0)};"
            f" against max_age alone: ops/s {cell(ops, '{:.2f}')}× (≥ 1.0×) — "
            f"{headline.verdict(ops, bool(ops) and med(ops) >= 1.0)}; origin bytes in the window "
            f"{cell(org, '{:.2f}')}× (≤ 0.8×) — {headline.verdict(org, bool(org) and med(org) <= 0.8)}; per op "
            f"{cell(per, '{:.2f}')}×; the witness within 64 MiB / 30 s in every run of each configuration: "
            + ", ".join(f"{c} {sum(map(stockgrid.within_bound, ok))}/{len(ok)}" for c, rs in rows.items()
                        if (ok := [r for r in rs if "error" not in r])) + ".")


def main() -> None:
    a = options(sys.argv[1:])
    timing = headline.QUICK if a.quick else headline.FULL
    spec = headline.spec("writecache")
    console.print(f"W4: seeds {a.seeds} (drawn for this run; --seeds {','.join(map(str, a.seeds))} replays it),"
                  f" stock {a.stock}")
    rows: dict[str, list[dict]] = {c: [] for c in a.configs}

    def cmd(c: str, seed: int) -> list[str]:
        return ["tests/bench/guest/wcfiles.py", a.stock.get(c, c), str(timing.window), "--warmup",
                str(timing.warmup), "--seed", str(seed)]

    jobs = [Job(c, f"{c}-{rnd}", spec, cmd(c, seed), "wcfiles")
            for rnd, seed in enumerate(a.seeds, 1) for c in shuffled(a.configs, seed)]
    runner = Runner("writecache", len(jobs), **({"out": a.out} if a.out else {}))
    try:
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    reps = a.reps
    md = header("W4: dm-writecache against its own max_age", spec,
                f"{headline.geometry()}. 4 threads: create a 64–192 KiB file + fsync, append 16 KiB to a live "
                f"file, read one whole, stat one, rewrite one whole in a tenth of the steps, delete the files whose "
                f"wall-clock death time (drawn at birth, W1's mix) has come. {timing.warmup} s of warm-up, then a "
                f"{timing.window} s window. Median (min–max) of {reps} rounds, seeds {a.seeds}, order shuffled "
                f"per round.")
    md += "\n" + md_table(["configuration", "ops/s", "origin written in the window, MiB", "origin MiB per 1000 ops",
                           "dirty owed at the end, MiB", "largest dirty, MiB", "oldest dirty (witness), s",
                           "longest time not clean, s",
                           "daemon CPU %", "runs"], summary(rows, reps, a.stock))
    md += "\n\n" + (goals(rows) if "cp-default" in rows else "")
    dmn = [r for r in rows.get("cp-default", []) if "error" not in r]
    md += (f"\n\nDaemon RSS {cell(values(dmn, 'daemon_rss_mib'))} MiB; decisions (round 1): "
           f"{dmn[0].get('decisions') if dmn else '-'}.")
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + repro(
        spec, cmd("cp-default", a.seeds[0])) + "\n```\n"
    for key, title, unit in (("dirty_mib", "dirty data", "MiB"), ("origin_mib", "origin written", "MiB")):
        series = {CONFIGS[c]: [(p["t"], p[key]) for p in rows[c][0].get("timeline", [])]
                  for c in a.configs if rows[c] and "timeline" in rows[c][0]}
        png = plot(runner.out, f"writecache_{key}", f"W4: {title} per second (round 1)", unit, series,
                   marks=[(float(timing.warmup), "window")])
        if png:
            md += f"\n![W4 {title}]({png.name})\n"
    save(runner.out, "writecache", md, {"configs": CONFIGS, "stock": a.stock, "seeds": a.seeds,
                                        "timing": timing.__dict__, "rows": rows})
    console.print(md)
    print(md)


if __name__ == "__main__":
    main()
