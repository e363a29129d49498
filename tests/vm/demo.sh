#!/usr/bin/env bash
# make demo: boot the lab with a real bcache volume (write-back) over a slowed origin (dm-delay), run the daemon
# (`cachepilot run`, default policy + tests/vm/demo/demo-policy.yaml) under a short mixed workload, and show what it did.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "cachepilot demo: booting Debian's stock kernel under qemu with a bcache volume (origin slowed by dm-delay)..."
start=$(date +%s)
tests/vm/lab run --recipe bcache --mode writeback --origin-delay-ms 2 --timeout 300 -- .venv/bin/python tests/vm/demo/demo.py
echo "demo finished in $(( $(date +%s) - start )) s"
