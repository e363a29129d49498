"""W4 of the headline benchmark: dm-writecache against its own `max_age`. The same fileserver-like load with a
documented lifetime mix (guest/wcfiles.py) on dm-writecache with the native age bound (`max_age` 30 s, a table
argument) against stock dm-writecache (no max_age) kept by cachepilot under the shipped default policy (exposure
<= 64 MiB / 30 s, deleted files' extents discarded after the commit that freed them: dm-writecache drops dirty blocks
a discard covers). ops/s, origin bytes in the window (per 1000 ops) and the dirty data still owed (separately), the
exposure witness. Rounds of the two, one lab boot each, on the headline geometry (headline.py).

.venv/bin/python tests/bench/bench_lab_writecache.py [--reps N] [--quick] [--out DIR]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline  # noqa: E402
from labbench import (  # noqa: E402
    Job,
    Runner,
    cell,
    console,
    header,
    md_table,
    med,
    pair_ratios,
    parse_args,
    plot,
    repro,
    save,
    values,
)

CONFIGS = {"max-age": "stock dm-writecache, max_age 30 s",
           "max-age-best": "stock dm-writecache, max_age 30 s, pause_writeback 0, ext4 -o discard",
           "cp-default": "stock dm-writecache + cachepilot, shipped default (30 s, 64 MiB)"}


def summary(rows: dict[str, list[dict]], reps: int) -> list[list[str]]:
    table = []
    for c, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        table.append([CONFIGS[c], cell(values(ok, "ops_s")), cell(values(ok, "origin_written_mib")),
                      cell(values(ok, "origin_mib_per_kop"), "{:.2f}"), cell(values(ok, "dirty_owed_mib")),
                      cell(values(ok, "max_dirty_mib")), cell(values(ok, "max_age_s"), "{:.0f}"),
                      cell(values(ok, "daemon_cpu_pct")), f"{len(ok)}/{reps}"])
    return table


def goals(rows: dict[str, list[dict]]) -> str:
    cp, ma = rows["cp-default"], rows["max-age"]
    ops = pair_ratios(cp, ma, "ops_s")
    org = pair_ratios(cp, ma, "origin_written_mib")
    per = pair_ratios(cp, ma, "origin_mib_per_kop")
    best = pair_ratios(cp, rows.get("max-age-best", []), "ops_s")
    return (f"Goals, pair by pair within a round: against the best stock table arguments at the same age bound"
            f" (issue 31) ops/s {cell(best, '{:.2f}')}× (≥ 1.0×) —"
            f" {headline.verdict(best, bool(best) and med(best) >= 1.0)};"
            f" against max_age alone: ops/s {cell(ops, '{:.2f}')}× (≥ 1.0×) — "
            f"{headline.verdict(ops, bool(ops) and med(ops) >= 1.0)}; origin bytes in the window "
            f"{cell(org, '{:.2f}')}× (≤ 0.8×) — {headline.verdict(org, bool(org) and med(org) <= 0.8)}; per op "
            f"{cell(per, '{:.2f}')}×.")


def main() -> None:
    reps, quick, out = parse_args(sys.argv[1:])
    timing = headline.QUICK if quick else headline.FULL
    spec = headline.spec("writecache")
    runner = Runner("writecache", reps * len(CONFIGS), **({"out": out} if out else {}))
    rows: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    cmd = ["tests/bench/guest/wcfiles.py", "{c}", str(timing.window), "--warmup", str(timing.warmup)]
    jobs = [Job(c, f"{c}-{rep + 1}", spec, [a.format(c=c) for a in cmd] + ["--seed", str(rep + 1)], "wcfiles")
            for rep in range(reps) for c in CONFIGS]
    try:
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    md = header("W4: dm-writecache against its own max_age", spec,
                f"{headline.geometry()}. 4 threads: create a 64–192 KiB file + fsync, append 16 KiB to a live "
                f"file, read one whole, stat one, delete the files whose lifetime is up (half die 2–60 s after "
                f"creation, half are long-lived in an 85 MiB live set). {timing.warmup} s of warm-up, then a "
                f"{timing.window} s window. Median (min–max) of {reps} rounds.")
    md += "\n" + md_table(["configuration", "ops/s", "origin written in the window, MiB", "origin MiB per 1000 ops",
                           "dirty owed at the end, MiB", "largest dirty, MiB", "longest time not clean, s",
                           "daemon CPU %", "runs"], summary(rows, reps))
    md += "\n\n" + goals(rows)
    dmn = [r for r in rows["cp-default"] if "error" not in r]
    md += (f"\n\nDaemon RSS {cell(values(dmn, 'daemon_rss_mib'))} MiB; decisions (round 1): "
           f"{dmn[0].get('decisions') if dmn else '-'}.")
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + repro(
        spec, [a.format(c="cp-default") for a in cmd] + ["--seed", "1"]) + "\n```\n"
    for key, title, unit in (("dirty_mib", "dirty data", "MiB"), ("origin_mib", "origin written", "MiB")):
        series = {CONFIGS[c]: [(p["t"], p[key]) for p in rows[c][0].get("timeline", [])]
                  for c in CONFIGS if rows[c] and "timeline" in rows[c][0]}
        png = plot(runner.out, f"writecache_{key}", f"W4: {title} per second (round 1)", unit, series,
                   marks=[(float(timing.warmup), "window")])
        if png:
            md += f"\n![W4 {title}]({png.name})\n"
    save(runner.out, "writecache", md, {"configs": CONFIGS, "timing": timing.__dict__, "rows": rows})
    console.print(md)
    print(md)


if __name__ == "__main__":
    main()
