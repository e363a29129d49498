"""Varmail-like sync-heavy load on a destructive-model bcache volume in the lab: the stock cache in write-through,
the stock cache in write-back, and stock write-back steered by cachepilot under the shipped default policy
(destructive, exposure <= 64 MiB / 30 s). ops/s, fsync p50/p99, and the largest dirty exposure (bytes, and age as
an independent witness measures it) sampled every second. Rounds of the three, one lab boot each, on the headline
geometry (headline.py): every run starts clean (the spool written in write-through, the cache settled to 0 dirty),
warms up, then measures a steady-state window.

.venv/bin/python tests/bench/bench_lab_varmail.py [--reps N] [--quick] [--out DIR]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline  # noqa: E402
import labbench as lb  # noqa: E402

CONFIGS = {"writethrough": "stock, write-through", "writeback": "stock, write-back",
           "cp-destructive": "stock write-back + cachepilot, shipped default (destructive)"}
BOUND_MIB, BOUND_S = 64, 30  # policies/default.yaml: exposure.max_dirty, exposure.max_age


def summary(rows: dict[str, list[dict]], reps: int) -> list[list[str]]:
    table = []
    for c, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        table.append([CONFIGS[c], lb.cellof(ok, "ops_s"), lb.cellof(ok, "fsync_p50_ms"),
                      lb.cellof(ok, "fsync_p99_ms"), lb.cellof(ok, "max_dirty_mib"),
                      lb.cellof(ok, "max_age_s", "{:.0f}"), lb.cellof(ok, "origin_written_mib"),
                      lb.cellof(ok, "origin_mib_per_kop", "{:.2f}"), lb.cellof(ok, "dirty_owed_mib"),
                      f"{len(ok)}/{reps}"])
    return table


def goals(rows: dict[str, list[dict]]) -> str:
    cp = [r for r in rows["cp-destructive"] if "error" not in r]
    vs_wt = lb.pair_ratios(rows["cp-destructive"], rows["writethrough"], "ops_s")
    vs_wb = lb.pair_ratios(rows["cp-destructive"], rows["writeback"], "ops_s")
    wb_wt = lb.pair_ratios(rows["writeback"], rows["writethrough"], "ops_s")
    within = bool(cp) and all(r["max_dirty_mib"] <= BOUND_MIB and r["max_age_s"] <= BOUND_S for r in cp)
    verdict = "n/a" if not vs_wt else ("met" if lb.med(vs_wt) >= 1.5 else "**missed**")
    return (f"Goals, pair by pair: ops/s vs write-through {lb.cell(vs_wt, '{:.2f}')}× (≥ 1.5×) — {verdict}; vs "
            f"plain write-back {lb.cell(vs_wb, '{:.2f}')}× (stock write-back itself: {lb.cell(wb_wt, '{:.2f}')}× "
            f"write-through). Exposure within the bound ({BOUND_MIB} MiB, {BOUND_S} s) in every cachepilot run: "
            f"{'met' if within else '**missed**'} (largest {max(lb.values(cp, 'max_dirty_mib'), default=0):.1f} MiB, "
            f"{max(lb.values(cp, 'max_age_s'), default=0):.1f} s).")


def main() -> None:
    reps, quick, out = lb.parse_args(sys.argv[1:])
    timing = headline.QUICK if quick else headline.FULL
    seconds = timing.window
    spec = headline.spec("bcache")
    rows: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    cmd = ["tests/bench/guest/varmail.py", "{c}", str(seconds), "--warmup", str(timing.warmup)]
    runner = lb.run_jobs("varmail", lb.numbered_rounds(list(CONFIGS), reps, spec, cmd, "varmail"), rows, out)
    md = lb.header(
        "Varmail on a destructive-model volume", spec,
        f"{headline.geometry()}. {timing.warmup} s of warm-up, then a {seconds} s window of a "
        f"varmail-like loop, 4 threads: delete a file; create one, append 16 KiB, fsync; "
        f"append 16 KiB to another, fsync; read two whole (page cache dropped). One op = one such iteration. "
        f"Exposure witness: dirty bytes every second; age = time since dirty data last read 0 (polled "
        f"every 50 ms). Median (min–max) of {reps} rounds.")
    md += "\n" + lb.md_table(["configuration", "ops/s", "fsync p50 ms", "fsync p99 ms", "largest dirty, MiB",
                              "largest age, s", "origin written in the window, MiB", "origin MiB per 1000 ops",
                              "dirty owed at the end, MiB", "runs"], summary(rows, reps))
    md += "\n\n" + goals(rows)
    dmn = [r for r in rows["cp-destructive"] if "error" not in r]
    md += (f"\n\nDaemon: CPU {lb.cellof(dmn, 'daemon_cpu_pct')}% of the guest's vCPU, RSS "
           f"{lb.cellof(dmn, 'daemon_rss_mib')} MiB; decisions (round 1): "
           f"{dmn[0].get('decisions') if dmn else '-'}.")
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + lb.repro(
        spec, [a.format(c="cp-destructive") for a in cmd] + ["--seed", "1"]) + "\n```\n"
    for key, title, unit in (("dirty_mib", "dirty data", "MiB"), ("age_s", "exposure age (witness)", "s")):
        series = {CONFIGS[c]: [(p["t"], p[key]) for p in rows[c][0].get("timeline", [])]
                  for c in CONFIGS if rows[c] and "timeline" in rows[c][0]}
        png = lb.plot(runner.out, f"varmail_{key}", f"varmail: {title} per second (round 1)", unit, series)
        if png:
            md += f"\n![varmail {title}]({png.name})\n"
    lb.save(runner.out, "varmail", md, {"configs": CONFIGS, "seconds": seconds, "rows": rows})
    lb.console.print(md)
    print(md)


if __name__ == "__main__":
    main()
