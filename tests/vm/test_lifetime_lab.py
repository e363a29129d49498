"""The lifetime hold on real bcache: young files die dirty in the cache under the recoverable model's hold, where
stock writeback_percent 10 writes them back first (tests/vm/daemon/lifetime.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_young_files_die_dirty_under_the_hold_and_are_written_back_under_stock(lab):
    r = lab.run([".venv/bin/python", "tests/vm/daemon/lifetime.py"], recipe="bcache", mode="writeback",
                lab_args=("--cache-size-mb", "64"), timeout=600)
    print(r.stdout)  # the measurements (pytest -s)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["stock_percent"] == "10" and v["cleaned"] == "yes" and v["ready"] == "yes", r.explain()
    # the same workload in both windows: ~45 MiB written, ~45 MiB deleted 10 s after it was written
    for tag in ("stock", "hold"):
        assert r.int(f"{tag}_written") >= 30 * MIB and r.int(f"{tag}_deleted") >= 30 * MIB, r.explain()
    # stock writes young data back before it dies ...
    assert r.int("stock_origin_written") >= 4 * MIB, r.explain()
    # ... the hold keeps it dirty until its delete discards it: the origin receives almost nothing
    assert v["hold_reached_s"] != "never" and int(v["hold_writeback_percent"]) >= 25, r.explain()
    assert r.int("hold_origin_written") <= r.int("stock_origin_written") // 4, r.explain()
    assert r.int("hold_origin_written") <= 2 * MIB, r.explain()
    assert r.int("hold_done") >= 1 and "died by" in v["hold_last_reason"] and "room 30%" in v["hold_last_reason"]
    # SIGTERM: the steered knob goes back to what the daemon found
    assert v["exit"] == "0" and v["traceback"] == "no" and v["percent_after_exit"] == "10", r.explain()
