"""The bcache allocation-failure hook (bpf/bcache.bpf.h) is optional: where bcache is not loaded (this host) the
probe loads without it, says why, and is not a partial attach; where it is (the lab guest) it attaches."""

from __future__ import annotations

from cachepilot.probe.checks import TRACEFS
from cachepilot.probe.hooks import BCACHE_ALLOC_FAIL
from cachepilot.probe.probe import Probe


def test_the_bcache_hook_is_optional(bpf_env: None) -> None:
    with Probe(max_files=1 << 10) as p:
        if (TRACEFS / "events" / "bcache" / "bcache_alloc_fail").is_dir():
            assert BCACHE_ALLOC_FAIL in p.report.attached, p.report.summary()
        else:
            assert BCACHE_ALLOC_FAIL not in p.report.attached
            assert "bcache is not loaded" in p.report.disabled[BCACHE_ALLOC_FAIL], p.report.summary()
            assert BCACHE_ALLOC_FAIL not in p.report.failed and not p.report.partial, p.report.summary()
        assert p.alloc_failures(0x800010) == 0  # the map is there either way; nothing counted for an unknown device
