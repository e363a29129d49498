"""Pinning (policy ``pin:``): patterns refused with one line, resolved by a bounded walk that never leaves the mount,
pinned files promoted at start and again when they fell out (not resident, or the cache missed reads since they were
last read), exempt from the sieve and from the believed-cached set, the cap checked against the cache's room, and
shown by status."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachepilot.commands.status import render
from cachepilot.daemon import pinning
from cachepilot.engine import Engine, Promote
from cachepilot.errors import UserError
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.fsfiles import resolve, walk
from cachepilot.models.hotness import F_MEMBER, F_RESIDENT
from cachepilot.models.pins import PinnedFile
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from cachepilot.policy.pinpaths import compile_patterns, pattern_error

NS = 1_000_000_000
DEV = kdev(252, 0)
MiB = 1 << 20


def policy(pin: str = "pin: {paths: [db], max_bytes: 64MiB, refresh: 10s}") -> str:
    return f"""
version: 1
defaults:
  failure_model: recoverable
  promotion: {{enabled: true, rate: 1MiB, max_cache_fraction: 0.5, sieve_size: 64KiB}}
  {pin}
"""


def engine(kind: str = "bcache", cache: int = 1 << 30, text: str | None = None) -> Engine:
    return Engine(parse_policy(text or policy(), "t.yaml"),
                  [VolumeInfo(dev=DEV, name="v0", kind=kind, cache_bytes=cache, mountpoint="/mnt")])


def pin(e: Engine, *inos: int, size: int = 256 << 10) -> None:
    e.set_pins("v0", [PinnedFile(f"db/f{i}", i, 1, size) for i in inos])


def promoted(e: Engine, t: float) -> list[Promote]:
    return [a for a in e.tick(int(t * NS)) if isinstance(a, Promote)]


def sample(e: Engine, t: float, misses: int) -> None:
    e.sample(VolumeSample(DEV, int(t * NS), "writeback", 0, 1000, misses, 0, False, {}, "cset-a", bypasses=0))


# ------------------------------------------------------------------ the policy
@pytest.mark.parametrize("bad, why", [
    ("/etc/passwd", "absolute"), ("db/../etc", "'..'"), ("db//x", "empty"), ("db/[ab", "unbalanced"),
    ("db/**/x", "'**'"), ("db/\nx", "control character"),
])
def test_bad_pin_paths_are_refused_with_one_line(bad: str, why: str) -> None:
    assert why in (pattern_error(bad) or "")
    with pytest.raises(UserError) as e:
        parse_policy(policy(f"pin: {{paths: [{bad!r}], max_bytes: 1MiB}}".replace("'", '"')), "t.yaml")
    assert "t.yaml:6: defaults.pin.paths.0:" in str(e.value) and "\n" not in str(e.value)


def test_a_pin_without_a_cap_or_without_promotion_is_refused() -> None:
    with pytest.raises(UserError, match="max_bytes"):
        parse_policy(policy("pin: {paths: [db]}"), "t.yaml")
    with pytest.raises(UserError, match="cap above 0"):
        parse_policy(policy("pin: {paths: [db], max_bytes: 0}"), "t.yaml")
    with pytest.raises(UserError, match="promotion must be enabled"):
        parse_policy(policy("pin: {paths: [db], max_bytes: 1MiB}").replace("enabled: true", "enabled: false"), "t")


def test_a_cap_past_the_caches_room_is_refused_at_adoption_and_at_reload() -> None:
    with pytest.raises(UserError, match="more than its cache holds"):
        engine(cache=32 * MiB)
    e = engine(cache=128 * MiB)
    with pytest.raises(UserError, match="more than its cache holds"):
        e.set_policy(parse_policy(policy("pin: {paths: [db], max_bytes: 1GiB}"), "t.yaml"))
    assert e.vols[DEV].policy.pin.max_bytes == 64 * MiB  # the running policy kept


# ------------------------------------------------------------------ the walk
def tree(tmp: Path) -> Path:
    for rel in ("db/a", "db/sub/b", "dbx", "logs/x.idx", "logs/old/y.idx", "other/z"):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(b"x" * 10)
    (tmp / "db" / "out").symlink_to(tmp / "other")  # a symbolic link out of the pinned tree
    (tmp / "db" / "zz").symlink_to(tmp / "other" / "z")
    os.mkfifo(tmp / "db" / "fifo")
    return tmp


def gen(fd: int) -> int:
    return 7


def test_the_walk_selects_prefixes_and_globs_and_never_follows_a_symlink(tmp_path: Path) -> None:
    r = walk(str(tree(tmp_path)), compile_patterns(("db", "logs/*.idx")), max_files=100, gen_fn=gen)
    assert sorted(f.path for f in r.files) == ["db/a", "db/sub/b", "logs/x.idx"] and not r.truncated
    assert all(f.gen == 7 and f.size == 10 for f in r.files)


def test_the_walk_is_bounded_in_entries_and_files(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"")
    r = walk(str(tmp_path), compile_patterns(("f*",)), max_files=1000, max_entries=20, gen_fn=gen)
    assert len(r.files) <= 20 and "more than 20 directory entries" in r.truncated
    r = walk(str(tmp_path), compile_patterns(("f*",)), max_files=5, gen_fn=gen)
    assert len(r.files) == 5 and "more than 5 files" in r.truncated


def test_hostile_names_survive_the_walk_and_are_escaped_in_status(tmp_path: Path) -> None:
    d = tmp_path / "db"
    d.mkdir()
    name = os.fsdecode(b"a\x1b[2J\xff\xe2\x80\xae")
    (d / name).write_bytes(b"y")
    r = walk(str(tmp_path), compile_patterns(("db",)), max_files=10, gen_fn=gen)
    assert [f.path for f in r.files] == [f"db/{name}"]
    e = engine()
    e.set_pins("v0", [PinnedFile(r.files[0].path, 5, 1, 1)])
    text = "\n".join(render_pins(e))
    assert "\x1b" not in text and "\\x1b[2J" in text and "\u202e" not in text


def render_pins(e: Engine) -> list[str]:
    from cachepilot.commands.status import _pins

    return _pins(e.vols[DEV].pins.status(e.hotness))


def test_resolve_refuses_symlinked_components_and_dotdot(tmp_path: Path) -> None:
    tree(tmp_path)
    assert resolve(str(tmp_path), "db/sub/b", gen) is not None
    assert resolve(str(tmp_path), "db/out/z", gen) is None  # through a symlink
    assert resolve(str(tmp_path), "db/zz", gen) is None
    assert resolve(str(tmp_path), "db/../other/z", gen) is None
    assert resolve(str(tmp_path), "db/fifo", gen) is None


def test_resolution_keeps_within_the_cap_and_says_what_it_left_out(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"p{i}").write_bytes(b"z" * 1000)
    info = VolumeInfo(dev=DEV, name="v0", mountpoint=str(tmp_path), cache_bytes=1 << 30)
    pol = parse_policy(policy("pin: {paths: ['p*'], max_bytes: 2500}"), "t.yaml").defaults.pin
    files, note = pinning.resolve(info, pol, lambda m, p: walk(m, p, max_files=100, gen_fn=gen))
    assert len(files) == 2 and "2 matching file(s) left out: over the cap of 2500 bytes" in note


# ------------------------------------------------------------------ the engine
def test_pinned_files_are_promoted_at_start_whatever_their_size_and_bcache_gate() -> None:
    e = engine()
    sample(e, 0, 0)
    pin(e, 1, 2, size=512 << 10)  # past the 64 KiB sieve, never read: the sieve would refuse both
    got = promoted(e, 1) + promoted(e, 2)
    assert sorted(p.ino for p in got) == [1, 2] and all("pinned by policy" in p.reason for p in got)
    assert not promoted(e, 3)  # resident now: nothing more while the cache misses nothing


def test_a_pinned_file_is_never_a_member_of_the_believed_cached_set() -> None:
    e = engine()
    pin(e, 1)
    e.feed(HotnessDelta(FileKey(DEV, 1, 1), 64, 0, 4096, 0, 1, size=4096))
    promoted(e, 1)
    slot = e.hotness.lookup(DEV, 1, 1)
    assert slot is not None and not e.hotness.flags[slot] & F_MEMBER
    c = e.vols[DEV]
    assert c.cached.capacity_bytes == (1 << 30) // 2 - (256 << 10)  # the pins' bytes come out of its room


def test_a_write_or_a_new_cache_device_makes_a_pin_due_again() -> None:
    e = engine()
    sample(e, 0, 0)
    pin(e, 1)
    assert [p.ino for p in promoted(e, 1)] == [1]
    e.feed(HotnessDelta(FileKey(DEV, 1, 1), 0, 64, 0, 4096, 2, size=256 << 10))  # written: not resident
    assert [p.ino for p in promoted(e, 2)] == [1]
    e.sample(VolumeSample(DEV, 3 * NS, "writeback", 0, 1000, 0, 0, False, {}, "cset-b", bypasses=0))
    assert [p.ino for p in promoted(e, 3)] == [1]  # the cache was replaced


def test_while_the_cache_misses_pins_are_re_read_once_per_refresh_interval() -> None:
    e = engine()
    sample(e, 0, 0)
    pin(e, 1)
    promoted(e, 1)
    times = []
    for t in range(2, 40):
        sample(e, t, misses=100 * (t // 5))  # a scan, seen in counters folded every 5 s (as bcache does)
        if promoted(e, t):
            times.append(t)
    assert times == [5, 15, 25, 35]  # every refresh interval from the first rise, not once per rise
    late = []
    for t in range(40, 120):
        sample(e, t, misses=100 * 7)  # quiet since the rise at 35: re-read until 30 s after it, then nothing
        if promoted(e, t):
            late.append(t)
    assert late == [45, 55, 65]


def test_a_deleted_pinned_file_is_dropped_not_promoted() -> None:
    from cachepilot.events import Delete

    e = engine()
    pin(e, 1)
    e.delete(Delete(FileKey(DEV, 1, 1), 0, 0))
    e.feed(HotnessDelta(FileKey(DEV, 9, 3), 64, 0, 4096, 0, 1, size=4096))  # may take the freed slot
    assert all(p.ino != 1 for p in promoted(e, 1))
    assert e.vols[DEV].pins.gone == 1


def test_status_shows_the_pins_and_their_residency() -> None:
    e = engine()
    sample(e, 0, 0)
    pin(e, 1, 2)
    s = e.vols[DEV].pins.status(e.hotness)
    assert s["files"] == 2 and s["resident_files"] == 0
    promoted(e, 1)
    slot = e.hotness.lookup(DEV, 1, 1)
    assert slot is not None and e.hotness.flags[slot] & F_RESIDENT
    s = e.vols[DEV].pins.status(e.hotness)
    assert s["resident_files"] == 2 and s["resident_bytes"] == 512 << 10
    lines = render_pins(e)
    assert "pinned: 2 file(s), 512.0 KiB; resident 2" in lines[0] and "resident" in lines[1] and "db/f1" in lines[1]
    assert render({"pid": 1, "uptime_s": 1, "dry_run": False, "observe_only": False,
                   "policy": {"source": "p", "generation": 1, "last_error": None},
                   "last_tick": {"time": 0, "duration_s": 0, "n": 1, "skipped": 0}, "tracked_files": 1,
                   "drops": {"ringbuf_full": 0, "hotness_map_full": 0, "other": 0},
                   "state_file": {"writes": 0, "failed_writes": 0}, "probe": {"summary": ""},
                   "volumes": [{"name": "v0", "observe_only": False, "kind": "bcache", "mode": None,
                                "target_mode": None, "dirty_bytes": None, "max_dirty_bytes": 1, "hit_ratio": None,
                                "health": "OK", "latched": False, "mountpoint": "/mnt", "pending": [],
                                "pins": s}]}).count("db/f") == 2
