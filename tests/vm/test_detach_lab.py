"""`cachepilot detach` / `attach` through the running daemon on real caches (issue 36 items 2 and 5), bcache and
dm-writecache in one guest boot: the volume stays mounted and serving, every fsync-acknowledged file is intact on
the bare origin (what was dirty was written back), status lists it as detached (not managed, not latched), and
attach puts the same cache back and the daemon adopts the volume again."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


def test_detach_leaves_every_file_on_the_bare_origin_then_attach_adopts_again(lab):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/detach.py"], recipe="bcache", mode="writeback",
                timeout=300)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["ready"] == "yes", r.explain()
    assert r.int("dirty_before") > 0 and r.int("wc_used_before") > 0, r.explain()  # something to write back
    # bcache: detached through the daemon, the kernel's own state read back, mounted and serving throughout
    assert v["detach_rc"] == "0" and v["detach_said"] == "yes", r.explain()
    assert v["state_after"] == "no cache" and v["cache_link_after"] == "no" and v["mounted_after"] == "yes"
    assert v["listed_detached"] == "yes" and "bcache0" not in v["managed_after_detach"].split(","), r.explain()
    assert v["files_intact_mount"] == "yes" and v["files_intact_bare"] == "yes", r.explain()
    assert v["serving"] == "yes", r.explain()
    assert v["attach_rc"] == "0" and v["attached_cset"] == "yes", r.explain()
    assert v["state_attached"] in ("clean", "dirty"), r.explain()
    # dm-writecache: a linear table over the origin, the files on the bare origin, the saved table back
    assert v["wc_detach_rc"] == "0" and v["wc_table_linear"] == "yes" and v["wc_mounted_after"] == "yes", r.explain()
    assert v["wc_listed_detached"] == "yes", r.explain()
    assert v["wc_files_intact_mount"] == "yes" and v["wc_files_intact_bare"] == "yes", r.explain()
    assert v["wc_serving"] == "yes", r.explain()
    assert v["wc_attach_rc"] == "0" and v["wc_table_back"] == "yes", r.explain()
    assert v["adopted_again"] == "yes" and v["files_intact_end"] == "yes", r.explain()
    assert v["exit"] == "0" and v["traceback"] == "no", r.explain()
    assert v["detach_logged"] == "yes" and v["released_logged"] == "yes", r.explain()
