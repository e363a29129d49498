"""Stuck write-back found and explained on real caches (issue 36 items 3 and 5), all four kinds at once in one guest
boot: bcache's ``writeback_running`` 0 behind the daemon's back, dm-writecache's stock pause_writeback under an fsync
loop, dm-cache's and lvmcache's smq under writes that keep the origin busy -- each with dirty data, each judged
stalled within two minutes, the shipped alert firing in a real Prometheus (Debian's, in the guest, with the shipped
rules), explain naming the cause, and the daemon leaving bcache's knob at 0; each stall ends once its cause is
gone."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_stalls_behind_the_daemons_back_are_found_explained_and_alerted_and_the_knob_left_alone(lab):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/stall.py"], recipe="bcache", mode="writeback",
                timeout=600)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    # 8 MiB written as 1 MiB files, the sequential cutoff 0 (the stock 4 MiB sent 13 of 16 around the cache once)
    assert v["ready"] == "yes" and r.int("dirty_before") >= 4 * MIB and v["running_after_echo"] == "0", r.explain()
    # health.stall_after and 2 x writeback_delay are 20 s here: found within two minutes of the echo, the reason named
    assert v["detected_s"] != "never" and int(v["detected_s"]) <= 120, r.explain()
    assert v["cause_names_knob"] == "yes" and v["explain_says"] == "yes", r.explain()
    # the shipped alert fires in Prometheus (its `for:` after the daemon's judgement), the gauge scraped as 1
    assert v["alert_s"] != "never" and v["alert_severity"] == "warning" and v["gauge_in_prometheus"] == "1", r.explain()
    # the operator's knob stays as the operator set it
    assert v["running_still"] == "0" and v["daemon_wrote_running"] == "no", r.explain()
    assert v["ended"] == "yes", r.explain()
    # dm-writecache past its high watermark (every used block dirty) under an fsync loop, dm-cache's and lvmcache's
    # dirty blocks under 4 KiB writes to uncached blocks: each held by the kernel's own rule, and still so when the
    # alert fired; lvmcache's cause in LVM's terms (its cleaner is lvchange's: a raw reload LVM would undo)
    assert r.int("wc_used_before") > r.int("wc_total") // 2, r.explain()
    assert r.int("wc_used_held") >= r.int("wc_used_before"), r.explain()  # nothing written back at all meanwhile
    for p in ("dmc_", "lvm_"):
        assert r.int(f"{p}dirty_before") >= 16 and r.int(f"{p}dirty_held") >= 16, (p, r.explain())
    assert r.int("lvm_lvs_dirty") >= 16, r.explain()  # the runbook's lvs reads them too
    for p in ("wc_", "dmc_", "lvm_"):
        assert v[f"{p}detected_s"] != "never" and int(v[f"{p}detected_s"]) <= 120, (p, r.explain())
        assert v[f"{p}cause_names_hold"] == "yes" and v[f"{p}explain_says"] == "yes", (p, r.explain())
        assert v[f"{p}alert_s"] != "never" and v[f"{p}alert_severity"] == "warning", (p, r.explain())
        assert v[f"{p}gauge_in_prometheus"] == "1" and v[f"{p}ended"] == "yes", (p, r.explain())
    assert v["exit"] == "0" and v["traceback"] == "no" and v["logged"] == "yes", r.explain()
