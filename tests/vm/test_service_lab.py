"""`cachepilot run` as the packaged systemd service under a real systemd (252, PID 1 of a lab guest, bcache volume):
the unit as systemd parsed it (verify, settings, online security score = docs/service.md's), Type=notify readiness,
metrics on 127.0.0.1, the control socket, a FITRIM discard through the hardening, a reload with a broken policy, the
watchdog killing a hung daemon and the restart, a clean stop (tests/vm/service/unit_lifecycle.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm


def test_the_service_lifecycle_under_systemd(lab) -> None:
    r = lab.run(["tests/vm/service/unit_lifecycle.sh"], recipe="bcache", lab_args=("--init", "systemd"),
                timeout=480)
    assert r.rc == 0, r.explain()
    v = r.values
    # the unit as a real systemd parsed it (a test drop-in only shortens the watchdog, abort and restart times)
    assert v.get("verify") == "ok" and v["LoadState"] == "loaded", r.explain()
    assert v["Type"] == "notify" and v["NotifyAccess"] == "main" and v["Restart"] == "on-failure"
    assert v["StartLimitBurst"] == "5" and v["RestartPreventExitStatus"] == "2 3" and v["KillMode"] == "mixed"
    assert v["ProtectSystem"] == "strict" and v["ProtectHome"] == "read-only" and v["NoNewPrivileges"] == "yes"
    assert v["DevicePolicy"] == "closed" and v["PrivateDevices"] == "no" and v["ProtectKernelTunables"] == "no"
    assert v["MemoryMax"] == str(512 << 20) and v["TasksMax"] == "64" and v["StateDirectory"] == "cachepilot"
    assert set(v["CapabilityBoundingSet"].split()) == {"cap_bpf", "cap_perfmon", "cap_sys_admin",
                                                       "cap_dac_read_search", "cap_fowner"}
    assert "/dev/mapper/control rw" in v["DeviceAllow"]
    assert "path=/usr/local/bin/cachepilot" in v["ExecStart"]
    assert "run --config /etc/cachepilot/config.yaml" in v["ExecStart"]
    service_md = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    score = re.search(r"exposure level (\d+\.\d+) \(", service_md)
    assert score and v["security"] == score.group(1), (v.get("security"), r.explain())
    # `systemctl start` returns once the daemon said READY=1: probe attached, volume adopted, metrics answering
    assert v["start_rc"] == "0" and v["active"] == "active", r.explain()
    assert v["ready_metric"] == "1.0" and v["observe_only"] == "0.0", r.explain()
    assert v.get("status_rc") == "0", r.explain()
    # the hardening lets it act: a deleted file's 4 MiB went to FITRIM
    assert float(v["discard_issued"]) >= 4 << 20, r.explain()
    # a reload with a broken policy: refused and counted, `systemctl reload` fails, the daemon runs on
    assert v["reload_rc"] != "0" and v["reload_success"] == "0.0" and v["reload_failures"] == "1.0", r.explain()
    assert v["active_after_reload"] == "active", r.explain()
    # a hung loop (SIGSTOP): the watchdog kills it, systemd restarts it, it becomes ready again
    assert v.get("watchdog_logged") == "yes" and int(v["restarts"]) >= 1, r.explain()
    assert v["active_after_restart"] == "active" and v["new_pid"] == "yes", r.explain()
    # stop: SIGTERM, exit 0, the cache's mode as the daemon left it; nothing denied by the sandbox on the way
    assert v["stop_result"] == "success" and v["stop_status"] == "0" and v["mode_same"] == "yes", r.explain()
    assert v["denied"] == "0", r.explain()
