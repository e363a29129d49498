"""The daemon's cost curve on this host (issue 32 item 1): `cachepilot run` with the real probe, observe-only on ext4
over a loop device (as tests/bpf/test_daemon_host.py runs it; this host has no cache), while a file-event generator
(tests/bench/filegen.c, compiled here with the system gcc) runs at 1 000, 10 000, 50 000 and 100 000 file events a
second; beside it the same generator without the daemon.

The mix ("churn", see filegen.c): create a file, write 8 KiB, fsync it every FSYNC_EVERY-th time, read 4 KiB of a
younger file, unlink the file created POOL cycles ago (POOL: LIFE_S worth of cycles at the rate); GENERATORS
processes each make an equal share of the rate in their own directory. A file event is one of those system calls.
The rate each point reached is printed: under load the generator falls short of a high target, and that is the
result, not a failure.

Per point and round: the daemon's CPU (utime + stime of /proc/PID/stat over the window, % of one core), its RSS at
the end, its tick durations (the status' last tick, asked every STATUS_EVERY_S: a tick counted once), the probe's
drops over the window (ring full, hotness table full, other) and the records the daemon took per file event by kind
(its event counters: ring records Delete, FreedExtent, JournalCommit, Barrier, Discard; per-tick map aggregates
HotnessDelta, MetadataDelta, SyncCalls, Drops; "Delete (map)": deletes taken in bulk from the kernel's map).
Rounds alternate the order of rates; a round starts a fresh daemon. The load average is printed beside the numbers:
other work on the host moves them.

Usage (root): .venv/bin/python tests/bench/bench_daemon_cost.py [--quick] [--rounds N] [--window S] [--rates ...]
[--pyspy .venv/bin/py-spy] (where the daemon's CPU goes, per rate)
--quick: one round of 1.5 s windows (checks that it runs; proves nothing). The last line is RESULT {json}.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bpf"))

from bpf_support import make_loop_ext4  # noqa: E402

from cachepilot.daemon.control import request  # noqa: E402
from cachepilot.daemon.lock import HOST_LOCK_ENV  # noqa: E402

CLI = Path(sys.executable).with_name("cachepilot")
GEN_SRC = Path(__file__).with_name("filegen.c")
RATES = (1_000, 10_000, 50_000, 100_000)
GENERATORS = 2  # one process cannot reach 100 000 events/s on this host (~70 000 alone, measured)
FSYNC_EVERY = 32
LIFE_S = 0.5  # a file lives this long (POOL = the cycles of LIFE_S): every window sees its deletes at any rate
STATUS_EVERY_S = 0.3
SETTLE_S = 2.5  # after a window's clean-up: the deletes it made are taken before the next window starts
POLICY = """version: 1
defaults:
  discard_on_delete: {enabled: true, interval: 1s, min_extent: 4KiB}
  promotion: {enabled: true, rate: 1MiB, sieve_size: 1MiB}
"""


@dataclass
class Point:
    """One window at one rate: with the daemon (daemon_* set) or without."""

    target: int
    reached: float  # file events per second the generators made
    gen_cpu_pct: float
    daemon_cpu_pct: float | None = None
    rss_mib: float | None = None
    ticks_ms: list[float] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)  # ring records (events by kind) taken over the window
    file_events: int = 0


def build_generator(where: Path) -> Path:
    exe = where / "filegen"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(GEN_SRC)], check=True)
    return exe


def generate(exe: Path, top: Path, rate: int, seconds: float) -> tuple[int, float, float]:
    """Run GENERATORS processes at rate / GENERATORS each; (events, seconds, CPU seconds) in total. Their files are
    removed afterwards (by the caller's clean-up, outside the window)."""
    procs = []
    each = rate / GENERATORS
    pool = max(64, int(each / (4 + 1 / FSYNC_EVERY) * LIFE_S))
    for i in range(GENERATORS):
        d = top / f"g{i}"
        d.mkdir(parents=True, exist_ok=True)
        argv = [str(exe), str(d), str(each), str(seconds), str(FSYNC_EVERY), str(pool)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    events, took, cpu = 0, 0.0, 0.0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        if p.returncode != 0:
            raise SystemExit(f"filegen failed ({p.returncode})")
        kv = dict(x.split("=") for x in out.split())
        events += int(kv["events"])
        took = max(took, float(kv["seconds"]))
        cpu += float(kv["cpu_s"])
    return events, took, cpu


def clean(top: Path) -> None:
    subprocess.run(["rm", "-rf", str(top)], check=True)


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Daemon:
    """`cachepilot run` observe-only on the mount, 1 s tick (the shipped default)."""

    def __init__(self, tmp: Path, mount: Path) -> None:
        (tmp / "policy.yaml").write_text(POLICY)
        self.config = tmp / "cachepilot.yaml"
        self.config.write_text(f"version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\n"
                               f"observe: [{json.dumps(str(mount))}]\nmetrics: {{listen: ''}}\n")
        self.socket = tmp / "ctl.sock"
        self.err = open(tmp / "daemon.err", "w+")  # noqa: SIM115 - kept open for the daemon's life
        # its own host lock: a daemon another test runs on this host must not make this one refuse to start
        env = {**os.environ, HOST_LOCK_ENV: str(tmp / "daemon.lock")}
        self.proc = subprocess.Popen([str(CLI), "run", "--config", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=self.err, env=env)
        deadline = time.monotonic() + 60
        while self.status().get("last_tick", {}).get("n", 0) < 1:  # ready, and a first tick done
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                self.proc.wait()
                raise SystemExit(f"the daemon did not start: {self.stderr()[-2000:]}")
            time.sleep(0.2)

    def status(self) -> dict[str, Any]:
        try:
            return request(self.socket, {"cmd": "status"})
        except Exception:  # noqa: BLE001 - not listening yet
            return {}

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        if rc != 0:
            raise SystemExit(f"the daemon exited {rc}: {self.stderr()[-2000:]}")


class TickWatch:
    """The daemon's tick durations, from its status, while a window runs (each tick once, by its number)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon, self.ticks, self.last = daemon, {}, None  # type: ignore[var-annotated]
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_flag.wait(STATUS_EVERY_S):
            s = self.daemon.status()
            if s:
                self.last = s
                t = s["last_tick"]
                self.ticks[t["n"]] = t["duration_s"] * 1e3

    def __enter__(self) -> TickWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join()


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def events_of(status: dict[str, Any]) -> dict[str, int]:
    """The events the daemon took by kind, through the ring (or made of the per-tick maps); "<kind> (map)": those
    taken in bulk from an in-kernel map instead of the ring (the counters' "bulk" group)."""
    c = status["counters"]
    out = {k.split(".", 1)[1]: v for k, v in c.items() if k.startswith("events.")}
    for k, v in c.items():
        if k.startswith("bulk."):
            kind = k.split(".", 1)[1]
            out[kind] -= v
            out[f"{kind} (map)"] = v
    return out


# --pyspy PATH: py-spy (pip install py-spy) records the daemon in every window with it, 200 Hz, busy samples only
PROFILE: dict[str, Path] = {}


def profiled(pid: int, rate: int, window: float) -> subprocess.Popen[bytes] | None:
    if not PROFILE:
        return None
    out = PROFILE["dir"] / f"{rate}-{time.monotonic_ns()}.txt"
    return subprocess.Popen([str(PROFILE["pyspy"]), "record", "-p", str(pid), "-d", str(max(1, int(window))), "-r",
                             "200", "-f", "raw", "-o", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def print_profile(rates: list[int], top_n: int = 12) -> None:
    """Per rate, over every window at that rate: the functions with the largest inclusive share of the daemon's busy
    samples (a function and what it called; the loop's trunk, in nearly every sample, left out) and the largest self
    shares (where the CPU is spent)."""
    for r in rates:
        total, incl, own = 0, {}, {}  # type: ignore[var-annotated]
        for f in PROFILE["dir"].glob(f"{r}-*.txt"):
            for line in f.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                n = int(count)
                frames = [_frame(fr) for fr in stack.split(";") if " (" in fr]
                total += n
                for fn in set(frames):
                    incl[fn] = incl.get(fn, 0) + n
                if frames:
                    own[frames[-1]] = own.get(frames[-1], 0) + n
        total = max(total, 1)
        inner = [(fn, n) for fn, n in sorted(incl.items(), key=lambda kv: -kv[1])
                 if n < 0.75 * total and "<lambda>" not in fn][:top_n]
        print(f"profile at {r:,} ev/s ({total} busy samples), inclusive: "
              + "; ".join(f"{fn} {n / total:.0%}" for fn, n in inner))
        print("  self: " + "; ".join(f"{fn} {n / total:.0%}" for fn, n in sorted(own.items(),
                                                                               key=lambda kv: -kv[1])[:top_n]))


def _frame(fr: str) -> str:
    """py-spy's "function (path/file.py:line)" as "function (file.py)"."""
    name, _, where = fr.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})"


def with_daemon(exe: Path, top: Path, d: Daemon, rate: int, window: float) -> Point:
    s0, c0 = d.status(), cpu_s(d.proc.pid)
    spy = profiled(d.proc.pid, rate, window)
    with TickWatch(d) as tw:
        t0 = time.monotonic()
        events, took, gcpu = generate(exe, top, rate, window)
        used, wall = cpu_s(d.proc.pid) - c0, time.monotonic() - t0
    if spy is not None:
        spy.wait(timeout=60)
    s1 = d.status()
    p = Point(rate, events / took, gcpu / took * 100, used / wall * 100, rss_mib(d.proc.pid),
              sorted(tw.ticks.values()), delta(s1["drops"], s0["drops"]), delta(events_of(s1), events_of(s0)), events)
    clean(top)
    time.sleep(SETTLE_S)
    return p


def alone(exe: Path, top: Path, rate: int, window: float) -> Point:
    events, took, gcpu = generate(exe, top, rate, window)
    clean(top)
    return Point(rate, events / took, gcpu / took * 100, file_events=events)


def one_round(exe: Path, mount: Path, tmp: Path, rates: list[int], window: float) -> list[Point]:
    top = mount / "gen"
    points = [alone(exe, top, r, window) for r in rates]
    d = Daemon(tmp, mount)
    try:
        time.sleep(SETTLE_S)
        points += [with_daemon(exe, top, d, r, window) for r in rates]
    finally:
        d.stop()
    return points


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    med = fmt.format(statistics.median(xs))
    return med if len(xs) == 1 else f"{med} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summarize(points: list[Point], rates: list[int]) -> list[dict[str, Any]]:
    rows = []
    for r in rates:
        al = [p for p in points if p.target == r and p.daemon_cpu_pct is None]
        wd = [p for p in points if p.target == r and p.daemon_cpu_pct is not None]
        ticks = [t for p in wd for t in p.ticks_ms]
        n_ev = sum(p.file_events for p in wd) or 1
        recs: dict[str, int] = {}
        drops: dict[str, int] = {}
        for p in wd:
            for k, v in p.records.items():
                recs[k] = recs.get(k, 0) + v
            for k, v in p.drops.items():
                drops[k] = drops.get(k, 0) + v
        rows.append({
            "target": r, "alone_reached": [p.reached for p in al], "alone_gen_cpu": [p.gen_cpu_pct for p in al],
            "reached": [p.reached for p in wd], "gen_cpu": [p.gen_cpu_pct for p in wd],
            "daemon_cpu": [p.daemon_cpu_pct for p in wd], "rss_mib": [p.rss_mib for p in wd],
            # per 10 000 events/s the generator reached: comparable between runs that reached different rates
            "cpu_per_10k": [p.daemon_cpu_pct / p.reached * 1e4 for p in wd if p.daemon_cpu_pct is not None],
            "tick_p50_ms": pct(ticks, 0.5), "tick_p99_ms": pct(ticks, 0.99), "ticks": len(ticks), "drops": drops,
            "records_per_event": {k: round(v / n_ev, 4) for k, v in sorted(recs.items())},
        })
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> None:
    print(f"rounds {args.rounds}, {args.window:g} s windows, {GENERATORS} generators, fsync every {FSYNC_EVERY}, "
          f"files live {LIFE_S:g} s; load average {load[0]:.1f} before, {load[1]:.1f} after")
    print("| target ev/s | alone: reached ev/s | with daemon: reached ev/s | daemon CPU % of a core | per 10k ev/s "
          "| RSS MiB | tick p50 / p99 ms | drops | records taken per file event |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in rows:
        recs = ", ".join(f"{k} {v:g}" for k, v in w["records_per_event"].items()) or "-"
        drops = ", ".join(f"{k} {v}" for k, v in w["drops"].items()) or "0"
        print(f"| {w['target']:,} | {spread(w['alone_reached'], '{:,.0f}')} | {spread(w['reached'], '{:,.0f}')} | "
              f"{spread(w['daemon_cpu'], '{:.2f}')} | {spread(w['cpu_per_10k'], '{:.2f}')} | "
              f"{spread(w['rss_mib'], '{:.0f}')} | "
              f"{w['tick_p50_ms']:.1f} / {w['tick_p99_ms']:.1f} ({w['ticks']}) | {drops} | {recs} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")], default=list(RATES))
    ap.add_argument("--pyspy", type=Path, help="profile the daemon with this py-spy (its CPU then includes py-spy's "
                    "pauses: numbers from a profiled run are not the curve's)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.window = 1, 1.5
    if os.geteuid() != 0:
        raise SystemExit("bench_daemon_cost needs root (the probe loads BPF programs; a loop device)")
    load0 = os.getloadavg()[0]
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="bench-daemon-cost-") as t, make_loop_ext4(1024) as fs:
        exe = build_generator(Path(t))
        if args.pyspy:
            PROFILE.update(pyspy=args.pyspy, dir=Path(t))
        for i in range(args.rounds):
            rates = args.rates if i % 2 == 0 else args.rates[::-1]
            tmp = Path(t) / f"r{i}"
            tmp.mkdir()
            points += one_round(exe, fs.mount, tmp, rates, args.window)
            if i == args.rounds - 1 and args.pyspy:
                print_profile(args.rates)
    rows = summarize(points, args.rates)
    print_table(rows, args, (load0, os.getloadavg()[0]))
    print("RESULT " + json.dumps({"rows": rows, "points": [asdict(p) for p in points], "load": [load0,
                                                                                                 os.getloadavg()[0]]}))


if __name__ == "__main__":
    main()
