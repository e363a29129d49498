"""A probe loaded inside a PID namespace (a daemon in a container) still ignores exactly its own I/O and unlinks, and
sees everyone else's (on today's kernels getpid() there is 1: the host's init, not the loader)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bpf_support import LoopFs, run

pytestmark = pytest.mark.bpf

INSIDE = """
import json, mmap, os, subprocess, sys, time
from cachepilot.events import Delete, FileKey, HotnessDelta
from cachepilot.probe import Probe
dev, own_read, own_unlink, other_unlink = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
assert os.getpid() == 1, os.getpid()
with Probe(max_files=1024) as p:
    p.watch_volume(dev)
    fd = os.open(own_read, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    for i in range(4):
        os.preadv(fd, [buf], i * 4096)
    os.close(fd)
    os.unlink(own_unlink)
    subprocess.run([sys.executable, "-c", "import os, sys; os.unlink(sys.argv[1])", other_unlink], check=True)
    events = []
    for _ in range(20):
        events += p.poll(50)
        if any(isinstance(e, Delete) for e in events):
            break
    events += p.drain()
    print(json.dumps({
        "self_tgid": p.self_tgid,
        "self_id": p.report.self_id,
        "hot": [e.key.ino for e in events if isinstance(e, HotnessDelta)],
        "deleted": [e.key.ino for e in events if isinstance(e, Delete)],
    }))
"""


def test_probe_in_a_pid_namespace_ignores_itself(bpf_env: None, loopfs: LoopFs) -> None:
    names = [str(loopfs.path(n)) for n in ("own-read", "own-unlink", "other-unlink")]
    for n in names:
        with open(n, "wb") as f:
            f.write(os.urandom(16384))
    inos = [os.stat(n).st_ino for n in names]
    run("sync")
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", INSIDE, str(loopfs.dev), *names],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # the kernel's tgid of the loader: the unshare'd child of our child, never 1
    assert out["self_tgid"] not in (0, 1) and out["self_id"] == "claimed in the kernel"
    assert inos[0] not in out["hot"]  # its own direct reads
    assert out["deleted"] == [inos[2]]  # another process's unlink, not its own
