"""Issue 34 items 1-4, on a real systemd guest over SSH, as a fleet goes through a week: check mode on a new host,
the role's rollout of the package at version N, check mode again on the installed host, the rollout of N+1 over it
(apt non-interactive, no conffile prompt: the role never wrote one; one restart; the older package pruned), then
playbooks/teardown.yml: the daemon stopped cleanly with the knob it changed (bcache's writeback_delay) back at the
value found, the package purged, nothing of ours left. One guest (lock B only)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from ops_support import need_tool

from cachepilot import __version__
from tests.vm.test_fleet_lab import Guest, recap

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
NEXT = ".".join([*__version__.split(".")[:-1], str(int(__version__.split(".")[-1]) + 1)])
POLICY = {"version": 1, "defaults": {"failure_model": "destructive",
                                     "exposure": {"max_dirty": "32MiB", "max_age": "30s"}}}
RESIDUE = ("ls -d /usr/lib/python3/dist-packages/cachepilot* /etc/cachepilot /var/lib/cachepilot "
           "/var/cache/cachepilot /var/cache/cachepilot-deb /run/cachepilot /usr/share/doc/cachepilot "
           "/lib/systemd/system/cachepilot.service /usr/bin/cachepilot /usr/local/bin/cachepilot "
           "/etc/systemd/system/cachepilot.service* /etc/systemd/system/*.wants/cachepilot.service 2>/dev/null; true")


def build(version: str) -> Path:
    r = subprocess.run(["make", "-s", "package", f"VERSION={version}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    deb = DIST / f"cachepilot_{version}_amd64.deb"
    assert r.returncode == 0 and deb.is_file(), r.stdout + r.stderr
    return deb


def run(tmp: Path, guest: Guest, control_dir: str, deb: Path, version: str, *args: str,
        book: str = "site.yml") -> tuple[int, str]:
    host = {"ansible_host": "127.0.0.1", "ansible_port": guest.ssh_port, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(guest.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "cachepilot_policy": POLICY, "cachepilot_install_method": "deb", "cachepilot_deb_src": str(deb),
            "cachepilot_version": version, "cachepilot_deb_sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
            "cachepilot_require_cached_volume": True, "cachepilot_health_timeout": 120, "cachepilot_tick": "2s"}
    inventory = {"all": {"vars": {"ansible_python_interpreter": "/usr/bin/python3", "ansible_become": False},
                         "children": {"cachepilot": {"hosts": {guest.name: host}}, "prometheus": {"hosts": {}}}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_RETRY_FILES_ENABLED": "0",
           "ANSIBLE_PIPELINING": "1", "ANSIBLE_HOST_KEY_CHECKING": "0", "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible"),
           "ANSIBLE_TIMEOUT": "60", "ANSIBLE_SSH_CONTROL_PATH_DIR": control_dir,
           "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=600s"}
    t = time.monotonic()
    r = subprocess.run([need_tool("ansible-playbook"), "-i", str(tmp / "inventory.yml"),
                        str(ROOT / "playbooks" / book), *args], capture_output=True, text=True, env=env, timeout=900)
    print(f"{book} {' '.join(args)} {version}: rc {r.returncode}, {time.monotonic() - t:.0f} s")
    return r.returncode, (r.stdout + r.stderr).replace('\\"', '"')


def facts(guest: Guest) -> dict[str, str]:
    r = guest.ssh("echo delay=$(cat /sys/block/bcache0/bcache/writeback_delay); "
                  "echo package=$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' cachepilot 2>/dev/null); "
                  "echo active=$(systemctl is-active cachepilot); "
                  "echo build=$(curl -s 127.0.0.1:9854/metrics"
                  " | sed -n 's/^cachepilot_build_info{.*version=\"\\([^\"]*\\)\".*/\\1/p'); "
                  "echo starts=$(journalctl -u cachepilot -o cat --no-pager | grep -c 'INFO: ready:'); "
                  "echo debs=$(ls /var/cache/cachepilot-deb 2>/dev/null | tr '\\n' ' '); "
                  "echo verify=$(dpkg --verify cachepilot 2>&1 | tr '\\n' ' ')", timeout=60)
    assert r.returncode == 0, r
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def test_check_rollout_upgrade_and_teardown_on_a_systemd_guest(tmp_path: Path) -> None:
    t0 = time.monotonic()
    deb_n, deb_next = build(__version__), build(NEXT)
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    control_dir = tempfile.mkdtemp(prefix="cp-")
    guest = Guest("u1", key, script="tests/vm/fleet/idle.sh")
    times: dict[str, float] = {}
    try:
        guest.wait_for_ssh(time.monotonic() + 240)
        guest.hide_apt_lists()
        before = facts(guest)
        assert before["delay"] == "30" and before["package"] == "", before

        # item 2: check mode on a new host (no package, no unit) passes and changes nothing
        t = time.monotonic()
        rc, out = run(tmp_path, guest, control_dir, deb_n, __version__, "--check")
        times["check_fresh"] = time.monotonic() - t
        assert rc == 0 and recap(out)["u1"]["failed"] == 0, out
        assert facts(guest)["package"] == ""

        # version N
        t = time.monotonic()
        rc, out = run(tmp_path, guest, control_dir, deb_n, __version__)
        times["rollout_n"] = time.monotonic() - t
        assert rc == 0, out
        n = facts(guest)
        assert n["package"] == f"ii {__version__}" and n["active"] == "active" and n["build"] == __version__, n
        assert n["delay"] == "5" and n["starts"] == "1", n  # the daemon holds writeback_delay to max_age/6
        assert n["verify"] == "", n  # the package's files and conffiles as shipped: the role wrote none of them

        # item 2: check mode on the installed host passes and would change nothing
        t = time.monotonic()
        rc, out = run(tmp_path, guest, control_dir, deb_n, __version__, "--check")
        times["check_installed"] = time.monotonic() - t
        assert rc == 0 and recap(out)["u1"]["changed"] == 0 and recap(out)["u1"]["failed"] == 0, out

        # items 1 and 4: N+1 over N: no conffile prompt, installed, one restart, the old package pruned
        t = time.monotonic()
        rc, out = run(tmp_path, guest, control_dir, deb_next, NEXT)
        times["upgrade"] = time.monotonic() - t
        assert rc == 0, out
        up = facts(guest)
        assert up["package"] == f"ii {NEXT}" and up["active"] == "active" and up["build"] == NEXT, up
        assert up["starts"] == "2", up  # one restart for the upgrade (the postinst left it to the handler)
        assert up["debs"].split() == [deb_next.name] and up["verify"] == "", up

        # item 3: teardown: a clean stop restores the knob, the purge leaves nothing of ours
        t = time.monotonic()
        rc, out = run(tmp_path, guest, control_dir, deb_next, NEXT, book="teardown.yml")
        times["teardown"] = time.monotonic() - t
        assert rc == 0, out
        after = facts(guest)
        assert after["delay"] == before["delay"] and not after["package"].startswith("ii"), after
        r = guest.ssh(RESIDUE)
        assert r.returncode == 0 and r.stdout == "", r.stdout
    finally:
        guest.finish()
        for p in DIST.glob(f"*{NEXT}*"):
            p.unlink()
    print({k: round(v) for k, v in times.items()}, f"in all {time.monotonic() - t0:.0f} s")
