"""A dm-cache that comes back from an unclean shutdown with every mapped block dirty (issue 36 item 4): the metadata
as a power cut leaves it (a copy taken after an ordinary commit, which clears the clean-shutdown flag), the target
created on it again; the daemon names it in status and a metric, with the time to clean at the measured rate, and
every file reads back intact once it is clean."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


def test_a_dm_cache_back_from_an_unclean_shutdown_is_named_with_its_time_to_clean(lab):
    # a slow origin (20 IOPS): the write-back of every mapped block takes long enough to measure
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/unclean.py"], recipe="dmcache", mode="writeback",
                timeout=600, lab_args=("--origin-iops", "20"))
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    used = r.int("before_used_blocks")
    assert used >= 64 and r.int("before_dirty_blocks") == 0, r.explain()  # clean when the "power went"
    # dm-cache loaded every mapped block dirty (dm-cache-metadata.c __load_mapping_v1)
    assert r.int("after_used_blocks") == used and r.int("after_dirty_blocks") == used, r.explain()
    assert v["ready"] == "yes" and v["status_all_dirty"] == "yes" and v["came_back"] == "yes", r.explain()
    assert v["metric_all_dirty"] == "1.0" and v["status_line"] == "yes", r.explain()
    assert v["eta_s"] != "none" and float(v["eta_s"]) > 0 and float(v["metric_eta"]) > 0, r.explain()
    assert v["cleaned"] == "yes" and v["files_intact"] == "yes" and v["explain_says"] == "yes", r.explain()
    assert v["exit"] == "0" and v["traceback"] == "no", r.explain()
