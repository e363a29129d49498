#!/usr/bin/env bash
# make demo: boot the lab with a real bcache volume over a slowed origin and show what cachepilot sees there.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "cachepilot demo: booting Debian's stock kernel under qemu with a bcache volume (origin slowed by dm-delay)..."
exec tests/vm/lab run --recipe bcache --mode writeback --origin-delay-ms 2 --timeout 300 -- tests/vm/guest/demo.sh
