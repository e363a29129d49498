"""The packaged systemd unit under a real systemd (252, PID 1 of a lab guest): it loads, `systemd-analyze verify`
is clean there, the settings systemd parsed are the ones asked for, and its online security score matches the
offline one stated in README. (Starting it needs `cachepilot run`.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm

SCRIPT = r"""
set -e
install -m 0644 controller/cachepilot/data/cachepilot.service /etc/systemd/system/cachepilot.service
mkdir -p /usr/local/bin && ln -sf "$PWD/.venv/bin/cachepilot" /usr/local/bin/cachepilot
systemctl daemon-reload
systemd-analyze verify cachepilot.service && echo verify=ok
systemctl show cachepilot -p LoadState -p Type -p NotifyAccess -p Restart -p StartLimitBurst \
    -p RestartPreventExitStatus -p ProtectSystem -p ProtectHome -p NoNewPrivileges -p DevicePolicy \
    -p MemoryMax -p TasksMax -p KillMode -p CapabilityBoundingSet -p PrivateDevices -p ProtectKernelTunables \
    -p StateDirectory -p DeviceAllow -p ExecStart
systemd-analyze security cachepilot.service --no-pager \
    | sed -n 's/.*Overall exposure level for cachepilot.service: \([0-9.]*\).*/security=\1/p'
"""


def test_the_packaged_unit_under_a_real_systemd(lab) -> None:
    r = lab.run(["bash", "-c", SCRIPT], recipe="none", lab_args=("--init", "systemd"), timeout=240)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v.get("verify") == "ok", r.explain()
    assert v["LoadState"] == "loaded" and v["Type"] == "notify" and v["NotifyAccess"] == "main"
    assert v["Restart"] == "on-failure" and v["StartLimitBurst"] == "5" and v["RestartPreventExitStatus"] == "2"
    assert v["ProtectSystem"] == "strict" and v["ProtectHome"] == "read-only" and v["NoNewPrivileges"] == "yes"
    assert v["DevicePolicy"] == "closed" and v["PrivateDevices"] == "no" and v["ProtectKernelTunables"] == "no"
    assert v["MemoryMax"] == str(512 << 20) and v["TasksMax"] == "64" and v["KillMode"] == "mixed"
    assert set(v["CapabilityBoundingSet"].split()) == {"cap_bpf", "cap_perfmon", "cap_sys_admin",
                                                       "cap_dac_read_search"}
    assert v["StateDirectory"] == "cachepilot" and "/dev/mapper/control rw" in v["DeviceAllow"]
    assert "path=/usr/local/bin/cachepilot" in v["ExecStart"] and "run --config /etc/cachepilot/config.yaml" in \
        v["ExecStart"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    score = re.search(r"exposure level (\d+\.\d+) \(", readme)
    assert score and v["security"] == score.group(1), (v.get("security"), r.explain())

