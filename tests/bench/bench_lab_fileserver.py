"""Fileserver with deletes on bcache writeback, in the lab: stock vs stock + ext4 `-o discard` vs stock + a periodic
fstrim vs stock + cachepilot (the shipped default policy = destructive; and the same policy with failure_model:
recoverable). Rounds of all five configurations, one lab boot each, so ratios are taken pair by pair per round.

.venv/bin/python tests/bench/bench_lab_fileserver.py [--reps N] [--quick] [--out DIR] [--report]
    [--recipe bcache|dmcache] [--configs stock,cp-destructive,...]
(--report with --out: rebuild the tables from that directory's finished runs; --recipe dmcache: the same on dm-cache,
smq, writeback, where a discard does not drop the cached copies; --configs: a subset of the configurations)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labbench import (  # noqa: E402
    Job,
    LabSpec,
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

CONFIGS = {
    "stock": "stock (writeback_percent 10, sequential_cutoff 4 MiB)",
    "discard": "stock + ext4 -o discard",
    "fstrim": "stock + fstrim every {every:.0f} s",
    "cp-destructive": "stock + cachepilot, shipped default policy (destructive)",
    "cp-recoverable": "stock + cachepilot, default policy with failure_model: recoverable",
    "cp-hold": "stock + cachepilot, recoverable, writeback_percent 40 pinned (not the shipped default)",
}


def _option(argv: list[str], name: str, default: str) -> str:
    """The value of `--name VALUE` (removed from argv), or default."""
    if name not in argv:
        return default
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def _to_discard(rs: list[dict]) -> str:
    """Delete -> discard latency as the kernel saw it (guest/common.DiscardWitness): medians over the rounds of
    each run's p50 and p90, and the share of deleted files any discard reached."""
    got = [r for r in rs if r.get("deletes")]
    if not got or not any(r["discarded"] for r in got):
        return "none reached"
    share = sum(r["discarded"] for r in got) / sum(r["deletes"] for r in got)
    p50 = [r["delete_discard_p50_s"] for r in got if r["discarded"]]
    p90 = [r["delete_discard_p90_s"] for r in got if r["discarded"]]
    return f"{med(p50):.1f} / {med(p90):.1f} ({share:.0%})"


def main() -> None:
    argv = sys.argv[1:]
    report_only = "--report" in argv
    recipe = _option(argv, "--recipe", "bcache")
    configs = {c: CONFIGS[c] for c in _option(argv, "--configs", ",".join(CONFIGS)).split(",")}
    if recipe == "dmcache" and "stock" in configs:
        configs["stock"] = "stock (smq, writeback)"
    reps, quick, out = parse_args([a for a in argv if a != "--report"])
    seconds = 20 if quick else 30
    # "an fstrim every minute" scaled to the run: a real fileserver runs for hours, this one for `seconds`; one
    # trim per third of the run keeps the trim-to-run ratio of a minute in a few-minute run
    every = seconds // 3
    spec = LabSpec(recipe=recipe)
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    runner = Runner(f"fileserver-{recipe}" if recipe != "bcache" else "fileserver",
                    0 if report_only else reps * len(configs), **({"out": out} if out else {}))
    jobs: list[Job] = []
    try:
        for rep in range(reps):
            for c in configs:
                if report_only:  # rebuild the report from a finished run's results
                    f = runner.out / "runs" / f"{c}-{rep + 1}" / "fileserver.json"
                    rows[c].append(json.loads(f.read_text()) if f.exists() else {"error": "missing"})
                    continue
                cmd = ["tests/bench/guest/fileserver.py", c, str(seconds), "--fstrim-every", str(every),
                       "--seed", str(rep + 1)]
                jobs.append(Job(c, f"{c}-{rep + 1}", spec, cmd, "fileserver"))
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    for rs in rows.values():
        for r in rs:
            if "ops" in r:  # the loop is timed, so a faster configuration does more work: compare per 1000 ops too
                r["origin_debt_per_kop"] = 1000 * r["origin_debt_mib"] / max(1, r["ops"])
                # the workload's own hit ratio: bcache's counters up to the loop's end, before the idle tail in which
                # the daemon re-warms (its promotion reads go through the same counters)
                loop = [p for p in r["timeline"] if p["t"] <= r["seconds"] + 0.5] or r["timeline"][:1]
                h, m = loop[-1]["hits"], loop[-1]["misses"]
                r["hit_ratio_loop"] = h / max(1, h + m)
    ok = {c: [r for r in rs if "error" not in r] for c, rs in rows.items()}
    table = []
    for c, rs in ok.items():
        table.append([configs[c].format(every=every), cell(values(rs, "origin_debt_per_kop")),
                      cell(values(rs, "origin_debt_mib")),
                      cell(values(rs, "origin_written_mib")), cell(values(rs, "hit_ratio_loop"), "{:.3f}"),
                      cell(values(rs, "hit_ratio"), "{:.3f}"),
                      cell(values(rs, "ops_s")), cell(values(rs, "delete_p50_ms"), "{:.2f}"),
                      cell(values(rs, "delete_p99_ms")), cell(values(rs, "commit_p50_ms")),
                      cell(values(rs, "commit_p99_ms")), _to_discard(rs), f"{len(rs)}/{reps}"])
    md = header(f"Fileserver with deletes, {recipe} writeback", spec,
                f"{seconds} s of Filebench-fileserver-shaped load per run (create+write+fsync, append 16 KiB, "
                f"read whole, delete, stat; files 64–192 KiB, file set 1.25× the cache); origin writes = bytes "
                f"written to the origin during the run and {12} s after it + dirty data left (still owed). "
                f"Median (min–max) of {reps} rounds.")
    md += "\n" + md_table(["configuration", "origin writes per 1000 ops, MiB",
                           "origin writes + dirty left, MiB", "origin written, MiB",
                           "read hit ratio, loop", "read hit ratio incl. tail",
                           "ops/s", "delete p50 ms", "delete p99 ms", "commit (fsync) p50 ms", "commit p99 ms",
                           "delete → discard p50 / p90 s (deletes discarded)", "runs"],
                          table)
    goals = []
    for c in [c for c in ("cp-destructive", "cp-recoverable", "cp-hold") if c in configs]:
        # pairs by round (rows, not ok: a failed run drops only its own pairs)
        w_stock = pair_ratios(rows[c], rows["stock"], "origin_debt_per_kop")
        w_disc = pair_ratios(rows[c], rows.get("discard", []), "origin_debt_per_kop")
        h_stock = [a["hit_ratio_loop"] - b["hit_ratio_loop"] for a, b in zip(rows[c], rows["stock"], strict=False)
                   if "hit_ratio_loop" in a and "hit_ratio_loop" in b]
        o_stock = pair_ratios(rows[c], rows["stock"], "ops_s")
        o_disc = pair_ratios(rows[c], rows.get("discard", []), "ops_s")

        def verdict(xs: list[float], good) -> str:  # type: ignore[no-untyped-def]
            return "n/a" if not xs else ("met" if good(med(xs)) else "**missed**")

        goals.append([configs[c].format(every=every),
                      f"{cell(w_stock, '{:.2f}')}× — {verdict(w_stock, lambda x: x <= 0.5)}",
                      f"{cell(w_disc, '{:.2f}')}× — {verdict(w_disc, lambda x: x <= 1.0)}",
                      f"{cell(h_stock, '{:+.3f}')} — {verdict(h_stock, lambda x: x >= 0)}",
                      f"{cell(o_stock, '{:.2f}')}× — {verdict(o_stock, lambda x: x >= 1.0)}",
                      f"{cell(o_disc, '{:.2f}')}× — {verdict(o_disc, lambda x: x >= 1.0)}"])
    md += "\n\nGoals, pair by pair within a round (median (min–max) of the per-round ratios):\n\n"
    md += md_table(["cachepilot", "origin writes per op vs stock (≤ 0.5×)", "vs -o discard (≤ 1×)",
                    "hit ratio (loop) − stock (≥ 0)", "ops/s vs stock (≥ 1×)", "ops/s vs -o discard (≥ 1×)"], goals)
    dmn = [r for c in ("cp-destructive", "cp-recoverable", "cp-hold") for r in ok.get(c, [])]
    md += (f"\n\nDaemon (in the guest, during the run): CPU {cell(values(dmn, 'daemon_cpu_pct'))}% of a core, "
           f"RSS {cell(values(dmn, 'daemon_rss_mib'))} MiB, ready after {cell(values(dmn, 'daemon_ready_s'))} s. "
           "Decisions per run: " + "; ".join(f"{c}: {r.get('decisions')}"
                                             for c in ("cp-destructive", "cp-recoverable", "cp-hold")
                                             for r in ok.get(c, [])[:1]) + ".")
    md += "\n\nReproduce one row (`cp-destructive`, round 1):\n\n```sh\n" + repro(
        spec, ["tests/bench/guest/fileserver.py", "cp-destructive", str(seconds), "--fstrim-every", str(every),
               "--seed", "1"]) + "\n```\n"
    series = {}
    for c, rs in ok.items():
        if rs:
            series[c] = [(p["t"], p["origin_mib"]) for p in rs[0]["timeline"]]
    png = plot(runner.out, "fileserver_origin_writes", "fileserver: bytes written to the origin (round 1)",
               "MiB written to the origin", series)
    if png:
        md += f"\n![origin writes]({png.name})\n"
    save(runner.out, "fileserver", md, {"recipe": recipe, "configs": CONFIGS, "seconds": seconds,
                                        "fstrim_every": every, "rows": rows})
    console.print(md)
    print(md)


if __name__ == "__main__":
    main()
