"""The lab's reading of bcache's tracepoints (tests/vm/bcache_trace.py): trace lines parsed, and each bio bcache
bypassed as sequential matched with the run it continued -- a bio that ended where it started within bcache's 5 s
run memory (check_should_bypass) -- or with none (the task's own EWMA of its runs carried it past the cutoff)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
from bcache_trace import ALLOC_FAIL, QUEUE, explain_bypasses, parse  # noqa: E402

TRACE = """# tracer: nop
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
              dd-812     [001] .....   100.000000: block_bio_queue: 252,0 R 1000 + 2048 [dd]
              dd-812     [001] .....   100.100000: block_bio_queue: 252,0 R 3048 + 2048 [dd]
      cachepilot-900     [000] .....   101.000000: block_bio_queue: 252,0 R 5096 + 256 [cachepilot]
      cachepilot-900     [000] .....   101.000001: bcache_bypass_sequential: 8,16  R 5112 + 256
      cachepilot-900     [000] .....   101.100000: block_bio_queue: 252,0 R 800 + 256 [cachepilot]
      cachepilot-900     [000] .....   101.100001: bcache_bypass_sequential: 8,16  R 816 + 256
      cachepilot-900     [000] .....   106.200000: block_bio_queue: 252,0 R 5352 + 256 [cachepilot]
      cachepilot-900     [000] .....   106.200001: bcache_bypass_sequential: 8,16  R 5368 + 256
    kworker/0:1-33      [000] d..1.   101.200000: bcache_alloc_fail: 8,32 reserve 3
           <idle>-0       [001] .....   101.300000: block_bio_queue: 8,16 W 9000 + 8 [swapper]
"""


def test_lines_are_parsed_with_task_device_sector_and_size() -> None:
    recs = parse(TRACE)
    assert len(recs) == 10
    assert recs[0].comm == "dd" and recs[0].pid == 812 and recs[0].event == QUEUE
    assert (recs[0].dev, recs[0].sector, recs[0].sectors, recs[0].ts) == ("252,0", 1000, 2048, 100.0)
    assert recs[8].event == ALLOC_FAIL and recs[8].comm == "kworker/0:1"


def test_each_bypassed_bio_is_matched_with_the_run_it_continued_within_5_s() -> None:
    got = explain_bypasses(parse(TRACE), "252,0", "cachepilot")
    assert got["offset"] == 16  # the backing device's data offset, found from the bios themselves
    assert got["bios"] == 3 and got["bypassed"] == 3 and got["bypassed_bytes"] == 3 * 256 * 512
    # 5096 continues dd's run (ended at 5096 0.9 s before); 800 continues nothing; 5352 continues the promoter's
    # own bio at 5096+256, but 5.2 s later: bcache has forgotten it
    assert got["continuing"] == {"dd-other": 1, "none": 2}
    assert got["alloc_fail"] == 1 and got["bypassed_by_comm"] == {"cachepilot": 3}
