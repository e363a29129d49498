"""The kernel half's user-space side: load bpf/cachepilot.bpf.o, attach, and yield typed events."""

from cachepilot.probe.poller import decode_event
from cachepilot.probe.probe import HOOKS, AttachReport, Probe

__all__ = ["HOOKS", "AttachReport", "Probe", "decode_event"]
