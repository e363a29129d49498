"""The lab with systemd as the guest's PID 1 and SSH from this host (`lab run --init systemd --ssh-port N`): what
the service tests (readiness, watchdog) and the Ansible rollout over SSH stand on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent / "lab"
ROOT = LAB.parents[2]
FINISH = ROOT / "tests" / "vm" / "guest" / "lab-finish"

pytestmark = pytest.mark.vm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def ssh(key: Path, port: int, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                           "-o", "ConnectTimeout=10", "root@127.0.0.1", command],
                          capture_output=True, text=True, timeout=timeout)


def test_systemd_guest_over_ssh(tmp_path: Path) -> None:
    key, other = keypair(tmp_path / "key"), keypair(tmp_path / "other")
    port = free_port()
    runner = subprocess.Popen([sys.executable, str(LAB), "run", "--recipe", "none", "--init", "systemd",
                               "--ssh-port", str(port), "--ssh-key", f"{key}.pub", "--timeout", "400", "--",
                               "sleep", "390"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, login = time.monotonic() + 240, None
        while time.monotonic() < deadline and runner.poll() is None:
            login = ssh(key, port, "cat /proc/1/comm; id -u; hostname", timeout=30)
            if login.returncode == 0:
                break
            time.sleep(2)
        assert login is not None and login.returncode == 0, (login, runner.poll())
        assert login.stdout.split() == ["systemd", "0", "lab"]

        # only the key the runner was given gets in
        assert ssh(other, port, "true").returncode != 0

        # Type=notify readiness and the watchdog work as on a real host
        r = ssh(key, port, "systemd-run -q --unit=wd -p DefaultDependencies=no -p Type=notify -p NotifyAccess=all "
                           "-p WatchdogSec=2 /bin/bash -c 'systemd-notify --ready; sleep 60' && "
                           "systemctl show wd -p ActiveState --value; sleep 6; systemctl show wd -p Result --value")
        assert r.returncode == 0 and r.stdout.split() == ["active", "watchdog"], r

        # restrict=on: the guest reaches nothing outside, not even a listener on this host's loopback (which
        # unrestricted user networking would hand it as 10.0.2.2)
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            probe = f"timeout 5 bash -c 'echo > /dev/tcp/10.0.2.2/{listener.getsockname()[1]}' && echo reached"
            r = ssh(key, port, f"{probe} || echo isolated")
        assert r.stdout.split() == ["isolated"], r

        # ending the run from inside: the runner reports that exit code and cleans up
        ssh(key, port, f"{FINISH} 7", timeout=30)
        assert runner.wait(60) == 7, runner.communicate()
    finally:
        if runner.poll() is None:
            runner.send_signal(signal.SIGTERM)
            runner.wait(30)
    with socket.socket() as s:  # qemu is gone: its forwarded port is free again
        s.bind(("127.0.0.1", port))


def test_a_busy_ssh_port_is_a_lab_error(tmp_path: Path) -> None:
    key = keypair(tmp_path / "key")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, str(LAB), "run", "--recipe", "none", "--init", "systemd",
                            "--ssh-port", str(port), "--ssh-key", f"{key}.pub", "--", "true"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ})
    assert r.returncode == 125 and f"port {port} on 127.0.0.1 is not free" in r.stderr, r


def test_ssh_options_are_checked() -> None:
    for args, message in ((["--ssh-port", "2222", "--ssh-key", "/nonexistent.pub"], "needs --init systemd"),
                          (["--init", "systemd", "--ssh-port", "2222"], "go together"),
                          (["--forward", "9854"], "expected HOSTPORT:GUESTPORT")):
        r = subprocess.run([sys.executable, str(LAB), "run", *args, "--", "true"], capture_output=True, text=True,
                           timeout=30, cwd=ROOT)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
