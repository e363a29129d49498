"""The indexed (linear) overlap check between volume rules agrees with the pairwise definition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.errors import UserError
from cachepilot.policy.loader import _check_overlaps, _covers, _Doc
from cachepilot.policy.model import Rule, Selector, VolumePolicy

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
        _check_overlaps(_Doc("p.yaml", None, {}, {}), rules)
        indexed = False
    except UserError:
        indexed = True
    assert indexed == pairwise
