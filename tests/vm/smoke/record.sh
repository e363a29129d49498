#!/bin/bash
# In the lab: record the cached volume's live event stream (and its samples) while a small workload runs: a file
# read hot with O_DIRECT, a file deleted; the recording ends with SIGINT. key=value lines on stdout, the trace in
# $LAB_OUT.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
py=$root/.venv/bin/python
"$py" -m cachepilot.cli record --out "$LAB_OUT/run.cptrace" --volume "$LAB_CACHED_DEV" --duration 120 --tick 0.5 \
    > "$LAB_OUT/record.out" 2> "$LAB_OUT/record.err" &
rec=$!
for i in $(seq 1 300); do grep -q "recording" "$LAB_OUT/record.err" 2>/dev/null && break; sleep 0.1; done
echo "attach_seconds=$((i / 10))"
M=$LAB_MOUNT
dd if=/dev/urandom of="$M/hot" bs=64k count=1 conv=fsync status=none
dd if=/dev/urandom of="$M/gone" bs=256k count=1 conv=fsync status=none
echo "hot_ino=$(stat -c %i "$M/hot")"
echo "gone_ino=$(stat -c %i "$M/gone")"
for _ in 1 2 3 4 5; do   # five fsync'd appends: each one annotates an epoch, its journal flush closes it
    dd if=/dev/urandom of="$M/log" bs=4k count=1 oflag=append conv=notrunc,fsync status=none
done
sync; echo 3 > /proc/sys/vm/drop_caches
for _ in 1 2 3; do dd if="$M/hot" of=/dev/null bs=4k iflag=direct status=none; done
rm "$M/gone"
sync
sleep 2   # one more drain tick after the journal commit
kill -INT "$rec"
rc=0; wait "$rec" || rc=$?
echo "record_rc=$rc"
