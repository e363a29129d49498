"""The table of cache kinds: each kind's declarative half in cachepilot.capabilities and its working half in
backends/<kind>.py (both checked when imported, and against each other); discovery and the set-knob path read the
working half, promotion rounds, the trace format, the policy checker and the schema the declarative one. Discovery
and describe run on a fixture host (sysfs tree, mountinfo, fake dmsetup and blkid), nothing monkeypatched."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from cachepilot.actions import SetKnob
from cachepilot.actuators.promote import Promoter
from cachepilot.backends import kinds, open_backend
from cachepilot.backends.base import FAILED
from cachepilot.backends.bcache import KIND as BCACHE
from cachepilot.backends.host import Host, ToolResult
from cachepilot.backends.kinds import Kind, KnobDef, check_declared
from cachepilot.backends.operation import Setting
from cachepilot.capabilities import CAPABILITIES, KINDS, KNOBS, WRITEBACK, Capabilities, check
from cachepilot.daemon import volumes
from cachepilot.errors import KernelRejected, UserError
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import capcheck
from cachepilot.policy.schema import SCHEMA
from cachepilot.trace.format import volume_info


def test_every_kind_module_is_in_the_table_with_its_backend() -> None:
    table = kinds.table()
    assert set(table) == set(KINDS) >= {"bcache", "dm-cache", "dm-writecache", "lvmcache"}
    for name, k in table.items():
        assert k.name == name and k.backend.kind == name and k.caps is CAPABILITIES[name]
        assert set(k.caps.knobs()) == set(k.settings)  # every declared knob has its get/set pair
        assert all(name in kn.kinds for kn in k.caps.knobs().values())
    with pytest.raises(UserError, match="unknown cache kind 'zfs' \\(known: bcache, dm-cache"):
        kinds.kind("zfs")


def test_the_readers_take_the_table() -> None:
    """Promotion rounds, trace kinds, the policy checker and the schema: each from the declarations."""
    for name, k in kinds.table().items():
        assert Promoter(VolumeInfo(dev=1, name="x", kind=name)).rounds == k.promote_rounds
        assert volume_info({"dev": 1, "name": "x", "kind": name}).kind == name
    assert [kinds.get(n).promote_rounds for n in ("bcache", "dm-cache", "dm-writecache")] == [1, 2, 0]
    with pytest.raises(ValueError, match="unknown kind 'zfs'"):
        volume_info({"dev": 1, "name": "x", "kind": "zfs"})
    assert capcheck.matchable_kinds({"device": "bcache*"}) == ("bcache",)
    assert "bcache" not in capcheck.matchable_kinds({"device": "dm-*"})
    knob_enum = SCHEMA["properties"]["defaults"]["properties"]["knobs"]
    assert knob_enum["propertyNames"]["enum"] == list(KNOBS)
    assert KNOBS["migration_threshold"].kinds == {"dm-cache", "lvmcache"}


def _decl(**over: object) -> Kind:
    base: dict[str, object] = dict(
        name="bcache", backend=BCACHE.backend, detect=BCACHE.detect, describe=BCACHE.describe,
        sample=BCACHE.sample, knobs=BCACHE.knobs)
    base.update(over)
    return Kind(**base)  # type: ignore[arg-type]


def test_a_bad_declaration_fails_at_import() -> None:
    """The working half: one get/set pair for each declared knob, no more, and a backend of its own kind."""
    assert _decl().settings.keys() == BCACHE.settings.keys()
    twice = BCACHE.knobs[0]
    with pytest.raises(TypeError, match="given twice"):
        _decl(knobs=(twice, twice, *BCACHE.knobs[1:]))
    with pytest.raises(TypeError, match="get/set pairs for .* but it declares"):
        _decl(knobs=BCACHE.knobs[1:])  # writeback_percent and the others, without sequential_cutoff
    with pytest.raises(TypeError, match="but it declares"):
        _decl(knobs=(*BCACHE.knobs, KnobDef("migration_threshold", BCACHE.knobs[0].setting)))
    with pytest.raises(TypeError, match="its backend BcacheBackend says 'bcache'"):
        _decl(name="dm-cache", knobs=(KnobDef("migration_threshold", BCACHE.knobs[0].setting),))
    with pytest.raises(UserError, match="unknown cache kind 'other'"):
        _decl(name="other", knobs=())
    with pytest.raises(TypeError, match=r"kinds with a module \['bcache'\] are not the kinds declared"):
        check_declared({"bcache": BCACHE}, CAPABILITIES)


def test_a_bad_capability_declaration_fails_at_import() -> None:
    """The declarative half: typed, ranged knobs of declared kinds; modes with kernel names; a drain sleep knob
    that is the kind's own."""
    check(CAPABILITIES, KNOBS)
    bc = CAPABILITIES["bcache"]
    with pytest.raises(TypeError, match="without a kernel name"):
        check({**CAPABILITIES, "bcache": replace(bc, kernel_mode_names={WRITEBACK: "writeback"})}, KNOBS)
    with pytest.raises(TypeError, match="drain_sleep_knob writeback_delay is not a knob of it"):
        check({**CAPABILITIES, "dm-cache": replace(CAPABILITIES["dm-cache"], drain_sleep_knob="writeback_delay")},
              KNOBS)
    with pytest.raises(TypeError, match="its capabilities say 'other'"):
        check({**CAPABILITIES, "bcache": Capabilities("other", frozenset({WRITEBACK}), {WRITEBACK: "wb"}, "", "")},
              KNOBS)
    for bad in (replace(KNOBS["readahead"], type="float"), replace(KNOBS["readahead"], min=2, max=1),
                replace(KNOBS["readahead"], kinds=frozenset({"zfs"}))):
        with pytest.raises(TypeError, match="knob readahead is not a typed, ranged knob"):
            check(CAPABILITIES, {**KNOBS, "readahead": bad})


def test_one_set_knob_path_rejects_a_knob_the_kind_lacks(tmp_path: Path) -> None:
    (tmp_path / "block" / "bcache0" / "bcache").mkdir(parents=True)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    out = b.apply(SetKnob("bcache0", "migration_threshold", "4096", "policy"))
    assert out.status == FAILED and isinstance(out.error, KernelRejected)
    assert "bcache has no knob 'migration_threshold'" in str(out.error)
    out = b.apply(SetKnob("bcache0", "writeback_percent", "41", "policy"))  # parsed and ranged before any write
    assert out.status == FAILED and "outside 0..40" in str(out.error) and not out.writes


# ------------------------------------------------------------------ discovery on a fixture host
class FakeTools:
    """dmsetup and blkid as the fixture host has them."""

    def __init__(self) -> None:
        self.tables = {
            "lab-cached": "0 2097152 cache 254:3 254:4 254:1 128 1 writeback smq 0",
            "lab-wc": "0 2097152 writecache s 254:1 254:5 4096 0",
            "lab-linear": "0 2097152 linear 254:1 0",
        }
        self.status = {
            "lab-cached": "0 2097152 cache 8 27/4096 128 10/2048 1 2 3 4 0 0 0 1 writeback 2 migration_threshold 2048 "
                          "smq 0 rw -",
            "lab-wc": "0 2097152 writecache 0 65536 65000 0",
        }
        self.calls: list[tuple[str, ...]] = []

    def dm(self, args: Sequence[str], timeout: float) -> str:
        self.calls.append(tuple(args))
        if tuple(args) == ("table",):
            return "\n".join(f"{n}: {t}" for n, t in self.tables.items())
        if args[0] == "table":
            return self.tables[args[1]]
        return self.status[args[1]]

    def tool(self, argv: Sequence[str], timeout: float) -> ToolResult:
        assert argv[0] == "blkid"
        return ToolResult(0, f"uuid-{argv[-1].rsplit('/', 1)[1]}\n", "")


def fixture_host(root: Path) -> tuple[Host, FakeTools]:
    block = root / "sys" / "block"

    def dev(name: str, major: int, minor: int, dm_name: str = "") -> Path:
        d = block / name
        d.mkdir(parents=True)
        (d / "dev").write_text(f"{major}:{minor}\n")
        if dm_name:
            (d / "dm").mkdir()
            (d / "dm" / "name").write_text(dm_name + "\n")
            (d / "dm" / "uuid").write_text(f"CACHEPILOT-{dm_name}\n")
        return d

    sdb = dev("sdb", 8, 16)
    (sdb / "size").write_text("2097152\n")
    (sdb / "bcache").mkdir()  # a cache device has a bcache directory too: not a volume
    cset = root / "sys" / "fs" / "bcache" / "set-uuid"
    cset.mkdir(parents=True)
    (cset / "cache0").symlink_to(sdb / "bcache")
    bc = dev("bcache0", 252, 0)
    (bc / "bcache").mkdir()
    (bc / "bcache" / "cache").symlink_to(cset)
    dev("dm-2", 254, 2, "lab-cached")
    dev("dm-4", 254, 6, "lab-wc")
    dev("dm-7", 254, 7, "lab-linear")
    mountinfo = root / "proc" / "self" / "mountinfo"
    mountinfo.parent.mkdir(parents=True)
    mountinfo.write_text("22 1 254:0 / / rw - ext4 /dev/vda rw\n"
                         "30 22 254:2 / /mnt/cached rw,relatime - ext4 /dev/dm-2 rw,discard\n"
                         "31 22 252:0 / /mnt/bc rw - ext4 /dev/bcache0 rw\n")
    tools = FakeTools()
    host = Host(sysfs=root / "sys", proc=root / "proc", dm=tools.dm, tool=tools.tool,
                statvfs=lambda p: os.statvfs("/"))
    return host, tools


def test_discovery_asks_the_table_on_a_fixture_host(tmp_path: Path) -> None:
    host, tools = fixture_host(tmp_path)
    found, problems = volumes.discover(host)
    assert problems == []
    by_name = {f.info.name: f for f in found}
    assert sorted(by_name) == ["bcache0", "dm-2", "dm-4"]  # not the cache device sdb, not the dm-linear
    bc, dmc, wc = by_name["bcache0"].info, by_name["dm-2"].info, by_name["dm-4"].info
    assert (bc.kind, bc.dev, bc.mountpoint, bc.fs_uuid, bc.cache_id) == (
        "bcache", kdev(252, 0), "/mnt/bc", "uuid-bcache0", "set-uuid")
    assert bc.cache_bytes == 2097152 * 512 and not bc.fs_discard
    assert (dmc.kind, dmc.mountpoint, dmc.fs_discard, dmc.cache_id, dmc.cache_bytes) == (
        "dm-cache", "/mnt/cached", True, "254:4", 2048 * 128 * 512)
    assert by_name["dm-2"].label == "lab-cached"
    assert (wc.kind, wc.mountpoint, wc.cache_bytes, wc.cache_id) == ("dm-writecache", "", 65536 * 4096, "254:5")
    assert tools.calls.count(("table",)) == 1  # one listing covers every dm device
    # the smallest discard that spares a write-back: a sector, dm-cache's discard block (1 GiB origin / 2**14 ->
    # its 64 KiB cache block), dm-writecache's block
    assert (bc.discard_unit, dmc.discard_unit, wc.discard_unit) == (512, 64 * 1024, 4096)


def test_dm_cache_discard_block_follows_the_kernel() -> None:
    """calculate_discard_block_size: the cache block, doubled until the origin has at most 2**14 of them."""
    from cachepilot.backends.dmcache import discard_block_bytes

    line = "0 {} cache 254:3 254:4 254:1 {} 1 writeback smq 0"
    assert discard_block_bytes(line.format(2097152, 128).split()) == 64 * 1024  # the lab: 1 GiB, 64 KiB blocks
    assert discard_block_bytes(line.format(8 << 30, 128).split()) == 256 << 20  # 4 TiB origin: 256 MiB
    assert discard_block_bytes(line.format(4194304, 512).split()) == 256 * 1024  # 2 GiB, 256 KiB blocks: as is
    assert discard_block_bytes(["0", "8", "linear"]) == 512


def test_describe_names_a_device_no_kind_takes(tmp_path: Path) -> None:
    from cachepilot.backends.inspect import describe

    host, _ = fixture_host(tmp_path)
    with pytest.raises(UserError, match=r"/dev/dm-7 \(lab-linear\) is a dm 'linear' target, not a cache"):
        describe(host, "dm-7", kdev(254, 7))
    with pytest.raises(UserError, match="/dev/sdb is not a cache of a known kind"):
        describe(host, "sdb", kdev(8, 16))


# ------------------------------------------------------------------ issue 35 item 2: traits, not names
def test_a_volumes_lower_devices_take_the_cache_device_its_kind_finds(tmp_path: Path) -> None:
    # bcache's cache device is not among the volume's slaves: the kind finds it (Kind.cache_devices), for the probe
    # to watch its discards; the dm kinds list theirs as slaves
    host, _ = fixture_host(tmp_path)
    found = {f.info.name: f for f in volumes.discover(host)[0]}
    assert found["bcache0"].lower == (kdev(8, 16),)
    assert found["dm-2"].lower == ()


def test_a_backend_acts_through_the_kind_it_was_built_with(tmp_path: Path) -> None:
    # no lookup of its own kind in the global table: a backend built with a Kind whose readahead get/set pair is
    # another uses that one (the table's would write sysfs, which this tree lacks)
    (tmp_path / "block" / "bcache0" / "bcache").mkdir(parents=True)
    seen: list[str] = []
    now = {"v": "0"}

    def fake(_b: object) -> Setting:
        return Setting("fake readahead", lambda: now["v"], lambda v: (seen.append(v), now.update(v=v)) and None)

    knobs = tuple(KnobDef(k.name, fake if k.name == "readahead" else k.setting) for k in BCACHE.knobs)
    mine = replace(BCACHE, knobs=knobs)
    b = mine.open(VolumeInfo(dev=1, name="bcache0", kind="bcache"), Host(sysfs=tmp_path))
    out = b.apply(SetKnob("bcache0", "readahead", "4096", "policy"))
    assert out.status != FAILED and seen == ["4096"], out


def test_the_hold_knob_and_ready_reserve_are_declared_traits(monkeypatch: pytest.MonkeyPatch) -> None:
    # a kind declared with a hold knob gets lifetime holds and one with a ready reserve the promoter's pacing,
    # whatever its name (the engine and promoter named bcache and dm-writecache before)
    from cachepilot.actuators.promote import default_burst
    from cachepilot.capabilities import HoldKnob, ReadyReserve
    from cachepilot.engine.lifetime import VolumeLifetimes, hold_for
    from cachepilot.policy.model import LifetimeHold

    caps = replace(CAPABILITIES["dm-cache"], kind="newcache", hold=HoldKnob("migration_threshold", 10),
                   ready_reserve=ReadyReserve("newcache", 4))
    monkeypatch.setitem(CAPABILITIES, "newcache", caps)
    lt = VolumeLifetimes(rate=4 << 20)
    lt.ages.add(20 * 10**9, 64 << 20, 10**9)
    h = hold_for("newcache", 1 << 30, lt, LifetimeHold())
    assert h is not None and h.knob == "migration_threshold" and h.value == 25 and "full less headroom" in h.reason
    info = VolumeInfo(dev=1, name="dm-9", kind="newcache", cache_bytes=1 << 20)
    assert default_burst(info, 1 << 20) == 1 << 16  # the reserve: cache bytes >> 4
    assert Promoter(info).backoff is not None
    assert Promoter(replace(info, kind="dm-cache")).backoff is None
