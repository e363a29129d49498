"""Warm restart on bcache in the lab: Zipf reads over data twice the cache; midway the cache device is replaced (a
fresh cache set attached); time until the hit ratio is back to 90% of steady state -- the stock cache (its own read
misses refill it) vs stock + cachepilot under the shipped default policy (the believed-cached set re-warmed, hottest
first, when the new cache set shows up). Rounds of stock/cachepilot pairs, one lab boot each.

.venv/bin/python tests/bench/bench_lab_warm.py [--reps N] [--quick] [--out DIR]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402

CONFIGS = lb.STOCK_VS_DEFAULT


def main() -> None:
    reps, quick, out = lb.parse_args(sys.argv[1:])
    warm, after = (20, 20) if quick else (30, 40)
    spec = lb.LabSpec()
    rows: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    cmd = ["tests/bench/guest/warm.py", "{c}", str(warm), str(after)]
    runner = lb.run_jobs("warm", lb.numbered_rounds(list(CONFIGS), reps, spec, cmd, "warm"), rows, out)
    table = []
    for c, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        rec = [r["recovery_s"] for r in ok if r["recovery_s"] is not None]
        table.append([CONFIGS[c], lb.cellof(ok, "steady_ratio", "{:.3f}"),
                      lb.cell([r["attached"] - r["replace_start"] for r in ok]),
                      lb.cell(rec, "{:.1f}") + (f" ({len(ok) - len(rec)} never)" if len(rec) < len(ok) else ""),
                      lb.cellof(ok, "after_mean", "{:.3f}"), f"{len(ok)}/{reps}"])
    st, cp = rows["stock"], rows["cp-destructive"]
    # a recovery under 1 s counts as 1 s (the ratio is measured per second)
    speed = [a["recovery_s"] / max(b["recovery_s"], 1.0) for a, b in zip(st, cp, strict=False)
             if a.get("recovery_s") is not None and b.get("recovery_s") is not None]
    verdict = "n/a" if not speed else ("met" if lb.med(speed) >= 5 else "**missed**")
    md = lb.header(
        "Warm restart: the cache device replaced", spec,
        f"Data 2× the cache in 64 KiB files read by Zipf(1.1) picks, O_DIRECT; {warm} s warm, then the cache "
        f"set is detached and unregistered, the device formatted as a fresh cache set and attached, then "
        f"{after} s more. A read is a hit when it returns in < 4 ms. Recovery = attach → the end of the "
        f"first second back at 90% of the steady ratio. Median (min–max) of {reps} rounds.")
    md += "\n" + lb.md_table(["configuration", "steady hit ratio", "replacement took, s", "recovery to 90%, s",
                              "hit ratio after (mean)", "runs"], table)
    md += (f"\n\nGoal: re-warm ≥ 5× faster than stock (stock / cachepilot recovery, pair by pair): "
           f"{lb.cell(speed, '{:.1f}')}× — {verdict}.")
    dmn = [r for r in cp if "error" not in r]
    md += (f"\n\nDaemon: CPU {lb.cellof(dmn, 'daemon_cpu_pct')}% of a core, RSS "
           f"{lb.cellof(dmn, 'daemon_rss_mib')} MiB; decisions (round 1): {dmn[0].get('decisions') if dmn else '-'}"
           f"; re-warms on the replacement: {[r.get('rewarm_decisions') for r in dmn]}.")
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + lb.repro(
        spec, [a.format(c="cp-destructive") for a in cmd] + ["--seed", "1"]) + "\n```\n"
    series = {c: [tuple(p) for p in rows[c][0].get("series", [])]
              for c in CONFIGS if rows[c] and "series" in rows[c][0]}
    png = lb.plot(runner.out, "warm_hit_ratio", "hit ratio per second, cache replaced midway (round 1)", "hit ratio",
                  series)  # type: ignore[arg-type]
    if png:
        md += f"\n![warm restart hit ratio]({png.name})\n"
    lb.save(runner.out, "warm", md, {"configs": CONFIGS, "warm": warm, "after": after, "rows": rows})
    lb.console.print(md)
    print(md)


if __name__ == "__main__":
    main()
