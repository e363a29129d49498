"""`cachepilot detach` / `attach` through the running daemon on real caches (issue 36 items 2 and 5), all four kinds
in one guest boot (bcache, and dm-writecache, dm-cache and lvmcache on loop devices): the volume stays mounted and
serving, every fsync-acknowledged file is intact on the bare origin (what was dirty was written back), status lists
it as detached (not managed, not latched), and attach puts the same cache back and the daemon adopts the volume
again. Then a failing cache holding dirty data (dm-writecache's and dm-cache's cache devices reloaded to dm-error):
refused with the bytes named, exit 2; ``--accept-loss`` leaves the volume on its origin. The failed dm-cache is
latched by the daemon's own committing status read, every FAILURE_COMMIT_S: nothing else in the guest commits."""

from __future__ import annotations

import pytest

from cachepilot.backends.operation import FAILURE_COMMIT_S

pytestmark = pytest.mark.vm


def test_detach_leaves_every_file_on_the_bare_origin_then_attach_adopts_again(lab):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/detach.py"], recipe="bcache", mode="writeback",
                timeout=420)
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
    # docs/operate.md's replace-a-cache walk-through, its hot-list steps as written there
    assert v["hot_export_rc"] == "0" and r.int("hot_export_files") > 0, r.explain()
    assert v["hot_import_rc"] == "0" and "handed to the daemon for re-warming" in v["hot_import_said"], r.explain()
    # the dm kinds: a linear table over the bare origin with every file on it, then the cache back
    for p in ("wc", "dmc", "lvm"):
        assert v[f"{p}_detach_rc"] == "0" and v[f"{p}_table_linear"] == "yes", (p, r.explain())
        assert v[f"{p}_mounted_after"] == "yes" and v[f"{p}_listed_detached"] == "yes", (p, r.explain())
        assert v[f"{p}_files_intact_mount"] == "yes" and v[f"{p}_files_intact_bare"] == "yes", (p, r.explain())
        assert v[f"{p}_serving"] == "yes" and v[f"{p}_attach_rc"] == "0", (p, r.explain())
    assert r.int("dmc_dirty_blocks_before") > 0 and r.int("lvm_dirty_blocks_before") > 0, r.explain()
    # dm kinds: the table detach replaced is loaded again (dm-cache's is write-through: the detach's drain left it
    # so, and the policy decides the mode after adoption, as on bcache)
    assert v["wc_table_back"] == "yes" and v["dmc_table_back"] == "yes" and v["wc_table_same"] == "yes", r.explain()
    # lvmcache: the pool --splitcache kept is "cpool" (lvs says [cpool_cpool] while attached), put back by attach
    assert v["lvm_segtype_back"] == "cache" and v["lvm_pool_back"] == "[cpool_cpool]", r.explain()
    assert v["adopted_again"] == "yes" and v["files_intact_end"] == "yes", r.explain()
    # a failed cache holding dirty data (dm-writecache; dm-cache, whose failed status has no figures): refused
    # with the bytes named, exit 2; --accept-loss leaves the volume reading its origin
    assert v["dmc_writeback_again"] == "yes", r.explain()
    # dm-cache shows its dead cache device only at a metadata commit, and nobody but the daemon commits here (no
    # `dmsetup status`): its committing sample latches it within FAILURE_COMMIT_S (+ ticks and the CLI's polling
    # on an emulated vCPU)
    assert float(v["dmcfail_seen_s"]) <= FAILURE_COMMIT_S + 8, r.explain()
    for p in ("fail", "dmcfail"):
        assert r.int(f"{p}_dirty") > 0 and v[f"{p}_seen"] == "yes", (p, r.explain())
        assert v[f"{p}_refused_rc"] == "2", (p, r.explain())
        assert "refused: the cache device failed holding" in v[f"{p}_refused_line"], (p, r.explain())
        assert r.int(f"{p}_dirty_named") > 0 and "--accept-loss" in v[f"{p}_refused_line"], (p, r.explain())
        assert v[f"{p}_accept_rc"] == "0" and v[f"{p}_table_linear"] == "yes", (p, r.explain())
        assert v[f"{p}_listed_detached"] == "yes" and v[f"{p}_reads_origin"] == "yes", (p, r.explain())
    assert v["exit"] == "0" and v["traceback"] == "no", r.explain()
    assert v["detach_logged"] == "yes" and v["released_logged"] == "yes", r.explain()
