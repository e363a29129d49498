#!/bin/bash
# `lab run --init systemd`: run by the host's bash as PID 1 right after switch_root (instead of stage2.sh). Prepares
# the guest's overlay (its tmpfs upper layer: nothing reaches the host) for systemd, writes a `lab.target` that
# runs stage2.sh as a oneshot service (and, with --ssh-port, the network and an sshd first), and execs systemd.
set -u
JOB=/lab/job
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "lab: systemd stage: $*" | tee -a "$JOB/stderr" > /dev/console; echo 125 > "$JOB/rc"; echo b > /proc/sysrq-trigger; }

# shellcheck disable=SC1091
source "$JOB/job.env"
: > "$JOB/booted"
mkdir -p /lib/modules && mount --bind "$LAB_KERNEL_DIR/lib/modules" /lib/modules || die "bind of the module tree"

# systemd over the host's root: not a container (/.dockerenv), a machine id of its own, no /tmp wipe (the stock
# `D /tmp` would walk a 9p tree and remove a checkout living under /tmp), no generators (no fstab, no udev here).
rm -f /.dockerenv
cat /proc/sys/kernel/random/uuid | tr -d - > /etc/machine-id
echo lab > /etc/hostname
mkdir -p /etc/tmpfiles.d /etc/systemd/system-generators /etc/systemd/system
: > /etc/tmpfiles.d/tmp.conf
for g in /lib/systemd/system-generators/*; do ln -sf /dev/null "/etc/systemd/system-generators/${g##*/}"; done
: > /root/.bashrc  # the host's runs pyenv init on every ssh command
: > /root/.profile

ssh=0
if [[ -s $JOB/authorized_keys ]]; then
    ssh=1
    install -d -m 0700 /root/.ssh && install -m 0600 "$JOB/authorized_keys" /root/.ssh/authorized_keys || die "authorized_keys"
fi

# The lab's units. No default dependencies: only what the lab needs starts (sysinit.target and its ~45 units
# would double the boot); a unit under test brings its own.
cat > /etc/systemd/system/lab.target <<UNIT
[Unit]
Description=cachepilot lab
Requires=lab.service
$( ((ssh)) && echo "Wants=lab-sshd.service" )
AllowIsolate=yes
UNIT
cat > /etc/systemd/system/lab.service <<UNIT
[Unit]
Description=cachepilot lab: build the recipe, run the command, power off
DefaultDependencies=no
After=lab-sshd.service
[Service]
Type=oneshot
Environment=LAB_INIT=systemd
ExecStart=/bin/bash $here/stage2.sh
TimeoutStartSec=infinity
UNIT
if ((ssh)); then
    cat > /etc/systemd/system/lab-net.service <<UNIT
[Unit]
Description=cachepilot lab: qemu user networking (10.0.2.15, restricted: the guest reaches nothing outside)
DefaultDependencies=no
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/modprobe virtio_net
ExecStart=/sbin/ip link set lo up
ExecStart=/sbin/ip link set eth0 up
ExecStart=/sbin/ip addr add 10.0.2.15/24 dev eth0
ExecStart=/sbin/ip route add default via 10.0.2.2
UNIT
    # Host keys are made here, in the guest's memory: never the host's, never on the host.
    cat > /etc/systemd/system/lab-sshd.service <<UNIT
[Unit]
Description=cachepilot lab: sshd for the host (key login as root only)
DefaultDependencies=no
Requires=lab-net.service
After=lab-net.service
[Service]
Type=notify
RuntimeDirectory=sshd lab-sshd
ExecStartPre=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /run/lab-sshd/host_ed25519_key
ExecStart=/usr/sbin/sshd -D -e -f $here/sshd_config
UNIT
fi
exec /lib/systemd/systemd
