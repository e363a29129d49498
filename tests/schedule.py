"""How `make test` shares its files among pytest-xdist's workers (conftest.py's pytest_xdist_make_scheduler).

The lab files (tests/vm) each run qemu guests under TCG, one vCPU each. Two workers run them, so at most two lab
files run at once, as this machine's two cores and the lab's rule ask. Those guests leave the host's CPU idle a
quarter of the time (a fresh clone's `make test` at b9e7909, sampled every 5 s: 75 % busy): they wait for the
daemon's ticks, alert rules' `for:` windows, slow origins. With three workers or more, the last one takes only the
host-level files (tests/bpf, tests/ops, tests/unit) from the start, in that idle time; the others take lab files,
longest first, then join it on the host files. With two workers (`make test`'s default) nothing changes: files in
collection order. Three are not the default: niced beside busy guests, the host files' latency bounds fail now and
then (tests/bpf/test_hostile_servers.py: a reply in 0.22-0.24 s against its 0.2 s, in one of three fresh-clone runs).
The scheduler itself is tests/xdist_schedule.py (imported only where xdist runs: Debian's floors test has none).
"""

from __future__ import annotations

LAB = "tests/vm/"
# the host-only worker's niceness: when both lab workers' guests are busy it still gets a few percent of the two
# cores (weight 36 against 1024 each: a run at nice 5 slowed the fleet test from 237 to 420 s), and all they leave idle
HOST_WORKER_NICE = 15

# `make test` runs the levels under pytest-xdist with --dist loadfile --no-loadscope-reorder: each worker takes whole
# files, in collection order, the next one as it runs out; two workers take the lab files (below). Every
# lab file is listed here, longest first (seconds per file in a fresh clone's `make test` at b9e7909, /tmp/fc11), so
# the two lab workers end close together: a long file taken last leaves the other worker idle (at b9e7909 the upgrade
# test, unlisted, came last: 293 s on one worker while the other had ended its lab files 233 s before). A lab file
# not listed runs after these. (xdist's own reorder puts files with the most tests first.)
LONGEST_FIRST = (
    "tests/vm/test_fleet_lab.py",  # 237 (first: its Ansible on this host and two guests, beside one guest only)
    "tests/vm/test_bpf_lab.py",  # 273
    "tests/vm/test_upgrade_lab.py",  # 293
    "tests/vm/test_pin_handoff_lab.py",  # 210
    "tests/vm/test_bcc_lab.py",  # 160
    "tests/vm/test_daemon_crash_lab.py",  # 148
    "tests/vm/test_hotlarge_lab.py",  # 138
    "tests/vm/test_drain_dm_lab.py",  # 132
    "tests/vm/test_package_lab.py",  # 112
    "tests/vm/test_service_lab.py",  # 107
    "tests/vm/test_stall_lab.py",  # 101
    "tests/vm/test_detach_lab.py",  # 91
    "tests/vm/test_lab_runner.py",  # 87
    "tests/vm/test_lab_smoke.py",  # 85
    "tests/vm/test_discard_lab.py",  # 81
    "tests/vm/test_promote_lab.py",  # 79
    "tests/vm/test_daemon_lab.py",  # 69
    "tests/vm/test_unclean_lab.py",  # 68
    "tests/vm/test_drain_lab.py",  # 63
    "tests/vm/test_switch_lab.py",  # 58
    "tests/vm/test_discard_stress_lab.py",  # 53
    "tests/vm/test_demo_lab.py",  # 51
    "tests/vm/test_record_lab.py",  # 48
    "tests/vm/test_lvmcache_lab.py",  # 26
    "tests/vm/test_lab_systemd.py",  # 21
    "tests/vm/test_fault_lab.py",  # 14
    "tests/vm/test_dmioctl_lab.py",  # 13
)


def host_only_worker(worker: str, count: int) -> bool:
    """Whether xdist's worker ``worker`` (gw0, gw1...) of ``count`` is the host-only one: the last of three or more."""
    return count >= 3 and worker == f"gw{count - 1}"
