"""The indexed (linear) overlap check between volume rules agrees with the pairwise definition, within one policy
file and across the files one daemon combines."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.cli import main
from cachepilot.daemon.config import load_config
from cachepilot.errors import UserError
from cachepilot.policy.loader import load_policy
from cachepilot.policy.model import Policy, Rule, Selector, VolumePolicy
from cachepilot.policy.overlaps import _covers, check_combined, check_overlaps
from cachepilot.policy.reader import Doc

_sel = st.builds(
    Selector,
    device=st.sampled_from([None, "bcache0", "bcache1", "bcache*", "dm-?", "dm-1"]),
    fs_uuid=st.sampled_from([None, "abcd-1234", "ABCD-1234", "ffff-0000"]),
    mountpoint=st.sampled_from([None, "/srv", "/srv/", "/var"]),
    kind=st.sampled_from([None, "bcache", "dm-cache"]),
).filter(lambda s: any((s.device, s.fs_uuid, s.mountpoint, s.kind)))


@settings(max_examples=400, deadline=None)
@given(st.lists(_sel, min_size=1, max_size=6))
def test_indexed_overlap_check_matches_pairwise(sels: list[Selector]) -> None:
    rules = [Rule(name=f"r{i}", selector=s, policy=VolumePolicy(), line=i + 1) for i, s in enumerate(sels)]
    pairwise = any(_covers(a.selector, b.selector) or _covers(b.selector, a.selector)
                   for i, a in enumerate(rules) for b in rules[:i])
    try:
        check_overlaps(Doc("p.yaml", None, {}, {}), rules)
        indexed = False
    except UserError:
        indexed = True
    assert indexed == pairwise


# -- several policy files, as one daemon combines them (issue 24) ------------------------------------------------

def _write(tmp: Path, name: str, rules: list[dict[str, object]]) -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump({"version": 1, "volumes": rules}))
    return p


def _files(tmp: Path, second: dict[str, str]) -> tuple[Path, Path, Path]:
    a = _write(tmp, "main.yaml", [{"name": "db", "match": {"device": "bcache*"}}])
    b = _write(tmp, "extra.yaml", [{"name": "logs", "match": second}])
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"version": 1, "policies": [str(a), str(b)], "state_dir": str(tmp / "st")}))
    return a, b, config


def test_overlapping_files_each_valid_alone_are_refused_together(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a, b, config = _files(tmp_path, {"device": "bcache0"})
    assert main(["policy", "check", str(a)]) == 0 and main(["policy", "check", str(b)]) == 0
    capsys.readouterr()
    assert main(["policy", "check", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"{b}:" in err and f"({a}:" in err and "'logs' overlaps rule 'db'" in err, err
    assert main(["run", "--check", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{b}:" in err and f"{a}:" in err, err
    with pytest.raises(UserError, match="overlaps rule 'db'"):
        load_config(config)


def test_files_that_do_not_overlap_pass_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, config = _files(tmp_path, {"device": "dm-*"})
    assert main(["policy", "check", str(a), str(b)]) == 0
    assert "2 files together: OK" in capsys.readouterr().out
    assert main(["run", "--check", "--config", str(config)]) == 0


def test_the_same_file_named_twice_overlaps_itself(tmp_path: Path) -> None:
    a = _write(tmp_path, "main.yaml", [{"name": "db", "match": {"device": "bcache*"}}])
    with pytest.raises(UserError, match=r"main.yaml:\d+: .* overlaps rule 'db'"):
        check_combined([load_policy(a), load_policy(a)])


@settings(max_examples=200, deadline=None)
@given(st.lists(_sel, min_size=1, max_size=4), st.lists(_sel, min_size=1, max_size=4))
def test_combined_check_matches_pairwise_across_files(one: list[Selector], two: list[Selector]) -> None:
    def policy(name: str, sels: list[Selector]) -> Policy:
        return Policy(source=name, defaults=VolumePolicy(), rules=tuple(
            Rule(name=f"{name}{i}", selector=s, policy=VolumePolicy(), line=i + 1) for i, s in enumerate(sels)))

    p1, p2 = policy("a", one), policy("b", two)
    within = [list(p1.rules), list(p2.rules)]
    if any(_covers(x.selector, y.selector) for rules in within for i, x in enumerate(rules) for y in rules[:i]) or \
            any(_covers(y.selector, x.selector) for rules in within for i, x in enumerate(rules) for y in rules[:i]):
        return  # each file alone would already be refused
    across = any(_covers(x.selector, y.selector) or _covers(y.selector, x.selector)
                 for x in p1.rules for y in p2.rules)
    try:
        check_combined([p1, p2])
        refused = False
    except UserError:
        refused = True
    assert refused == across
