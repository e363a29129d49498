"""Discard safety under churn, in the lab: 10 000 seeded create/write/truncate/punch-hole/delete/fsync operations on
a bcache writeback volume (where a wrong discard destroys dirty data) while every freed extent is discarded through
the FITRIM actuator, at once and again after the blocks may have been reused; every live file intact at the end and
after a remount."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"


def test_discards_during_churn_never_touch_live_data(lab):
    r = lab.run(["env", "LAB_OPS=10000", "LAB_SEED=9", PY, "tests/vm/act/stress.py"], recipe="bcache", timeout=480)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.int("ops") == 10000
    assert r.int("discard_calls") > 100 and r.int("issued_bytes") > 0 and r.int("failed") == 0, r.explain()
    assert r.int("freed_ranges_now_reused") > 0, r.explain()  # the reuse race really happened
    assert r.int("live_files") > 50, r.explain()
    assert r.values["intact"] == "yes" and r.values["intact_remount"] == "yes", r.explain()
