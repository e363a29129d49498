"""The write-policy decision: the failure latch first, then the failure model and the exposure bound, with
hysteresis; a drain in flight keeps the mode it found. Under the destructive model, a volume whose drains replace
the cache's policy (dm-cache) and whose writes are a trickle runs write-through: nothing to drain."""

from __future__ import annotations

from cachepilot.actions import Action, SetWritePolicy
from cachepilot.engine.drains import drain_putting_back
from cachepilot.engine.exposure import (
    LEAVE_FACTOR,
    MIN_RECENT_IO,
    READ_MOSTLY_BARRIERS,
    READ_MOSTLY_WRITE_SHARE,
    RECENT_IO_NS,
    Exposure,
    read_mostly,
)
from cachepilot.engine.volumectl import NS, REQUEST_RETRY_NS, BoundStretch, VolumeCtl, normalise_mode
from cachepilot.models.volume import BYPASS, WRITEBACK, WRITETHROUGH

MIB = 1 << 20
BOUND_REASON = "exposure bound"
BREACH_REASON = "exposure breach"
RESUME_RATE_SHARE = 0.8  # write-back again once the volume writes at most this share of its write-back rate


class WritePolicy:
    """Asks for the write mode each volume should be in (at most once per REQUEST_RETRY_NS while unanswered)."""

    def __init__(self, exposure: Exposure) -> None:
        self.exposure = exposure

    def _target_mode(self, c: VolumeCtl, now: int, io: tuple[int, int]) -> tuple[str, str, bool]:
        """(mode, reason, forced): forced switches ignore the hysteresis interval."""
        st = c.state
        cur = normalise_mode(st.mode)
        if c.latch is not None:
            what = f"latched: {c.latch.reason}; stays out of write-back until the cache device is replaced or cleared"
            if st.dirty_bytes > 0:
                return WRITETHROUGH, f"{what}: write-through and drain {st.dirty_bytes} dirty bytes", True
            if cur == WRITEBACK:
                return WRITETHROUGH, f"{what}: write-through first", True
            lost = st.dirty_before_failure if st.failed else 0
            if lost:  # a failed dm-cache reports no figures: its 0 dirty bytes are not a clean cache
                return BYPASS, (f"{what}: the cache device failed holding {lost} dirty bytes it can no longer write"
                                " back; taking it out of the path (cachepilot detach --accept-loss drops them)"), True
            return BYPASS, f"{what}: cache clean, taking it out of the path", True
        fm, why = self.exposure.failure_model(c, now)
        if fm == "read-mostly":
            return WRITETHROUGH, why, False
        if fm == "recoverable":
            return WRITEBACK, f"{why}: write-back is safe", False
        ex = c.policy.exposure
        if c.breach is not None:
            return WRITETHROUGH, f"{BREACH_REASON}: {c.breach}", True
        if c.bound_wt is not None and cur != WRITEBACK:
            return self._resume(c, now)
        projected, rate = self.exposure.projected_dirty(c, now)
        if projected > ex.max_dirty:
            if cur == WRITEBACK:
                return WRITETHROUGH, (
                    f"{BOUND_REASON}: {st.dirty_bytes} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                    f" by the next sample (bound {ex.max_dirty} bytes)"), True
            return WRITETHROUGH, "holding write-through: write-back could cross the byte bound", False
        trickle = self._trickle(c, now, cur, io)
        if trickle is not None and trickle[0]:
            return WRITETHROUGH, f"{why}: {trickle[1]}", False
        if cur != WRITEBACK and st.dirty_bytes > c.policy.hysteresis.resume_below * ex.max_dirty:
            return WRITETHROUGH, "waiting for dirty data to drain below the resume mark", False
        if trickle is not None and cur != WRITEBACK:
            why = f"{why}: {trickle[1]}"
        return WRITEBACK, f"{why}: within exposure bound", False

    def _resume(self, c: VolumeCtl, now: int) -> tuple[str, str, bool]:
        """A write-through stretch the byte bound forced ends as soon as write-back can keep the bound again --
        hysteresis on dirty data and on rate, not a timer of minutes (issue 31: with a 5 min hold a sync-heavy
        run spent most of its time at write-through's speed): dirty data down to the resume mark, and the volume's
        writes no faster than RESUME_RATE_SHARE of the write-back rate measured at full rate (its drains, or how
        fast this stretch drained), so write-back outruns them; unmeasured, no faster than fills max_dirty in
        max_age. Not held by min_switch_interval: both marks are the hysteresis."""
        st, ex = c.state, c.policy.exposure
        mark = int(c.policy.hysteresis.resume_below * ex.max_dirty)
        w, r = self.exposure.write_rate(c, now), self.exposure.writeback_rate(c, now)
        cap = RESUME_RATE_SHARE * r if r > 0 else ex.max_dirty / max(ex.max_age_s, 1e-9)
        against = f"a measured write-back rate of {r / MIB:.2f} MiB/s" if r > 0 else "no measured write-back rate"
        seen = f"{st.dirty_bytes} dirty bytes (resume mark {mark}), writes {w / MIB:.2f} MiB/s against {against}"
        if st.dirty_bytes > mark or w > cap:
            limit = f"{RESUME_RATE_SHARE:.0%} of it" if r > 0 else f"max_dirty per max_age, {cap / MIB:.2f} MiB/s"
            why = f"holding write-through the bound forced: {seen}; write-back again below {limit}"
            return WRITETHROUGH, why, False
        return WRITEBACK, f"write-back can keep the bound again: {seen}", True

    @staticmethod
    def _trickle(c: VolumeCtl, now: int, cur: str, io: tuple[int, int]) -> tuple[bool, str] | None:
        """Whether a destructive volume on a kind whose drains replace the cache's policy should stay out of
        write-back because its writes are a trickle (True, why), or go back to it (False, why); None: not such a
        kind. Write-back would gain such a volume nothing (its few writes still have to be drained within
        max_age), while each drain costs the cache what its policy learnt (Capabilities.drain_replaces_policy).
        Read-mostly (engine.exposure.read_mostly) over the last RECENT_IO_NS of the probe's counts, with
        hysteresis; a window with fewer than MIN_RECENT_IO bytes changes nothing."""
        if not c.caps.drain_replaces_policy or WRITETHROUGH not in c.caps.modes:
            return None
        rb, wb = io
        total = rb + wb
        window = f"{RECENT_IO_NS // NS} s"
        if total < MIN_RECENT_IO:
            return (cur == WRITETHROUGH, f"{total >> 20} MiB moved in the last {window} (under {MIN_RECENT_IO >> 20}"
                    f" MiB): too little to tell, staying in {cur}")
        share, rate = wb / total, c.epochs.stats(now).barrier_rate
        seen = (f"{share:.1%} of the {total / (1 << 20):.0f} MiB moved in the last {window} were writes,"
                f" {rate:.1f} barriers/s")
        back = f"{LEAVE_FACTOR * READ_MOSTLY_WRITE_SHARE:.0%} writes or {LEAVE_FACTOR * READ_MOSTLY_BARRIERS:g}/s"
        if not read_mostly(share, rate, leaving=cur != WRITEBACK):
            return False, f"writes picked up ({seen}; the mark is {back} barriers)"
        if cur == WRITEBACK and (c.drain is not None or drain_putting_back(c, now)):
            return None  # the drain puts back the mode it found first
        return True, (f"read-mostly ({seen}): write-through, so no dirty data needs a drain -- on {c.info.kind}"
                      f" each drain reloads the table with the cleaner policy and back, which loses smq's hotspot"
                      f" statistics and per-block levels; write-back again from {back} barriers")

    def decide(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        st = c.state
        if st.samples == 0:
            return  # never act on a volume whose state we have not read
        cur = normalise_mode(st.mode)
        self.exposure.write_rate(c, now)  # a mark every tick, so the window is there when a stretch needs it
        if cur == WRITEBACK:
            c.bound_wt = None
        target, reason, forced = self._target_mode(c, now, self.exposure.recent_io(c, now))
        if target == WRITEBACK and (c.drain is not None or drain_putting_back(c, now)):
            return  # a drain puts back the mode it found (bcache closes a drain in write-through)
        if target == BYPASS and st.dirty_bytes > 0:  # the invariant, whatever the rules above say
            target, reason = WRITETHROUGH, f"not bypassing a dirty cache ({st.dirty_bytes} bytes): {reason}"
        if target == cur or target not in c.caps.modes:
            c.requested_mode = None
            return  # e.g. dm-writecache: write-back only; its bound is kept by drains (Drains.plan)
        req = c.requested_mode
        if req is not None and req[0] == target and now - req[1] < REQUEST_RETRY_NS:
            return
        if not forced and c.last_switch_ns is not None:
            hold = c.policy.hysteresis.min_switch_interval_s * NS
            if now - c.last_switch_ns < hold:
                c.held_switches += 1
                return
        out.append(SetWritePolicy(c.info.name, target, reason))
        c.requested_mode = (target, now)
        c.last_switch_ns = now
        if target == WRITETHROUGH and cur == WRITEBACK and reason.startswith((BOUND_REASON, BREACH_REASON)):
            c.bound_wt = BoundStretch(now, st.dirty_bytes)
