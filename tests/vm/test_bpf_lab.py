"""The kernel half on real cached volumes: the host's exact-count tests of tests/bpf, run inside the lab guest
(Debian's stock 6.1 kernel) against a bcache and a dm-cache volume, with events attributed to the cached device.

One guest boot per recipe: the guest runs pytest over the tests/bpf modules (their fixtures switch to the lab's
volume when LAB_CACHED_DEV is set) and writes a JUnit report and the probe's attach report to $LAB_OUT.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from bpf_support import STACK_LAYOUT

from tests.collected import collected

pytestmark = pytest.mark.vm

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "tests/bpf/test_hotness.py",
    "tests/bpf/test_barriers.py",
    "tests/bpf/test_freed.py",
    "tests/bpf/test_durability.py",
]
GUEST_ONLY = ["tests/bpf/lab_attribution.py"]  # attribution to the cached device vs the disks below it
# host-only: a second loop device with its own ext4 (or XFS), and a loop device whose max_sectors_kb is lowered
DESELECT = "not unwatched and not split_bios and not non_ext4"

GUEST = f"""
set -e
cd {ROOT}
{sys.executable} -c 'from cachepilot.probe import Probe
p = Probe(max_files=64)
print(p.report.summary())' > "$LAB_OUT/attach.txt" 2>&1
exec {sys.executable} -m pytest -q -p no:cacheprovider -k '{DESELECT}' --junitxml="$LAB_OUT/junit.xml" \\
    {" ".join(MODULES + GUEST_ONLY)}
"""


def host_test_ids() -> set[str]:
    # the guest's parameters (one block I/O variant)
    ids = collected(["-k", DESELECT, *MODULES], LAB_CACHED_DEV="collect-only")
    return {i.split("::", 1)[1] for i in ids}


@pytest.mark.parametrize("recipe", ["bcache", "dmcache"])
def test_bpf_exact_counts_on_cached_volume(lab, recipe: str) -> None:
    res = lab.run(["bash", "-c", GUEST], recipe=recipe, timeout=1200)
    attach = (res.out / "attach.txt").read_text() if (res.out / "attach.txt").exists() else "(no attach report)"
    junit = res.out / "junit.xml"
    assert junit.exists(), f"the guest produced no test report\n{attach}\n{res.explain()}"
    suite = ET.parse(junit).getroot()  # noqa: S314 - our own guest's report
    cases = suite.iter("testcase")
    ran: dict[str, str] = {}
    for case in cases:
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = f"{child.tag}: {child.get('message', '')[:300]}"
        ran[case.get("name", "")] = status
    failed = {k: v for k, v in ran.items() if v != "passed"}
    assert not failed, f"{recipe}: {failed}\n{attach}\n{res.explain()}"
    assert res.rc == 0, res.explain()
    # every host test ran in the guest too (nothing silently deselected)
    assert set(ran) == host_test_ids() | {
        "test_io_is_attributed_to_the_cached_device[default]",
        "test_discards_on_the_volume_and_below[default]",
    }
    # the probe loaded on the guest's stock kernel with everything attached; only the XFS hook may be missing
    # (the xfs module is not loaded in the guest: reported, not hidden)
    missing = [line for line in attach.splitlines() if line.startswith("NOT attached")]
    assert all(line.startswith("NOT attached: on_xfs_extent_free:") for line in missing), attach
    # 6.1 has no bpf_rdonly_cast: the block I/O hook is the variant without it
    assert "attached: on_bio_queue_compat" in attach, attach
    assert "on_ext4_free_blocks" in attach.splitlines()[1] and "on_jbd2_end_commit" in attach.splitlines()[1], attach


STACKED_GUEST = f"""
set -e
cd {ROOT}
{STACK_LAYOUT}exec {sys.executable} -m pytest -q -p no:cacheprovider -k stacked --junitxml="$LAB_OUT/junit.xml" \\
    tests/bpf/test_stacking.py
"""


def test_bpf_files_of_dm_linear_on_bcache(lab) -> None:
    """A filesystem on dm-linear over the bcache volume: its files are hot at the volume (the host test's layout)."""
    res = lab.run(["bash", "-c", STACKED_GUEST], recipe="bcache", timeout=600)
    junit = res.out / "junit.xml"
    assert junit.exists(), f"the guest produced no test report\n{res.explain()}"
    suite = ET.parse(junit).getroot()  # noqa: S314 - our own guest's report
    ran = {case.get("name", ""): [child.tag for child in case] for case in suite.iter("testcase")}
    assert ran == {"test_files_of_a_filesystem_stacked_on_the_volume_are_hot": []}, f"{ran}\n{res.explain()}"
    assert res.rc == 0, res.explain()
