"""Lab: `cachepilot drain` through a running daemon on the lab's bcache (writeback) volume (issue 36). The policy
keeps written data dirty (recoverable, writeback_percent 40); fsync'ed files make ~24 MiB dirty; then:
1. a drain whose deadline cannot be met (the origin is throttled to 20 IOPS by the test: ~24 MiB of write-back
   takes far longer than the 4 s deadline) exits 1 naming the bytes left;
2. with write-back running again, a drain to the end: exit 0, dirty 0 and the cache clean read back by the guest,
   a progress line, every file intact; the policy has the volume back (write-back) afterwards.
key=value lines on stdout."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.backends.inspect import parse_bcache_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import quiet_policy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
tmp = Path(tempfile.mkdtemp(prefix="cp-drain-"))
POLICY = quiet_policy("knobs: {writeback_percent: 40, sequential_cutoff: 0, congested_read_threshold_us: 0,\n"
                      "          congested_write_threshold_us: 0}")


def dirty() -> int:
    return parse_bcache_size((sysfs / "dirty_data").read_text())


d = LabDaemon(tmp, POLICY, tick="500ms")
ok = d.ready(150)
say("ready", "yes" if ok else "no")
if not ok or not wait(lambda: (sysfs / "writeback_percent").read_text().strip() == "40", 60):
    d.fail()

files = {}
for i in range(24):
    p = mnt / f"f{i:02d}"
    data = os.urandom(MIB)
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    files[p] = hashlib.sha256(data).hexdigest()
say("dirty_before", dirty())

# 1. the deadline: a 4 s drain of ~24 MiB to a 20-IOPS origin cannot end
t0 = time.monotonic()
rc, out = d.cli("drain", "bcache0", "--deadline", "4s")
say("expired_rc", rc)
say("expired_s", f"{time.monotonic() - t0:.1f}")
say("expired_said", "yes" if "drain expired" in out and "still dirty" in out else "no")
print(out)
say("dirty_after_expired", dirty())

# 2. a drain to the end, verified
rc, out = d.cli("drain", "bcache0", "--deadline", "180s")
say("drain_rc", rc)
say("drain_progress", "yes" if " left of " in out and "/s, ETA" in out else "no")
say("drain_done_said", "yes" if "drain done" in out and "verified clean" in out else "no")
print(out)
say("dirty_after", dirty())
say("state_after", (sysfs / "state").read_text().strip())
subprocess.run(["sync"], check=True)
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3\n")
say("files_intact", "yes" if all(hashlib.sha256(p.read_bytes()).hexdigest() == h for p, h in files.items()) else "no")
time.sleep(2)
say("mode_after", (sysfs / "cache_mode").read_text().strip())
log = d.stop()
say("operator_logged", "yes" if "operator drain started" in log else "no")
