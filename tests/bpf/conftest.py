"""Fixtures for the real eBPF tests on the host kernel: root, BTF, tracefs, the built object, ext4 on loop devices.

A test that cannot run here fails with the reason (never skips): these are the tests that prove the kernel half.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bpf_support import LAB_CACHED_DEV, ROOT, LoopFs, lab_volume, make_loop_ext4, run, settle

from cachepilot.probe.checks import CHECKOUT_OBJECT, TRACEFS
from cachepilot.probe.probe import Probe

# "bcc": the lab guest hid the kernel's BTF (tests/vm/test_bcc_lab.py): the probe must take the bcc capture path
LAB_CAPTURE = os.environ.get("LAB_CAPTURE", "core")


@pytest.fixture(scope="session")
def bpf_env() -> None:
    """Everything the kernel half needs; a missing piece is a loud failure with its reason."""
    problems = []
    if os.geteuid() != 0:
        problems.append("tests/bpf need root (loading BPF programs, loop devices, mount)")
    if LAB_CAPTURE == "core" and not Path("/sys/kernel/btf/vmlinux").is_file():
        problems.append("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    if not (TRACEFS / "events").is_dir():
        r = run("mount", "-t", "tracefs", "nodev", str(TRACEFS), check=False)
        if r.returncode != 0:
            pytest.fail(f"tracefs is not mounted and mounting it failed: {r.stderr.strip()}", pytrace=False)
    # in the lab guest the host-built object is used as is (CO-RE relocates it on the guest's kernel)
    r = run("true") if LAB_CACHED_DEV else run("make", "-s", "-C", str(ROOT / "bpf"), check=False)
    if r.returncode != 0 or not CHECKOUT_OBJECT.is_file():
        pytest.fail(f"building the BPF object failed:\n{r.stdout}\n{r.stderr}", pytrace=False)


@pytest.fixture
def loopfs(bpf_env: None) -> Iterator[LoopFs]:
    with lab_volume() if LAB_CACHED_DEV else make_loop_ext4() as fs:
        yield fs


# The block I/O hook comes in two variants (bpf/core_fixes.bpf.h): the one this kernel runs by default, and on the host
# the one for kernels without bpf_rdonly_cast too (the lab's 6.1 runs that one by default).
BIO_VARIANTS = ["default"] if LAB_CACHED_DEV else ["default", "compat"]


@pytest.fixture(scope="session", params=BIO_VARIANTS)
def probe(bpf_env: None, request: pytest.FixtureRequest) -> Iterator[Probe]:
    p = Probe(max_files=1 << 14, unavailable={"on_bio_queue"} if request.param == "compat" else ())
    assert p.capture_path == LAB_CAPTURE, p.report.summary()
    assert ("on_bio_queue_compat" if request.param == "compat" else "on_bio_queue") in p.report.attached or (
        LAB_CACHED_DEV and "on_bio_queue_compat" in p.report.attached
    ), p.report.summary()
    yield p
    p.close()


@pytest.fixture
def watched(probe: Probe, loopfs: LoopFs) -> Iterator[LoopFs]:
    """The loop ext4 filesystem, watched by the session probe; events of earlier tests are flushed first."""
    probe.watch_volume(loopfs.dev)
    settle(probe)
    yield loopfs
    probe.unwatch(loopfs.dev)
    probe.poll(0)
    probe.drain()


