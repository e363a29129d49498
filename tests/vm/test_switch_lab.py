"""Drain-and-verify write-policy switches through cachepilot's backends on real bcache, dm-cache and
dm-writecache in the lab, with dirty data; the data is then checked through the volume and on the origin alone."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"


@pytest.mark.parametrize("recipe", ["bcache", "dmcache", "writecache"])
def test_switch_drains_dirty_data_and_keeps_it(lab, recipe):
    r = lab.run([PY, "tests/vm/act/switch.py"], recipe=recipe, timeout=240)
    print(r.stdout)  # the measured times (pytest -s)
    assert r.rc == 0, r.explain()
    v = r.values
    assert r.int("dirty_before") >= (8 << 20), r.explain()  # the switch really had dirty data to drain
    assert v["switch_status"] == "done", r.explain()
    assert r.int("dirty_after") == 0, r.explain()
    if recipe == "writecache":
        assert v["writethrough_status"] == "failed" and "write-back only" in v["writethrough_line"]
        assert "high_watermark 90" in v["table"] and "low_watermark 80" in v["table"], v["table"]
        # the delegated bound (engine.nativebound): its four table arguments in one reload, read back, and put
        # back in one when a policy reload makes the model recoverable (it was a reload per argument each way)
        assert r.int("delegate_reloads") == 1 and r.int("putback_reloads") == 1, r.explain()
        for arg in ("max_age 30000", "pause_writeback 0", "high_watermark ", "low_watermark "):
            assert arg in v["delegate_table"], v["delegate_table"]
        assert "=> done" in v["delegate_lines"] and "max_age=30000" in v["delegate_lines"], v["delegate_lines"]
        assert "put back" in v["putback_lines"] and "=> done" in v["putback_lines"], v["putback_lines"]
        assert sorted(v["putback_table"].split()) == sorted(v["delegate_table_before"].split()), v["putback_table"]
    else:
        assert v["mode_after"] == "writethrough", r.explain()
        assert v["bypass_status"] == "done" and v["mode_bypass"] in ("none", "passthrough"), r.explain()
    if recipe == "bcache":
        assert v["writeback_percent_after"] == "40"  # the drain put back what it changed
    if recipe == "dmcache":
        assert " passthrough smq " in v["table_after"], v["table_after"]  # the cleaner is gone again
        # done = the backend read 0 dirty blocks; back in writeback, the filesystem may dirty a block or two since
        assert r.int("drain_dirty_before") >= (8 << 20) and r.int("drain_dirty_after") < (1 << 20), r.explain()
        assert v["drain_status"] == "done", r.explain()
        assert "writeback/smq -> writethrough/cleaner" in v["drain_line"], v["drain_line"]  # no new dirty blocks
        assert " writeback smq " in v["table_after_drain"], v["table_after_drain"]
    assert v["intact_volume"] == "yes", r.explain()
    assert v["intact_origin"] == "yes", r.explain()  # everything reached the origin
