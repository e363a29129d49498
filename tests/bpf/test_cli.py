"""`cachepilot probe` end to end: a real loop ext4, JSON lines out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bpf_support import LoopFs, child

pytestmark = pytest.mark.bpf


def test_cachepilot_probe_prints_live_events(bpf_env: None, loopfs: LoopFs) -> None:
    cli = Path(sys.executable).with_name("cachepilot")
    proc = subprocess.Popen(
        [str(cli), "probe", "--dev", str(loopfs.mount), "--seconds", "4", "--tick", "0.5", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        head = [proc.stderr.readline() for _ in range(2)]  # the attach report: printed once loaded and attached
        time.sleep(0.3)  # then the volume is watched
        path = str(loopfs.path("f\nnew line"))
        child(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'q' * 40960)\n"
            "os.fsync(fd); print(os.fstat(fd).st_ino); os.close(fd); os.unlink(sys.argv[1])",
            path,
        )
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "attached: on_bio_queue" in "".join(head) + err
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = {e["event"] for e in lines}
    assert {"Barrier", "FreedExtent", "Delete", "HotnessDelta", "Drops"} <= kinds
    major, minor = os.major(os.stat(loopfs.loopdev).st_rdev), os.minor(os.stat(loopfs.loopdev).st_rdev)
    hot = [e for e in lines if e["event"] == "HotnessDelta"]
    assert any(e["key"]["dev"] == f"{major}:{minor}" and e["write_bytes"] == 40960 for e in hot)
