"""The DM ioctl reader (backends/dmioctl.py) on the lab's real dm-cache: the same lines as dmsetup, faster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


def test_status_and_table_through_the_ioctl_are_what_dmsetup_prints(lab):
    r = lab.run([".venv/bin/python", "tests/vm/guest/dmioctl_check.py"], recipe="dmcache", mode="writeback")
    assert r.rc == 0, r.explain()
    assert "lab-cached" in r.values["devices"].split(), r.explain()
    assert r.int("compared") >= 4 and r.values["same"] == r.values["compared"], r.explain()
    assert r.values["gone"].startswith("DeviceGone"), r.explain()
    assert float(r.values["ioctl_ms"]) < float(r.values["dmsetup_ms"]), r.explain()
    print(f"dm status of one device: ioctl {r.values['ioctl_ms']} ms, dmsetup {r.values['dmsetup_ms']} ms")
