"""`make demo`'s guest part (tests/vm/demo/demo.py) in the lab, asserting the claims its report makes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_demo_daemon_discards_promotes_switches_and_keeps_files(lab):
    r = lab.run([".venv/bin/python", "tests/vm/demo/demo.py", "--values"], recipe="bcache", mode="writeback",
                origin_delay_ms=2, timeout=300)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["knobs_pinned"] == "yes", r.explain()
    # the deleted files' dirty data left the cache through the daemon's FITRIM and never reached the origin
    base = r.int("dirty_base")
    assert r.int("dirty_before") >= base + 3 * MIB and r.int("dirty_after") <= base + 512 * 1024, r.explain()
    assert r.int("origin_written_during_delete") < MIB, r.explain()
    assert r.int("discard_landed") >= 1 and r.int("discard_issued_bytes") >= 4 * MIB, r.explain()
    assert r.int("promote_done") >= 1, r.explain()
    # the burst ran at the demo policy's exposure bound, and the bound held: a drain started as dirty data neared it,
    # or (the burst outrunning the write-back) write-through with that reason; write-back again after either
    assert v["drained_early"] == "yes" or v["switched_writethrough"] == "yes", r.explain()
    if v["switched_writethrough"] == "yes":
        assert "writethrough: exposure bound" in v["switch_reasons"], r.explain()
    assert v["back_writeback"] == "yes", r.explain()
    assert r.int("files_bad") == 0 and r.int("status_rc") == 0, r.explain()
    assert v["exit"] == "0" and v["traceback"] == "no" and "[writeback]" in v["mode_after"], r.explain()
