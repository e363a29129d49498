"""Lab: promotion by reading, through the Promoter, on the lab's volume. bcache: the cache detached and
re-attached (empty for this volume), the hot set promoted, then an ordinary re-read must come from the cache.
dm-cache: the cache replaced by an empty one; one round of reads vs the promoter's two. key=value lines on stdout."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

from labkit import drive, drop_caches, reattach_bcache, run, say, volume, write_files

from cachepilot.actions import Promote, SetKnob
from cachepilot.actuators.promote import Promoter
from cachepilot.backends.dmstatus import parse_dm_cache_status
from cachepilot.backends.inspect import block_name, describe_volume
from cachepilot.policy.model import Promotion

MIB = 1 << 20
recipe = os.environ["LAB_RECIPE"]
mnt = Path(os.environ["LAB_MOUNT"])
cached, origin = os.environ["LAB_CACHED_DEV"], os.environ["LAB_ORIGIN_DEV"]
info = describe_volume(cached)


def generation(path: Path) -> int:
    with open(path, "rb") as f:
        buf = bytearray(8)
        fcntl.ioctl(f.fileno(), 0x80087601, buf, True)  # FS_IOC_GETVERSION
        return struct.unpack("=q", buf)[0] & 0xFFFFFFFF


def origin_read() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[2]) * 512


def actions(prefix: str, n: int) -> list[Promote]:
    out = []
    for i in range(n):
        p = mnt / f"{prefix}{i}"
        st = os.stat(p)
        out.append(Promote(info.name, info.dev, st.st_ino, generation(p), ((0, st.st_size),), "lab: hot"))
    return out


def promote(acts: list[Promote], rounds: int | None = None) -> tuple[int, int, float]:
    """Run the promoter over the set as the daemon would: at the shipped policy's rate, deferred work again once
    it is due (the daemon comes back at its next tick; 20 ms here)."""
    p = Promoter(info, rate=Promotion().rate, rounds=rounds, seed=7)
    t0 = time.monotonic()
    reads = nbytes = 0
    todo = list(acts)
    while todo:
        a = todo.pop(0)
        r = p.run(a)
        assert r.status in ("done", "pending"), r.line()
        reads += r.reads
        nbytes += r.read_bytes
        if r.deferred is not None:
            todo.append(r.deferred)
            time.sleep(max(0.02, (r.not_before_ns - time.monotonic_ns()) / 1e9) if not r.read_bytes else 0)
    return reads, nbytes, time.monotonic() - t0


def reread(prefix: str, n: int) -> tuple[int, int]:
    """An application's read of the set (O_DIRECT, 64 KiB): (reads issued, bytes read from the origin)."""
    before = origin_read()
    for i in range(n):
        run("dd", f"if={mnt / f'{prefix}{i}'}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
    return n * MIB // (64 << 10), origin_read() - before


if recipe == "bcache":
    bc = Path(f"/sys/block/{info.name}/bcache")

    def read_stats() -> dict[str, int]:
        return {k: int((bc / "stats_total" / k).read_text()) for k in
                ("cache_hits", "cache_misses", "cache_bypass_hits", "cache_bypass_misses")}

    def settled(base: dict[str, int] | None = None, hits: int = 0) -> dict[str, int]:
        """bcache folds its counters into stats_total on a 5 s timer (much later on a loaded lab host): wait
        until they have not changed for 6 s and, given ``base``, show at least ``hits`` more hits (30 s at most;
        the test then judges what it got)."""
        t0 = last_change = time.monotonic()
        seen = read_stats()

        def enough(c: dict[str, int]) -> bool:
            return base is None or c["cache_hits"] + c["cache_bypass_hits"] - base["cache_hits"] - \
                base["cache_bypass_hits"] >= hits

        while (time.monotonic() - last_change < 6 or not enough(seen)) and time.monotonic() - t0 < 30:
            time.sleep(0.25)
            cur = read_stats()
            if cur != seen:
                seen, last_change = cur, time.monotonic()
        return seen

    # bcache bypasses I/O at random while its cache device looks congested (read latency above 2 ms, common
    # on a loaded TCG lab host): a policy that promotes pins the threshold to 0 (off), as here.
    for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
        say(f"{knob}_status", drive(volume(), SetKnob(info.name, knob, "0", "lab: promotion"))[0].status)
    write_files(mnt, "hot", 8, MIB, seed=1)
    os.sync()
    say("reattached", reattach_bcache(bc))
    say("sequential_cutoff", (bc / "sequential_cutoff").read_text().strip())
    drop_caches()
    s0 = settled()
    o0 = origin_read()
    reads, nbytes, secs = promote(actions("hot", 8))
    say("promote_reads", reads)
    say("promote_bytes", nbytes)
    say("promote_seconds", f"{secs:.2f}")
    say("promote_origin_bytes", origin_read() - o0)
    n, from_origin = reread("hot", 8)
    say("reread_reads", n)
    say("reread_origin_bytes", from_origin)
    s1 = settled(s0, n)  # the counters of both: the promotion's misses and the re-read's hits
    for k in s0:
        say(k, s1[k] - s0[k])
else:
    name = os.environ["LAB_DM_NAME"]

    def promotions() -> int:
        time.sleep(1.5)  # migrations run in the background
        return parse_dm_cache_status(run("dmsetup", "status", name)).promotions

    for k in (1, 2):
        write_files(mnt, f"p{k}_", 4, MIB, seed=k)
    os.sync()
    # Replace the cache by an empty one: the same table over freshly zeroed metadata (the lab volume is
    # write-through, so the origin holds everything).
    table = run("dmsetup", "table", name)
    run("umount", str(mnt))
    run("dmsetup", "remove", name)
    run("dd", "if=/dev/zero", f"of={os.environ['LAB_CACHE_META_DEV']}", "bs=1M", "count=1", "oflag=direct",
        "status=none")
    run("dmsetup", "create", name, "--table", table)
    run("mount", cached, str(mnt))
    say("fresh_cache_used_blocks", parse_dm_cache_status(run("dmsetup", "status", name)).cache_used_blocks)
    info = describe_volume(cached)
    drop_caches()
    # One round over a fresh set (measured: smq promotes nothing), then the promoter's own way (two rounds).
    base = promotions()
    promote(actions("p1_", 4), rounds=1)
    say("one_round_promotions", promotions() - base)
    base = promotions()
    reads, nbytes, secs = promote(actions("p2_", 4))
    say("promote_bytes", nbytes)
    say("promote_seconds", f"{secs:.2f}")
    say("promote_promotions", promotions() - base)
    n, from_origin = reread("p2_", 4)
    say("reread_origin_bytes", from_origin)
