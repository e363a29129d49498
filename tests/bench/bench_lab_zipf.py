"""W3 of the headline benchmark: buffered readers with Zipf file popularity on dm-cache (promotion's home ground):
stock smq against stock smq + cachepilot under the shipped default policy. The workload's own hit ratio (reads
faster than the origin's read delay; the daemon's promotion reads never counted), read p50/p99, reads/s; dm-cache's
counters, promotions and the daemon's promoted bytes beside them. Rounds of the two, one lab boot each, on the
headline geometry (headline.py).

.venv/bin/python tests/bench/bench_lab_zipf.py [--reps N] [--quick] [--out DIR] [--with-promote]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import headline  # noqa: E402
import labbench as lb  # noqa: E402

CONFIGS = {"smq": "stock dm-cache (smq)", "cp-default": "stock smq + cachepilot, shipped default policy"}
# --with-promote: a third configuration, the shipped default with promotion.only_uncached false (admitted files
# promoted by reading on dm-cache too, the default before 2026-11-27): what those promotion reads cost, in the same
# round. Not in the headline set (a third guest per round).
PROMOTE = ("cp-promote", "stock smq + cachepilot, shipped default with only_uncached: false (promotes admitted files)")


def summary(rows: dict[str, list[dict]], reps: int) -> list[list[str]]:
    table = []
    for c, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        table.append([CONFIGS[c], lb.cellof(ok, "ops_s"), lb.cellof(ok, "hit_ratio", "{:.3f}"),
                      lb.cellof(ok, "read_p50_ms"), lb.cellof(ok, "read_p99_ms"),
                      lb.cellof(ok, "dm_workload_hit_ratio", "{:.3f}"),
                      lb.cellof(ok, "dm_hit_ratio", "{:.3f}"), lb.cellof(ok, "dm_promotions", "{:.0f}"),
                      lb.cellof(ok, "promoted_mib"), lb.cellof(ok, "daemon_cpu_pct"), f"{len(ok)}/{reps}"])
    return table


def goals(rows: dict[str, list[dict]]) -> str:
    cp, st = rows["cp-default"], rows["smq"]
    dh = headline.pair_deltas(cp, st, "hit_ratio")
    dd = headline.pair_deltas(cp, st, "dm_workload_hit_ratio")
    p99 = lb.pair_ratios(cp, st, "read_p99_ms")
    ops = lb.pair_ratios(cp, st, "ops_s")
    return (f"Goals, pair by pair within a round: workload hit ratio {lb.cell(dh, '{:+.3f}')} over smq (≥ +0.10) — "
            f"{headline.verdict(dh, bool(dh) and lb.med(dh) >= 0.10)} (at bio level, dm-cache's counters with the "
            f"promoter's bios taken out: {lb.cell(dd, '{:+.3f}')} — "
            f"{headline.verdict(dd, bool(dd) and lb.med(dd) >= 0.10)}); read p99 {lb.cell(p99, '{:.2f}')}× smq's "
            f"(≤ 0.8×) — {headline.verdict(p99, bool(p99) and lb.med(p99) <= 0.8)}; reads/s {lb.cell(ops, '{:.2f}')}×.")


def main() -> None:
    ap = lb.parser(reps=3, quick_help="one repetition, shorter runs")
    ap.add_argument("--with-promote", action="store_true", help=f"a third configuration: {PROMOTE[1]}")
    a = ap.parse_args(sys.argv[1:])
    if a.with_promote:
        CONFIGS[PROMOTE[0]] = PROMOTE[1]
    reps, quick, out = (1 if a.quick else a.reps), a.quick, a.out
    timing = headline.QUICK if quick else headline.FULL
    spec = headline.spec("dmcache")
    rows: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    cmd = ["tests/bench/guest/zipfread.py", "{c}", str(timing.window), "--warmup", str(timing.warmup),
           "--origin-read-ms", str(headline.READ_MS)]
    runner = lb.run_jobs("zipf", lb.numbered_rounds(list(CONFIGS), reps, spec, cmd, "zipfread"), rows, out)
    first = next((r for rs in rows.values() for r in rs if "error" not in r), {})
    md = lb.header("W3: Zipf readers on dm-cache", spec,
                   f"{headline.geometry()}. {first.get('files', '?')} files of {first.get('file_kib', '?')} KiB (3× "
                   f"the cache), popularity Zipf(s = {first.get('exponent', '?')}; an ideal cache of 256 MiB would hit "
                   f"{first.get('ideal_hit_ratio', float('nan')):.2f}), 4 buffered reader threads, each read whole "
                   f"after posix_fadvise DONTNEED. {timing.warmup} s of warm-up, then a {timing.window} s window. "
                   f"Hit = a file read faster than the origin's {headline.READ_MS} ms read delay. Median (min–max) of "
                   f"{reps} rounds.")
    md += "\n" + lb.md_table([
        "configuration", "reads/s", "workload hit ratio", "read p50 ms", "read p99 ms",
        "dm-cache read hit ratio, promoter taken out (bio level)",
        "dm-cache read hit ratio (incl. promoter)", "smq promotions", "promoted by the daemon, MiB",
        "daemon CPU %", "runs"], summary(rows, reps))
    md += "\n\n" + goals(rows)
    if PROMOTE[0] in rows:
        dh = headline.pair_deltas(rows[PROMOTE[0]], rows["smq"], "hit_ratio")
        p99 = lb.pair_ratios(rows[PROMOTE[0]], rows["smq"], "read_p99_ms")
        md += (f" With only_uncached false (admitted files promoted): workload hit ratio {lb.cell(dh, '{:+.3f}')} "
               f"over smq, read p99 {lb.cell(p99, '{:.2f}')}× smq's.")
    dmn = [r for r in rows["cp-default"] if "error" not in r]
    md += (f"\n\nDaemon RSS {lb.cellof(dmn, 'daemon_rss_mib')} MiB; decisions (round 1): "
           f"{dmn[0].get('decisions') if dmn else '-'}.")
    for c, rs in rows.items():
        shares = [r["cached_share_by_rank"] for r in rs if "cached_share_by_rank" in r]
        if shares:
            md += f"\n\nHeld whole by the cache at the end, by popularity rank ({CONFIGS[c]}): " + ", ".join(
                f"ranks {band}: {lb.cell([s[band] for s in shares], '{:.2f}')}" for band in shares[0])
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + lb.repro(
        spec, [a.format(c="cp-default") for a in cmd] + ["--seed", "1"]) + "\n```\n"
    series = {CONFIGS[c]: [(p["t"], p["hit_ratio"]) for p in rows[c][0].get("timeline", [])]
              for c in CONFIGS if rows[c] and "timeline" in rows[c][0]}
    png = lb.plot(runner.out, "zipf_hit_ratio", "W3: workload hit ratio per 5 s, warm-up included (round 1)",
                  "hit ratio", series, marks=[(float(timing.warmup), "window")])
    if png:
        md += f"\n![W3 hit ratio]({png.name})\n"
    lb.save(runner.out, "zipf", md, {"configs": CONFIGS, "timing": timing.__dict__, "rows": rows})
    lb.console.print(md)
    print(md)


if __name__ == "__main__":
    main()
