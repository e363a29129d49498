"""The daemon's start-up does not import what its configuration does not use (issue 32: RSS <= 100 MiB with 1 M
tracked files; prometheus_client with the http.server, email, urllib and ssl modules it pulls in is ~5 MiB of it,
jsonschema ~6 MiB: a valid configuration and policy are checked without it, policy/schemacheck.py).

Each case starts a daemon on fakes (tests/unit/daemon_rig.py, dry run) in a fresh interpreter -- this one has
imported everything already -- ticks it, asks for its status, and lists the heavy modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
HEAVY = ("prometheus_client", "http.server", "email", "ssl", "urllib.request", "jsonschema")
SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {here!r})
from daemon_rig import Rig
r = Rig(Path({tmp!r}), dry_run=True, metrics={metrics!r})
r.d.start()
r.tick(1)
r.status()
loaded = sorted(m for m in sys.modules if m in {heavy!r} or m.startswith("prometheus_client."))
r.d.shutdown()
print(json.dumps(loaded))
"""


def started(tmp: Path, metrics: str) -> list[str]:
    """The heavy modules a daemon with ``metrics`` loaded by the end of its first tick."""
    code = SCRIPT.format(here=str(HERE), tmp=str(tmp), metrics=metrics, heavy=HEAVY)
    env = dict(os.environ, CACHEPILOT_HOST_LOCK=str(tmp / "host.lock"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout.splitlines()[-1]))


def test_a_daemon_without_an_exporter_imports_neither_prometheus_client_nor_jsonschema(tmp_path: Path) -> None:
    assert started(tmp_path, "{listen: ''}") == []


def test_the_textfile_exporter_still_loads_it_and_writes_its_file(tmp_path: Path) -> None:
    loaded = started(tmp_path, f"{{listen: '', textfile: {tmp_path}/out.prom}}")
    assert "prometheus_client" in loaded
    assert "cachepilot_ready 1.0" in (tmp_path / "out.prom").read_text()
