#!/bin/bash
# bcache smoke checks, run in the lab guest; reports key=value lines for tests/vm/test_lab_smoke.py.
set -euo pipefail
S=$LAB_BCACHE_SYSFS
say() { echo "$1=$2"; }
stat() { cat "$S/stats_total/$1"; }
wait_stats() {  # bcache folds its per-I/O counters into stats_* on a timer: wait until they move
    local before=$1 i
    for i in $(seq 1 60); do [[ $(stat cache_hits):$(stat cache_misses) != "$before" ]] && return 0; sleep 0.5; done
}

say cached_dev "$LAB_CACHED_DEV"
say clocksource "$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
say mount_source "$(findmnt -n -o SOURCE "$LAB_MOUNT")"
say fstype "$(findmnt -n -o FSTYPE "$LAB_MOUNT")"

dd if=/dev/urandom of="$LAB_MOUNT/data" bs=1M count=4 status=none
say data_written "$(sha256sum < "$LAB_MOUNT/data" | cut -c1-64)"
sync; echo 3 > /proc/sys/vm/drop_caches
say data_read "$(sha256sum < "$LAB_MOUNT/data" | cut -c1-64)"

for m in writethrough writeback writearound none; do
    echo "$m" > "$S/cache_mode"
    say "mode_$m" "$(cat "$S/cache_mode")"
done

# A hot set smaller than the cache, written around the cache, then read twice with O_DIRECT.
echo 0 > "$S/sequential_cutoff"
echo 0 > "$LAB_BCACHE_CSET/congested_read_threshold_us"
echo 0 > "$LAB_BCACHE_CSET/congested_write_threshold_us"
echo writearound > "$S/cache_mode"
dd if=/dev/urandom of="$LAB_MOUNT/hot" bs=1M count=8 oflag=direct status=none
echo writethrough > "$S/cache_mode"
sleep 1
base="$(stat cache_hits):$(stat cache_misses)"; wait_stats "$base" || true
say hits0 "$(stat cache_hits)"; say misses0 "$(stat cache_misses)"
dd if="$LAB_MOUNT/hot" of=/dev/null bs=64k iflag=direct status=none
wait_stats "$(stat cache_hits):$(stat cache_misses)"
say hits1 "$(stat cache_hits)"; say misses1 "$(stat cache_misses)"
dd if="$LAB_MOUNT/hot" of=/dev/null bs=64k iflag=direct status=none
wait_stats "$(stat cache_hits):$(stat cache_misses)"
say hits2 "$(stat cache_hits)"; say misses2 "$(stat cache_misses)"
