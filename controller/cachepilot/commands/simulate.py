"""`cachepilot simulate`: run generated workloads through the block-cache simulator (LRU, smq-like, OPT,
each with and without the controller) and print hit ratio, origin writes and dirty exposure; optionally
write a workload's event stream as a trace for `cachepilot replay`."""

from __future__ import annotations

import argparse
import sys
import time

from cachepilot.errors import UserError
from cachepilot.safeio import check_output
from cachepilot.sim.prepare import prepare
from cachepilot.sim.report import (
    ALIASES,
    SCENARIOS,
    WORKLOADS,
    Evaluation,
    bars,
    describe_controllers,
    evaluate,
    format_bars,
    table,
)
from cachepilot.sim.runner import POLICIES, run, sim_volume
from cachepilot.trace.format import TraceWriter


def progress(what: str) -> None:
    """A line per phase on stderr when a person watches it (a full run takes a minute); the tables on stdout stay
    clean for a pipe, and a script reading stderr gets only the errors (one line each)."""
    if sys.stderr.isatty():
        print(f"cachepilot simulate: {what}", file=sys.stderr, flush=True)


def _evaluate(key: str, policies: tuple[str, ...], i: int, n: int) -> Evaluation:
    t0 = time.monotonic()
    progress(f"[{i}/{n}] {key} ...")
    ev = evaluate(key, policies)
    progress(f"[{i}/{n}] {key} done in {time.monotonic() - t0:.1f} s")
    return ev


def simulate(args: argparse.Namespace) -> int:
    keys = list(SCENARIOS) if args.workload == "all" else [ALIASES.get(args.workload, args.workload)]
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    for p in policies:
        if p not in POLICIES:
            raise UserError(f"unknown cache policy {p!r} (choose from {', '.join(POLICIES)})")
    if args.trace_out:
        if len(keys) != 1:
            raise UserError("--trace-out needs one --workload, not 'all'")
        check_output(args.trace_out, "trace", stream=True)  # before minutes of simulation
        sc = SCENARIOS[keys[0]]
        progress(f"simulating {sc.key} for its trace")
        prep = prepare(sc.make(), tick_s=sc.tick_s)
        cap = max(16, int(prep.data_blocks_peak * sc.cache_fraction))
        meta = {"source": "cachepilot simulate", "workload": prep.workload.name,
                "params": prep.workload.params, "cache_policy": "lru"}
        with TraceWriter(args.trace_out, [sim_volume(cap)], meta) as w:
            run(prep, "lru", False, cap, sc.writeback_percent, trace=w)
            n = w.total
        print(f"wrote {n} records to {args.trace_out} ({prep.workload.name}, stock LRU samples)")
        return 0
    evs = {k: _evaluate(k, policies, i, len(keys)) for i, k in enumerate(keys, 1)}
    print(describe_controllers())
    print()
    print(table(list(evs.values())))
    b = bars(evs)
    if b:
        print()
        print(format_bars(b))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("simulate", help="offline block-cache simulation of generated workloads")
    p.add_argument("--workload", default="all", choices=WORKLOADS)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: lru,smq,opt")
    p.add_argument("--trace-out", metavar="FILE", help="write the workload's event stream as a trace instead")
    p.set_defaults(handler=simulate)
