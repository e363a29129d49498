"""W5 (issue 37): hot large files on bcache while a backup streams twice the cache, in the lab on the headline
geometry. Configurations: stock (sequential_cutoff 4 MiB), stock sequential_cutoff 0 (every stream cached), stock
16 MiB (between the two: one hot file's run passes, the backup's 64 MiB files do not), cachepilot's shipped default.
--kind dmcache (issue 37 item 2, measure before building): the same load on dm-cache -- stock smq, smq with
migration_threshold 16 MiB (its stock lever for promoting faster), cachepilot's shipped default.
Metrics: origin bytes per hot-file read (the daemon's promotion reads charged to it), hot-file read time p50/p99, the
per-round origin bytes (the hot set's residency over time, plotted), the backup's throughput, the daemon's CPU.

.venv/bin/python tests/bench/bench_lab_hotlarge.py [--reps N] [--quick] [--out DIR]
    [--rounds N] [--interval S] [--stream-x X] [--backup-round K] [--configs a,b,...] [--kind bcache|dmcache]
    [--seeds N,...]
(the defaults: 8 rounds 90 s apart, a backup of 2x the cache from round 3, every configuration; --quick: 4 rounds 45 s
apart, 1x the cache; --configs also sets the order the runs go in)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import geometry, spec  # noqa: E402
from labbench import (  # noqa: E402
    Job,
    Runner,
    cell,
    console,
    header,
    md_table,
    med,
    parse_args,
    plot,
    repro,
    round_seeds,
    save,
)

CONFIGS = {"stock": "stock (sequential_cutoff 4 MiB)", "cutoff0": "stock, sequential_cutoff 0",
           "cutoff16": "stock, sequential_cutoff 16 MiB", "smq": "stock dm-cache smq (migration_threshold 1 MiB)",
           "smq-mt": "stock smq, migration_threshold 16 MiB", "cp-default": "stock + cachepilot, shipped default"}
KIND_CONFIGS = {"bcache": ("stock", "cutoff0", "cutoff16", "cp-default"), "dmcache": ("smq", "smq-mt", "cp-default")}
BASE = {"bcache": "stock", "dmcache": "smq"}  # the stock defaults: the backup's throughput is compared with them
MIB = 1 << 20
# bcache's counters per round, as the guest records them (stats_total and the bcache_alloc_fail tracepoint)
OWN = {"cache_misses": "read misses", "alloc_fail": "inserts refused (alloc_fail)",
       "cache_miss_collisions": "miss collisions", "cache_bypass_misses": "bypassed misses",
       "cache_bypass_hits": "bypassed hits", "cache_hits": "hits"}
DM_OWN = {"read_misses": "read misses", "read_hits": "read hits", "promotions": "promotions (blocks)",
          "demotions": "demotions (blocks)"}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "-"


def summary(r: dict) -> dict:
    """One run's metrics: over every round after the first two (the daemon admits a file after its second read)."""
    later = [x for x in r["rounds"] if x["round"] > 2] or r["rounds"]
    times = [t for x in later for t in x["read_ms"]]
    own = [x["bcache"] for x in later if "bcache" in x]
    return {"origin_mib_per_read": sum(x["origin_bytes_per_read"] for x in later) / len(later) / MIB,
            "origin_mib_rounds": [x["origin_bytes_per_read"] / MIB for x in later],
            "p50_ms": pct(times, 0.5), "p99_ms": pct(times, 0.99), "stream_mib_s": r["stream_mib_s"],
            "cpu_pct": r.get("daemon_cpu_pct"),
            # bcache's own account per round (mean over the same rounds): what it inserted, bypassed and refused
            "bcache": {k: sum(o.get(k, 0) for o in own) / len(own) for k in (OWN if "cache_misses" in own[0] else
                                                                                DM_OWN)} if own else None}


def options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This benchmark's own options (the rest: labbench's --reps, --quick, --out)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--interval", type=float)
    ap.add_argument("--stream-x", type=float)
    ap.add_argument("--backup-round", type=int, default=3)
    ap.add_argument("--configs", default="")
    ap.add_argument("--kind", choices=tuple(KIND_CONFIGS), default="bcache")
    ap.add_argument("--seeds", default="", help="the runs' seeds (a run's printed ones); default: drawn now")
    own, rest = ap.parse_known_args(argv)
    own.configs = [c for c in own.configs.split(",") if c] or list(KIND_CONFIGS[own.kind])
    if unknown := [c for c in own.configs if c not in KIND_CONFIGS[own.kind]]:
        raise SystemExit(f"unknown configuration(s) {unknown} for {own.kind} (of {', '.join(KIND_CONFIGS[own.kind])})")
    return own, rest


def main() -> None:
    own, rest = options(sys.argv[1:])
    reps, quick, out = parse_args(rest, default_reps=5)
    rounds, interval, stream_x = (4, 45, 1.0) if quick else (8, 90, 2.0)
    rounds, interval = own.rounds or rounds, own.interval or interval
    stream_x = own.stream_x or stream_x
    order = own.configs
    try:
        seeds = round_seeds(own.seeds, reps)
    except ValueError:
        raise SystemExit(f"--seeds {own.seeds!r}: expected integers separated by commas") from None
    reps = len(seeds)
    console.print(f"W5 ({own.kind}): seeds {seeds} (drawn for this run; --seeds {','.join(map(str, seeds))}"
                  " replays it)")
    runner = Runner("hotlarge", reps * len(order), **({"out": out} if out else {}))
    rows: dict[str, list[dict]] = {c: [] for c in order}
    cmd = ["tests/bench/guest/hotlarge.py", "{c}", str(rounds), f"{interval:g}", f"{stream_x:g}",
           "--backup-round", str(own.backup_round)]
    lab = spec(own.kind, mode="writethrough", timeout=rounds * interval + 900)
    jobs = [Job(c, f"{c}-{rep + 1}", lab, [a.format(c=c) for a in cmd] + ["--seed", str(seed)], "hotlarge")
            for rep, seed in enumerate(seeds) for c in order]
    try:
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    sums = {c: [summary(r) for r in rs if "error" not in r] for c, rs in rows.items()}
    table = [[CONFIGS[c], cell([s["origin_mib_per_read"] for s in ss], "{:.2f}"),
              spread([x for s in ss for x in s["origin_mib_rounds"]]),
              cell([s["p50_ms"] for s in ss], "{:.0f}"), cell([s["p99_ms"] for s in ss], "{:.0f}"),
              cell([s["stream_mib_s"] for s in ss], "{:.1f}"),
              cell([s["cpu_pct"] for s in ss if s["cpu_pct"] is not None], "{:.1f}") or "-",
              f"{len(ss)}/{reps} × {len(ss[0]['origin_mib_rounds']) if ss else 0}"] for c, ss in sums.items()]
    stock = [c for c in order if c != "cp-default" and sums[c]]
    best = min(stock, key=lambda c: med([s["origin_mib_per_read"] for s in sums[c]]), default=None)
    goals = []
    if best and sums.get("cp-default"):
        cp, b, st = sums["cp-default"], sums[best], sums.get(BASE[own.kind]) or sums[best]
        ratio = med([s["origin_mib_per_read"] for s in cp]) / max(med([s["origin_mib_per_read"] for s in b]), 1e-9)
        p50 = med([s["p50_ms"] for s in cp]) / max(med([s["p50_ms"] for s in b]), 1e-9)
        stream = med([s["stream_mib_s"] for s in cp]) / max(med([s["stream_mib_s"] for s in st]), 1e-9)
        goals = [["origin bytes per hot read vs the best stock (" + CONFIGS[best] + ")", f"{ratio:.2f}×", "≤ 0.3×",
                  "met" if ratio <= 0.3 else "**missed**"],
                 ["hot-file read p50 vs the best stock", f"{p50:.2f}×", "≤ 0.5×",
                  "met" if p50 <= 0.5 else "**missed**"],
                 ["backup throughput vs stock", f"{stream:.2f}×", "≥ 0.95×", "met" if stream >= 0.95 else "**missed**"]]
    md = header("W5: hot large files while a backup streams", lab,
                f"{geometry()}. Hot set 4 × 16 MiB (64 MiB: the shipped max_cache_fraction of the cache), each read "
                f"whole O_DIRECT 1 MiB every {interval:g} s, {rounds} rounds; from round {own.backup_round} on a "
                f"backup reads {stream_x:g}× the cache of cold 64 MiB files once, buffered. Metrics over rounds 3 on "
                f"(the daemon admits a file after its second whole read); median (min–max) over {reps} run(s) of each "
                "configuration, a run's origin bytes being the mean over its rounds (min–max per round beside it), "
                "its p50/p99 over every hot read of those rounds.")
    md += "\n" + md_table(["configuration", "origin MiB per hot read (mean of rounds 3+)", "per round min–max",
                           "hot read p50 ms", "p99 ms", "backup MiB/s", "daemon CPU %", "runs × rounds"], table)
    for r in rows.get("cp-default", []):
        if "promoted_after_round2_s" in r:
            md += (f"\n\ncachepilot run {rows['cp-default'].index(r) + 1}: {r.get('promotions')} promotions done, "
                   f"{r['promoted_after_round2_s']} s after round 2's reads; bcache refused "
                   f"{r.get('alloc_failures')} inserts; the promoter's rate at the end "
                   f"{(r.get('promotion_rate') or 0) / MIB:.2f} MiB/s")
    own_keys = OWN if own.kind == "bcache" else DM_OWN
    account = [[CONFIGS[c]] + [cell([s["bcache"][k] for s in ss if s["bcache"]], "{:.0f}") or "-" for k in own_keys]
               for c, ss in sums.items()]
    md += (("\n\nbcache's own account per round (requests; mean over the rounds above, median over runs): read-miss "
            "inserts it refused for want of a ready bucket (bcache_alloc_fail), misses and hits, bypassed or not\n\n"
            if own.kind == "bcache" else "\n\ndm-cache's own account per round (its status line; mean over the rounds "
            "above, median over runs)\n\n") + md_table(["configuration", *own_keys.values()], account))
    if goals:
        md += "\n\n" + md_table(["goal", "measured", "target", ""], goals)
    md += "\n\nReproduce one row (cachepilot, round 1):\n\n```sh\n" + repro(
        lab, [a.format(c="cp-default") for a in cmd] + ["--seed", str(seeds[0])]) + "\n```\n"
    series = {CONFIGS[c]: [(x["t"], x["origin_bytes_per_read"] / MIB) for x in rs[0]["rounds"]]
              for c, rs in rows.items() if rs and "rounds" in rs[0]}
    png = plot(runner.out, "hotlarge_origin", "origin MiB per hot-file read, per round (round 1)", "MiB", series)
    if png:
        md += f"\n![origin bytes per hot read]({png.name})\n"
    # "goals": [goal, measured, verdict] rows, as the headline set's (tests/bench/summary.py lists them)
    save(runner.out, "hotlarge" if own.kind == "bcache" else "hotlarge_dmcache", md,
         {"configs": CONFIGS, "rows": rows, "kind": own.kind, "seeds": seeds,
                                      "goals": [[g[0], g[1], f"{g[3]} (target {g[2]})"] for g in goals]})
    console.print(md)
    print(md)


if __name__ == "__main__":
    main()
