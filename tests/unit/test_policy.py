"""Policy files: schema, line-numbered errors, overlap detection, resolution, last-good reload."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot.cli import main
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import PolicyStore, load_policy, parse_duration, parse_policy, parse_size
from cachepilot.policy.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((Path(__file__).parent / "data" / "policies").glob("bad_*.yaml"))
SHIPPED = sorted((ROOT / "policies").glob("*.yaml"))


def _expect(path: Path) -> tuple[int, str]:
    m = re.match(r'# expect: line (\d+), "([^"]+)"', path.read_text().splitlines()[0])
    assert m, f"{path} lacks its '# expect:' header"
    return int(m.group(1)), m.group(2)


def test_there_are_bad_examples() -> None:
    assert len(BAD) >= 10


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_policy_names_file_and_line(path: Path) -> None:
    line, needle = _expect(path)
    with pytest.raises(UserError) as ei:
        load_policy(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:{line}:"), msg
    assert needle in msg


@pytest.mark.parametrize("path", BAD[:3], ids=lambda p: p.name)
def test_policy_check_cli_one_line_no_traceback(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert f"{path}:" in err


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_policies_are_valid(path: Path) -> None:
    pol = load_policy(path)
    assert pol.half_life_s > 0


def test_default_policy_is_conservative() -> None:
    pol = load_policy(ROOT / "policies" / "default.yaml")
    d = pol.defaults
    assert d.failure_model == "destructive"
    assert d.exposure.max_dirty <= 256 << 20
    assert d.promotion.max_cache_fraction <= 0.5
    assert not d.knobs
    assert pol.rules == ()


def test_schema_file_matches_module() -> None:
    assert json.loads((ROOT / "policies" / "schema.json").read_text()) == SCHEMA


def test_units() -> None:
    assert parse_size("4MiB") == 4 << 20
    assert parse_size("1.5 KiB") == 1536
    assert parse_size("10MB") == 10_000_000
    assert parse_size(7) == 7
    assert parse_duration("5m") == 300
    assert parse_duration("250ms") == 0.25
    assert parse_duration(3) == 3.0
    for bad in (-1, "lots", True):
        with pytest.raises(ValueError):
            parse_size(bad)  # type: ignore[arg-type]


TEXT = """
version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 64MiB, max_age: 30s}
volumes:
  - name: db
    match: {mountpoint: /var/lib/db}
    failure_model: recoverable
    exposure: {max_age: 5s}
  - name: bc1
    match: {device: "bcache1"}
    knobs: {sequential_cutoff: 0}
"""


def test_resolution_and_merge() -> None:
    pol = parse_policy(TEXT, "t.yaml")
    db, by = pol.resolve(VolumeInfo(dev=1, name="bcache0", mountpoint="/var/lib/db/"))
    assert by == "db" and db.failure_model == "recoverable"
    assert db.exposure.max_age_s == 5 and db.exposure.max_dirty == 64 << 20  # merged with defaults
    other, by = pol.resolve(VolumeInfo(dev=2, name="bcache7"))
    assert by == "defaults" and other.failure_model == "destructive"
    bc1, _ = pol.resolve(VolumeInfo(dev=3, name="bcache1"))
    assert bc1.knobs == {"sequential_cutoff": "0"}


def test_volume_matching_two_rules_is_an_error() -> None:
    pol = parse_policy(TEXT, "t.yaml")
    with pytest.raises(UserError, match="overlapping selectors"):
        pol.resolve(VolumeInfo(dev=1, name="bcache1", mountpoint="/var/lib/db"))


def test_reload_keeps_last_good(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("version: 1\ndefaults: {failure_model: recoverable}\n")
    store = PolicyStore(f)
    assert store.policy.defaults.failure_model == "recoverable"
    f.write_text("version: 1\ndefaults: {failure_model: nope}\n")
    assert store.reload() is False
    assert store.policy.defaults.failure_model == "recoverable"
    assert store.last_error and f"{f}:2:" in store.last_error
    f.write_text("version: 1\ndefaults: {failure_model: auto}\n")
    assert store.reload() is True
    assert store.policy.defaults.failure_model == "auto"


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_cli_subprocess_ok() -> None:
    out = subprocess.run([sys.executable, "-m", "cachepilot.cli", "policy", "check", "-v",
                          str(ROOT / "policies" / "default.yaml")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "failure_model=destructive" in out.stdout


def test_builtin_default_equals_shipped_default() -> None:
    import dataclasses

    from cachepilot.policy import DEFAULT_POLICY

    shipped = load_policy(ROOT / "policies" / "default.yaml")
    assert dataclasses.replace(shipped, source="<built-in>") == DEFAULT_POLICY


def test_kind_selector_resolves_and_does_not_overlap_other_kinds() -> None:
    from cachepilot.policy.capcheck import glob_can_start_with, matchable_kinds
    pol = parse_policy("version: 1\nvolumes:\n"
                       "  - {name: b, match: {kind: bcache}, knobs: {writeback_percent: 10}}\n"
                       "  - {name: d, match: {kind: dm-cache}, knobs: {migration_threshold: 4096}}\n", "k.yaml")
    assert pol.resolve(VolumeInfo(1, "bcache0", kind="bcache"))[1] == "b"
    assert pol.resolve(VolumeInfo(2, "dm-3", kind="dm-cache"))[1] == "d"
    assert pol.resolve(VolumeInfo(3, "dm-4", kind="dm-writecache"))[1] == "defaults"
    assert matchable_kinds({"device": "bcache*"}) == ("bcache",)
    assert matchable_kinds({"device": "dm-[0-9]"}) == ("dm-cache", "lvmcache", "dm-writecache")
    assert matchable_kinds({"device": "*"}) == ("bcache", "dm-cache", "lvmcache", "dm-writecache")
    assert matchable_kinds({"device": "sd?"}) == ()
    assert glob_can_start_with("b?a*", "bcache") and not glob_can_start_with("b?x*", "bcache")
    with pytest.raises(UserError, match="overlaps"):
        parse_policy("version: 1\nvolumes:\n  - match: {kind: bcache}\n  - match: {kind: bcache, mountpoint: /x}\n")
