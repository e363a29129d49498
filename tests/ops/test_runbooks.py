"""The runbooks work as written: every `cachepilot ...` command in them parses with the real command line (its
subcommand and options exist), every setting they name exists (in the daemon's configuration schema, the policy
schema, the knobs, or is one of the words the metrics use), every hand write to sysfs or a dm table comes after the
advice to pause the daemon (it puts its own settings back otherwise), a latch is cleared with `cachepilot
clear-latch`, and the memory figures agree with the measured ones in docs/kernel.md."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ops_support import DASHBOARDS, ROOT

from cachepilot.capabilities import KNOBS
from cachepilot.cli import build_parser
from cachepilot.daemon.config import SCHEMA as CONFIG_SCHEMA
from cachepilot.exporter.snapshot import DECISION_KINDS, FAILURE_KINDS, MODES, UNMANAGED_REASONS
from cachepilot.policy.schema import SCHEMA as POLICY_SCHEMA

pytestmark = pytest.mark.ops

RUNBOOKS = sorted((DASHBOARDS / "runbooks").glob("*.md"))
# Words runbooks quote that are no setting: the kernel's sysfs attributes and dm status words they tell operators to
# read, the probe's drop kinds, systemd's words.
KERNEL_WORDS = {"cache_mode", "dirty_data", "writeback_running", "writeback_percent", "writeback_rate",
                "writeback_rate_debug", "io_errors", "needs_check", "stats_five_minute", "cache_hit_ratio",
                "cache_bypass_hits", "cache_bypass_misses", "ringbuf_full", "hotness_map_full", "start-limit-hit"}
HAND_WRITE = re.compile(r"echo [^`]*> */sys/|echo [^`]*> \.\.\./|dmsetup` reload|dmsetup (reload|message|suspend)|"
                        r"lvchange --cache|lvconvert")
PAUSE = re.compile(r"systemctl stop cachepilot|`dry_run: true`")


def spans(text: str) -> Iterator[str]:
    """Inline code spans and the lines of fenced blocks."""
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        yield from (line.strip() for line in block.splitlines() if line.strip())
    yield from re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))


def commands() -> list[tuple[str, str]]:
    return [(book.name, s) for book in RUNBOOKS for s in spans(book.read_text()) if s.startswith("cachepilot ")]


def schema_keys(schema: Any) -> Iterator[tuple[str, ...]]:
    """Every key path of a JSON schema (through objects, arrays, and $defs by reference)."""
    defs = schema.get("$defs", {})

    def walk(node: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            yield from walk(defs.get(node["$ref"].rsplit("/", 1)[-1], {}), path)
        for key, sub in node.get("properties", {}).items():
            yield (*path, key)
            yield from walk(sub, (*path, key))
        for key in ("items", "additionalProperties"):
            yield from walk(node.get(key), path)
        for key in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(key, []):
                yield from walk(sub, path)

    yield from walk(schema, ())


def settings() -> set[str]:
    """What a runbook may call a setting: a key or dotted key path of the configuration or a policy (as
    ``defaults.x.y``, ``x.y`` or ``y``), a knob."""
    out: set[str] = set(KNOBS)
    for schema in (CONFIG_SCHEMA, POLICY_SCHEMA):
        for path in schema_keys(schema):
            out.update(".".join(path[i:]) for i in range(len(path)))
    return out


def test_every_cachepilot_command_parses_with_the_real_command_line() -> None:
    assert len(commands()) >= 10
    for book, command in commands():
        argv = [re.sub(r"<[^>]+>", "x", w) for w in shlex.split(command.split("|")[0])][1:]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                args = build_parser(argv[0]).parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{book}: `{command}` does not parse (exit {exc.code}): {err.getvalue().strip()}")
        assert getattr(args, "handler", None) is not None, f"{book}: `{command}` names no command"


def test_every_setting_a_runbook_names_exists() -> None:
    known = settings() | KERNEL_WORDS | set(MODES) | set(DECISION_KINDS) | set(FAILURE_KINDS) | set(UNMANAGED_REASONS)
    for book in RUNBOOKS:
        for s in spans(book.read_text()):
            key = re.match(r"([a-z_][a-z0-9_.]*)(?:: \S+)?$", s)  # a key, a dotted path, or `key: value`
            if key is None or not re.search(r"[_.]|: ", s) or s.startswith("cachepilot_"):
                continue
            assert key.group(1) in known, f"{book.name}: `{s}` is no setting of the configuration or the policies"


def test_advice_to_change_the_configuration_names_a_setting_that_exists() -> None:
    # "raise the ring buffer size in the daemon config" names nothing an operator could write (there is no such key)
    known = settings()
    for book in RUNBOOKS:
        todo = book.read_text().split("## What to do")[1]
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z0-9`])|\n\d+\. ", todo):
            if re.search(r"daemon config|config\.yaml", sentence) and re.search(r"\b(raise|lower|set|change)\b",
                                                                                 sentence):
                named = {s for s in spans(sentence) if s.split(":")[0] in known}
                assert named, f"{book.name}: names no setting that exists: {sentence.strip()[:120]!r}"


def test_the_settings_check_catches_a_key_that_does_not_exist() -> None:
    assert "max_files" in settings() and "hysteresis.min_switch_interval" in settings()
    assert "promotion.rate" in settings() and "mountpoint" in settings() and "sequential_cutoff" in settings()
    assert "ringbuf_bytes" not in settings() and "ring_size" not in settings()


def test_hand_writes_come_after_the_advice_to_pause_the_daemon() -> None:
    writers = []
    for book in RUNBOOKS:
        todo = book.read_text().split("## What to do")[1]
        first = HAND_WRITE.search(todo)
        if first is None:
            continue
        writers.append(book.stem)
        assert PAUSE.search(todo[:first.start()]), f"{book.name}: a hand write before the advice to pause cachepilot"
    assert {"dirty-over-bound", "write-back-stalled", "cache-device-errors"} <= set(writers)


def test_a_latch_is_cleared_with_the_command_that_clears_it() -> None:
    for book in RUNBOOKS:
        text = book.read_text()
        if re.search(r"\bclear(s|ing)?\s+(it|the\s+latch)\b", text.split("## What to do")[1], re.I):
            assert "`cachepilot clear-latch <name>`" in text, book.name


def test_memory_figures_are_the_documented_measured_ones() -> None:
    readme = (ROOT / "docs" / "kernel.md").read_text()
    measured = set(re.findall(r"= ([0-9.]+) bytes of kernel memory per tracked file", readme))
    assert len(measured) == 1, measured
    for book in RUNBOOKS:
        for figure in re.findall(r"([0-9.]+) bytes of kernel memory per tracked", book.read_text()):
            assert {figure} == measured, (book.name, figure, measured)


def test_runbooks_name_only_their_own_paths() -> None:
    # the configuration the unit runs (ExecStart) is the one runbooks tell operators to edit and check
    unit = (ROOT / "controller" / "cachepilot" / "data" / "cachepilot.service").read_text()
    config = re.search(r"--config (\S+)", unit)
    assert config is not None
    for book in RUNBOOKS:
        for path in re.findall(r"/etc/cachepilot/\S*?config\.yaml", book.read_text()):
            assert path == config.group(1), (book.name, path)



# Issue 34 item 7: every command a runbook tells the operator to run is there on a host that has the package and its
# Recommends (or, here, `make deps`), and runs. Each command's package: in the package's Depends/Recommends, in
# APT_PACKAGES, or part of every Debian system (priority required: coreutils, util-linux).
COMMAND_PACKAGES = {"cachepilot": "cachepilot", "systemctl": "systemd", "journalctl": "systemd",
                    "dmsetup": "dmsetup", "lvchange": "lvm2", "lvconvert": "lvm2", "lvs": "lvm2", "bpftool": "bpftool",
                    "sysctl": "procps", "ps": "procps", "vmstat": "procps", "curl": "curl",
                    "cat": "coreutils", "echo": "coreutils", "ls": "coreutils", "df": "coreutils",
                    "findmnt": "util-linux"}
REQUIRED = {"coreutils", "util-linux"}  # Priority: required in Debian


def runbook_commands() -> set[str]:
    """The first word of every code span that is a command line (has arguments), or a lone *-bpfcc tool name."""
    out = set()
    for book in RUNBOOKS:
        for s in spans(book.read_text()):
            word = s.split()[0]
            if re.fullmatch(r"[a-z][a-z0-9.-]*", word) and (" " in s or word.endswith("-bpfcc")):
                out.add(word)
    return out


def test_every_command_a_runbook_names_is_installed_and_runs() -> None:
    control = (ROOT / "controller/packaging/debian/control").read_text()
    fields = dict(line.split(": ", 1) for line in control.splitlines() if ": " in line and not line.startswith(" "))
    shipped = {d.split()[0] for key in ("Depends", "Recommends") for d in fields[key].split(", ")} | {"cachepilot"}
    makefile = (ROOT / "Makefile").read_text()
    apt = set(re.search(r"^APT_PACKAGES := (.*?)\n\n", makefile, re.M | re.S).group(1).replace("\\\n", " ").split())
    named = runbook_commands()
    assert "vmstat" in named and not [c for c in named if c.endswith("-bpfcc")], named  # none of bcc's tools
    unknown = named - set(COMMAND_PACKAGES)
    assert not unknown, f"runbooks name {sorted(unknown)}: add each to COMMAND_PACKAGES with the package that has it"
    for cmd in sorted(named):
        package = COMMAND_PACKAGES[cmd]
        assert package in shipped | apt | REQUIRED, f"{cmd} ({package}): neither Recommends nor make deps installs it"
        # cachepilot: this checkout's (the virtualenv's bin, beside the running Python)
        exe = shutil.which(cmd, path=os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent),
                                                      "/usr/sbin", "/sbin"]))
        assert exe, f"{cmd}: not on this host (make deps)"
        args = ["help"] if cmd == "bpftool" else ["-V"] if cmd in ("ps", "vmstat", "sysctl") else ["--help"]
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and (r.stdout or r.stderr), f"{cmd} {args[0]}: rc {r.returncode} {r.stderr[-300:]}"
