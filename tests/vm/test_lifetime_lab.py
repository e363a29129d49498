"""The lifetime hold on real bcache: a young file dies dirty in the cache under the recoverable model's hold,
where stock writeback_percent 10 writes part of it back first (tests/vm/daemon/lifetime.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20
YOUNG = 12 * MIB


def test_a_young_file_dies_dirty_under_the_hold_and_is_written_back_under_stock(lab):
    r = lab.run([".venv/bin/python", "tests/vm/daemon/lifetime.py"], recipe="bcache", mode="writeback",
                lab_args=("--cache-size-mb", "64"), timeout=600)
    print(r.stdout)  # the measurements (pytest -s)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["stock_percent"] == "10" and v["cleaned"] == "yes" and v["ready"] == "yes", r.explain()
    for tag in ("stock", "hold"):
        assert r.int(f"{tag}_young_dirty_added") >= YOUNG * 0.9, r.explain()  # written into the cache, dirty
    # stock (target 6.4 MiB) writes part of the young file back during its 20 s of life ...
    assert r.int("stock_young_origin_written") >= MIB, r.explain()
    assert r.int("stock_young_dirty_discarded") <= YOUNG - MIB, r.explain()
    # ... under the hold (learnt from the volume's deletes) it sits dirty until its delete discards it
    assert v["hold_reached_s"] != "never" and int(v["hold_writeback_percent"]) >= 22, r.explain()
    assert r.int("hold_young_origin_written") <= MIB // 2, r.explain()
    assert r.int("hold_young_dirty_discarded") >= YOUNG * 0.95, r.explain()
    assert r.int("hold_done") >= 1 and "died by" in v["hold_last_reason"] and "room" in v["hold_last_reason"]
    # SIGTERM: the steered knob goes back to what the daemon found
    assert v["exit"] == "0" and v["traceback"] == "no" and v["percent_after_exit"] == "10", r.explain()
