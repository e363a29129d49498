"""Health in the lab: a write-through bcache volume whose cache device starts failing is taken out of the
cache's path through the backend (write-through, drain, bypass) and loses no fsync-acknowledged data."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

PY = ".venv/bin/python"


def test_failing_cache_device_goes_writethrough_drain_bypass_without_loss(lab):
    r = lab.run([PY, "tests/vm/act/fault.py"], recipe="bcache", mode="writethrough", timeout=240)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    assert v["detected"] != "no", r.explain()
    for step in ("writethrough", "drain", "bypass"):
        assert v[f"{step}_status"] == "done", r.explain()
    assert v["mode_after"] == "none", r.explain()
    assert r.int("acked_files") > 8, r.explain()  # files were acknowledged while the cache was failing
    assert v["intact"] == "yes" and v["intact_remount"] == "yes", r.explain()
