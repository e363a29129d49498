"""Simulator benchmark = `cachepilot simulate --workload all`: the generated workloads x LRU / smq-like / OPT,
each stock, with the controller under the shipped default policy (+ctl, first) and under the simulator-tuned
policy (+tuned, its settings printed), the fileserver sweep, and the issue's quality bars (PASS/FAIL printed
honestly). Run: python tests/bench/bench_sim.py [SCENARIO...]"""

from __future__ import annotations

import sys
import time

from cachepilot.sim.report import SCENARIOS, bars, describe_controllers, evaluate, format_bars, table


def main() -> int:
    t0 = time.process_time()
    evs = {}
    for key in (sys.argv[1:] or list(SCENARIOS)):
        evs[key] = evaluate(key)
    print(describe_controllers())
    print()
    print(table(list(evs.values())))
    print()
    print(format_bars(bars(evs)))
    print(f"\n(simulator CPU time {time.process_time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
