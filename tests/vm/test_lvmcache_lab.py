"""lvmcache in the lab: a real LVM cache LV (lvconvert --type cache), found as its own kind and driven through
cachepilot: a knob, a drain and a switch with dirty data (through lvchange: LVM's metadata says what the live
table says), promotion by reading, and a targeted discard of deleted files that reaches the origin."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"
MIB = 1 << 20


def test_lvmcache_switch_drain_promotion_and_discard_through_lvchange(lab):
    r = lab.run([PY, "tests/vm/act/lvmcache.py"], recipe="lvmcache", timeout=300)
    print(r.stdout)  # the measured times (pytest -s)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["kind"] == "lvmcache", r.explain()
    assert v["threshold_status"] == "done" and "migration_threshold=4096" in v["threshold_lvs"], r.explain()
    # a drain: the cleaner by lvchange, then the saved policy in the saved mode, in LVM's metadata too
    assert r.int("drain_dirty_before") >= 8 * MIB, r.explain()
    assert v["drain_status"] == "done", r.explain()
    assert "writethrough/cleaner" in v["drain_line"], v["drain_line"]  # LVM loads the cleaner in writethrough
    assert r.int("drain_dirty_after") < MIB, r.explain()
    assert v["lvs_after_drain"] == "writeback smq", r.explain()
    # a switch with dirty data: drained, then the mode changed by lvchange once clean
    assert r.int("dirty_before") >= 8 * MIB, r.explain()
    assert v["switch_status"] == "done" and r.int("dirty_after") == 0, r.explain()
    assert v["mode_after"] == "writethrough" and v["lvs_after_switch"] == "writethrough smq", r.explain()
    assert " writethrough smq " in v["table_after_switch"], r.explain()
    assert v["bypass_status"] == "done" and v["lvs_bypass"] == "passthrough smq", r.explain()
    assert v["writethrough_status"] == "done", r.explain()
    # promotion of files written in passthrough (uncached): two rounds (smq), then the re-read comes from the cache
    assert r.int("promote_rounds") == 2 and r.int("promote_bytes") == 8 * MIB, r.explain()
    assert r.int("promote_promotions") >= 60, r.explain()  # 64 blocks of 64 KiB
    assert r.int("reread_origin_bytes") <= 4 * MIB // 20, r.explain()
    # discard: the deleted files' ranges trimmed and passed down to the origin
    assert v["discard_status"] == "done" and r.int("discard_issued_bytes") == r.int("dead_bytes"), r.explain()
    assert r.int("discard_origin_bytes") >= r.int("dead_bytes") * 0.9, r.explain()
    assert v["intact_hot"] == "yes", r.explain()
    assert v["writeback_status"] == "done" and v["lvs_end"] == "writeback smq", r.explain()
    assert " writeback smq " in v["table_end"], r.explain()
