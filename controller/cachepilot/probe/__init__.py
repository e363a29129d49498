"""The kernel half's user-space side: load bpf/cachepilot.bpf.o, attach, and yield typed events."""

from cachepilot.probe.hooks import HOOKS
from cachepilot.probe.loader import AttachReport
from cachepilot.probe.poller import decode_event
from cachepilot.probe.probe import Probe

__all__ = ["HOOKS", "AttachReport", "Probe", "decode_event"]
