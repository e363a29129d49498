"""Stuck write-back found and explained on a real bcache volume (issue 36 item 3): ``writeback_running`` 0 behind the
daemon's back, with dirty data, is judged stalled within two minutes, the shipped alert fires in a real Prometheus
(Debian's, in the guest, with the shipped rules), explain names the knob, and the daemon leaves the knob at 0."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

MIB = 1 << 20


def test_a_stall_behind_the_daemons_back_is_found_explained_and_alerted_and_the_knob_left_alone(lab):
    r = lab.run([".venv/bin/python", "tests/vm/lifecycle/stall.py"], recipe="bcache", mode="writeback",
                timeout=600)
    print(r.stdout)
    assert r.rc == 0, r.explain()
    v = r.values
    # 8 MiB written as 1 MiB files, the sequential cutoff 0 (the stock 4 MiB sent 13 of 16 around the cache once)
    assert v["ready"] == "yes" and r.int("dirty_before") >= 4 * MIB and v["running_after_echo"] == "0", r.explain()
    # health.stall_after and 2 x writeback_delay are 20 s here: found within two minutes of the echo, the reason named
    assert v["detected_s"] != "never" and int(v["detected_s"]) <= 120, r.explain()
    assert v["cause_names_knob"] == "yes" and v["explain_says"] == "yes", r.explain()
    # the shipped alert fires in Prometheus (its `for:` after the daemon's judgement), the gauge scraped as 1
    assert v["alert_s"] != "never" and v["alert_severity"] == "warning" and v["gauge_in_prometheus"] == "1", r.explain()
    # the operator's knob stays as the operator set it
    assert v["running_still"] == "0" and v["daemon_wrote_running"] == "no", r.explain()
    assert v["ended"] == "yes", r.explain()
    assert v["exit"] == "0" and v["traceback"] == "no" and v["logged"] == "yes", r.explain()
