"""Drains and the exposure guarantee: when a destructive volume's dirty data must be driven to zero, how a
drain ends (clean, failed, past its deadline: a breach), and when a drain in flight holds other work back."""

from __future__ import annotations

from cachepilot.actions import Action, Drain
from cachepilot.engine.exposure import Exposure, tick_ns
from cachepilot.engine.volumectl import NS, DrainInFlight, VolumeCtl, normalise_mode
from cachepilot.models.volume import WRITEBACK, WRITETHROUGH


def drain_at_risk(c: VolumeCtl, now: int) -> bool:
    """A drain past half its window on a kind whose write-back needs the origin idle (dm-cache writes back
    recently written blocks only after a second without I/O): promotion reads must not keep it busy."""
    d = c.drain
    return (d is not None and c.caps.drain_needs_idle
            and now - d.start_ns >= (d.action.deadline_ns - d.start_ns) // 2)


def drain_putting_back(c: VolumeCtl, now: int) -> bool:
    """A sample saw the cache clean, which ends the drain for the exposure bound; the backend puts its saved
    settings back at its next step. Two ticks for that before the engine asks for a mode itself."""
    return c.drain_clean_ns is not None and now - c.drain_clean_ns < 2 * tick_ns(c, now)


class Drains:
    """Plans each volume's drains and tracks the one in flight."""

    def __init__(self, exposure: Exposure) -> None:
        self.exposure = exposure

    def track(self, c: VolumeCtl, now: int) -> None:
        """A drain is done once a sample taken after it started shows no dirty data (or the backend said so);
        past its deadline it is a breach."""
        d = c.drain
        if d is None:
            return
        st = c.state
        if st.clean_ns is not None and st.clean_ns >= d.start_ns:
            c.drain, c.drain_clean_ns = None, now
        elif now >= d.action.deadline_ns:
            c.drain = None
            self._set_breach(c, (
                f"drain started at {d.start_ns / NS:.0f} s missed its deadline"
                f" ({d.action.deadline_ns / NS:.0f} s; {st.dirty_bytes} bytes still dirty)"))

    def plan(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """The exposure guarantee. Let A = exposure.max_age, P = A/2, C = the last time the cache was known clean
        (a sample with no dirty data, or the tick in which a drain's backend read it clean). Every dirty byte was
        written after C. A drain starts no later than C + P (a tick early, so a late tick cannot delay it) with
        deadline C + A. When it completes, every byte dirty at its start is written back. So no byte
        stays dirty longer than A, provided each drain completes within P (the backing device absorbs the
        write-back, the samples or outcomes report it; dm-cache writes back recently written blocks only when the
        device idles, see Capabilities.drain_needs_idle); a drain that does not is a breach: write-through
        (where the kind has it), a new drain, and an alert-worthy reason."""
        st = c.state
        if st.samples == 0 or c.drain is not None:
            return
        ex = c.policy.exposure
        half = int(ex.max_age_s * NS / 2)
        why = self._drain_reason(c, now, half)
        if why is None:
            return
        base = st.clean_ns
        deadline = now + half if base is None else max(base + 2 * half, now + half)
        deadline = max(deadline, c.drain_sleep_until_ns + half)
        a = Drain(c.info.name, deadline, why)
        out.append(a)
        c.drain = DrainInFlight(a, now)

    def _drain_reason(self, c: VolumeCtl, now: int, half: int) -> str | None:
        st = c.state
        dirty = st.dirty_bytes
        if c.latch is not None:
            return f"latched: {c.latch.reason}: draining {dirty} dirty bytes" if dirty > 0 else None
        if c.breach is not None:
            return f"exposure breach: {c.breach}: draining {dirty} dirty bytes" if dirty > 0 else None
        # auto is destructive about what it leaves dirty, read-mostly or not
        fm, _ = self.exposure.failure_model(c, now)
        if fm == "recoverable" or (dirty == 0 and normalise_mode(st.mode) != WRITEBACK):
            return None
        ex = c.policy.exposure
        if WRITETHROUGH not in c.caps.modes:
            projected, rate = self.exposure.projected_dirty(c, now)
            if projected > ex.max_dirty:
                return (f"exposure bound: {dirty} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                        f" (bound {ex.max_dirty}); {c.info.kind} has no write-through: flushing")
        if dirty == 0:
            return None  # this sample read clean: clean_ns moved to it, no byte is older than the sample
        base = st.clean_ns
        if base is None:
            return f"periodic drain: dirty data of unknown age ({dirty} bytes)"
        if now + tick_ns(c, now) >= base + half:
            return (f"periodic drain: last known clean {(now - base) / NS:.0f} s ago; every dirty byte written back"
                    f" within max_age {ex.max_age_s:g} s")
        return None

    def ended(self, c: VolumeCtl, a: Drain, ok: bool, detail: str, now: int) -> None:
        d = c.drain
        if d is None or d.action != a:
            return
        c.drain = None
        if ok:
            # A backend reports a drain done when it reads the cache clean, which it does after this tick began:
            # every byte dirty now was written after the tick's time.
            c.state.cleaned(max(d.start_ns, now))
            c.breach = None  # the bound holds again (write-back resumes after the hysteresis interval)
        else:
            self._set_breach(c, f"drain started at {d.start_ns / NS:.0f} s failed: {detail or 'no reason given'}")

    def _set_breach(self, c: VolumeCtl, why: str) -> None:
        c.breach = why
        c.breaches += 1
