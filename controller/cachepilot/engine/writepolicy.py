"""The write-policy decision: the failure latch first, then the failure model and the exposure bound, with
hysteresis; a drain in flight keeps the mode it found."""

from __future__ import annotations

from cachepilot.actions import Action, SetWritePolicy
from cachepilot.engine.drains import drain_putting_back
from cachepilot.engine.exposure import Exposure
from cachepilot.engine.volumectl import NS, REQUEST_RETRY_NS, VolumeCtl, normalise_mode
from cachepilot.models.volume import BYPASS, WRITEBACK, WRITETHROUGH


class WritePolicy:
    """Asks for the write mode each volume should be in (at most once per REQUEST_RETRY_NS while unanswered)."""

    def __init__(self, exposure: Exposure) -> None:
        self.exposure = exposure

    def _target_mode(self, c: VolumeCtl, now: int) -> tuple[str, str, bool]:
        """(mode, reason, forced): forced switches ignore the hysteresis interval."""
        st = c.state
        cur = normalise_mode(st.mode)
        if c.latch is not None:
            what = f"latched: {c.latch.reason}; stays out of write-back until the cache device is replaced or cleared"
            if st.dirty_bytes > 0:
                return WRITETHROUGH, f"{what}: write-through and drain {st.dirty_bytes} dirty bytes", True
            if cur == WRITEBACK:
                return WRITETHROUGH, f"{what}: write-through first", True
            return BYPASS, f"{what}: cache clean, taking it out of the path", True
        fm, why = self.exposure.failure_model(c, now)
        if fm == "read-mostly":
            return WRITETHROUGH, why, False
        if fm == "recoverable":
            return WRITEBACK, f"{why}: write-back is safe", False
        ex = c.policy.exposure
        if c.breach is not None:
            return WRITETHROUGH, f"exposure breach: {c.breach}", True
        projected, rate = self.exposure.projected_dirty(c, now)
        if projected > ex.max_dirty:
            if cur == WRITEBACK:
                return WRITETHROUGH, (
                    f"exposure bound: {st.dirty_bytes} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                    f" by the next sample (bound {ex.max_dirty} bytes)"), True
            return WRITETHROUGH, "holding write-through: write-back could cross the byte bound", False
        if cur != WRITEBACK and st.dirty_bytes > c.policy.hysteresis.resume_below * ex.max_dirty:
            return WRITETHROUGH, "waiting for dirty data to drain below the resume mark", False
        return WRITEBACK, f"{why}: within exposure bound", False

    def decide(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        st = c.state
        if st.samples == 0:
            return  # never act on a volume whose state we have not read
        cur = normalise_mode(st.mode)
        target, reason, forced = self._target_mode(c, now)
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
