"""Lab measurement (issue 37, Deliver 2): does dm-cache's smq take a hot large file by itself, and how fast?

Six 16 MiB files (the issue's hot set) read whole, buffered, five rounds with the page cache dropped before each
round -- first into an empty cache, then again after a cold stream of twice the cache has been read once (the cache
full of cold blocks, as on a host that has run a while). No daemon. Per round: bytes the origin served, and the
cache's read hits, read misses and promotions (`dmsetup status`). key=value lines on stdout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from labkit import drop_caches, run, say, sectors

from cachepilot.backends.inspect import describe_volume

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
cached, origin, name = os.environ["LAB_CACHED_DEV"], os.environ["LAB_ORIGIN_DEV"], os.environ["LAB_DM_NAME"]


def status() -> tuple[int, int, int]:
    """(read hits, read misses, promotions) from the cache target's status line."""
    f = run("dmsetup", "status", name).split()
    return int(f[7]), int(f[8]), int(f[12])


def write(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
        os.fsync(f.fileno())


def rounds(tag: str, files: list[Path], n: int = 5) -> None:
    for r in range(1, n + 1):
        drop_caches()
        s0, o0 = status(), sectors(origin)[0]
        for p in files:
            subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=1M", "status=none"], check=True)
        s1, o1 = status(), sectors(origin)[0]
        say(f"{tag}_round{r}_origin_mib", f"{(o1 - o0) * 512 / MIB:.1f}")
        say(f"{tag}_round{r}_hits_misses_promotions", " ".join(str(b - a) for a, b in zip(s0, s1, strict=True)))


def main() -> None:
    cache_bytes = describe_volume(cached).cache_bytes
    say("cache_bytes", cache_bytes)
    say("policy_args", " ".join(run("dmsetup", "status", name).split()[-6:]))
    hot = [mnt / f"hot{i}" for i in range(6)]
    for p in hot:
        write(p, 16 * MIB)
    stream = mnt / "stream"
    write(stream, 2 * cache_bytes)
    drop_caches()
    rounds("fresh", hot)
    drop_caches()
    o0 = sectors(origin)[0]
    subprocess.run(["dd", f"if={stream}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    say("stream_origin_mib", f"{(sectors(origin)[0] - o0) * 512 / MIB:.1f}")
    rounds("after_stream", hot)


main()
