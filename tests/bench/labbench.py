"""Host side of the lab benchmarks: run a guest script in the lab, collect its JSON, summarise repetitions
(median, min–max, pair-by-pair ratios), write markdown + JSON + PNG under build/bench/, show progress (rich)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tests" / "vm" / "lab"
OUT_ROOT = ROOT / "build" / "bench"
console = Console(stderr=True)


# The plain pair: the stock cache alone, and with the daemon under the shipped default policy (scan, warm).
STOCK_VS_DEFAULT = {"stock": "stock", "cp-destructive": "stock + cachepilot, shipped default policy"}


@dataclass
class LabSpec:
    recipe: str = "bcache"
    mode: str = "writeback"
    origin_delay_ms: int = 5
    origin_size_mb: int = 512
    cache_size_mb: int = 64
    timeout: int = 900
    # dm-delay per class (None: origin_delay_ms) and qemu's IOPS budget for the origin (0: none)
    read_delay_ms: int | None = None
    write_delay_ms: int | None = None
    flush_delay_ms: int | None = None
    origin_iops: int = 0
    origin_bps: int = 0  # qemu's byte budget for the origin (0: none)
    origin_iops_size: int = 0  # a request of N bytes counts as N / this many operations against origin_iops
    env: tuple[str, ...] = ()  # extra NAME=VALUE for the guest's command

    def argv(self, out: Path, cmd: Sequence[str]) -> list[str]:
        split = [arg for cls, v in (("read", self.read_delay_ms), ("write", self.write_delay_ms),
                                    ("flush", self.flush_delay_ms)) if v is not None
                 for arg in (f"--origin-{cls}-delay-ms", str(v))]
        for flag, v in (("--origin-iops", self.origin_iops), ("--origin-bps", self.origin_bps),
                        ("--origin-iops-size", self.origin_iops_size)):
            split += [flag, str(v)] if v else []
        return [str(LAB.relative_to(ROOT)), "run", "--recipe", self.recipe, "--mode", self.mode,
                "--origin-delay-ms", str(self.origin_delay_ms), *split, "--origin-size-mb", str(self.origin_size_mb),
                "--cache-size-mb", str(self.cache_size_mb), "--timeout", str(self.timeout), "--out", str(out),
                "--", "env", f"BENCH_CACHE_MB={self.cache_size_mb}", *self.env, ".venv/bin/python", *cmd]


def repro(spec: LabSpec, cmd: Sequence[str]) -> str:
    """The exact command that reproduces one row (its JSON lands in /tmp/bench-row)."""
    return shlex.join(spec.argv(Path("/tmp/bench-row"), cmd))


def default_jobs() -> int:
    """Lab guests at a time: one per core (each guest is one single-threaded TCG vCPU), at most 2 (the machines
    here have 2), or $BENCH_JOBS."""
    env = os.environ.get("BENCH_JOBS", "")
    return max(1, int(env)) if env.isdigit() else max(1, min(2, os.cpu_count() or 1))


@dataclass(frozen=True)
class Job:
    key: Hashable  # the row it belongs to
    label: str
    spec: LabSpec
    cmd: Sequence[str]
    result_name: str
    # called in the worker right before the boot, for a command that depends on an earlier job's result (the
    # CPU-tax control takes the share the same round's daemon measured); None: cmd as given
    prepare: Callable[[], Sequence[str]] | None = None


def fresh_out() -> Path:
    """A run's own results directory: build/bench/<time>."""
    return OUT_ROOT / time.strftime("%Y%m%d-%H%M%S")


@dataclass
class Runner:
    """Runs lab jobs, ``jobs`` guests at a time (in the order given, so round 1 runs first), with a progress bar;
    every result is kept, failures are reported, not hidden."""

    name: str
    total: int
    out: Path = field(default_factory=fresh_out)
    jobs: int = field(default_factory=default_jobs)
    done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                                 "{task.total}"), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task(f"{self.name} ({self.jobs} at a time)", total=self.total)
        self.progress.start()

    def run_all(self, jobs: Sequence[Job], rows: dict) -> None:
        """Run every job; each result is appended to ``rows[job.key]`` in the order the jobs were given."""
        with ThreadPoolExecutor(self.jobs) as pool:
            for job, res in zip(jobs, pool.map(self.run, jobs), strict=True):
                rows[job.key].append(res)

    def run(self, job: Job) -> dict:
        label = job.label
        where = self.out / "runs" / label
        where.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        cmd = job.prepare() if job.prepare else job.cmd
        (where / "cmd.txt").write_text(shlex.join(job.spec.argv(where, cmd)) + "\n")
        proc = subprocess.run(job.spec.argv(where, cmd), cwd=ROOT, capture_output=True, text=True,
                              timeout=job.spec.timeout + 120)
        (where / "stderr.txt").write_text(proc.stderr)
        (where / "stdout.txt").write_text(proc.stdout)
        with self._lock:
            self.done += 1
            self.progress.update(self.task, completed=self.done)
        path = where / f"{job.result_name}.json"
        if proc.returncode != 0 or not path.exists():
            console.print(f"[red]{label}: lab run failed (rc={proc.returncode}); {where}/stderr.txt:[/red]\n"
                          + proc.stderr[-1500:])
            return {"error": f"rc={proc.returncode}", "label": label}
        dmesg = where / "dmesg.txt"
        fault = guest_clock_fault(dmesg.read_text(errors="replace")) if dmesg.exists() else None
        if fault is not None:
            console.print(f"[red]{label}: left out: {fault}[/red]")
            return {"error": fault, "label": label}
        res = json.loads(path.read_text())
        res["wall_s"] = time.monotonic() - t0
        res["guests_at_a_time"] = self.jobs
        self.progress.console.print(f"{label}: done in {res['wall_s']:.0f} s")
        return res

    def close(self) -> None:
        self.progress.stop()


_PIT_VS_HPET = re.compile(r"tsc: PIT calibration deviates from HPET: (\d+) (\d+)")
_CLOCKSOURCE = re.compile(r"clocksource: Switched to clocksource (\S+)")


def guest_clock_fault(dmesg: str) -> str | None:
    """Why a guest's clock cannot be trusted, from its kernel log (None: it can). Under TCG the kernel calibrates the
    TSC in a busy-wait against the PIT; a host that takes the vCPU away meanwhile makes that calibration wrong, the
    kernel prefers it to the HPET's when the two deviate, and with tsc=reliable nothing corrects it: the guest's
    clock then runs several times fast (seen: 203 MHz for a 2 595 MHz TSC), every rate measured in the guest is
    that many times too low and every timed window that many times too short. Seen in 10 of 144 runs here; the lab
    now keeps time by the HPET (tests/vm/lab), this catches a run that still used the TSC."""
    dev = _PIT_VS_HPET.search(dmesg)
    switched = _CLOCKSOURCE.findall(dmesg)
    if dev is None or "tsc: Using PIT calibration value" not in dmesg or not switched:
        return None
    if not switched[-1].startswith("tsc") or "Refined TSC clocksource calibration" in dmesg:
        return None
    pit, hpet = int(dev.group(1)), int(dev.group(2))
    return (f"guest clock untrustworthy: its TSC was calibrated at {pit / 1000:.0f} MHz against the PIT (the HPET "
            f"says {hpet / 1000:.0f} MHz) and kept time by it: {hpet / max(pit, 1):.1f}x fast")


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def cell(xs: Sequence[float], fmt: str = "{:.1f}") -> str:
    """median (min–max) of the repetitions."""
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def values(rows: Sequence[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if key in r and r[key] is not None]


def cellof(rows: Sequence[dict], key: str, fmt: str = "{:.1f}") -> str:
    """A table cell of one result key over the repetitions: median (min–max)."""
    return cell(values(rows, key), fmt)


def pair_ratios(a: Sequence[dict], b: Sequence[dict], key: str) -> list[float]:
    """a[i][key] / b[i][key] for the repetitions where both ran (pairs from the same round)."""
    return [float(x[key]) / float(y[key]) for x, y in zip(a, b, strict=False)
            if key in x and key in y and float(y[key]) != 0]


def verdict(xs: Sequence[float], ok: Callable[[float], bool]) -> str:
    """A goal line's word: on the median of the per-round values; n/a without any."""
    if not xs:
        return "n/a"
    return "met" if ok(med(xs)) else "**missed**"


def all_rounds(xs: Sequence[float], ok: Callable[[float], bool]) -> str:
    """For a bound that must hold in every run (the exposure): met only if it held in each."""
    if not xs:
        return "n/a"
    return "met" if all(ok(x) for x in xs) else "**missed**"


def wait_for_file(path: Path, timeout: float, poll: float = 5.0) -> bool:
    """True once path exists (an earlier job's result), False after timeout."""
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() >= end:
            return False
        time.sleep(poll)
    return True


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def save(out: Path, name: str, markdown: str, data: dict) -> None:
    (out / f"{name}.md").write_text(markdown + "\n")
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    console.print(f"results: {out / (name + '.md')}, {out / (name + '.json')}")


def plot(out: Path, name: str, title: str, ylabel: str, series: dict[str, list[tuple[float, float]]],
         marks: Sequence[tuple[float, str]] = ()) -> Path | None:
    """One PNG with a line per series ((t, y) points); matplotlib comes with the test extras."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("[yellow]matplotlib missing (pip install -e '.[test]'): no plot[/yellow]")
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
    for x, text in marks:
        ax.axvline(x, color="grey", linestyle=":")
        ax.text(x, ax.get_ylim()[1], text, fontsize=8, va="top")
    ax.set_xlabel("seconds")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_jobs(name: str, jobs: Sequence[Job], rows: dict, out: Path | None = None,
             at_a_time: int | None = None) -> Runner:
    """Every job run (Runner.run_all: results appended to ``rows``) under a progress bar named ``name``, closed however
    the run ends; ``out``: where the results go (default build/bench/<time>); ``at_a_time``: guests at a time
    (default_jobs)."""
    runner = Runner(name, len(jobs), out=out or fresh_out(), jobs=at_a_time or default_jobs())
    try:
        runner.run_all(jobs, rows)
    finally:
        runner.close()
    return runner


def numbered_rounds(configs: Sequence[str], reps: int, spec: LabSpec, cmd: Sequence[str], result_name: str,
                    prefix: str = "") -> list[Job]:
    """``reps`` rounds of every configuration in the order given, round N with ``--seed N``: ``cmd``'s "{c}" is
    the configuration; each job's row is its configuration, its label prefix + config + round."""
    return [Job(c, f"{prefix}{c}-{rep + 1}", spec, [a.format(c=c) for a in cmd] + ["--seed", str(rep + 1)],
                result_name) for rep in range(reps) for c in configs]


# The options every lab benchmark shares: --reps, --quick, --out first; --configs, --warmup/--window and --seeds
# where a benchmark has them, checked and defaulted here.

def parser(reps: int, quick_help: str | None = None) -> argparse.ArgumentParser:
    """--reps N (default ``reps``), --quick, --out DIR; a benchmark adds its own after them."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", type=Path, default=None)
    return ap


def parse_args(argv: Sequence[str], default_reps: int = 3) -> tuple[int, bool, Path | None]:
    """--reps N, --quick (1 repetition, shorter runs), --out DIR."""
    a = parser(default_reps, "one repetition, shorter runs").parse_args(argv)
    return (1 if a.quick else a.reps), a.quick, a.out


def chosen(ap: argparse.ArgumentParser, text: str, table: Mapping[str, str], what: str = "configuration") -> list[str]:
    """The names in ``text`` (separated by commas), each one of ``table``'s; ap.error naming the others, or none."""
    names = [c for c in text.split(",") if c]
    if bad := [c for c in names if c not in table]:
        ap.error(f"unknown {what}(s) {','.join(bad)}: choose from {','.join(table)}")
    if not names:
        ap.error(f"no {what} given: choose from {','.join(table)}")
    return names


def add_windows(ap: argparse.ArgumentParser) -> None:
    """--warmup S, --window S (defaults by --quick: ``windows``)."""
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--window", type=float, default=None)


def windows(a: argparse.Namespace, quick: tuple[float, float], full: tuple[float, float]) -> None:
    """a.warmup, a.window as given, else the (warm-up, window) seconds of a --quick or a full run."""
    warmup, window = quick if a.quick else full
    a.warmup = a.warmup if a.warmup is not None else warmup
    a.window = a.window if a.window is not None else window


def add_seeds(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seeds", default="", help="the rounds' seeds (a run's printed ones); default: drawn now")


def seeds(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """a.seeds: --seeds as given, else drawn (one a round: a.reps, 1 with --quick); a.reps: as many."""
    try:
        a.seeds = round_seeds(a.seeds, 1 if a.quick else a.reps)
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected integers separated by commas")
    a.reps = len(a.seeds)


def draw_seeds(n: int) -> list[int]:
    """One seed per round, drawn for this run (not the seeds a workload was developed on; issue 31)."""
    import random

    r = random.SystemRandom()
    return [r.randrange(1, 2**31) for _ in range(n)]


def round_seeds(text: str, n: int) -> list[int]:
    """The rounds' seeds: ``--seeds`` as given ("N,N,...": a run's printed seeds, to replay it), else ``n`` drawn
    now. ValueError when ``text`` is not integers separated by commas."""
    return [int(x) for x in text.split(",") if x] or draw_seeds(n)


def shuffled(configs: Sequence[str], seed: int) -> list[str]:
    """The configurations in an order shuffled by the round's seed (no configuration always first or last)."""
    import random

    order = list(configs)
    random.Random(seed ^ 0x5EED).shuffle(order)  # noqa: S311 - an order, not a secret
    return order


def machine() -> str:
    import os
    import platform

    return f"{platform.node()}, {os.cpu_count()} cores, qemu TCG guest, host kernel {platform.release()}"


def origin_text(spec: LabSpec) -> str:
    """The origin's cost model in words: one dm-delay, or per class, and the IOPS budget."""
    d = spec.origin_delay_ms
    if (spec.read_delay_ms, spec.write_delay_ms, spec.flush_delay_ms) == (None, None, None):
        text = f"dm-delay {d} ms"
    else:
        r, w, f = (d if v is None else v for v in (spec.read_delay_ms, spec.write_delay_ms, spec.flush_delay_ms))
        text = f"dm-delay read {r} / write {w} / flush {f} ms"
    budget = [f"{spec.origin_iops} IOPS"] if spec.origin_iops else []
    budget += [f"{spec.origin_bps / 1e6:g} MB/s"] if spec.origin_bps else []
    budget += [f"a request counts once per {spec.origin_iops_size >> 10} KiB"] if spec.origin_iops_size else []
    return text + (f", {', '.join(budget)} (qemu throttling)" if budget else "")


def load_text() -> str:
    """The host's load average (the numbers depend on it: two guests share two cores)."""
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def header(name: str, spec: LabSpec, extra: str = "") -> str:
    return (f"## {name}\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()} ({load_text()}); "
            f"lab {spec.recipe} {spec.mode}, origin {spec.origin_size_mb} MiB behind {origin_text(spec)}, "
            f"cache {spec.cache_size_mb} MiB. {extra}\n")


Fn = Callable[..., object]
_ = sys  # the scripts import this module by path
