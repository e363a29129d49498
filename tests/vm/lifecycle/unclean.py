"""Lab: a dm-cache that comes back from an unclean shutdown with every mapped block dirty (issue 36 item 4).

The provocation costs no crash: dm-cache writes the clean-shutdown flag only when the target is suspended
(dm-cache-target.c ``sync_metadata`` from ``cache_postsuspend``); every ordinary commit (a ``dmsetup status``
triggers one) clears it (dm-cache-metadata.c ``dm_cache_commit`` with ``clear_clean_shutdown``). So a copy of the
metadata device taken after a status, with the volume idle and clean, is the metadata of a cache that lost power
then. The target is removed (clean), that copy written back, the target created again (with no migration until the
daemon has looked): it loads every valid block dirty (``__load_mapping_v1``: ``dirty = true`` unless
``clean_when_opened``). The daemon (recoverable: no drain of its own) starts then; measured: status and the metric
name it, the time to clean once the rate is measured, and the files read back intact after the write-back.
key=value lines on stdout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cachepilot.backends.dmcache import CacheTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import quiet_policy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

MIB = 1 << 20
METRICS = "127.0.0.1:9854"
mnt = Path(os.environ["LAB_MOUNT"])
dm_name, meta = os.environ["LAB_DM_NAME"], os.environ["LAB_CACHE_META_DEV"]
tmp = Path(tempfile.mkdtemp(prefix="cp-unclean-"))
POLICY = quiet_policy()


def dm(*args: str) -> str:
    return subprocess.run(["dmsetup", *args], check=True, capture_output=True, text=True).stdout.strip()


def blocks() -> tuple[int, int]:
    """(used, dirty) cache blocks from the status line (a status also commits the metadata)."""
    f = dm("status", dm_name).split()
    return int(f[6].split("/")[0]), int(f[13])


def volume() -> dict[str, Any]:
    rc, out = d.cli("status", "--json")
    vols = json.loads(out).get("volumes", []) if rc == 0 else []
    return next((v for v in vols if v["kind"] == "dm-cache"), {})


def metric(name: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return "none"
    return next((line.split()[-1] for line in text.splitlines() if line.startswith(name + "{")), "none")


# a cache with mapped blocks: files written, then read three times (smq promotes blocks it sees read again)
files = {}
for i in range(24):
    p = mnt / f"u{i:02d}"
    data = os.urandom(MIB)
    p.write_bytes(data)
    files[p.name] = hashlib.sha256(data).hexdigest()
subprocess.run(["sync"], check=True)
for _ in range(3):
    for p in sorted(mnt.glob("u*")):
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none"], check=True)
subprocess.run(["umount", str(mnt)], check=True)
clean = wait(lambda: blocks()[1] == 0, 240, step=1)  # smq cleans once the origin idles
used, dirty = blocks()
say("before_used_blocks", used)
say("before_dirty_blocks", dirty)
if not clean or used < 64:
    sys.exit(1)

# the metadata as a power cut would leave it, then the target back on it
table = dm("table", dm_name)
image = tmp / "meta.img"
subprocess.run(["dd", f"if={meta}", f"of={image}", "bs=1M", "iflag=direct", "status=none"], check=True)
dm("remove", dm_name)
subprocess.run(["dd", f"if={image}", f"of={meta}", "bs=1M", "oflag=direct", "status=none"], check=True)
# no migration until the daemon has seen it (migration_threshold 0: spare_migration_bandwidth allows none), or smq
# would clean it all while the daemon starts under TCG; given back below
held = CacheTable.parse(table).with_(policy_args=("migration_threshold", "0")).line()
dm("create", dm_name, "--table", held)
used, dirty = blocks()
say("after_used_blocks", used)
say("after_dirty_blocks", dirty)
subprocess.run(["mount", "-t", "ext4", f"/dev/mapper/{dm_name}", str(mnt)], check=True)

# the busybox guest leaves lo down (only the systemd one brings it up): the metrics are scraped over it
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
d = LabDaemon(tmp, POLICY, metrics=METRICS)
ok = d.ready(180)
say("ready", "yes" if ok else "no")
if not ok:
    d.fail()
t0 = time.monotonic()
named = wait(lambda: (volume().get("writeback") or {}).get("all_dirty"), 60, step=1)
w = volume().get("writeback") or {}
say("status_all_dirty", "yes" if named else "no")
say("came_back", "yes" if w.get("came_back_all_dirty") else "no")
say("metric_all_dirty", metric("cachepilot_volume_all_dirty"))
rc, out = d.cli("status")
say("status_line", "yes" if "ALL DIRTY: came back with every mapped block dirty" in out else "no")
print(out)
# write-back allowed again (the lab's own act, not the daemon's); the time to clean once dirty data has fallen
dm("message", dm_name, "0", "migration_threshold", "2048")
eta = wait(lambda: (volume().get("writeback") or {}).get("clean_eta_s") is not None
           and volume().get("dirty_bytes", 0) > 0, 120, step=1)
w = volume().get("writeback") or {}
say("eta_s", w.get("clean_eta_s") if eta else "none")
say("rate_bytes_s", w.get("rate_bytes_s"))
say("metric_eta", metric("cachepilot_volume_clean_eta_seconds"))
say("eta_after_s", f"{time.monotonic() - t0:.0f}")
done = wait(lambda: blocks()[1] == 0, 300, step=2)
say("cleaned", "yes" if done else "no")
say("cleaned_after_s", f"{time.monotonic() - t0:.0f}")
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3\n")
say("files_intact", "yes" if all(hashlib.sha256((mnt / n).read_bytes()).hexdigest() == h for n, h in files.items())
    else "no")
rc, out = d.cli("explain")
say("explain_says", "yes" if "all_dirty => found" in out and "unclean shutdown" in out else "no")
d.stop()
