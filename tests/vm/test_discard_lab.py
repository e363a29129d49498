"""Delete -> discard in the lab, through the real chain: the probe's freed extents and journal commit, the
freed-extent queue, the FITRIM actuator. bcache drops the deleted files' dirty data (never written back);
dm-cache keeps its cached dirty copies (it only sets discard bits) — docs/operate.md says so."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"
MIB = 1 << 20


def test_delete_then_discard_on_bcache_writeback_never_reaches_the_origin(lab):
    r = lab.run([PY, "tests/vm/act/discard.py"], recipe="bcache", timeout=240)
    print(r.stdout)  # the measured latencies (pytest -s)
    assert r.rc == 0, r.explain()
    v = r.values
    dead = r.int("dead_bytes")
    assert v["freed_equals_fiemap"] == "yes", r.explain()  # exactly the deleted files' extents, nothing else
    assert r.int("dirty_before") >= dead, r.explain()
    assert r.int("issued_bytes") == dead, r.explain()
    assert r.int("landed_probe_bytes") >= dead and r.int("landed_diskstat_bytes") >= dead, r.explain()
    # the deleted files' dirty data is gone from the cache ...
    assert r.int("dirty_before") - r.int("dirty_after") >= dead * 0.95, r.explain()
    # ... and never reaches the origin: after a full drain it received the 8 MiB kept plus metadata only
    assert r.int("dirty_drained") == 0
    assert r.int("origin_written_bytes") < 8 * MIB + dead // 2, r.explain()
    assert 0 <= r.int("commit_to_first_landed_ms") <= 2000, r.explain()
    assert v["keep_intact"] == "yes" and v["keep_intact_remount"] == "yes", r.explain()


def test_dmcache_discard_leaves_the_cached_dirty_copy(lab):
    from cachepilot.backends.dmstatus import parse_dm_cache_status

    r = lab.run([PY, "tests/vm/act/discard.py"], recipe="dmcache", timeout=240)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    before = parse_dm_cache_status(r.values["status_before"])
    after = parse_dm_cache_status(r.values["status_after"])
    assert before.dirty_blocks > 0, r.explain()
    assert r.int("landed_diskstat_bytes") >= r.int("dead_bytes"), r.explain()  # the discard did land ...
    # ... and the dirty cached blocks of the deleted files are still there, still dirty, still cached
    assert after.dirty_blocks >= before.dirty_blocks * 0.9, r.explain()
    assert after.cache_used_blocks >= before.cache_used_blocks, r.explain()
    assert r.values["keep_intact"] == "yes" and r.values["keep_intact_remount"] == "yes", r.explain()
