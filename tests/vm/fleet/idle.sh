#!/bin/bash
# Lab guest of the upgrade test (tests/vm/test_upgrade_lab.py): nothing of its own; Ansible drives it over SSH until
# the test ends the run (lab-finish).
set -u
while :; do sleep 5; done
