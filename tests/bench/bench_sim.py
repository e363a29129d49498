"""Simulator benchmark: the four generated workloads x LRU / smq-like / OPT, each with and without the
controller, and the issue's quality bars (PASS/FAIL printed honestly). Run: python tests/bench/bench_sim.py"""

from __future__ import annotations

import sys
import time

from cachepilot.sim.report import SCENARIOS, bars, evaluate, format_bars, table


def main() -> int:
    t0 = time.process_time()
    evs = {}
    for key in (sys.argv[1:] or list(SCENARIOS)):
        evs[key] = evaluate(key)
    print(table(list(evs.values())))
    print()
    print(format_bars(bars(evs)))
    print(f"\n(simulator CPU time {time.process_time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
