"""`cachepilot run` as the packaged systemd service under a real systemd (PID 1 of a lab guest, bcache volume):
Type=notify readiness, metrics on 127.0.0.1, the control socket, a FITRIM discard through the hardening, SIGHUP
with a broken policy, the watchdog killing a hung daemon and the restart, a clean stop (tests/vm/service/)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


def test_the_service_lifecycle_under_systemd(lab) -> None:
    r = lab.run(["tests/vm/service/unit_lifecycle.sh"], recipe="bcache", lab_args=("--init", "systemd"),
                timeout=480)
    assert r.rc == 0, r.explain()
    v = r.values
    # `systemctl start` returns once the daemon said READY=1: probe attached, volume adopted, metrics answering
    assert v["start_rc"] == "0" and v["active"] == "active", r.explain()
    assert v["ready_metric"] == "1.0" and v["observe_only"] == "0.0", r.explain()
    assert v.get("status_rc") == "0", r.explain()
    # the hardening lets it act: a deleted file's 4 MiB went to FITRIM
    assert float(v["discard_issued"]) >= 4 << 20, r.explain()
    # SIGHUP with a broken policy: refused and counted, the daemon runs on
    assert v["reload_rc"] == "0" and v["reload_success"] == "0.0" and v["reload_failures"] == "1.0", r.explain()
    assert v["active_after_reload"] == "active", r.explain()
    # a hung loop (SIGSTOP): the watchdog kills it, systemd restarts it, it becomes ready again
    assert v.get("watchdog_logged") == "yes" and int(v["restarts"]) >= 1, r.explain()
    assert v["active_after_restart"] == "active" and v["new_pid"] == "yes", r.explain()
    # stop: SIGTERM, exit 0, the cache's mode as the daemon left it; nothing denied by the sandbox on the way
    assert v["stop_result"] == "success" and v["stop_status"] == "0" and v["mode_same"] == "yes", r.explain()
    assert v["denied"] == "0", r.explain()
