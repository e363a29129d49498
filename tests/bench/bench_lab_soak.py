"""The soak, in the lab: the daemon (shipped default policy) on a bcache write-back volume over a dm-delay origin,
under the fileserver-shaped load for --minutes (default 30), with a SIGHUP every minute, one cache-device error
(at 40%) and one removal and re-adding of the volume (at 70%). See tests/bench/guest/soak.py for what happens in
the guest. Not part of `make bench` (it takes the lab for half an hour): `make soak`, or

    flock /tmp/cachepilot-lab.lock .venv/bin/python tests/bench/bench_lab_soak.py [--minutes N] [--out DIR]

Criteria: RSS flat (end of warm-up -> end: <= +10%), no tick over 1 s after warm-up (the whole run's count is
reported too: the first ticks adopt the volume and drain the set-up's dirty data), no traceback in the daemon's
log, every fsync-acknowledged undeleted file intact, every SIGHUP reloaded, both disruptions carried out. Writes
soak.md and soak.json under build/bench/<time>/ (or --out), prints the result as JSON on stdout; exit 1 when a
criterion fails."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import labbench as lb  # noqa: E402

RSS_GROWTH_MAX = 1.10
SETUP_S = 1200  # boot, daemon start, waiting for the drain, the latch and the re-added volume, the final check


def criteria(r: dict) -> list[tuple[str, str, bool]]:
    """(criterion, measured, passed) for each goal of the soak."""
    growth = r.get("rss_growth_ratio")
    sent, ok = r.get("hups_sent", 0), r.get("hups_ok", 0)
    events = [e["event"] for e in r.get("events", [])]
    return [
        ("RSS flat: ≤ +10% from the end of warm-up to the end",
         f"{r.get('rss_start_kib')} → {r.get('rss_end_kib')} KiB (×{growth}), max {r.get('rss_max_kib')} KiB",
         growth is not None and growth <= RSS_GROWTH_MAX),
        ("no tick over 1 s after warm-up",
         f"{r.get('ticks_over_1s_after_warmup')} of {r.get('ticks_after_warmup')} after warm-up "
         f"({r.get('ticks_over_1s')} of {r.get('ticks')} in the whole run); longest ≤ {r.get('max_tick_seconds')} s "
         f"(histogram bound), longest sampled {r.get('max_last_tick_sampled_s')} s",
         r.get("ticks_over_1s_after_warmup") == 0 and bool(r.get("ticks_after_warmup"))),
        ("no traceback in the daemon's log", f"{r.get('tracebacks')} (daemon exit {r.get('daemon_exit')})",
         r.get("tracebacks") == 0 and r.get("daemon_exit") == 0),
        ("every fsync-acknowledged file intact",
         f"{r.get('files_bad')} bad of {r.get('files_checked')} checked ({r.get('files_deleted')} deleted)",
         r.get("files_bad") == 0 and bool(r.get("files_checked"))),
        ("every SIGHUP reloaded", f"{ok}/{sent}", sent > 0 and ok == sent),
        ("cache error latched, volume removed and re-added",
         "; ".join(e for e in events if e in ("latched", "volume removed", "volume re-added") or e.startswith(
             ("NOT", "FAILED", "still dirty", "volume NOT"))),
         bool(r.get("completed")) and {"latched", "volume removed", "volume re-added"} <= set(events)),
    ]


def report(r: dict, spec: lb.LabSpec, minutes: float, cmd: str) -> str:
    rows = [[name, measured, "pass" if passed else "**FAIL**"] for name, measured, passed in criteria(r)]
    md = lb.header("Soak", spec, f"{minutes:g} min of the fileserver-shaped load (measured {r.get('seconds', 0):.0f} s "
                   f"after the daemon was ready), warm-up {r.get('warmup_s', 0):.0f} s; {r.get('ops')} ops.")
    md += "\n" + lb.md_table(["criterion", "measured", "verdict"], rows)
    stages = r.get("stage_ms_per_tick_after_warmup") or {}
    md += (f"\n\nThe daemon's CPU after warm-up: {r.get('daemon_cpu_pct_after_warmup')}% of the vCPU. Its loop per "
           "tick after warm-up, wall / CPU ms by stage: " + ", ".join(
               f"{k} {w:g} / {c:g}" for k, (w, c) in sorted(stages.items(), key=lambda kv: -kv[1][0])) + ".")
    md += "\n\nEvents (seconds after the daemon was ready):\n\n" + "\n".join(
        f"- {e['t']:.0f} s: {e['event']}" for e in r.get("events", []))
    md += f"\n\nCommand:\n\n```sh\n{cmd}\n```\n"
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the loaded run (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not 1 <= a.minutes <= 24 * 60:
        ap.error("--minutes: between 1 and 1440")
    seconds = round(a.minutes * 60)
    spy = os.environ.get("SOAK_PYSPY")  # a py-spy binary the guest can run (its root is the host's): a profile
    spec = lb.LabSpec(timeout=seconds + SETUP_S, env=(f"SOAK_PYSPY={Path(spy).resolve()}",) if spy else ())
    cmd = ["tests/bench/guest/soak.py", str(seconds), "--seed", str(a.seed)]
    rows: dict[str, list[dict]] = {"soak": []}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runner = lb.run_jobs("soak", [lb.Job("soak", "soak", spec, cmd, "soak")], rows, a.out, at_a_time=1)
    r = rows["soak"][0]
    line = f"flock /tmp/cachepilot-lab.lock .venv/bin/python tests/bench/bench_lab_soak.py --minutes {a.minutes:g}"
    md = report(r, spec, a.minutes, line)
    lb.save(runner.out, "soak", md, {"started": started, "minutes": a.minutes, "result": r})
    lb.console.print(md)
    print(json.dumps({k: v for k, v in r.items() if k != "samples"}, indent=1))
    return 0 if "error" not in r and all(p for _, _, p in criteria(r)) else 1


if __name__ == "__main__":
    sys.exit(main())
