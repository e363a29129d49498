"""The snapshot published when the daemon says READY=1 already says ready: a scrape (or /ready) right after
`systemctl start` returned must not read cachepilot_ready 0 until the first tick (seen in a lab guest, issue 34)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.daemon_rig import Rig


def test_the_first_snapshot_says_ready(tmp_path: Path) -> None:
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    try:
        assert "\ncachepilot_ready 1.0\n" in (tmp_path / "m.prom").read_text()  # before any tick
    finally:
        r.d.shutdown()
