"""Promotion by reading, in the lab: the cache emptied (bcache detached and re-attached; dm-cache replaced by
an empty one), the promoter reads the hot set, and an ordinary re-read then comes from the cache."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"
MIB = 1 << 20


def test_promotion_on_bcache_is_admitted_and_the_next_reads_hit(lab):
    r = lab.run([PY, "tests/vm/act/promote.py"], recipe="bcache", timeout=240)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.values["sequential_cutoff"] == "4.0M"  # the stock cutoff: the promoter must not look sequential
    assert r.values["congested_read_threshold_us_status"] == "done"
    assert r.int("promote_bytes") == 8 * MIB
    assert r.int("promote_origin_bytes") >= 8 * MIB  # the promotion read the hot set from the origin ...
    # ... as misses that bcache inserted (bcache counts per bio, so at least one per read), not bypassed ...
    assert r.int("cache_misses") >= r.int("promote_reads"), r.explain()
    assert r.int("cache_bypass_misses") <= 1, r.explain()
    # ... and the next read of the hot set is served by the cache: hits (a long dd run is counted as bypass
    # hits past sequential_cutoff, still from the cache), the origin (nearly) untouched
    assert r.int("cache_hits") + r.int("cache_bypass_hits") >= r.int("reread_reads") * 0.9, r.explain()
    assert r.int("reread_origin_bytes") <= 8 * MIB // 20, r.explain()


def test_promotion_on_dmcache_takes_two_rounds_and_the_next_reads_hit(lab):
    r = lab.run([PY, "tests/vm/act/promote.py"], recipe="dmcache", mode="writethrough", timeout=240)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.int("promote_bytes") == 8 * MIB  # 4 MiB, two rounds
    assert r.int("promote_promotions") >= 60, r.explain()  # 64 blocks of 64 KiB
    assert r.int("reread_origin_bytes") <= 4 * MIB // 20, r.explain()


def test_promotion_backs_off_on_bcache_alloc_failures_and_what_it_read_stays_resident(lab):
    # 16 MiB promoted in one burst into an emptied 256 MiB cache (4 096 buckets of 64 KiB: 4 ready at a time):
    # bcache refuses inserts. Without the back-off those misses are lost; with it the rate halves, the bucket
    # empties and what a failing tick read is read once more, so the re-read of the set finds (nearly) all of it.
    r = lab.run([PY, "tests/vm/act/allocfail.py"], recipe="bcache", timeout=400)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    assert r.values["hook"] == "attached", r.explain()
    # How many inserts bcache refuses depends on how fast this TCG guest's allocator refills against the reads
    # (2 per run in the runs measured): a run where the paced half met none shows nothing and says so, rather
    # than failing at random; the unpaced half's count is the probe's (it counts the refusals on the cache device).
    if r.int("unpaced_failures") + r.int("paced_failures") == 0:
        print("no allocation failure provoked in this run: only residency is checked")  # seen once in 3 runs at 16 MiB
    if r.int("paced_failures") > 0:
        assert r.int("paced_rereads") > 0, r.explain()
        assert r.int("paced_lowest_rate") <= 64 * MIB // 2, r.explain()  # halved
    lost_unpaced, lost_paced = r.int("unpaced_reread_origin_bytes"), r.int("paced_reread_origin_bytes")
    # the promoted set is resident: the re-read hits (at most half what the unpaced run lost, or 2% of the set: a
    # fresh-clone run lost 144 KiB of 16 MiB with no refusal counted, so not every lost insert is an alloc failure)
    assert lost_paced <= max(lost_unpaced // 2, 16 * MIB // 50), r.explain()
