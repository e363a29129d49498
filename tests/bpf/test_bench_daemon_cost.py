"""The daemon's cost curve (tests/bench/bench_daemon_cost.py) runs here and its output parses: the real daemon and
probe, the generator compiled with the system gcc, a point per rate with and without the daemon. --quick proves no
number (a benchmark gives those); it checks the harness, and that the daemon took the generator's deletes from the
kernel's map, not one ring record each (issue 32 item 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bpf_support import ROOT

pytestmark = pytest.mark.bpf
BENCH = ROOT / "tests" / "bench" / "bench_daemon_cost.py"


def test_the_cost_curve_runs_and_its_result_parses(bpf_env: None) -> None:
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--rates", "1000,10000"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert any(line.startswith("| 10,000 |") for line in lines), r.stdout
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])
    rows = {row["target"]: row for row in result["rows"]}
    assert sorted(rows) == [1000, 10000]
    for rate, row in rows.items():
        assert len(row["alone_reached"]) == len(row["reached"]) == 1
        assert row["alone_reached"][0] > 0.8 * rate and row["reached"][0] > 0.8 * rate  # low rates are reachable
        assert row["daemon_cpu"][0] >= 0 and row["rss_mib"][0] > 10 and row["ticks"] >= 1
        assert row["cpu_per_10k"][0] == pytest.approx(row["daemon_cpu"][0] / row["reached"][0] * 1e4)
        # files live 0.5 s: the 1.5 s window sees their deletes, taken from the map, none by the ring. How many the
        # daemon took inside the window is its ticks' share of the CPU there, a number --quick does not prove: 0.17-0.19
        # a file event beside two busy loops (three runs), 0.027 in a fresh clone's suite beside two busy loops and its
        # own two lab guests (2026-11-29), where "> 0.1" failed
        recs = row["records_per_event"]
        assert recs.get("Delete (map)", 0) > 0 and recs.get("Delete", 0) == 0, recs
