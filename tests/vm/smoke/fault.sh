#!/bin/bash
# Fail the cache device mid-run (dm-error under it) and report how the cache noticed; key=value lines.
set -uo pipefail
say() { echo "$1=$2"; }
case $LAB_RECIPE in
bcache)
    # Write-through, so that every cached block is clean and bcache can recover reads from the origin.
    echo writethrough > "$LAB_BCACHE_SYSFS/cache_mode"
    echo 0 > "$LAB_BCACHE_SYSFS/sequential_cutoff"
    # Keep the cache set registered while it fails, so its error counter stays readable (by default bcache
    # unregisters the set after a few errors, and the counter goes with it).
    echo 1000000 > "$LAB_BCACHE_CSET/io_error_limit"
    dd if=/dev/urandom of="$LAB_MOUNT/before" bs=1M count=4 oflag=direct status=none
    want=$(sha256sum < "$LAB_MOUNT/before" | cut -c1-64)
    echo 3 > /proc/sys/vm/drop_caches
    say io_errors_before "$(cat "$LAB_BCACHE_CSET/cache0/io_errors")"
    # Sample the cache's error counter while it fails: bcache unregisters a cache set whose metadata I/O fails,
    # and the counter's sysfs file goes with it. `read` is a builtin, so the sampler forks nothing.
    errs=$LAB_BCACHE_CSET/cache0/io_errors peak=$LAB_OUT/io_errors_peak
    ( p=0; while read -r v < "$errs"; do (( v > p )) && { p=$v; echo "$p" > "$peak"; }; done ) 2>/dev/null &
    sampler=$!
    lab-fail-cache error > /dev/null
    # Reads of cached data and new writes both go to the (now failing) cache device.
    dd if="$LAB_MOUNT/before" of=/dev/null bs=64k iflag=direct status=none 2>/dev/null
    say read_back_after_failure "$([[ $(sha256sum < "$LAB_MOUNT/before" | cut -c1-64) == "$want" ]] && echo yes || echo no)"
    dd if=/dev/urandom of="$LAB_MOUNT/after" bs=64k count=64 oflag=direct status=none 2>/dev/null
    sleep 1
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    say io_errors_peak "$(cat "$peak" 2>/dev/null || echo 0)"
    say cache_attached "$([[ -e $LAB_BCACHE_SYSFS/cache ]] && echo yes || echo no)"
    if [[ -r $LAB_BCACHE_CSET/cache0/io_errors ]]; then
        say io_errors_after "$(cat "$LAB_BCACHE_CSET/cache0/io_errors")"
    else
        say io_errors_after gone
    fi
    say state "$(cat "$LAB_BCACHE_SYSFS/state" 2>/dev/null || echo gone)"
    say dmesg_errors "$(dmesg | grep -c -i 'bcache.*error' || true)"
    dmesg | grep -i bcache | tail -n 5 >&2
    ;;
dmcache)
    dd if=/dev/urandom of="$LAB_MOUNT/before" bs=1M count=4 oflag=direct status=none
    lab-fail-cache error > /dev/null
    dd if=/dev/urandom of="$LAB_MOUNT/after" bs=64k count=64 oflag=direct status=none 2>/dev/null
    sync 2>/dev/null
    say status "$(dmsetup status "$LAB_DM_NAME")"
    ;;
esac
