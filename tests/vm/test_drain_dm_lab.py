"""`cachepilot drain` on the device-mapper kinds through the running daemon (issue 36 items 1 and 5): dm-cache and
lvmcache drain with the cleaner policy (progress lines), dm-writecache with its flush message; each to a verified 0,
the table as it was, every file intact, and --rate refused with the reason; first a drain whose deadline passes:
exit 1, the bytes left named, the volume back under the policy."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


@pytest.mark.parametrize("recipe", ["dmcache", "lvmcache", "writecache"])
def test_a_drain_on_a_dm_kind_shows_progress_to_a_verified_zero(lab, recipe):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/drain_dm.py"], recipe=recipe, mode="writeback",
                timeout=600, lab_args=("--origin-iops", "20"))
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["ready"] == "yes" and r.int("dirty_blocks_before") >= 16, r.explain()
    assert v["rate_rc"] == "2" and v["rate_refused"] == "yes", r.explain()
    # the deadline (1 s, shorter than the drain): exit 1, the bytes left at the deadline named, the drain's table put
    # back (the policy has the volume again); nothing lost: the files are checked after the drain below. How soon
    # after the deadline the CLI returns is the daemon's loop: lvmcache's lvchange to the cleaner held it 10 s (the
    # cleaner wrote everything back meanwhile), dm-cache's reload 7 s
    assert v["expired_rc"] == "1" and v["expired_said"] == "yes" and v["expired_state"] == "expired", r.explain()
    assert float(v["expired_s"]) < 30 and r.int("expired_left_bytes") > 0, r.explain()
    assert v["policy_back"] == "yes", r.explain()
    assert v["drain_rc"] == "0" and v["drain_done_said"] == "yes", r.explain()
    # a progress line each poll (1 s) while the drain runs: dm-cache's took 13 s at the 20-IOPS origin (progress
    # shown); lvmcache's 2.1 s (LVM's cleaner done before the first poll); dm-writecache's is one flush message.
    # How long it ran is the daemon's own "done after N s", not the CLI's wall time (6.5 s on a loaded host for a
    # drain the daemon had done after 1 s: no poll could see it running)
    if recipe != "writecache" and float(v["drain_daemon_s"]) >= 5:
        assert v["drain_progress"] == "yes", r.explain()
    # done = the daemon read 0 dirty; back in write-back the filesystem may dirty a block or two since (as in
    # test_switch_lab: ext4's journal and atime writes)
    assert r.int("dirty_blocks_after") <= 16 and v["table_same"] == "yes", r.explain()
    if recipe == "lvmcache":
        assert v["lvm_policy"] == "smq", r.explain()
    assert v["files_intact"] == "yes", r.explain()
    assert v["exit"] == "0" and v["traceback"] == "no" and v["operator_logged"] == "yes", r.explain()
