"""Drains and the exposure guarantee: when a destructive volume's dirty data must be driven to zero, how a
drain ends (clean, failed, past its deadline: a breach), and when a drain in flight holds other work back."""

from __future__ import annotations

from cachepilot.actions import Action, Drain
from cachepilot.engine.exposure import Exposure, tick_ns
from cachepilot.engine.nativebound import NativeBound
from cachepilot.engine.pacing import PACE_SHARE, drain_rate
from cachepilot.engine.volumectl import NS, DrainInFlight, VolumeCtl, normalise_mode
from cachepilot.models.volume import WRITEBACK, WRITETHROUGH

ROOM = 0.75  # a late drain starts early once dirty data could pass this share of max_dirty within two ticks


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

    def __init__(self, exposure: Exposure, native: NativeBound | None = None) -> None:
        self.exposure = exposure
        self.native = native if native is not None else NativeBound()

    def track(self, c: VolumeCtl, now: int) -> None:
        """A drain is done once a sample taken after it started shows no dirty data (or the backend said so);
        past its deadline it is a breach."""
        d = c.drain
        if d is None:
            return
        st = c.state
        if st.clean_ns is not None and st.clean_ns >= d.start_ns:
            c.drain, c.drain_clean_ns = None, now
            self._measured(c, d, st.clean_ns, now)
        elif now >= d.action.deadline_ns:
            c.drain = None
            self._measured(c, d, now, now, at_least=True)  # at least this long: the next drains start earlier
            if d.by_operator:
                return
            self._set_breach(c, (
                f"drain started at {d.start_ns / NS:.0f} s missed its deadline"
                f" ({d.action.deadline_ns / NS:.0f} s; {st.dirty_bytes} bytes still dirty)"))

    def plan(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """The exposure guarantee. Let A = exposure.max_age, C = the last time the cache was known clean (a sample
        with no dirty data, or the tick in which a drain's backend read it clean). Every dirty byte was written
        after C, so the oldest is at most now - C old. A drain starts no later than C + A - L (a tick early, so a
        late tick cannot delay it) with deadline C + A, where the lead L is the drain's predicted duration plus a
        margin (:meth:`lead`; A/2 until a drain of the volume has been measured). When it completes, every byte
        dirty at its start is written back. So no byte stays dirty longer than A, provided each drain completes
        within its lead (the backing device absorbs the write-back, the samples or outcomes report it; dm-cache
        writes back recently written blocks only when the device idles, see Capabilities.drain_needs_idle); a
        drain that does not is a breach: write-through (where the kind has it), a new drain, and an alert-worthy
        reason. Starting as late as the bound allows gives young data the most time to die in the cache (its
        delete's discard drops it there) before the drain writes it back."""
        st = c.state
        if st.samples == 0 or c.drain is not None:
            return
        half = int(c.policy.exposure.max_age_s * NS / 2)
        lead, how = self.lead(c, now, half)
        planned = self._drain_reason(c, now, lead, how)
        if planned is None:
            return
        why, window = planned
        base = st.clean_ns
        deadline = now + half if base is None else max(base + 2 * half, now + window)
        deadline = max(deadline, c.drain_sleep_until_ns + half)
        # a breach or a latch drains at the full rate: the bound is already at stake
        rate = drain_rate(c) if why.startswith("periodic drain") else 0
        if rate:
            why += f"; paced at {rate / (1 << 20):.2f} MiB/s ({PACE_SHARE:g}x the measured full rate, exposure.pace)"
        a = Drain(c.info.name, deadline, why, rate)
        out.append(a)
        c.drain = DrainInFlight(a, now, st.dirty_bytes)

    def lead(self, c: VolumeCtl, now: int, half: int) -> tuple[int, str]:
        """How long before the age bound a periodic drain starts, and why: the predicted duration P of draining the
        dirty data the next sample may show, at the write-back rate of the volume's last drains (their bytes over
        their durations, and never less than the longest of them: a drain has a fixed cost, a mode switch and the
        sample that sees it clean), plus a margin of P/2 and two ticks; at most A. A/2 before any drain of the
        volume was measured."""
        done = c.drains_done
        if not done:
            return half, f"no drain of this volume measured yet: starting at max_age/2 ({half / NS:g} s)"
        projected, _ = self.exposure.projected_dirty(c, now)
        nbytes, took = sum(b for b, _ in done), sum(t for _, t in done)
        longest = max(t for _, t in done)
        predicted = max(longest, projected * took // max(1, nbytes))
        paced = drain_rate(c) > 0
        if paced:
            predicted = int(predicted / PACE_SHARE)  # a paced drain takes 1/PACE_SHARE as long: it starts earlier
        lead = min(2 * half, predicted + predicted // 2 + 2 * tick_ns(c, now))
        rate = nbytes / max(1, took) * NS / (1 << 20)
        pace = f" paced at {PACE_SHARE:g}x," if paced else ""
        return lead, (f"the last {len(done)} drains wrote back {rate:.2f} MiB/s at full rate (longest"
                      f" {longest / NS:.1f} s), so {projected / (1 << 20):.1f} MiB should take{pace}"
                      f" {predicted / NS:.1f} s; with half that and two"
                      f" ticks of margin the drain starts {lead / NS:.1f} s before max_age {2 * half / NS:g} s,"
                      f" leaving young data the rest to die in the cache")

    def _drain_reason(self, c: VolumeCtl, now: int, lead: int, how: str) -> tuple[str, int] | None:
        """Why a drain starts now, and the least time it gets from now (its deadline is C + A or later); None: not
        yet."""
        st = c.state
        dirty = st.dirty_bytes
        half = int(c.policy.exposure.max_age_s * NS / 2)
        if c.latch is not None:
            return (f"latched: {c.latch.reason}: draining {dirty} dirty bytes", half) if dirty > 0 else None
        if c.breach is not None:
            return (f"exposure breach: {c.breach}: draining {dirty} dirty bytes", half) if dirty > 0 else None
        # auto is destructive about what it leaves dirty, read-mostly or not
        fm, _ = self.exposure.failure_model(c, now)
        if fm == "recoverable" or (dirty == 0 and normalise_mode(st.mode) != WRITEBACK):
            return None
        if self.native.holds(c):
            # the kernel keeps the bound (engine.nativebound): no periodic drain, a flush only on a measured breach
            breach = self.native.breach(c)
            return (f"{breach}: flushing {dirty} dirty bytes", half) if breach else None
        if self.native.pending(c, now):
            return None  # the reloads that delegate the bound are under way (NativeBound.pending)
        ex = c.policy.exposure
        if WRITETHROUGH not in c.caps.modes:
            projected, rate = self.exposure.projected_dirty(c, now)
            if projected > ex.max_dirty:
                return (f"exposure bound: {dirty} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                        f" (bound {ex.max_dirty}); {c.info.kind} has no write-through: flushing", half)
        if dirty == 0:
            return None  # this sample read clean: clean_ns moved to it, no byte is older than the sample
        base = st.clean_ns
        if base is None:
            return f"periodic drain: dirty data of unknown age ({dirty} bytes)", half
        late = now + tick_ns(c, now) >= base + 2 * half - lead
        room = "" if late or not c.drains_done else self._byte_room(c, now)
        if late or room:
            # deadline C + A: a tick that comes after it (a stalled loop) is a breach, not a later deadline
            return (f"periodic drain: last known clean {(now - base) / NS:.0f} s ago, so no dirty byte is older;"
                    f" every dirty byte written back within max_age {ex.max_age_s:g} s: {room or how}", tick_ns(c, now))
        return None

    def _byte_room(self, c: VolumeCtl, now: int) -> str:
        """A drain timed late lets dirty data grow for longer: start it once the dirty data, growing at its peak
        rate, could pass ROOM of max_dirty by the sample after next (a drain started a tick later would start
        there; once it runs, dirty data shrinks), so that the byte bound does not force write-through (and its
        hysteresis) before the drain comes. "" while there is room."""
        st = c.state
        cap = c.policy.exposure.max_dirty
        rate = st.dirty_rate()
        reach = st.dirty_bytes + int(rate * 2 * tick_ns(c, now) / NS)
        if reach <= ROOM * cap:
            return ""
        return (f"{st.dirty_bytes} dirty bytes growing {rate:.0f} B/s could reach {reach} by the sample after next"
                f" ({ROOM:.0%} of max_dirty {cap}): starting now, before the byte bound forces write-through")

    def ended(self, c: VolumeCtl, a: Drain, ok: bool, detail: str, now: int) -> None:
        d = c.drain
        if d is None or d.action != a:
            return
        c.drain = None
        if ok:
            self._measured(c, d, now, now)
            # A backend reports a drain done when it reads the cache clean, which it does after this tick began:
            # every byte dirty now was written after the tick's time; or (drain_done_as_of_start) once every byte
            # dirty at the drain's start is written back.
            c.state.cleaned(d.start_ns if c.caps.drain_done_as_of_start else max(d.start_ns, now))
            c.breach = None  # the bound holds again (write-back resumes after the hysteresis interval)
        elif c.breach is None and not d.by_operator:
            self._set_breach(c, f"drain started at {d.start_ns / NS:.0f} s failed: {detail or 'no reason given'}")
        # else the breach's own drain failed (e.g. refused while the backend still abandons the drain that missed
        # its deadline): the same breach goes on and the next tick drains again -- not a second breach

    @staticmethod
    def _measured(c: VolumeCtl, d: DrainInFlight, done_ns: int, now: int, at_least: bool = False) -> None:
        """Keep a completed drain's bytes and duration; a drain is seen done a tick after it started at the
        earliest, so a tick is the least duration it is taken for (the resolution of the measurement). Not a
        completed one that started while the write-back thread may still have been in a sleep begun before it was
        shortened (``drain_sleep_until_ns``): its duration may be mostly that sleep, and taken for the next drains'
        predicted duration it would start each of them right after the last (W1's round 1: a drain every ~4 s
        after the first). One that missed its deadline (``at_least``) is kept, timed from when that sleep had
        ended at the latest."""
        start = d.start_ns
        if start < c.drain_sleep_until_ns:
            if not at_least:
                return
            start = c.drain_sleep_until_ns
        took = done_ns - start
        if d.action.rate:
            took = int(took * PACE_SHARE)  # kept at full-rate terms: the next drains' pace and lead derive from it
        c.drains_done.append((d.dirty_bytes, max(tick_ns(c, now), took)))

    def _set_breach(self, c: VolumeCtl, why: str) -> None:
        c.breach = why
        c.breaches += 1
