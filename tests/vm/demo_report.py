"""Summarise a `cachepilot probe --json` capture for the demo: hottest files, deletes and the extents they freed,
barriers and epoch sizes. Paths are looked up only for display (by inode, in the demo's own directory)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict


def main(events_path: str, mount: str) -> None:
    names: dict[int, str] = {}
    for dirpath, _dirs, files in os.walk(mount):
        for f in files:
            full = os.path.join(dirpath, f)
            names[os.stat(full).st_ino] = os.path.relpath(full, mount)

    kinds: Counter[str] = Counter()
    heat: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    freed: dict[int, int] = defaultdict(int)
    deletes: list[dict] = []
    barriers: Counter[str] = Counter()
    epoch_bytes: list[int] = []
    with open(events_path) as f:
        for line in f:
            ev = json.loads(line)
            kind = ev.pop("event")
            kinds[kind] += 1
            if kind == "HotnessDelta":
                h = heat[ev["key"]["ino"]]
                h[0] += ev["read_score"]
                h[1] += ev["write_score"]
            elif kind == "FreedExtent" and not ev["metadata"]:
                freed[ev["ino"]] += ev["count"]
            elif kind == "Delete":
                deletes.append(ev)
            elif kind == "Barrier":
                barriers[ev["kind"]] += 1
                if ev.get("epoch_bytes"):
                    epoch_bytes.append(ev["epoch_bytes"])

    print("== what the probe saw")
    print("  events: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print("  hottest files (inverse-bitmap score: 64 per 4 KiB request, 4 per 64 KiB):")
    top = sorted(heat.items(), key=lambda kv: kv[1][0] + kv[1][1], reverse=True)[:8]
    for ino, (r, w) in top:
        print(f"    {names.get(ino, f'inode {ino} (deleted)'):<24} read {r:>6}  write {w:>6}")
    print(f"  deletes: {len(deletes)} files; freed data extents: {sum(freed.values())} fs blocks "
          f"in {len(freed)} files — exactly what the controller would FITRIM")
    print("  barriers: " + ", ".join(f"{k} {n}" for k, n in sorted(barriers.items())))
    if epoch_bytes:
        print(f"  epochs: {len(epoch_bytes)} closed, median {sorted(epoch_bytes)[len(epoch_bytes) // 2]} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
