#!/bin/bash
# Lab (--init systemd, recipe bcache): the packaged cachepilot.service under a real systemd — how systemd parsed
# it, readiness, metrics, the control socket, a discard through the sandbox, reload with a broken policy, the
# watchdog killing a hung daemon and the restart, a clean stop. Reports key=value lines.
set -u
say() { echo "$1=$2"; }
show() { systemctl show cachepilot -p "$1" --value; }
metric() {  # metric NAME: its value from the daemon's /metrics ("" if absent)
    python3 -c "import urllib.request,sys
t = urllib.request.urlopen('http://127.0.0.1:9854/metrics', timeout=5).read().decode()
print(next((l.split()[-1] for l in t.splitlines() if l.startswith(sys.argv[1] + ' ')), ''))" "$1" 2>/dev/null
}
metric_sum() {  # metric_sum NAME: the sum of its samples over all label sets
    python3 -c "import urllib.request,sys
t = urllib.request.urlopen('http://127.0.0.1:9854/metrics', timeout=5).read().decode()
print(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith(sys.argv[1] + '{')))" "$1" 2>/dev/null
}
wait_for() {  # wait_for SECONDS COMMAND...: until the command succeeds
    local end=$((SECONDS + $1)); shift
    until "$@"; do ((SECONDS < end)) || return 1; sleep 0.5; done
}

install -m 0644 controller/cachepilot/data/cachepilot.service /etc/systemd/system/cachepilot.service
mkdir -p /etc/systemd/system/cachepilot.service.d /usr/local/bin /etc/cachepilot
# test-only timings: a short watchdog, a prompt abort and restart (the unit's own values are 30 s, 90 s, 5 s)
printf '[Service]\nWatchdogSec=10s\nTimeoutAbortSec=2s\nRestartSec=1s\n' > /etc/systemd/system/cachepilot.service.d/test.conf
# The service runs this checkout's venv. PrivateTmp=yes gives the unit its own /tmp, which hides a checkout under
# /tmp (a fresh clone there failed with 203/EXEC); bind it back read-only, as a real install would live in /usr/local.
case "$PWD/" in /tmp/*) printf 'BindReadOnlyPaths=%s\n' "$PWD" >> /etc/systemd/system/cachepilot.service.d/test.conf ;; esac
ln -sf "$PWD/.venv/bin/cachepilot" /usr/local/bin/cachepilot
cp policies/default.yaml /etc/cachepilot/policy.yaml
printf 'version: 1\npolicies: [/etc/cachepilot/policy.yaml]\ntick: 1s\nmetrics: {listen: 127.0.0.1:9854}\n' \
    > /etc/cachepilot/config.yaml
systemctl daemon-reload

# the unit as systemd parsed it: verify, the settings, the online security score
systemd-analyze verify cachepilot.service && say verify ok
systemctl show cachepilot -p LoadState -p Type -p NotifyAccess -p Restart -p StartLimitBurst \
    -p RestartPreventExitStatus -p ProtectSystem -p ProtectHome -p NoNewPrivileges -p DevicePolicy \
    -p MemoryMax -p TasksMax -p KillMode -p CapabilityBoundingSet -p PrivateDevices -p ProtectKernelTunables \
    -p StateDirectory -p DeviceAllow -p ExecStart
systemd-analyze security cachepilot.service --no-pager \
    | sed -n 's/.*Overall exposure level for cachepilot.service: \([0-9.]*\).*/security=\1/p'

start=$SECONDS
systemctl start cachepilot; say start_rc $?
say start_s $((SECONDS - start))
say active "$(show ActiveState)"
say ready_metric "$(metric cachepilot_ready)"
say observe_only "$(metric cachepilot_observe_only)"
pid1=$(show MainPID)
cachepilot status --json > /dev/null && say status_rc 0

# the hardening lets the daemon act: a deleted file's extents become a FITRIM discard
dd if=/dev/urandom of="$LAB_MOUNT/dead" bs=1M count=4 conv=fsync status=none
rm "$LAB_MOUNT/dead"
sync
discarded() { local v; v=$(metric_sum cachepilot_volume_discard_issued_bytes_total); [[ -n $v && $v != 0 && $v != 0.0 ]]; }
wait_for 60 discarded
say discard_issued "$(metric_sum cachepilot_volume_discard_issued_bytes_total)"

# reload with a broken policy: refused (`systemctl reload` fails: ExecReload waits for the verdict), the daemon
# runs on with the old one
printf 'version: 1\ndefaults: {failure_model: sometimes}\n' > /etc/cachepilot/policy.yaml
systemctl reload cachepilot; say reload_rc $?
wait_for 30 test "$(metric cachepilot_policy_last_reload_success)" = 0.0
say reload_success "$(metric cachepilot_policy_last_reload_success)"
say reload_failures "$(metric cachepilot_policy_reload_failures_total)"
say active_after_reload "$(show ActiveState)"
cp policies/default.yaml /etc/cachepilot/policy.yaml

# a hung loop: the watchdog kills it and systemd starts it again
kill -STOP "$pid1"
wait_for 60 test "$(show NRestarts)" -ge 1
say restarts "$(show NRestarts)"
wait_for 120 test "$(show ActiveState)" = active
say active_after_restart "$(show ActiveState)"
say new_pid "$([[ $(show MainPID) != "$pid1" ]] && echo yes || echo no)"
journalctl -u cachepilot --no-pager -o cat 2>/dev/null | grep -qi 'watchdog timeout' && say watchdog_logged yes

# a clean stop: the cache stays as the daemon left it (no switch on the way out)
mode_before=$(cat "$LAB_BCACHE_SYSFS/cache_mode")
systemctl stop cachepilot
say stop_result "$(show Result)"
say stop_status "$(show ExecMainStatus)"
say mode_same "$([[ $(cat "$LAB_BCACHE_SYSFS/cache_mode") == "$mode_before" ]] && echo yes || echo no)"
say denied "$(journalctl -u cachepilot --no-pager -o cat 2>/dev/null | grep -ciE 'permission denied|operation not permitted')"
journalctl -u cachepilot --no-pager -o cat 2>/dev/null | tail -n 40 >&2
