"""Offline block-cache simulator: workloads -> block stream -> LRU / smq-like / OPT, +/- the controller."""

from cachepilot.sim.cache import LRU, OPT, SMQ, BlockCache
from cachepilot.sim.prepare import Prepared, prepare
from cachepilot.sim.runner import POLICIES, SIM_POLICY, SimResult, recovery_ticks, run

__all__ = ["LRU", "OPT", "POLICIES", "SIM_POLICY", "SMQ", "BlockCache", "Prepared", "SimResult", "prepare",
           "recovery_ticks", "run"]
