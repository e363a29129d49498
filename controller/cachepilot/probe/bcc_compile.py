"""Compile bpf/cachepilot.bcc.c with bcc and write each program's instructions (hex) as JSON.

Run by the system interpreter, where Debian's python3-bpfcc lives (probe/bccload.py starts it; it imports nothing of
cachepilot): a compile only, nothing is loaded or attached, no map is created (the source names its maps by
placeholder numbers that the loader replaces).

usage: python3 bcc_compile.py SOURCE OUT.json PROGRAM... -- CFLAG...
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from bcc import BPF  # type: ignore[import-not-found]  # only the system interpreter has it

    source, out = argv[1], argv[2]
    sep = argv.index("--")
    programs, cflags = argv[3:sep], argv[sep + 1 :]
    b = BPF(src_file=source.encode(), cflags=cflags)
    code = {name: b.dump_func(name.encode()).hex() for name in programs}
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(code, f)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
