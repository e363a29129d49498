"""The daemon on fakes, for the daemon's tests (tests/unit/test_daemon_*.py and others): an in-memory backend
stands in for a cache, fake file actuators and probes, and `Rig`, a daemon without a probe whose ticks are driven by
hand. The same paths run for real in tests/bpf/test_daemon_host.py (the real probe, observe-only) and in the lab."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.backends.base import DONE, FAILED, PENDING, Backend, ControlAction, Outcome, Write
from cachepilot.daemon.config import load_config
from cachepilot.daemon.daemon import Daemon
from cachepilot.daemon.volumes import Found
from cachepilot.engine.volumectl import VolumeCtl
from cachepilot.errors import DeviceGone
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample

NS = 1_000_000_000


DEV = kdev(252, 0)


VOL = VolumeInfo(dev=DEV, name="bcache0", kind="bcache", fs_uuid="u-1", mountpoint="/mnt/x", cache_bytes=1 << 30)


def write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


class FakeBackend(Backend):
    """An in-memory cache: mode, dirty bytes, knobs; drains take ``drain_steps`` steps; scripted errors."""

    kind = "bcache"

    def __init__(self, info: VolumeInfo, **kw: object) -> None:
        super().__init__(info)
        self.mode = "writeback"
        self.dirty = 0
        self.knobs = {"sequential_cutoff": "4194304", "writeback_percent": "10"}
        self.applied: list[tuple[ControlAction, bool]] = []
        self.fail_with: list[Exception] = []
        self.gone = False
        self.drains: list[Drain] = []
        self.restored = 0
        self.bypasses = 3
        self.bypass_rate = 0  # bypassed reads per sample (on bcache only a bypassing volume's files are promoted)

    def sample(self, now_ns: int) -> VolumeSample:
        if self.gone:
            raise DeviceGone(f"{self.info.name} vanished")
        self.bypasses += self.bypass_rate
        return VolumeSample(self.info.dev, now_ns, self.mode, self.dirty, 10, 5, 0, False, dict(self.knobs),
                            bypasses=self.bypasses if self.info.kind == "bcache" else None,
                            bypassed_bytes=12288 if self.info.kind == "bcache" else None)

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        self.applied.append((action, dry_run))
        if self.fail_with:
            exc = self.fail_with.pop(0)
            return Outcome(action, FAILED, dry_run=dry_run, error=exc)  # type: ignore[arg-type]
        if isinstance(action, SetWritePolicy):
            w = Write(f"{self.info.name} cache_mode", self.mode, action.mode, action.mode)
            if not dry_run:
                self.mode = action.mode
            return Outcome(action, DONE, dry_run=dry_run, writes=(w,))
        if isinstance(action, Drain):
            w = Write(f"{self.info.name} writeback_percent", self.knobs["writeback_percent"], "0", "0")
            if not dry_run:
                self.knobs["writeback_percent"] = "0"
                self.drains.append(action)
            return Outcome(action, PENDING, dry_run=dry_run, writes=(w,))
        assert isinstance(action, SetKnob)
        w = Write(f"{self.info.name} {action.knob}", self.knobs.get(action.knob, ""), action.value, action.value)
        if not dry_run:
            self.knobs[action.knob] = action.value
        return Outcome(action, DONE, dry_run=dry_run, writes=(w,))

    def step(self, now_ns: int) -> list[Outcome]:
        return []

    def pending(self) -> list[ControlAction]:
        return list(self.drains)

    def restore(self) -> list[Outcome]:
        self.restored += 1
        outs = []
        for d in self.drains:
            self.knobs["writeback_percent"] = "10"
            outs.append(Outcome(d, FAILED, detail="abandoned; writeback_percent put back"))
        self.drains = []
        return outs


class FakeFiles:
    """Stands in for the FITRIM and promotion actuators (the real ones are tested in tests/unit/test_discard.py,
    test_promote.py and the lab)."""

    def __init__(self, info: VolumeInfo, discard_rate: int, promote_rate: int) -> None:
        self.ran: list[tuple[object, bool]] = []

    def run(self, action: object, dry_run: bool) -> Outcome:
        self.ran.append((action, dry_run))
        return Outcome(action, DONE, dry_run=dry_run)  # type: ignore[arg-type]


POLICY_DESTRUCTIVE = """
version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 1MiB, max_age: 60s}
  hysteresis: {min_switch_interval: 0s}
  discard_on_delete: {enabled: false}
"""


class Rig:
    """A daemon without a probe, on fakes; ticks driven by hand. What it is built with goes through the daemon's
    constructor (``backend_factory``: the cache each found volume gets, default a FakeBackend kept in ``backends``;
    ``files``: the file actuators; ``found`` and ``problems``: what discovery returns at each look)."""

    def __init__(self, tmp: Path, policy: str = POLICY_DESTRUCTIVE, dry_run: bool = False,
                 metrics: str = "{listen: ''}", advisor: bool = False,
                 backend_factory: Callable[[VolumeInfo], Backend] | None = None,
                 files: Callable[[VolumeInfo, int, int], Any] = FakeFiles) -> None:
        self.tmp = tmp
        write(tmp / "p.yaml", policy)
        self.cfg_path = write(tmp / "c.yaml", f"version: 1\npolicies: [p.yaml]\nstate_dir: st\nsocket: ctl.sock\n"
                              f"dry_run: {str(dry_run).lower()}\nmetrics: {metrics}\nrescan: 1s\n"
                              f"advisor: {str(advisor).lower()}\n")
        self.socket = tmp / "ctl.sock"
        self.found = [Found(VOL)]
        self.problems: list[str] = []
        self.backends: dict[str, FakeBackend] = {}
        self.d = Daemon(load_config(self.cfg_path), config_path=self.cfg_path,
                        discover=lambda: (list(self.found), list(self.problems)),
                        backend_factory=backend_factory or self.backend,
                        actuators_factory=files, rescan_events=lambda: None)  # the fakes change by polling

    def backend(self, info: VolumeInfo) -> FakeBackend:
        b = self.backends.setdefault(info.name, FakeBackend(info))
        return b

    def tick(self, t: float) -> None:
        self.d.tick(self.d.started_ns + int(t * NS))

    def status(self) -> dict[str, Any]:
        """What `cachepilot status` gets: the control socket's answer, from the last published snapshot."""
        return self.d.answer({"cmd": "status"})

    def ctl(self, dev: int = DEV) -> VolumeCtl:
        """The engine's state of a managed volume, through the daemon's own table of them."""
        return self.d.vols[dev].ctl

    def crash(self) -> None:
        """Stop as a killed daemon does: nothing put back, the state file as last written, the socket and lock let go
        (as the kernel would)."""
        self.d.control.stop()
        self.d.lock.release()


class FakeProbe:
    """Records what it was asked to watch, and what the backend looked like when it was loaded."""

    def __init__(self, seen: dict[str, object], backend: FakeBackend) -> None:
        seen["knob_at_load"] = backend.knobs["writeback_percent"]
        self.watched: list[int] = []
        self.closed = False
        self.report = type("R", (), {"summary": staticmethod(lambda: "fake")})()
        self.capture_path = "bcc"
        seen["probe"] = self

    def watch_volume(self, dev: int, fs_dev: int | None = None, lower: object = ()) -> None:
        self.watched.append(dev)

    def unwatch(self, dev: int) -> None:
        self.watched.remove(dev)

    def wake_on(self, fd: int) -> None:  # Probe's: a poll also ends when fd is readable (these polls do not wait)
        pass

    def unread(self) -> bool:  # Probe's: records wait in the rings (these fakes' polls bring what they bring)
        return False

    def take_deletes(self) -> object:  # Probe's bulk deletes (issue 32): none here
        from cachepilot.models.hotness import deletes_array

        return deletes_array([])

    def close(self) -> None:
        self.closed = True


class CountingProbe(FakeProbe):
    """Counts the table drains (each one is a swap of the kernel table's halves and an RCU grace period)."""

    def __init__(self, seen: dict[str, object], backend: FakeBackend) -> None:
        super().__init__(seen, backend)
        self.table_drains = 0

    def poll(self, timeout_ms: int) -> list[object]:
        return []

    def drain_hotness_array(self) -> object:
        import numpy as np

        from cachepilot.models.hotness import HOT_DTYPE

        self.table_drains += 1
        return np.empty(0, dtype=HOT_DTYPE)

    def drain_aggregates(self) -> list[object]:
        return []

    def drain(self) -> list[object]:
        self.table_drains += 1
        return []


def metrics(r: Rig) -> str:
    return (r.tmp / "m.prom").read_text()
