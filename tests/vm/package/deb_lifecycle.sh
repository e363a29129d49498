#!/bin/bash
# Lab (--init systemd, recipe bcache): the Debian package on a host that cannot see the checkout. Copies only the
# .deb into the guest's memory, hides the checkout under a tmpfs (in systemd's own mount namespace, so the unit
# cannot see it either), installs with apt (no network: the dependencies are the host's packages, shared), starts
# the unit as packaged, promotes a file owned by an unprivileged user, discards a deleted one, reloads a broken
# policy (the reload fails, the old policy runs on), stops clean. Reports key=value lines.
set -u
say() { echo "$1=$2"; }
show() { systemctl show cachepilot -p "$1" --value; }
metric() {  # metric NAME: the sum of its samples ("" if absent)
    /usr/bin/python3 -c "import urllib.request,sys
t = urllib.request.urlopen('http://127.0.0.1:9854/metrics', timeout=5).read().decode()
v = [float(l.split()[-1]) for l in t.splitlines() if l.split('{')[0].split(' ')[0] == sys.argv[1]]
print(sum(v) if v else '')" "$1" 2>/dev/null
}
wait_for() {  # wait_for SECONDS COMMAND...: until the command succeeds
    local end=$((SECONDS + $1)); shift
    until "$@"; do ((SECONDS < end)) || return 1; sleep 0.5; done
}

knobs() { local k; for k in writeback_delay writeback_percent sequential_cutoff; do
    printf '%s=%s ' "$k" "$(cat "$LAB_BCACHE_SYSFS/$k")"; done; }
say knobs_before "$(knobs)"
checkout=$PWD
deb=$(ls "$checkout"/dist/cachepilot_*_amd64.deb | tail -n 1)
mkdir -p /root/pkg && cp "$deb" /root/pkg/ && cd /root/pkg || exit 1
mount -t tmpfs -o ro,size=1m hidden "$checkout" || exit 1
trap 'cd /; umount "$checkout"' EXIT
say checkout_hidden "$([[ ! -e $checkout/controller && ! -e $checkout/.venv ]] && echo yes || echo no)"
say importable_before "$(env -i /usr/bin/python3 -c 'import cachepilot' 2>/dev/null && echo yes || echo no)"
say on_path_before "$(command -v cachepilot >/dev/null && echo yes || echo no)"

# apt in the guest sees this host's lists (60 000 packages and no pkgcache): under TCG parsing them was ~20 s of a
# 31 s install. Offline, the dependencies can only come from what is installed either way: hide the lists.
mount -t tmpfs -o size=1m,mode=0755 nolists /var/lib/apt/lists || exit 1
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "/root/pkg/${deb##*/}" >apt.log 2>&1
rc=$?
say install_rc $rc
tail -n 5 apt.log >&2
((rc == 0)) || exit 1
say module_path "$(env -i /usr/bin/python3 -c 'import cachepilot; print(cachepilot.__file__)')"
say version "$(/usr/bin/cachepilot --version)"
say enabled "$(systemctl is-enabled cachepilot 2>/dev/null)"
say exec_start "$(show ExecStart | sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p' | tr -s ' ')"
say exec_reload "$(show ExecReload | sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p' | tr -s ' ')"
say caps "$(show CapabilityBoundingSet)"
say wants "$(show Wants)"

# The hot file below is read through the page cache: bcache inserts those misses itself, so the shipped rule
# (promotion.only_uncached) rightly skips it. This test is about the promotion read of a file root does not own
# (O_NOATIME needs CAP_FOWNER), so the installed policy is told to promote what is hot regardless.
sed -i 's/only_uncached: true/only_uncached: false/' /etc/cachepilot/policy.yaml
grep -q 'only_uncached: false' /etc/cachepilot/policy.yaml || { echo "policy.yaml: no only_uncached to turn off" >&2; exit 1; }
start=$SECONDS
systemctl enable cachepilot 2>/dev/null  # the enablement link purge must take away
systemctl start cachepilot; say start_rc $?
say start_s $((SECONDS - start))
say active "$(show ActiveState)"
say ready_metric "$(metric cachepilot_ready)"
probe() { /usr/bin/python3 -c "import urllib.request, urllib.error, sys
try:
    r = urllib.request.urlopen('http://127.0.0.1:9854' + sys.argv[1], timeout=5); print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())" "$1" 2>&1; }
say healthz "$(probe /healthz)"
say ready "$(probe /ready)"
say knobs_running "$(knobs)"
say warnings_at_start "$(journalctl -u cachepilot --no-pager -o cat | grep -c ': WARNING: ')"  # the daemon's own level: journald sees stderr as info
say fresh_start "$(journalctl -u cachepilot --no-pager -o cat | grep -m1 'starting fresh')"
journalctl -u cachepilot --no-pager -o cat | grep -m1 'probe:' >&2

# a hot file owned by an unprivileged user: the promotion read opens it O_NOATIME (CAP_FOWNER)
mkdir -p "$LAB_MOUNT/users" && chmod 0755 "$LAB_MOUNT/users"
dd if=/dev/urandom of="$LAB_MOUNT/users/hot" bs=256k count=1 conv=fsync status=none
chown nobody:nogroup "$LAB_MOUNT/users/hot"
say hot_owner "$(stat -c %U "$LAB_MOUNT/users/hot")"
# buffered reads from the volume (the page cache dropped each time): the probe attributes them to the file
for _ in 1 2 3 4; do echo 1 > /proc/sys/vm/drop_caches; cat "$LAB_MOUNT/users/hot" > /dev/null; sleep 1; done
promotes() { cachepilot explain --json 2>/dev/null | /usr/bin/python3 -c "import json,sys
d = [x for x in json.load(sys.stdin) if x['kind'] == 'promote']
print(' '.join(sorted({x['status'] for x in d})), '|', ' '.join(x.get('detail', '') for x in d if x['status'] != 'done'))"; }
wait_for 60 bash -c "cachepilot explain --json 2>/dev/null | grep -q '\"kind\": \"promote\"'"
sleep 3
say promote "$(promotes)"
say promoted_bytes "$(metric cachepilot_volume_promoted_bytes_total)"

# a deleted file's extents become a FITRIM discard
dd if=/dev/urandom of="$LAB_MOUNT/users/dead" bs=1M count=4 conv=fsync status=none
rm "$LAB_MOUNT/users/dead"
sync
discarded() { local v; v=$(metric cachepilot_volume_discard_issued_bytes_total); [[ -n $v && $v != 0 && $v != 0.0 ]]; }
wait_for 60 discarded
say discard_issued "$(metric cachepilot_volume_discard_issued_bytes_total)"

# reload with a broken policy: `systemctl reload` fails, the daemon runs on with the old one
cp /etc/cachepilot/policy.yaml policy.good
printf 'version: 1\ndefaults: {failure_model: sometimes}\n' > /etc/cachepilot/policy.yaml
systemctl reload cachepilot; say reload_rc $?
say reload_success "$(metric cachepilot_policy_last_reload_success)"
say active_after_reload "$(show ActiveState)"
say refusal_logged "$(journalctl -u cachepilot --no-pager -o cat | grep -c 'reload refused, the running policy is kept')"
cp policy.good /etc/cachepilot/policy.yaml
systemctl reload cachepilot; say good_reload_rc $?

systemctl stop cachepilot
say stop_result "$(show Result)"
say stop_status "$(show ExecMainStatus)"
say denied "$(journalctl -u cachepilot --no-pager -o cat | grep -ciE 'permission denied|operation not permitted')"
journalctl -u cachepilot --no-pager -o cat | tail -n 30 >&2
say knobs_after_stop "$(knobs)"

# purge: nothing of ours is left (files, links, directories), bytecode compiled here and the wants link included
env -i /usr/bin/python3 -c 'import cachepilot.cli'  # compile some bytecode, as any import on the host does
systemctl start cachepilot && systemctl stop cachepilot  # a state file and the unit's directories exist
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q cachepilot >purge.log 2>&1; say purge_rc $?
say purge_warnings "$(grep -ci 'warning' purge.log)"
grep -i warning purge.log >&2
say residue "$(find /usr/lib/python3/dist-packages/cachepilot* /etc/cachepilot /var/lib/cachepilot /var/cache/cachepilot \
    /run/cachepilot /usr/share/doc/cachepilot /lib/systemd/system/cachepilot.service /usr/bin/cachepilot \
    /etc/systemd/system -name '*cachepilot*' 2>/dev/null | sort -u | tr '\n' ' ')"
say dpkg_status "$(dpkg-query -W -f='${db:Status-Abbrev}' cachepilot 2>&1)"
