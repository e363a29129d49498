"""The best stock configuration, found by search rather than guessed (issue 31): per cache kind, the grid of stock
settings its headline workload runs under, how a point is judged, and the file that carries the search's result to
the headline.

bcache (W1): a point is stock write-back with ``writeback_percent`` P, ``writeback_delay`` D and ext4 ``-o discard``
or not; every point runs with the same ``sequential_cutoff`` (4 MiB, bcache's default) and the congestion thresholds
off (as every W1 row). dm-writecache (W4): a point is the table with ``max_age`` A s (30: the bound's age; 15: half
of it, so that a block is written back within the bound), ``pause_writeback`` P ms (3000 is the kernel's default:
write-back waits for that much origin idle time), high/low watermarks H/L percent (50/45 are the defaults; 25/20
starts write-back at 64 MiB of the 256 MiB cache, the bound's size; 18/13 at three quarters of it, what cachepilot
itself sets when it delegates the bound: engine/nativebound.py) and ext4 ``-o discard`` or not. "Within the bound"
means the exposure witness of every run of the point stayed within the shipped policy's bound (64 MiB dirty, 30 s
oldest dirty data); the best point within the bound and the best overall are the ones with the highest median
ops/s."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RESULT = RESULTS / "stock_grid_bcache.json"
KINDS = ("bcache", "writecache")
WRITEBACK_PERCENT = (0, 10, 40)
WRITEBACK_DELAY = (5, 10, 30)
DISCARD = (0, 1)
MAX_AGE_S = (15, 30)
PAUSE_MS = (0, 3000)
WATERMARKS = ((50, 45), (25, 20), (18, 13))
BOUND_DIRTY_MIB, BOUND_AGE_S = 64.0, 30.0  # policies/default.yaml's exposure bound


def point(wp: int, wd: int, discard: int) -> str:
    """The guest's configuration name of a grid point (headline_fileserver.py's ``stock:``)."""
    return f"stock:wp={wp},wd={wd},discard={discard}"


def writecache_point(age_s: int, pause_ms: int, watermarks: tuple[int, int], discard: int) -> str:
    """The W4 guest's configuration name of a grid point (wcfiles.py's ``stock:``)."""
    return f"stock:age={age_s},pause={pause_ms},wm={watermarks[0]}/{watermarks[1]},discard={discard}"


def grid(kind: str = "bcache") -> list[str]:
    if kind == "writecache":
        return [writecache_point(*p) for p in itertools.product(MAX_AGE_S, PAUSE_MS, WATERMARKS, DISCARD)]
    return [point(*p) for p in itertools.product(WRITEBACK_PERCENT, WRITEBACK_DELAY, DISCARD)]


def result(kind: str = "bcache") -> Path:
    return RESULTS / f"stock_grid_{kind}.json"


def within_bound(run: dict) -> bool:
    """The run's exposure witness within the bound (both the dirty amount and the oldest dirty data's age)."""
    return (run.get("exposure_max_dirty_mib", float("inf")) <= BOUND_DIRTY_MIB
            and run.get("exposure_oldest_dirty_s", float("inf")) <= BOUND_AGE_S)


def best(rows: Mapping[str, Sequence[dict]]) -> dict[str, str | float | None]:
    """The best point within the bound (every run of it within) and the best overall, by median ops/s; None where no
    point qualifies. Failed runs (``error``) do not count; a point with none left is skipped."""
    med = {}
    bounded = {}
    for cfg, runs in rows.items():
        ok = [r for r in runs if "error" not in r and "ops_s" in r]
        if not ok:
            continue
        med[cfg] = statistics.median(r["ops_s"] for r in ok)
        if all(within_bound(r) for r in ok):
            bounded[cfg] = med[cfg]
    top = max(med, key=lambda c: med[c]) if med else None
    topb = max(bounded, key=lambda c: bounded[c]) if bounded else None
    return {"best_overall": top, "best_overall_ops_s": med.get(top) if top else None,
            "best_bounded": topb, "best_bounded_ops_s": bounded.get(topb) if topb else None}


def load(path: Path = RESULT) -> dict:
    """The committed search result; one line naming the problem when it is missing or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        kind = path.stem.removeprefix("stock_grid_")
        raise SystemExit(f"{path}: no stock grid result: run tests/bench/bench_lab_stock_grid.py --kind {kind} --write"
                         " first") from None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: unreadable stock grid result ({exc})") from None
    for key in ("best_bounded", "best_overall"):
        if not isinstance(doc.get(key), str) or not doc[key].startswith("stock:"):
            raise SystemExit(f"{path}: {key} missing or not a stock configuration")
    return doc
