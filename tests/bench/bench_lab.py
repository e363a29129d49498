"""Lab boot timings: `tests/vm/lab run --recipe R --timing -- true`, repeated; medians per recipe.

Run by `make bench` (or directly: .venv/bin/python tests/bench/bench_lab.py [RUNS]).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tests" / "vm" / "lab"
TIMING = re.compile(r"boot_to_stage2=([\d.]+)s boot_to_command=([\d.]+)s total=([\d.]+)s")


def measure(recipe: str) -> tuple[float, float, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(LAB), "run", "--recipe", recipe, "--timing", "--", "true"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    wall = time.monotonic() - t0
    m = TIMING.search(proc.stderr)
    if proc.returncode != 0 or not m:
        raise SystemExit(f"lab run failed (rc={proc.returncode}):\n{proc.stderr}")
    return float(m.group(1)), float(m.group(2)), wall


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(f"lab timings, median of {runs} runs (seconds)")
    print(f"{'recipe':<12}{'boot->stage2':>14}{'boot->command':>15}{'wall (lab run -- true)':>24}")
    for recipe in ("none", "bcache", "dmcache", "writecache"):
        samples = [measure(recipe) for _ in range(runs)]
        med = [statistics.median(s[i] for s in samples) for i in range(3)]
        print(f"{recipe:<12}{med[0]:>14.2f}{med[1]:>15.2f}{med[2]:>24.2f}")


if __name__ == "__main__":
    main()
