#!/usr/bin/env python3
"""Render a preview of the Grafana dashboard's panels from real query results (Grafana is not packaged here).

    render_preview.py RESULTS.json OUT.png

RESULTS.json is what tests/vm/test_fleet_lab.py collected from Prometheus (tests/ops/dashboard_support.py
`range_results`): every panel's title, type, unit, grid position and its series as (unix time, value) points. The
panels are laid out on Grafana's 24-column grid; a state timeline is drawn as steps between the write modes.
Needs matplotlib (the project's `test` extras).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

MODES = {1: "writeback", 2: "writethrough", 3: "bypass"}  # volume:cachepilot_volume_mode:code
# (divisor, suffix) per Grafana unit, for readable axes
UNITS: dict[str, tuple[float, str]] = {"bytes": (1 << 20, "MiB"), "Bps": (1 << 20, "MiB/s"), "s": (1, "s"),
                                       "ops": (1, "/s"), "percentunit": (0.01, "%")}


def draw(ax: Axes, panel: dict[str, Any], start: float) -> None:
    divisor, suffix = UNITS.get(panel["unit"], (1, ""))
    ax.set_title(panel["title"] + (f" ({suffix})" if suffix else ""), fontsize=8, loc="left")
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    drawn = 0
    for s in panel["series"]:
        pts = [(t - start, v / divisor) for t, v in s["points"] if math.isfinite(v)]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        if panel["type"] == "state-timeline":
            ax.step(xs, ys, where="post", label=s["legend"])
        else:
            ax.plot(xs, ys, label=s["legend"], linewidth=1)
        drawn += 1
    if panel["type"] == "state-timeline":
        ax.set_yticks(list(MODES), list(MODES.values()))
        ax.set_ylim(0.5, 3.5)
    if drawn:
        ax.legend(fontsize=5, loc="upper left", framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    ax.set_xlabel("seconds", fontsize=6)


def render(data: dict[str, Any], out: Path) -> None:
    panels = data["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    top = min(p["gridPos"]["y"] for p in panels)
    fig = plt.figure(figsize=(16, (rows - top) * 0.32))
    grid = fig.add_gridspec(rows - top, 24, hspace=4.0, wspace=1.2, top=0.95, bottom=0.02)
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"] - top:g["y"] - top + g["h"] - 1, g["x"]:g["x"] + g["w"]])
        draw(ax, p, data["start"])
    fig.suptitle(f"cachepilot dashboard: {len(panels)} panels from Prometheus, "
                 f"{data['end'] - data['start']:.0f} s of two lab guests", fontsize=10)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: render_preview.py RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as exc:
        print(f"render_preview: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    render(data, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
