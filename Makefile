# cachepilot — one-command set-up, tests, lab, demo and benchmarks.
# `make deps` installs everything (idempotent; a second run downloads nothing), `make test` runs every test level.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT      := $(abspath .)
VENV      := $(ROOT)/.venv
PY        := $(VENV)/bin/python
PYTEST    := $(VENV)/bin/pytest
RUFF      := $(VENV)/bin/ruff
LAB_CACHE := $(ROOT)/.cache/lab
# make test's parallel workers (the lab guests run single-threaded TCG: one guest per core).
TEST_JOBS ?= 2
BASE_PY   ?= $(shell command -v python3.11 || command -v python3)

# Debian packages the project needs on the host (and, through the shared root, in the lab guest).
APT_PACKAGES := clang llvm libbpf-dev libbpf1 bpftool make gcc \
	qemu-system-x86 qemu-utils busybox-static cpio zstd xz-utils kmod \
	bcache-tools dmsetup lvm2 thin-provisioning-tools e2fsprogs xfsprogs util-linux fio dbench \
	prometheus prometheus-node-exporter ansible ansible-lint yamllint systemd procps file openssh-server curl \
	python3-yaml python3-jsonschema python3-numpy python3-zstandard python3-rich \
	python3-bpfcc

.PHONY: help deps deps-system deps-python deps-lab bpf lint test test-unit test-bpf test-vm test-ops \
	demo bench bench-all bench-grid soak lab-shell package clean distclean generated

help:
	@echo "make deps       install system packages, the virtualenv, the lab kernel and initramfs"
	@echo "make demo       boot the lab and show cachepilot on a real cached volume"
	@echo "make test       lint + every test level (unit, bpf, vm, ops)"
	@echo "make bench      benchmarks (not part of make test)"
	@echo "make bench-all  the stock grid search, make bench, the other outside workloads, W2-W5"
	@echo "make soak       the daemon for SOAK_MINUTES (30) in the lab under load and disruptions (not in bench)"
	@echo "make lab-shell  an interactive shell in the lab guest"
	@echo "make package    dist/: a wheel with the BPF object inside, and cachepilot_<version>_amd64.deb"
	@echo "make generated  the schema, the role's policy checks and docs/policy-reference.md from the policy table"

deps: deps-system deps-python deps-lab bpf

# Only touch apt when something is missing, so a second run is fast and offline.
deps-system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "deps-system: installing:" $$missing; \
		apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps-system: all packages present"; fi

$(VENV)/.stamp: pyproject.toml
	@[ -x $(PY) ] || $(BASE_PY) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

deps-python: $(VENV)/.stamp

deps-lab:
	tests/vm/fetch-kernel.sh $(LAB_CACHE)
	tests/vm/build-initramfs.sh $(LAB_CACHE)
	tests/vm/fetch-headers.sh $(LAB_CACHE)

bpf:
	@if [ -f bpf/Makefile ]; then $(MAKE) -C bpf; fi

lint: deps-python
	$(RUFF) check controller tests tests/vm/lab
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture controller/cachepilot --min-confidence 100
	$(PY) tests/import_layers.py controller/cachepilot
	$(PY) tests/kind_names.py controller/cachepilot

# The files made from the policy's field table (controller/cachepilot/policy/model.py): the schema, the Ansible
# role's early check list and the policy reference. Unit tests (tests/unit/test_policy_table.py) fail when a
# committed one differs from what the table makes.
generated: deps-python
	$(PY) -m cachepilot.policy.schema > policies/schema.json
	$(PY) -m cachepilot.policy.fields > playbooks/roles/cachepilot/files/policy_fields.json
	$(PY) -m cachepilot.policy.reference > docs/policy-reference.md

# One pytest run over every level that exists; each level's fixtures do their own set-up (tracefs, loop devices, the lab).
test: deps-python bpf lint
	# whole files per worker in collection order (not xdist's reorder by test count): the longest lab files first
	# (tests/conftest.py, LONGEST_FIRST), the rest of the lab level next, the short unit tests fill the tail
	$(PYTEST) -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=30 \
		$(wildcard tests/vm tests/bpf tests/ops tests/unit)

test-unit: deps-python
	$(PYTEST) tests/unit
test-bpf: deps-python bpf
	$(PYTEST) tests/bpf
test-vm: deps-python
	$(PYTEST) tests/vm
test-ops: deps-python
	$(PYTEST) tests/ops

demo: deps-python bpf
	tests/vm/demo.sh

# make bench = the host micro-benchmarks (a few minutes; bench_probe.py, ~3 min, runs on its own), the headline W1
# (issue 31: 5 rounds of cachepilot, write-through and the best stock configurations the grid found in
# tests/bench/results/stock_grid_bcache.json) and one outside workload (Debian's dbench, fsync after every write),
# then summary.py. The lab runs two guests at a time on a 2-core machine (BENCH_JOBS=1: one at a time).
# BENCH_QUICK=1: the development variant (one round, short windows): it checks that the set runs and proves nothing.
# make bench-all = the stock grid searches first (bcache on W1's workload, dm-writecache on W4's; they rewrite the
# grids' results), make bench, then the other outside workloads, W1 and dbench -F's stock write-back rows, W1's
# cp-paced, and W2-W5 (varmail, Zipf readers on dm-cache, dm-writecache against the grid's find, hot large files on
# bcache while a backup streams).
BENCH_QUICK ?=
# make bench's rows: what its goal lines compare (the shipped default, write-through, the grid's two finds); stock
# write-back at its defaults and cp-paced run in bench-all. Six W1 rows and four dbench rows took 44 + 22 min on
# 2026-11-28; these four and three took 28 + 18 min, `make bench` 53 min 06 s end to end (2026-11-29, timed).
BENCH_W1_CONFIGS      ?= cp-destructive,wt,best-bounded,best-overall
BENCH_OUTSIDE_CONFIGS ?= wt,best-bounded,cp-destructive
BENCH_HOST     := $(filter-out tests/bench/bench_lab% tests/bench/bench_probe.py,$(wildcard tests/bench/bench_*.py))
BENCH_HEADLINE := $(sort $(wildcard tests/bench/bench_lab_headline_*.py))
BENCH_REST     := tests/bench/bench_lab_varmail.py tests/bench/bench_lab_zipf.py tests/bench/bench_lab_writecache.py \
                  tests/bench/bench_lab_hotlarge.py
# The stock grids' results are artefacts of a search: made once (make bench-grid re-runs them), then kept in git.
STOCK_GRID := tests/bench/results/stock_grid_bcache.json
STOCK_GRID_WC := tests/bench/results/stock_grid_writecache.json
$(STOCK_GRID):
	$(PY) tests/bench/bench_lab_stock_grid.py --write
$(STOCK_GRID_WC):
	$(PY) tests/bench/bench_lab_stock_grid.py --kind writecache --reps 1 --write

bench: deps-python bpf $(STOCK_GRID)
	@set -e; for b in $(BENCH_HOST); do echo "== $$b"; $(PY) $$b; done; \
	for b in $(BENCH_HEADLINE); do echo "== $$b"; $(PY) $$b --configs $(BENCH_W1_CONFIGS) $(if $(BENCH_QUICK),--quick); done; \
	echo "== tests/bench/bench_lab_outside.py"; $(PY) tests/bench/bench_lab_outside.py --tools dbench-fsync \
		--configs $(BENCH_OUTSIDE_CONFIGS) $(if $(BENCH_QUICK),--quick); \
	$(PY) tests/bench/summary.py

bench-grid: deps-python bpf
	$(PY) tests/bench/bench_lab_stock_grid.py $(if $(BENCH_QUICK),--quick,--write)
	$(PY) tests/bench/bench_lab_stock_grid.py --kind writecache $(if $(BENCH_QUICK),--quick,--reps 1 --write)

bench-all: bench-grid bench
	@set -e; $(PY) tests/bench/bench_lab_headline_fileserver.py --configs wb,cp-paced $(if $(BENCH_QUICK),--quick); \
	$(PY) tests/bench/bench_lab_outside.py --tools dbench-fsync --configs wb $(if $(BENCH_QUICK),--quick); \
	$(PY) tests/bench/bench_lab_outside.py --tools dbench,fio-fileset,fio-db $(if $(BENCH_QUICK),--quick); \
	for b in $(BENCH_REST); do echo "== $$b"; $(PY) $$b $(if $(BENCH_QUICK),--quick); done; \
	$(PY) tests/bench/summary.py

# The soak takes the lab for SOAK_MINUTES plus ~10 min of set-up: one guest, under the lab lock.
SOAK_MINUTES ?= 30
soak: deps-python bpf
	flock /tmp/cachepilot-lab.lock $(PY) tests/bench/bench_lab_soak.py --minutes $(SOAK_MINUTES)

lab-shell:
	tests/vm/lab shell

# The wheel carries the CO-RE object (built once, relocates on any kernel with BTF); the .deb installs it under
# Debian's Python with Debian's modules, the unit, an example configuration, the default policy and a man page.
# make package [VERSION=0.1.3]: the version of this build (default: cachepilot.__version__); reproducible from the
# last commit's time (SOURCE_DATE_EPOCH), so two builds of one commit are byte-identical
package: deps-python bpf
	controller/packaging/build-package.sh $(ROOT) $(PY) $(VERSION)

clean:
	rm -rf build dist .pytest_cache .ruff_cache
	@if [ -f bpf/Makefile ]; then $(MAKE) -C bpf clean; fi

distclean: clean
	rm -rf $(VENV) .cache
