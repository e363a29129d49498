"""Pinning and warm handoff on real caches (issue 25 items 2 and 3)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"
MIB = 1 << 20


def test_a_pinned_file_stays_hit_through_a_scan_that_evicts_its_unpinned_twin_on_bcache(lab):
    r = lab.run([PY, "tests/vm/act/pin.py"], recipe="bcache", timeout=420, lab_args=("--cache-size-mb", "64"))
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.int("pinned_files") == 1
    # held before the scan (bcache may drop a few inserts its allocator cannot place: measured 0.6 MiB of 4)
    assert r.int("before_scan_p") <= 4 * MIB // 4 and r.int("before_scan_u") <= 4 * MIB // 4, r.explain()
    # at start, and again while the scan made the cache miss (8 and 10 in runs with the scan at 8 and 16 MiB/s)
    assert r.int("pin_promotions") >= 4, r.explain()
    assert r.int("after_scan_u") >= 4 * MIB // 2, r.explain()  # the scan evicted the twin ...
    assert r.int("after_scan_p") <= 4 * MIB // 20, r.explain()  # ... and not the pinned file


def test_an_exported_hot_list_re_warms_a_fresh_dm_cache_faster_than_its_own_misses(lab):
    # host A reads 30 s: 200 exported files are asserted and 1 008-1 162 came from 50 s (fc8, h35e's A/B runs)
    r = lab.run([PY, "tests/vm/act/handoff.py", "30", "40"], recipe="dmcache", mode="writethrough",
                origin_delay_ms=20, timeout=600, lab_args=("--cache-size-mb", "80"))
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.int("export_rc") == 0 and r.int("import_rc") == 0, r.explain()
    assert r.int("exported_files") >= 200, r.explain()  # host A's hot files, by path
    said = r.values["import_said"]  # every one found on the receiving side, by generation (the same filesystem)
    assert f"{r.int('exported_files')} of {r.int('exported_files')} file(s) handed" in said, r.explain()
    assert "skipped: 0 unknown, 0 changed" in said, r.explain()
    assert r.int("imported_promotions") >= 100, r.explain()  # the daemon re-warmed them
    # ... quickly: reader threads, the list past the rate (8x it). Before, one read at a time on the loop at the
    # policy's rate: ~256 files (max_cache_fraction cut the list then) by 36 s into the workload, ~6 files a second;
    # with them 6.9 s (24 s at 32 in flight). The whole list now (~870 files, two rounds each on dm-cache), with the
    # workload competing for the guest's one vCPU: 21 files a second from the import's start (its last read 35 s
    # into the workload).
    assert r.int("exported_files") / float(r.values["imported_rewarm_s"]) >= 12, r.explain()
    # `import --wait`: the workload cut over once B is warm (every file re-warmed before it starts). The workload
    # after it is short (handoff.py's WAIT_CHECK_S): what the re-warm had done by the cut-over is counted, so a
    # `--wait` that returned early fails here even if no re-warm read lands within that short workload
    assert r.int("wait_import_rc") == 0 and "re-warmed in" in r.values["wait_import_said"], r.explain()
    assert r.int("wait_imported_done_before_start") >= 100, r.explain()
    assert float(r.values["wait_imported_last_done_s"]) <= 0, r.explain()
    # Recovery (stock_recovery_s vs import_recovery_s) is measured and reported in docs/operate.md ("Warm handoff,
    # measured": handoff.py --measure, which this test leaves out), not asserted: the issue asks 3x faster; measured
    # so far it was only with --wait.
