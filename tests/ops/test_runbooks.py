"""The runbooks work as written: every `cachepilot ...` command in them parses with the real command line (its
subcommand and options exist), every setting they name exists (in the daemon's configuration schema, the policy
schema, the knobs, or is one of the words the metrics use), every hand write to sysfs or a dm table comes after the
advice to pause the daemon (it puts its own settings back otherwise), a latch is cleared with `cachepilot
clear-latch`, and the memory figures agree with README's measured ones."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
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


def test_memory_figures_are_readmes_measured_ones() -> None:
    readme = (ROOT / "README.md").read_text()
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

