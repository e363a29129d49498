#!/bin/bash
# Stage 2 of the lab guest, run by the host's bash inside the guest after switch_root.
# Reads the job the runner left in /lab/job, builds the requested cached volume, runs the command with its
# output in /lab/job/{stdout,stderr} and its exit code in /lab/job/rc, then powers the guest off.
set -u
JOB=/lab/job
here=$(cd "$(dirname "$0")" && pwd)

finish() {  # $1: exit code to report
    echo "$1" > "$JOB/rc.tmp" && mv "$JOB/rc.tmp" "$JOB/rc"
    dmesg > "$JOB/dmesg.txt" 2>/dev/null
    sync
    # An emergency restart skips the reboot notifiers: bcache's waits up to 10 s for its devices to stop, and the
    # disks are throw-away. The job share is written through (cache=none), so nothing of the results is lost.
    echo b > /proc/sysrq-trigger
    /bin/busybox reboot -f
}

# With --init systemd this runs as a service (stage2-systemd.sh set the guest up, systemd mounted /run and /dev).
if [[ ${LAB_INIT:-} != systemd ]]; then
    # /tmp stays the overlay's (writable, in the guest's tmpfs upper layer): a fresh tmpfs there would hide a
    # checkout that lives under the host's /tmp, and with it this script's own recipes and the kernel's modules.
    mount -t tmpfs -o mode=0755 tmpfs /run
    mkdir -p /dev/pts /dev/shm
    mount -t devpts devpts /dev/pts
    mount -t tmpfs tmpfs /dev/shm
fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null

# shellcheck disable=SC1091
source "$JOB/job.env"
: > "$JOB/booted"
mkdir -p /lib/modules
mountpoint -q /lib/modules || mount --bind "$LAB_KERNEL_DIR/lib/modules" /lib/modules
hostname lab
export DM_DISABLE_UDEV=1 HOME=/root TERM=${TERM:-linux}
export PATH="$here:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export LAB_OUT=$JOB/out LAB_FAIL_CACHE=$here/lab-fail-cache
mkdir -p "$LAB_OUT"

# shellcheck source=recipes.sh
source "$here/recipes.sh"
if ! build_volume 2>> "$JOB/stderr"; then
    echo "lab: recipe '$LAB_RECIPE' failed at step: $LAB_STEP" | tee -a "$JOB/stderr" > /dev/console
    finish 125
fi

cd "$LAB_CWD" 2>/dev/null || cd /
if [[ $LAB_INTERACTIVE == 1 ]]; then
    echo "lab: recipe=$LAB_RECIPE cached=${LAB_CACHED_DEV:-} mount=${LAB_MOUNT:-} — exit the shell to power off"
    setsid -c bash -l < /dev/ttyS0 > /dev/ttyS0 2>&1
    finish $?
fi
mapfile -d '' -t argv < "$JOB/argv"
: > "$JOB/started"
"${argv[@]}" > "$JOB/stdout" 2> "$JOB/stderr" < /dev/null
finish $?
