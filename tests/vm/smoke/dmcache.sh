#!/bin/bash
# dm-cache smoke checks, run in the lab guest (recipe dmcache, mode writeback); key=value lines on stdout.
set -euo pipefail
say() { echo "$1=$2"; }
say mount_source "$(findmnt -n -o SOURCE "$LAB_MOUNT")"
say table_before "$(dmsetup table "$LAB_DM_NAME")"
# Write, read a few times (smq promotes), and overwrite: overwrites of cached blocks become dirty.
dd if=/dev/urandom of="$LAB_MOUNT/hot" bs=1M count=16 oflag=direct status=none
for _ in 1 2 3; do dd if="$LAB_MOUNT/hot" of=/dev/null bs=64k iflag=direct status=none; done
dd if=/dev/urandom of="$LAB_MOUNT/hot" bs=64k count=256 oflag=direct conv=notrunc status=none
# Sampled at once: smq writes back dirty blocks older than its writeback period even while the device is busy,
# so on a slow (loaded) host a sample taken after reading the file back found them all clean already.
say status_dirty "$(dmsetup status "$LAB_DM_NAME")"
want=$(sha256sum < "$LAB_MOUNT/hot" | cut -c1-64)
# writeback -> writethrough: reload + suspend + resume; dm-cache then cleans the dirty blocks.
table=$(dmsetup table "$LAB_DM_NAME")
dmsetup reload "$LAB_DM_NAME" --table "${table/ writeback / writethrough }"
dmsetup suspend "$LAB_DM_NAME"
dmsetup resume "$LAB_DM_NAME"
say table_after "$(dmsetup table "$LAB_DM_NAME")"
for i in $(seq 1 120); do
    line=$(dmsetup status "$LAB_DM_NAME")
    [[ $(awk '{print $14}' <<< "$line") == 0 ]] && break
    sleep 0.25
done
say status_drained "$line"
say drain_polls "$i"
sync; echo 3 > /proc/sys/vm/drop_caches
say data_intact "$([[ $(sha256sum < "$LAB_MOUNT/hot" | cut -c1-64) == "$want" ]] && echo yes || echo no)"
