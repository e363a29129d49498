"""The daemon's start-up does not import what it does not need (issue 32: RSS <= 100 MiB with 1 M tracked files):
prometheus_client with the http.server, email, urllib and ssl modules it pulls in was 4 MiB of it, and the metrics
endpoint (on in the shipped config) and the textfile no longer need it (our own exposition, exporter/exposition.py);
jsonschema ~6 MiB: a valid configuration and policy are checked without it (policy/schemacheck.py).

Each case starts a daemon on fakes (tests/unit/daemon_rig.py, dry run) in a fresh interpreter -- this one has
imported everything already -- ticks it, asks for its status, scrapes its endpoint if it has one (over a bare
socket: urllib would import email and http itself), and lists the heavy modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ops_support import free_port

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
if r.d.metrics is not None and r.d.metrics.server is not None:
    import socket
    with socket.create_connection(("127.0.0.1", r.d.metrics.server.port), timeout=10) as c:
        c.sendall(b"GET /metrics HTTP/1.1\\r\\nAccept: application/openmetrics-text;version=1.0.0\\r\\n\\r\\n")
        answer = b"".join(iter(lambda: c.recv(65536), b""))
    assert b"\\ncachepilot_ready 1.0\\n" in answer and answer.endswith(b"# EOF\\n"), answer[:300]
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


def test_the_shipped_endpoint_serves_its_metrics_without_prometheus_client(tmp_path: Path) -> None:
    assert started(tmp_path, f"{{listen: '127.0.0.1:{free_port()}'}}") == []


def test_the_textfile_exporter_writes_its_file_without_prometheus_client(tmp_path: Path) -> None:
    assert started(tmp_path, f"{{listen: '', textfile: {tmp_path}/out.prom}}") == []
    assert "cachepilot_ready 1.0" in (tmp_path / "out.prom").read_text()
