#!/bin/bash
# The demo's guest half: watch the bcache volume with the eBPF probe while a small file workload runs, then
# report what was seen per file and per volume.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
py=$root/.venv/bin/python
M=$LAB_MOUNT
S=$LAB_BCACHE_SYSFS

echo
echo "== the volume"
echo "$LAB_CACHED_DEV: origin $LAB_ORIGIN_DEV (dm-delay), cache $LAB_CACHE_DEV, ext4 at $M"
echo "cache_mode: $(cat "$S/cache_mode")"

echo
echo "== cachepilot probe: loading the eBPF programs and watching $LAB_CACHED_DEV"
"$py" -m cachepilot.cli probe --dev "$M" --json --seconds 30 > "$LAB_OUT/events.jsonl" 2> "$LAB_OUT/probe.log" &
probe=$!
for _ in $(seq 1 100); do grep -q . "$LAB_OUT/probe.log" 2>/dev/null && break; sleep 0.1; done
sed 's/^/  /' "$LAB_OUT/probe.log"

echo
echo "== workload: 40 small files, 5 of them read hot, an fsync'ed log, 20 files deleted"
mkdir -p "$M/www" "$M/log"
for i in $(seq -w 1 40); do dd if=/dev/urandom of="$M/www/page$i.html" bs=64k count=1 status=none; done
sync; echo 3 > /proc/sys/vm/drop_caches
for i in $(seq -w 1 40); do dd if="$M/www/page$i.html" of=/dev/null bs=64k iflag=direct status=none; done
for _ in $(seq 1 10); do
    for i in 01 02 03 04 05; do dd if="$M/www/page$i.html" of=/dev/null bs=4k iflag=direct status=none; done
done
for _ in $(seq 1 8); do
    dd if=/dev/urandom of="$M/log/app.log" bs=16k count=1 oflag=append conv=notrunc,fsync status=none
done
rm -f "$M"/www/page2*.html "$M"/www/page3*.html
sync
sleep 3   # one more drain tick and the journal commit that frees the deleted blocks
kill -INT "$probe" 2>/dev/null || true
wait "$probe" 2>/dev/null || true

echo
"$py" "$root/tests/vm/demo_report.py" "$LAB_OUT/events.jsonl" "$M"

echo
echo "== bcache's own view"
for f in cache_hits cache_misses cache_bypass_hits cache_bypass_misses; do
    printf '  %-22s %s\n' "$f" "$(cat "$S/stats_total/$f")"
done
printf '  %-22s %s\n' dirty_data "$(cat "$S/dirty_data")"
echo
echo "Next in cachepilot: the daemon (cachepilot run) turns these events into promotions of the hot files,"
echo "FITRIM of exactly the freed extents (bcache then drops the dead, even dirty, data instead of writing it back),"
echo "and write-policy switches per volume — see README.md."
