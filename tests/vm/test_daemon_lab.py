"""The daemon in the lab, end to end: `cachepilot run` on a real bcache volume in write-back."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_daemon_discards_deleted_dirty_data_answers_reloads_and_stops_clean(lab):
    r = lab.run([".venv/bin/python", "tests/vm/daemon/e2e.py"], recipe="bcache", mode="writeback", timeout=420)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["ready"] == "yes" and v["observe_only"] == "False" and v["status_kind"] == "bcache", r.explain()
    # the policy's pinned knobs were set through the real backend (read back)
    assert v["knob_set"] == "yes" and r.int("knob_decisions_done") >= 4, r.explain()
    # deletes became discards: ~16 MiB of dirty data left the cache, and it never went to the origin
    # (what was dirty before the workload -- mkfs, the journal -- stays, as the hot file does; the policy turns
    # bcache's congestion bypass off, which under TCG sent writes to the origin whenever other guests were busy)
    base = r.int("dirty_base")
    assert r.int("dirty_before") >= base + 4 * MIB and r.int("dirty_after") <= base + 512 * 1024, r.explain()
    assert r.int("origin_written_during") < MIB, r.explain()
    assert r.int("discard_done") >= 1 and r.int("discard_issued_bytes") >= 16 * MIB, r.explain()
    # the hot file was not promoted: nothing was bypassed, bcache kept it itself (its re-reads hit)
    assert r.int("promote_done") == 0 and v["hot_skipped_as_inserted"] == "yes", r.explain()
    reread = dict(kv.split("=") for kv in v["hot_reread"].split())
    assert int(reread["hits"]) >= 1 and int(reread["bypass_misses"]) == 0, r.explain()
    # status, top and explain answer through the real CLI
    assert v["cli_status_rc"] == "0" and v["cli_status_has_volume"] == "yes", r.explain()
    assert v["cli_top_rc"] == "0" and v["cli_top_has_hot"] == "yes", r.explain()
    assert v["cli_explain_rc"] == "0" and v["cli_explain_has_fitrim"] == "yes", r.explain()
    # SIGHUP with a broken policy keeps the running one
    assert ":3: defaults.exposure.max_dirty" in v["reload_error"] and v["policy_generation"] == "1", r.explain()
    assert v["alive_after_hup"] == "yes" and v["log_reload_failed"] == "yes", r.explain()
    # the volume vanished (dropped, one log line) and came back (adopted again, its pinned knob set again) ...
    assert v["dropped"] == "yes" and v["gone_from_status"] == "yes", r.explain()
    assert v["readopted"] == "yes" and v["knob_repinned"] == "yes", r.explain()
    # ... with its filesystem now on a dm-linear device stacked on bcache0: found, and a delete there still drops
    # the dirty data (the FITRIM goes to the stacked filesystem, the discard passes down to bcache)
    assert r.int("stacked_discard_done") == 1, r.explain()
    sbase = r.int("stacked_dirty_base")
    assert r.int("stacked_dirty_before") >= sbase + MIB, r.explain()
    assert r.int("stacked_dirty_after") <= sbase + 256 * 1024, r.explain()
    # SIGTERM: exit 0, the cache as it was
    assert v["exit"] == "0" and v["traceback"] == "no", r.explain()
    assert v["mode_after"] == v["mode_before"] and "[writeback]" in v["mode_after"], r.explain()
    # the pinned writeback_percent put back to the value found (issue 34: no knob outlives the daemon), never a
    # drain's 0
    assert v["wb_percent_after"] == v["wb_percent_before"] != "0" and v["dirty_stable"] == "yes", r.explain()
    assert v["state_volumes"] == "bcache0", r.explain()
