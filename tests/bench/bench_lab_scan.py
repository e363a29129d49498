"""Backup scan over a Zipf hot set, on bcache (writeback) and dm-cache (smq, writeback), in the lab: stock vs stock +
cachepilot under the shipped default policy. The hot set's hit ratio before, during and after the scan and its
recovery time (to 90% of the pre-scan ratio). Rounds of stock/cachepilot pairs, one lab boot each.

.venv/bin/python tests/bench/bench_lab_scan.py [--reps N] [--quick] [--out DIR]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402

CONFIGS = lb.STOCK_VS_DEFAULT
RECIPES = ("bcache", "dmcache")


def main() -> None:
    reps, quick, out = lb.parse_args(sys.argv[1:])
    warm, scan_mb, after = (10, 96, 15) if quick else (15, 128, 20)
    rows: dict[tuple[str, str], list[dict]] = {(r, c): [] for r in RECIPES for c in CONFIGS}
    cmd = ["tests/bench/guest/scan.py", "{c}", str(warm), str(scan_mb), str(after)]
    jobs = [lb.Job((recipe, c), f"{recipe}-{c}-{rep + 1}", lb.LabSpec(recipe=recipe),
                   [a.format(c=c) for a in cmd] + ["--seed", str(rep + 1)], "scan")
            for rep in range(reps) for recipe in RECIPES for c in CONFIGS]
    runner = lb.run_jobs("scan", jobs, rows, out)
    table, goals = [], []
    for (recipe, c), rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        rec = [r["recovery_s"] for r in ok if r["recovery_s"] is not None]
        table.append([recipe, CONFIGS[c], lb.cellof(ok, "pre_ratio", "{:.3f}"),
                      lb.cellof(ok, "during_mean", "{:.3f}"), lb.cellof(ok, "during_min", "{:.3f}"),
                      lb.cellof(ok, "after_mean", "{:.3f}"),
                      lb.cell(rec, "{:.1f}") + (f" ({len(ok) - len(rec)} never)" if len(rec) < len(ok) else ""),
                      f"{sum(1 for r in ok if r['never_below_90'])}/{len(ok)}", f"{len(ok)}/{reps}"])
    for recipe in RECIPES:
        st, cp = rows[(recipe, "stock")], rows[(recipe, "cp-destructive")]
        speed = [a["recovery_s"] / max(b["recovery_s"], 1.0) for a, b in zip(st, cp, strict=False)
                 if a.get("recovery_s") is not None and b.get("recovery_s") is not None]
        never = [b.get("never_below_90") for b in cp if "error" not in b]
        met = (speed and lb.med(speed) >= 5) or (never and all(never))
        goals.append([recipe, lb.cell(speed, "{:.1f}") + "×", f"{sum(map(bool, never))}/{len(never)}",
                      "met" if met else "**missed**"])
    spec = lb.LabSpec()
    md = lb.header(
        "Backup scan over a Zipf hot set", spec,
        f"Hot set 256 files × 64 KiB (16 MiB) read by Zipf(1.1) picks, O_DIRECT; warm {warm} s, then a "
        f"backup reads {scan_mb} MiB of cold 1 MiB files once while the Zipf reads go on, then {after} s more. "
        "A hot read is a hit when it returns in < 4 ms. dm-cache: smq, writeback, same sizes. "
        f"Median (min–max) of {reps} rounds.")
    md += "\n" + lb.md_table(["cache", "configuration", "hot hit ratio before", "during (mean)", "during (min 1 s)",
                              "after (mean)", "recovery to 90%, s", "never below 90%", "runs"], table)
    md += "\n\nGoal: recovery ≥ 5× faster than stock (a recovery under 1 s counts as 1 s), or never below 90%:\n\n"
    md += lb.md_table(["cache", "stock / cachepilot recovery", "cachepilot never below 90%", "goal"], goals)
    md += "\n\nReproduce one row (bcache, cachepilot, round 1):\n\n```sh\n" + lb.repro(
        spec, [a.format(c="cp-destructive") for a in cmd] + ["--seed", "1"]) + "\n```\n"
    series = {f"{recipe} {c}": [tuple(p) for p in rows[(recipe, c)][0].get("series", [])]
              for recipe in RECIPES for c in CONFIGS if rows[(recipe, c)] and "series" in rows[(recipe, c)][0]}
    png = lb.plot(runner.out, "scan_hit_ratio", "hot-set hit ratio per second (round 1)", "hit ratio", series)  # type: ignore[arg-type]
    if png:
        md += f"\n![hot-set hit ratio]({png.name})\n"
    lb.save(runner.out, "scan", md, {"configs": CONFIGS, "rows": {f"{k[0]}/{k[1]}": v for k, v in rows.items()}})
    lb.console.print(md)
    print(md)


if __name__ == "__main__":
    main()
