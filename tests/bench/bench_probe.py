"""Benchmark of the kernel half (run by `make bench`, not a timed test).

1. Capture overhead: fio 4 KiB random O_DIRECT reads, and a 4 KiB buffered-write + fsync loop, on ext4 on a loop device
   backed by tmpfs (a fast device), with and without the BPF programs attached, alternating runs in one go.
   Reported as IOPS(with) / IOPS(without); goal >= 0.98.
2. Drain: 1 million tracked files in the kernel's hotness table, drained to user space; goal <= 1 s of user CPU and
   <= 64 bytes of kernel memory per tracked file.

Needs root. Prints a table; exit code 0 even when a goal is missed (the numbers are the result).
"""

from __future__ import annotations

import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bpf"))

from bpf_support import make_loop_ext4  # noqa: E402

from cachepilot.probe import Probe  # noqa: E402
from cachepilot.probe import layout as L  # noqa: E402

RUNTIME = int(os.environ.get("BENCH_RUNTIME", "4"))
PAIRS = int(os.environ.get("BENCH_PAIRS", "3"))
DRAIN_FILES = int(os.environ.get("BENCH_DRAIN_FILES", "1000000"))


def fio(directory: Path, job: str) -> float:
    common = [
        "fio", "--output-format=json", "--name=bench", f"--directory={directory}", "--size=256m",
        f"--runtime={RUNTIME}", "--time_based", "--group_reporting", "--randrepeat=0",
    ]
    if job == "randread":
        args = ["--rw=randread", "--bs=4k", "--direct=1", "--ioengine=psync"]
    else:
        args = ["--rw=randwrite", "--bs=4k", "--direct=0", "--ioengine=psync", "--fsync=1", "--size=64m"]
    r = subprocess.run(common + args, capture_output=True, text=True, check=True)
    data = json.loads(r.stdout[r.stdout.index("{"):])
    job0 = data["jobs"][0]
    return float(job0["read" if job == "randread" else "write"]["iops"])


def overhead() -> dict[str, tuple[float, float, float]]:
    results: dict[str, tuple[float, float, float]] = {}
    with make_loop_ext4(1024) as fs:
        for job in ("randread", "write+fsync"):
            fio(fs.mount, job)  # lay out the file, warm up
            base: list[float] = []
            with_probe: list[float] = []
            for _ in range(PAIRS):
                base.append(fio(fs.mount, job))
                with Probe(max_files=1 << 16) as p:
                    p.watch_volume(fs.dev)
                    stop = time.monotonic() + RUNTIME + 30
                    proc = subprocess.Popen  # the daemon's loop: poll + drain once a second while fio runs
                    del proc
                    import threading

                    done = threading.Event()

                    def loop(probe: Probe = p, ev: threading.Event = done, deadline: float = stop) -> None:
                        while not ev.is_set() and time.monotonic() < deadline:
                            probe.poll(1000)
                            probe.drain()

                    t = threading.Thread(target=loop)
                    t.start()
                    with_probe.append(fio(fs.mount, job))
                    done.set()
                    t.join()
            b, w = statistics.median(base), statistics.median(with_probe)
            results[job] = (b, w, w / b)
    return results


def drain_cost() -> dict[str, float]:
    with Probe(max_files=DRAIN_FILES) as p:
        mm = p._hot_mm  # noqa: SLF001 - the same memory the BPF programs write
        assert mm is not None
        pack = struct.Struct(L.HOT_SLOT_FORMAT).pack
        now = time.monotonic_ns()
        blob = b"".join(pack(i + 1, 7 << 20, 1, 64, 0, 8, 0, now, 4096) for i in range(DRAIN_FILES))
        mm[: len(blob)] = blob
        del blob
        t0 = os.times()
        raw = p.drain_hotness_raw()
        t1 = os.times()
        assert len(raw) == DRAIN_FILES, len(raw)
        mem = p.kernel_memory_bytes()["hot_slots"]
        # the same again through drain(): typed HotnessDelta objects
        blob = b"".join(pack(i + 1, 7 << 20, 1, 64, 0, 8, 0, now, 4096) for i in range(DRAIN_FILES))
        mm[: len(blob)] = blob
        del blob
        t2 = os.times()
        events = p.drain()
        t3 = os.times()
        assert len(events) >= DRAIN_FILES
        empty0 = os.times()
        p.drain()
        empty1 = os.times()
        return {
            "raw_user_s": t1.user - t0.user,
            "raw_sys_s": t1.system - t0.system,
            "typed_user_s": t3.user - t2.user,
            "typed_sys_s": t3.system - t2.system,
            "empty_tick_user_s": empty1.user - empty0.user,
            "kernel_bytes": mem,
            "bytes_per_file": mem / DRAIN_FILES,
            "slots": p.nslots,
        }


def main() -> int:
    if os.geteuid() != 0:
        print("bench_probe: needs root", file=sys.stderr)
        return 2
    subprocess.run(["make", "-s", "-C", str(ROOT / "bpf")], check=True)
    print(f"capture overhead (fio, {RUNTIME} s runs, {PAIRS} alternating pairs, ext4 on loop on tmpfs; median IOPS)")
    print(f"{'workload':<14}{'without':>12}{'with':>12}{'ratio':>9}  goal >= 0.98")
    for job, (b, w, ratio) in overhead().items():
        print(f"{job:<14}{b:>12.0f}{w:>12.0f}{ratio:>9.3f}  {'ok' if ratio >= 0.98 else 'MISSED'}")
    d = drain_cost()
    print(f"\ndrain of {DRAIN_FILES} tracked files ({d['slots']} slots)")
    print(f"  raw tuples:         user {d['raw_user_s']:.3f} s  sys {d['raw_sys_s']:.3f} s"
          f"  goal <= 1 s user: {'ok' if d['raw_user_s'] <= 1 else 'MISSED'}")
    print(f"  typed HotnessDelta: user {d['typed_user_s']:.3f} s  sys {d['typed_sys_s']:.3f} s")
    print(f"  empty tick:         user {d['empty_tick_user_s']:.3f} s")
    print(f"  kernel memory: {d['kernel_bytes']} bytes = {d['bytes_per_file']:.1f} bytes per tracked file"
          f"  goal <= 64: {'ok' if d['bytes_per_file'] <= 64 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
