"""Record and replay: the versioned trace file format, its writer/reader, and the replay driver."""

from cachepilot.trace.format import Tick, TraceReader, TraceWriter, write_trace
from cachepilot.trace.replay import Decision, ReplayResult, replay

__all__ = ["Decision", "ReplayResult", "Tick", "TraceReader", "TraceWriter", "replay", "write_trace"]
