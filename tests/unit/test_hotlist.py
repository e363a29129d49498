"""Warm handoff (`cachepilot hotlist export` / `import`): the format round-trips hostile names and refuses bad files
with one line, in bounded size; export finds paths by handle; import matches by generation and size, else size and
mtime, skips and counts unknown and changed files; the daemon takes the list in bounded requests and the engine
re-warms it at the promotion rate, past bcache's bypass rule."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cachepilot import hotlist
from cachepilot.cli import main
from cachepilot.commands.hotlist import REQUEST_BYTES, _chunks
from cachepilot.daemon.answers import answer
from cachepilot.daemon.control import MAX_REQUEST
from cachepilot.daemon.imports import MAX_PER_REQUEST, Imports
from cachepilot.engine import Engine, Promote
from cachepilot.engine.handoff import IMPORTED
from cachepilot.errors import UserError
from cachepilot.events import kdev
from cachepilot.fsfiles import generation
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
HOSTILE = os.fsdecode(b"evil\x1b[2J\xff\xe2\x80\xae name")


def ident(p: Path) -> tuple[int, int]:
    fd = os.open(p, os.O_RDONLY)
    try:
        return os.fstat(fd).st_ino, generation(fd)
    finally:
        os.close(fd)


def make_tree(root: Path) -> list[Path]:
    out = []
    for rel in ("db/a", "db/b", f"db/{HOSTILE}", "logs/c"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(4096 * (len(out) + 1)))
        out.append(p)
    return out


def exported(root: Path) -> hotlist.HotList:
    files = make_tree(root)
    hot = [[*ident(p), 1000 - i, p.stat().st_size] for i, p in enumerate(files)] + [[999_999_999, 5, 1, 1]]
    hl, lost = hotlist.export("v0", "uuid", str(root), hot)
    assert lost == 1  # the inode that does not exist
    return hl


def test_export_names_files_by_path_and_the_format_round_trips_hostile_names(tmp_path: Path) -> None:
    hl = exported(tmp_path)
    assert [f.path for f in hl.files] == ["db/a", "db/b", f"db/{HOSTILE}", "logs/c"]
    text = hl.dumps()
    assert text.isascii()  # undecodable bytes and controls travel as escapes
    back = hotlist.parse(text.encode(), "h.json")
    assert back.files == hl.files and back.volume == "v0"


def test_import_matches_by_generation_or_by_size_and_mtime_and_counts_the_rest(tmp_path: Path) -> None:
    a = tmp_path / "a"
    hl = exported(a)
    m = hotlist.match(hl, str(a))
    assert (m.by_generation, m.by_mtime, m.unknown, m.changed) == (4, 0, 0, 0)
    assert [f[2] for f in m.files] == [1000, 999, 998, 997]  # hottest first, with the exported counters
    b = tmp_path / "b"
    shutil.copytree(a, b)  # a file-by-file copy: new inodes and generations, same sizes and mtimes
    (b / "db" / "b").write_bytes(b"changed")
    (b / "logs" / "c").unlink()
    m = hotlist.match(hl, str(b))
    assert (m.by_generation, m.by_mtime, m.unknown, m.changed) == (0, 2, 1, 1)


def test_import_never_follows_a_symlink_out_of_the_mount(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    hl = exported(outside)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "db").symlink_to(outside / "db")
    m = hotlist.match(hl, str(mnt))
    assert m.unknown == 4 and not m.files


@pytest.mark.parametrize("content, why", [
    (b"\x00\xff", "not JSON"),
    (b"[1]", "no \"format\""),
    (b'{"format": "cachepilot-hotlist", "version": 9, "files": []}', "unsupported hot-list version"),
    (b'{"format": "cachepilot-hotlist", "version": 1, "files": {}}', "files: not a list"),
    (b'{"format": "cachepilot-hotlist", "version": 1, "files": [{"path": "/etc/passwd", "size": 1, "gen": 1,'
     b' "mtime_ns": 1, "score": 1}]}', "files[0]: path"),
    (b'{"format": "cachepilot-hotlist", "version": 1, "files": [{"path": "../x", "size": 1, "gen": 1,'
     b' "mtime_ns": 1, "score": 1}]}', "files[0]: path"),
    (b'{"format": "cachepilot-hotlist", "version": 1, "files": [{"path": "x", "size": -1, "gen": 1,'
     b' "mtime_ns": 1, "score": 1}]}', "files[0]: not an integer"),
    (b'{"format": "cachepilot-hotlist", "version": 1, "files": [{"path": "x", "size": 1, "gen": 4294967296,'
     b' "mtime_ns": 1, "score": 1}]}', "files[0]: not an integer"),
    (b"[" * 100_000, "not JSON"),
])
def test_bad_hot_list_files_are_refused_with_one_line_and_exit_2(tmp_path: Path, content: bytes, why: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "h.json"
    f.write_bytes(content)
    with pytest.raises(UserError, match=why.replace("[", r"\[")):
        hotlist.parse(content, str(f))
    assert main(["hotlist", "import", "--socket", str(tmp_path / "none.sock"), "v0", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why.split("[")[0] in err


def test_a_huge_or_special_hot_list_file_costs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(5 << 30)  # sparse 5 GiB: refused by its size, never read
    assert main(["hotlist", "import", "--socket", "/nonexistent", "v0", str(big)]) == 2
    assert "larger than 32 MiB" in capsys.readouterr().err
    assert main(["hotlist", "import", "--socket", "/nonexistent", "v0", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_export_reads_the_state_file_and_refuses_a_missing_volume(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from cachepilot.daemon.state import StateFile

    st = StateFile(tmp_path)
    assert st.write({"volumes": {"v0": {"name": "v0", "dev": "0:0", "hot": []}}, "counters": {}, "decisions": []})
    assert main(["hotlist", "export", "--state-dir", str(tmp_path), "nope"]) == 2
    assert "the state file has no volume 'nope' (known: v0)" in capsys.readouterr().err
    assert main(["hotlist", "export", "--state-dir", str(tmp_path), "v0"]) == 2  # device 0:0 is mounted nowhere
    assert "is not mounted here" in capsys.readouterr().err


# ------------------------------------------------------------------ the daemon and the engine
def engine(kind: str = "bcache") -> Engine:
    pol = parse_policy("""
version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 64KiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
""", "t.yaml")
    return Engine(pol, [VolumeInfo(dev=DEV, name="v0", kind=kind, cache_bytes=1 << 30)])


def test_requests_stay_under_the_sockets_limit_and_bad_entries_are_refused() -> None:
    files = [((1 << 62) + i, 4_000_000_000, 4_000_000_000, 1 << 40) for i in range(1000)]
    chunks = _chunks(files)
    assert sum(len(c) for c in chunks) == 1000
    for c in chunks:
        req = json.dumps({"cmd": "hotlist_import", "volume": "v" * 64, "files": c})
        assert len(req) < MAX_REQUEST and len(c) <= MAX_PER_REQUEST and REQUEST_BYTES < MAX_REQUEST
    imp = Imports()
    for bad in ([[1, 2, 3]], [[1, 2, 3, True]], [[0, 1, 1, 1]], [[1, 1 << 32, 1, 1]], "x", [[1, 1, 1, 1]] * 129):
        with pytest.raises(UserError):
            imp.add("v0", bad)


def test_an_imported_list_leaves_the_queue_at_once_hottest_first_past_the_rate_and_the_bypass_rule() -> None:
    """At the policy's rate (64 KiB/s here) the list would take 8 s; its bytes are a credit, spent first, so all of it
    goes to the promoter at the first tick (which reads it at IMPORT_RATE_FACTOR times the rate). The credit lapses
    with the list: an ordinary admission afterwards waits for the rate as before."""
    e = engine("bcache")
    for t in (0, 1):  # bcache bypassed nothing: an ordinary admission would wait, then be taken as inserted
        e.sample(VolumeSample(DEV, t * NS, "writeback", 0, 0, 0, 0, False, {}, "cset", bypasses=5))

    class Snap:
        volumes = [type("V", (), {"name": "v0", "latched": False})()]

    imp = Imports()
    files = [[10 + i, 1, 100 + i, 64 << 10] for i in range(8)]  # ascending counters: the last is the hottest
    got = answer(Snap(), {"cmd": "hotlist_import", "volume": "v0", "files": files},  # type: ignore[arg-type]
                 [], lambda: None, imp)  # type: ignore[arg-type, return-value]
    assert got == {"queued": 8}
    with pytest.raises(UserError, match="unknown volume"):
        answer(Snap(), {"cmd": "hotlist_import", "volume": "x", "files": files}, [], lambda: None, imp)  # type: ignore[arg-type, return-value]
    imp.apply(e)
    acts = [a for a in e.tick(2 * NS) if isinstance(a, Promote)]
    assert all(a.reason == IMPORTED for a in acts)
    assert [a.ino for a in acts] == [17, 16, 15, 14, 13, 12, 11, 10]  # all at once (64 KiB/s: 2 a tick), hottest first
    c = e.volume("v0")
    assert c.import_credit == 0 and c.tokens <= 2 * (64 << 10)  # lapsed: nothing left over for other admissions


def test_import_hands_the_hottest_files_over_before_it_resolves_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon re-warms what it has: the CLI sends each request's worth as soon as it is resolved (in the lab
    the CLI took 7 s before its one batch of requests, the re-warm waiting meanwhile)."""
    from cachepilot import fsfiles
    from cachepilot.daemon import control

    root = tmp_path / "mnt"
    paths = []
    for i in range(300):
        p = root / f"f{i:03d}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x" * 10)
        paths.append(p)
    hot = [[*ident(p), 1000 - i, 10] for i, p in enumerate(paths)]
    hl, _ = hotlist.export("v0", "uuid", str(root), hot)
    f = tmp_path / "h.json"
    f.write_text(hl.dumps())
    resolved = [0]
    real = fsfiles.resolve

    def counting(*a: object, **k: object) -> object:
        resolved[0] += 1
        return real(*a, **k)  # type: ignore[arg-type]

    sent: list[tuple[int, int]] = []  # (files in the request, files resolved by then)

    def fake_request(sock: object, req: dict) -> dict:  # type: ignore[type-arg]
        if req["cmd"] == "status":
            return {"volumes": [{"name": "v0", "mountpoint": str(root)}]}
        sent.append((len(req["files"]), resolved[0]))
        return {"queued": len(req["files"])}

    monkeypatch.setattr(hotlist, "resolve", counting)
    monkeypatch.setattr(control, "request", fake_request)
    assert main(["hotlist", "import", "--socket", str(tmp_path / "s"), "v0", str(f)]) == 0
    assert "300 of 300 file(s) handed" in capsys.readouterr().out
    assert sum(n for n, _ in sent) == 300
    assert sent[0][1] == MAX_PER_REQUEST  # the first request left before the other 172 were resolved


LIGHT_PROBE = """
import sys
from pathlib import Path
from cachepilot.daemon import control

def fake(sock, req):
    if req["cmd"] == "status":
        return {"volumes": [{"name": "v0", "mountpoint": sys.argv[1]}]}
    return {"queued": len(req["files"])}

control.request = fake  # the CLI's one way to the daemon: the rest of its path runs for real
from cachepilot.cli import main
argv = sys.argv[2:]
try:
    rc = main(argv)
except SystemExit as exc:  # --help
    rc = exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "jsonschema", "yaml")
               or m.startswith(("cachepilot.engine", "cachepilot.models", "cachepilot.actuators")))
print("RESULT", rc, heavy)
"""


@pytest.mark.parametrize("argv", [["hotlist", "import", "--help"], ["hotlist", "import", "--socket", "s", "v0", "H"],
                                  ["status", "--help"], ["explain", "--help"], ["clear-latch", "--help"]])
def test_the_light_commands_start_without_numpy_or_the_engine(tmp_path: Path, argv: list[str]) -> None:
    """In the lab's TCG guest `hotlist import` took 7-11 s, most of it start-up (numpy, the engine's models,
    jsonschema and yaml: 0.6 s on the host against 0.15 s without): the re-warm waited meanwhile."""
    import subprocess
    import sys

    hl = exported(tmp_path)
    (tmp_path / "h.json").write_text(hl.dumps())
    argv = [str(tmp_path / "h.json") if a == "H" else a for a in argv]
    r = subprocess.run([sys.executable, "-c", LIGHT_PROBE, str(tmp_path), *argv], capture_output=True, text=True,
                       timeout=60, check=False)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT")), r.stdout + r.stderr)
    assert line == "RESULT 0 []", line
    if "--help" not in argv:
        assert "4 of 4 file(s) handed" in r.stdout


def small_cache_engine() -> Engine:
    pol = parse_policy("""
version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 4MiB, max_cache_fraction: 0.25, sieve_size: 1MiB}
""", "t.yaml")
    return Engine(pol, [VolumeInfo(dev=DEV, name="v0", kind="dm-cache", cache_bytes=64 << 20)])


def imported_inos(e: Engine, files: list[list[int]], at_s: int) -> list[int]:
    imp = Imports()
    for i in range(0, len(files), MAX_PER_REQUEST):  # as the CLI sends them
        imp.add("v0", files[i:i + MAX_PER_REQUEST])
    imp.apply(e)
    return [a.ino for a in e.tick(at_s * NS) if isinstance(a, Promote) and a.reason == IMPORTED]


def test_an_imported_list_that_fits_the_cache_is_not_cut_to_max_cache_fraction() -> None:
    """In the lab a quarter of a 64 MiB cache cut the re-warm to ~256 of ~900 exported files. An imported list
    (the operator's request, typically for a fresh cache) may fill the cache less pinned files; the set goes back
    to its share 30 s after the import's last request, so what the daemon promotes on its own stays within it."""
    e = small_cache_engine()
    files = [[10 + i, 1, 5000 - i, 64 << 10] for i in range(900)]  # 56 MiB, hottest first
    got = imported_inos(e, files[:450], 1) + imported_inos(e, files[450:], 2)  # two batches a tick apart
    assert got == [f[0] for f in files]
    c = e.volume("v0")
    assert c.cached.capacity_bytes == 64 << 20 and len(c.cached) == 900
    e.tick(40 * NS)
    assert c.cached.capacity_bytes == 16 << 20  # the loan ended: the share again


def test_an_imported_list_larger_than_the_cache_is_cut_to_its_hottest_files_that_fit() -> None:
    e = small_cache_engine()
    files = [[10 + i, 1, 5000 - i, 64 << 10] for i in range(2000)]  # 125 MiB into 64 MiB
    got = imported_inos(e, files[:1000], 1) + imported_inos(e, files[1000:], 2)
    assert len(got) * (64 << 10) <= 64 << 20 and len(got) >= 900
    assert set(got) == {f[0] for f in files[:len(got)]}  # the hottest


def test_importing_counts_the_imported_files_the_daemon_has_not_re_warmed_yet() -> None:
    from cachepilot.daemon.volume import ManagedVolume
    from cachepilot.daemon.volumes import Found

    e = small_cache_engine()
    v = ManagedVolume(Found(e.volume("v0").info), None, ctl=e.volume("v0"))
    Imports().add("v0", [[10, 1, 9, 4096]])  # not applied yet: counted once the loop takes it (the CLI waits 2 ticks)
    imp = Imports()
    imp.add("v0", [[10 + i, 1, 100 - i, 4096] for i in range(5)])
    imp.apply(e)
    assert v.importing() == 5  # queued, with the credit that lets them out at the next tick
    acts = [a for a in e.tick(1 * NS) if isinstance(a, Promote)]
    v.deferred = [*acts[:3], Promote("v0", DEV, 99, 1, ((0, 4096),), "counter 5 > last evicted 0")]
    assert v.importing() == 3  # being read (rounds, reader threads): deferred; the ordinary promotion is not counted


def wait_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statuses: list[dict], wait: str) -> int:  # type: ignore[type-arg]
    from dataclasses import asdict

    from cachepilot.daemon import control
    from cachepilot.daemon.status import TickStatus

    root = tmp_path / "mnt"
    hl = exported(root)
    f = tmp_path / "h.json"
    f.write_text(hl.dumps())
    seen = iter(statuses)

    def fake_request(sock: object, req: dict) -> dict:  # type: ignore[type-arg]
        if req["cmd"] == "hotlist_import":
            return {"queued": len(req["files"])}
        st = next(seen, statuses[-1])
        return {"last_tick": asdict(TickStatus(0.0, 0.0, st["ticks"], 0)),  # the daemon's own shape
                "volumes": [{"name": "v0", "mountpoint": str(root), **({"importing": st["left"]} if "left" in st
                                                                        else {})}]}

    monkeypatch.setattr(control, "request", fake_request)
    monkeypatch.setattr("time.sleep", lambda s: None)
    return main(["hotlist", "import", "--socket", str(tmp_path / "s"), "--wait", wait, "v0", str(f)])


def test_import_wait_returns_once_the_daemon_has_re_warmed_the_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A handoff cuts the workload over once B is warm. 0 left in the snapshot read right after the requests is no
    answer (the loop may not have taken them yet): the count holds two ticks on."""
    statuses = [{"ticks": 0, "left": 0}, {"ticks": 7, "left": 0}, {"ticks": 8, "left": 4}, {"ticks": 9, "left": 1},
                {"ticks": 10, "left": 0}]
    assert wait_cli(tmp_path, monkeypatch, statuses, "60") == 0  # the first status: the import's mountpoint
    out = capsys.readouterr().out
    assert "re-warmed in" in out


@pytest.mark.parametrize(("statuses", "wait", "rc", "said"), [
    ([{"ticks": 3, "left": 2}], "0.001", 1, "2 file(s) still being re-warmed"),
    ([{"ticks": 3}], "5", 2, "reports no re-warm progress"),  # a daemon from before --wait
    ([{"ticks": 3, "left": 0}], "nan", 2, "--wait 'nan': must be a finite number"),
    ([{"ticks": 3, "left": 0}], "-1", 2, "--wait '-1': must be a finite number"),
])
def test_import_wait_gives_up_at_its_limit_and_refuses_what_it_cannot_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        statuses: list[dict], wait: str, rc: int, said: str) -> None:  # type: ignore[type-arg]
    assert wait_cli(tmp_path, monkeypatch, statuses, wait) == rc
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
