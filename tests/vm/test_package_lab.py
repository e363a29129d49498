"""The Debian package on a systemd host that cannot see the checkout (tests/vm/package/deb_lifecycle.sh): `apt-get
install ./cachepilot_*.deb` with no network, the packaged unit reaches ready and acts — a promotion of a file owned
by an unprivileged user (O_NOATIME needs the unit's CAP_FOWNER), a discard of a deleted one —, `systemctl reload`
with a broken policy fails while the old policy runs on, and the stop is clean. The wheel's own check (a fresh
virtualenv) is host-level: tests/ops/test_package.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cachepilot import __version__

pytestmark = pytest.mark.vm
ROOT = Path(__file__).resolve().parents[2]


def test_the_deb_installs_starts_acts_and_refuses_a_broken_reload(lab) -> None:
    r = subprocess.run(["make", "-s", "package"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = lab.run(["tests/vm/package/deb_lifecycle.sh"], recipe="bcache", lab_args=("--init", "systemd"), timeout=480)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = {k: s.strip() for k, s in r.values.items()}
    # nothing of the checkout is visible: what runs is what the package installed
    assert v["checkout_hidden"] == "yes" and v["importable_before"] == "no" and v["on_path_before"] == "no", v
    assert v["install_rc"] == "0", r.explain()
    assert v["module_path"] == "/usr/lib/python3/dist-packages/cachepilot/__init__.py"
    assert v["version"] == f"cachepilot {__version__}" and v["enabled"] == "disabled"
    assert v["exec_start"] == "/usr/bin/cachepilot run --config /etc/cachepilot/config.yaml"
    assert v["exec_reload"] == "/usr/bin/cachepilot reload --config /etc/cachepilot/config.yaml"
    assert "cap_fowner" in v["caps"].split() and "modprobe@bcache.service" in v["wants"].split()
    # ready with the packaged configuration, policy and object
    assert v["start_rc"] == "0" and v["active"] == "active" and v["ready_metric"] == "1.0", r.explain()
    # the unprivileged user's file was promoted (before CAP_FOWNER: EPERM, "failed")
    assert v["hot_owner"] == "nobody"
    # (a promotion handed to a reader thread is recorded pending, then done)
    statuses = set(v["promote"].split("|")[0].split())
    assert "done" in statuses and statuses <= {"done", "pending"}, r.explain()
    assert float(v["promoted_bytes"]) >= 256 << 10, r.explain()
    assert float(v["discard_issued"]) >= 4 << 20, r.explain()
    # a refused reload fails `systemctl reload`; the daemon runs on; a good one succeeds
    assert v["reload_rc"] != "0" and v["reload_success"] == "0.0", r.explain()
    assert v["active_after_reload"] == "active" and int(v["refusal_logged"]) >= 1, r.explain()
    assert v["good_reload_rc"] == "0", r.explain()
    assert v["stop_result"] == "success" and v["stop_status"] == "0" and v["denied"] == "0", r.explain()
    # issue 34: the probes on the metrics listener; a first start is no warning
    assert v["healthz"] == "200 ok" and v["ready"] == "200 ready", v
    assert v["warnings_at_start"] == "0" and "INFO: starting fresh: no state file" in v["fresh_start"], r.explain()
    # a clean stop put back what the daemon changed (the shipped policy holds writeback_delay to max_age/6 = 5)
    assert "writeback_delay=5 " in v["knobs_running"] and v["knobs_before"] != v["knobs_running"], v
    assert v["knobs_after_stop"] == v["knobs_before"], v
    # purge leaves no file, link or directory of ours, and says no warning
    assert v["purge_rc"] == "0" and v["purge_warnings"] == "0", r.explain()
    assert v["residue"] == "" and v["dpkg_status"] != "ii", v
