"""One table over the latest results of `make bench`: for every lab benchmark, what cachepilot cost and how fast a
delete became a discard (the daemon's CPU share of the guest's vCPU and its RSS, delete -> discard latency as the
kernel witnessed it), next to the capture overhead and BPF ns per I/O measured on the host (bench_probe.py).
Reads the newest build/bench/*/<name>.json of each benchmark; writes build/bench/summary.md and prints it.

.venv/bin/python tests/bench/summary.py"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labbench import OUT_ROOT, cell, md_table  # noqa: E402

# the lab benchmarks' result names (the headline ones are found by their "goals", see goal_rows)
LAB = ("headline_fileserver", "fileserver", "scan", "warm", "varmail", "zipf", "writecache", "hotlarge")
GOALS_TOO = ("hotlarge",)  # benchmarks outside the headline set that carry goal lines (W5, issue 37)


def newest(name: str) -> list[tuple[Path, dict]]:
    """The newest result of a benchmark, one per recipe (fileserver runs on bcache and on dm-cache)."""
    seen: dict[str, tuple[Path, dict]] = {}
    for f in sorted(OUT_ROOT.glob(f"*/{name}.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        seen.setdefault(str(doc.get("recipe", "")), (f, doc))
    return list(seen.values())


def runs(doc: dict) -> list[tuple[str, list[dict]]]:
    """(configuration, its successful runs) of the cachepilot configurations."""
    out = []
    for key, rs in doc.get("rows", {}).items():
        config = key.split("/")[-1]
        if config.startswith("cp-"):
            out.append((key, [r for r in rs if isinstance(r, dict) and "error" not in r]))
    return out


def vals(rs: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rs if isinstance(r.get(key), (int, float)) and r[key] == r[key]]


def lab_rows() -> list[list[str]]:
    rows = []
    for name in LAB:
        for path, doc in newest(name):
            for key, rs in runs(doc):
                label = f"{name}{' (' + doc['recipe'] + ')' if doc.get('recipe') not in (None, 'bcache') else ''}"
                p50, p90 = vals(rs, "delete_discard_p50_s"), vals(rs, "delete_discard_p90_s")
                to_discard = f"{statistics.median(p50):.1f} / {statistics.median(p90):.1f}" if p50 else "–"
                rows.append([label, key, cell(vals(rs, "daemon_cpu_pct")), cell(vals(rs, "daemon_rss_mib")),
                             to_discard, f"{len(rs)} ({path.parent.name})"])
    return rows


def goal_rows() -> list[list[str]]:
    """The goal lines of every benchmark whose result JSON carries a "goals" list ([goal, measured, verdict] rows:
    the headline set of issue 23, whatever its scripts are called), the newest result of each."""
    names = sorted({f.stem for f in OUT_ROOT.glob("*/*.json") if f.stem.startswith("headline_")}) + [
        n for n in GOALS_TOO if any(OUT_ROOT.glob(f"*/{n}.json"))]
    rows = []
    for name in names:
        for path, doc in newest(name):
            for g in doc.get("goals", []):
                if isinstance(g, list) and len(g) == 3:
                    rows.append([name, *map(str, g), path.parent.name])
    return rows


def probe_rows() -> list[list[str]]:
    rows = []
    for path, doc in newest("probe"):
        for job, r in doc.get("overhead", {}).items():
            rows.append([job, f"{r['ratio']:.3f} ({r['min']:.3f}–{r['max']:.3f})", f"{r['bpf_ns']:.0f}",
                         f"{r['estimate']:.3f}", path.parent.name])
    return rows


def main() -> int:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    md = (f"## cachepilot's own cost, latest `make bench` results ({when})"
          "\n\nIn the lab guests (one vCPU under qemu TCG), per cachepilot configuration: median (min–max) over the "
          "rounds; delete → discard = medians of each run's p50 / p90, seconds from the unlink to the first discard "
          "bio that reached the deleted extents (ftrace witness).\n\n")
    md += md_table(["benchmark", "configuration", "daemon CPU, % of the vCPU", "daemon RSS, MiB",
                    "delete → discard p50 / p90, s", "runs (result dir)"], lab_rows() or [["–"] * 6])
    md += "\n\nGoals of the headline set (issue 23, per-round pairs, median (min–max)) and of W5 (issue 37):\n\n"
    md += md_table(["benchmark", "goal", "measured", "verdict", "result dir"], goal_rows() or [["–"] * 5])
    md += ("\n\nCapture on the host (`tests/bench/bench_probe.py`: fio psync, ext4 on a loop device; ratio = IOPS with "
           "the programs attached / without, median (min–max) of ABBA pairs; BPF ns per I/O as the kernel measures "
           "it; est. = the ratio that run time alone gives). Goals: ratio ≥ 0.99, ≤ 250 ns per I/O.\n\n")
    md += md_table(["workload", "capture ratio", "BPF ns/IO", "est.", "result dir"], probe_rows() or [["–"] * 5])
    OUT_ROOT.mkdir(parents=True, exist_ok=True)
    (OUT_ROOT / "summary.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
