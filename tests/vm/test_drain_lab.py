"""`cachepilot drain` on a real bcache volume through the running daemon (issue 36): the deadline honoured (exit 1,
what is left named), then a drain verified clean with every fsync-acknowledged file intact."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_drain_honours_its_deadline_then_drains_to_verified_clean(lab):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/drain.py"], recipe="bcache", mode="writeback",
                origin_delay_ms=2, timeout=420, lab_args=("--origin-iops", "20"))
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["ready"] == "yes" and r.int("dirty_before") >= 16 * MIB, r.explain()
    # the deadline: exit 1, within it (plus the CLI's polling), the bytes left named; nothing lost
    assert v["expired_rc"] == "1" and v["expired_said"] == "yes", r.explain()
    assert float(v["expired_s"]) < 30 and r.int("dirty_after_expired") >= 8 * MIB, r.explain()
    # the drain to the end: exit 0 with progress, the cache read clean by the guest itself, the files intact
    assert v["drain_rc"] == "0" and v["drain_progress"] == "yes" and v["drain_done_said"] == "yes", r.explain()
    assert r.int("dirty_after") == 0 and v["state_after"] == "clean", r.explain()
    assert v["files_intact"] == "yes", r.explain()
    assert "[writeback]" in v["mode_after"], r.explain()  # the policy has the volume back
    assert v["exit"] == "0" and v["traceback"] == "no" and v["operator_logged"] == "yes", r.explain()
