#!/bin/bash
# Lab guest of the two-guest rollout (tests/vm/test_fleet_lab.py): while Ansible installs cachepilot over SSH and
# Prometheus scrapes it, a light, steady workload on the cached volume gives every dashboard panel something to
# show — fsynced writes (barriers, epochs, dirty data), direct reads of what was just written (cache hits) and of
# older files (misses), deletes (freed extents the daemon discards). It starts once the role has started the daemon
# (the rollout itself runs on a quiet guest: under TCG every busy cycle slows Ansible's steps) and runs until the
# test ends the run (lab-finish).
set -u
cd "$LAB_MOUNT" || exit 1
until systemctl is-active -q cachepilot; do sleep 2; done
i=0
while :; do
    dd if=/dev/zero of="w$((i % 6))" bs=64k count=8 conv=fsync status=none
    dd if="w$((i % 6))" of=/dev/null bs=64k iflag=direct status=none
    dd if="w$(((i + 3) % 6))" of=/dev/null bs=64k iflag=direct status=none 2>/dev/null
    rm -f "w$(((i + 2) % 6))"
    i=$((i + 1))
    sleep 2
done
