"""Synchronous reloads: a control-socket `reload` request waits for the loop's verdict.

The reload is applied on the loop thread (the engine is the loop's) and parsed beside it (:class:`BackgroundParse`);
the control server's thread only hands the request over and waits, bounded, for the outcome, so `cachepilot
reload` (the unit's ExecReload) can exit non-zero when the new configuration or policy is refused. A SIGHUP still
reloads without anyone waiting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cachepilot.daemon.config import DaemonConfig

log = logging.getLogger("cachepilot")
# what a reload cannot change in a running daemon (its sockets, files, loop and probe are set up at start)
FIXED = ("state_dir", "socket", "tick_s", "max_files", "metrics_listen", "metrics_textfile", "bpf_object")


@dataclass
class Verdict:
    ok: bool
    message: str


@dataclass
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    verdict: Verdict | None = None


class ReloadRequests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Waiter] = []
        self._pending = False

    def request(self) -> None:
        """A reload nobody waits for (SIGHUP: a flag only, safe in a signal handler)."""
        self._pending = True

    def pending(self) -> bool:
        return self._pending

    def ask(self, timeout_s: float) -> Verdict:
        """Called off the loop thread: queue a reload and wait for its verdict (a refusal if none comes in time)."""
        w = _Waiter()
        with self._lock:
            self._waiting.append(w)
        self._pending = True
        if not w.done.wait(timeout_s) or w.verdict is None:
            return Verdict(False, f"the daemon did not reload within {timeout_s:g} s (is its loop stuck or stopping?)")
        return w.verdict

    def take(self) -> list[_Waiter]:
        """Called by the loop before it reloads: the waiters this reload answers (later ones get the next)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        self._pending = False
        return waiting

    @staticmethod
    def answer(waiting: list[_Waiter], verdict: Verdict) -> None:
        for w in waiting:
            w.verdict = verdict
            w.done.set()


class BackgroundParse:
    """One reload's reading and parsing, off the loop thread: the loop only applies the result. A reload may read
    64 policy files of 4 MiB (seconds to parse), and even the default one took over a second of a loaded lab
    guest's tick: in the 30-minute soak, 22 ticks over 1 s after warm-up against 24 SIGHUPs. A stop never waits
    for it (the thread is a daemon thread; nothing it does needs undoing)."""

    def __init__(self, parse: Callable[[], DaemonConfig]) -> None:
        self._done = threading.Event()
        self.result: DaemonConfig | None = None
        self.error: BaseException | None = None  # a UserError refuses the reload; anything else is a bug
        threading.Thread(target=self._run, args=(parse,), name="cachepilot-reload", daemon=True).start()

    def _run(self, parse: Callable[[], DaemonConfig]) -> None:
        try:
            self.result = parse()
        except Exception as exc:  # handed to the loop thread, which judges it (and the guard logs a bug)
            self.error = exc
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        return self._done.wait(seconds)


def keep_fixed(new: DaemonConfig, running: DaemonConfig) -> DaemonConfig:
    """The reloaded configuration with what only a restart can change kept as it runs (a change is said)."""
    for key in FIXED:
        if getattr(new, key) != getattr(running, key):
            log.warning("reload: %s changed; takes effect at the next start", key)
    return replace(new, **{k: getattr(running, k) for k in FIXED})
