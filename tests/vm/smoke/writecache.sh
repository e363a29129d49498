#!/bin/bash
# dm-writecache smoke checks, run in the lab guest (recipe writecache); key=value lines on stdout.
set -euo pipefail
say() { echo "$1=$2"; }
say mount_source "$(findmnt -n -o SOURCE "$LAB_MOUNT")"
say status_empty "$(dmsetup status "$LAB_DM_NAME")"
dd if=/dev/urandom of="$LAB_MOUNT/data" bs=1M count=16 oflag=direct status=none
sync
say status_written "$(dmsetup status "$LAB_DM_NAME")"
# Freeze the filesystem so nothing writes while the cache is flushed.
fsfreeze -f "$LAB_MOUNT"
dmsetup message "$LAB_DM_NAME" 0 flush
say status_flushed "$(dmsetup status "$LAB_DM_NAME")"
fsfreeze -u "$LAB_MOUNT"
