"""`cachepilot record` for real on this host (the real probe, ext4 on a loop device, no cache), killed with SIGKILL:
the trace reads up to its last complete block, replay says it was cut, and a 1 KiB-block ext4 is recorded with
its own block size (freed extents count filesystem blocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bpf_support import LoopFs, make_loop_ext4

from cachepilot.events import FreedExtent
from cachepilot.trace import TraceReader

CLI = Path(sys.executable).with_name("cachepilot")


def _wait_for_line(err: Path, what: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while what not in err.read_text():
        assert proc.poll() is None, f"record exited {proc.returncode}: {err.read_text()}"
        assert time.monotonic() < deadline, f"no {what!r} from record within {timeout} s: {err.read_text()}"
        time.sleep(0.1)


def test_record_killed_leaves_a_readable_trace_with_the_filesystems_block_size(tmp_path: Path, bpf_env: None) -> None:
    out, err = tmp_path / "rec.cptrace", tmp_path / "stderr"
    with make_loop_ext4(64, mkfs_opts=("-b", "1024")) as fs, open(err, "w") as errf:
        assert os.statvfs(fs.mount).f_bsize == 1024
        p = subprocess.Popen([str(CLI), "record", "--out", str(out), "--volume", fs.loopdev, "--tick", "0.2"],
                             stdout=subprocess.DEVNULL, stderr=errf)
        try:
            _wait_for_line(err, f" to {out}", p)  # said once the programs are attached
            victim = fs.mount / "doomed"
            victim.write_bytes(os.urandom(1 << 20))
            os.sync()
            victim.unlink()
            os.sync()
            time.sleep(1.5)  # several ticks: the freed extents drained and written
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
    r = TraceReader(out)
    (vol,) = r.volumes
    assert vol.kind == "none" and vol.fs_block_size == 1024
    freed = [ev for ev in r.events() if isinstance(ev, FreedExtent) and not ev.metadata]
    assert r.cut is not None and "no END block" in r.cut
    assert sum(ev.count for ev in freed) * vol.fs_block_size == 1 << 20, freed
    rep = subprocess.run([str(CLI), "replay", "-q", str(out)], capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr.splitlines() == [f"cachepilot: warning: {out}: {r.cut}"]
    assert "trace cut at offset" in rep.stdout


def test_record_to_a_full_disk_is_one_line(loopfs: LoopFs) -> None:
    r = subprocess.run([str(CLI), "record", "--out", "/dev/full", "--volume", loopfs.loopdev, "--duration", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == "cachepilot: /dev/full: cannot write trace: No space left on device", r.stderr
