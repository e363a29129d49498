"""cachepilot: an eBPF-instrumented policy controller for the kernel's block caches."""

__version__ = "0.1.0"
