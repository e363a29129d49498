"""lvmcache: a dm-cache LV that LVM manages (its dm uuid starts ``LVM-``), changed only through ``lvchange`` so that
LVM's metadata stays the truth and a change survives a reboot (a raw ``dmsetup reload`` would be undone by the next
activation).

What LVM does (lvm2 tools/lvchange.c ``_lvchange_cache``, lib/metadata/cache_manip.c): ``--cachemode`` on a cache
with dirty blocks first waits for it to be clean (loading the cleaner itself, polling) and refuses if that is
interrupted; ``--cachepolicy`` and ``--cachesettings`` are written to the metadata and the table reloaded. So a
drain is ``lvchange --cachepolicy cleaner`` alone (a mode change would block until clean; LVM loads the cleaner in
writethrough, so no new dirty blocks appear), polled tick by tick until ``dirty`` reads 0, and only then
``lvchange --cachemode M --cachepolicy P`` with the saved policy. As on raw dm-cache, recently written blocks are
written back only once the origin idles (``Capabilities.drain_needs_idle``).
Reads (mode, policy, dirty, counters) come from ``dmsetup table|status``, which is what the kernel runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cachepilot.actions import Detach, Drain, Write
from cachepilot.backends import dmcache
from cachepilot.backends.host import BlockDev, Host, ToolResult
from cachepilot.backends.kinds import Kind, KnobDef, Reattach
from cachepilot.backends.operation import Operation, Setting
from cachepilot.capabilities import KIND_LVMCACHE
from cachepilot.errors import CachepilotError, DeviceGone, KernelRejected, RetryLater
from cachepilot.models.volume import VolumeInfo, VolumeSample

NAME = KIND_LVMCACHE
LVCHANGE_TIMEOUT_S = 120.0  # a mode change on a cache that got dirty again waits inside lvchange until it is clean

# What lvchange prints, by class (lvm2's log_error texts).
_GONE = ("Failed to find logical volume", "not found")
_RETRY = ("not clean, refusing", "Can't get lock", "aborted", "busy", "Device or resource busy")
# The hold is dm-cache's own (an LVM cache LV is a dm cache target with smq), said in LVM's terms: the cleaner an
# operator can ask for here is LVM's (lvchange), as a raw dmsetup reload would be undone by the next activation.
LVM_BUSY = ("lvmcache's smq (dm-cache under LVM) cleans only once the origin has been idle for a second"
            " (clean_target_met: busy, no cleaning): a drain (cachepilot drain, LVM's cleaner policy by lvchange)"
            " writes back under load")


def lv_of_dm_name(dm_name: str) -> str:
    """``vg/lv`` of a dm name LVM made (``lab--vg-cached`` -> ``lab-vg/cached``): a single ``-`` separates the
    names, a ``-`` inside a name is doubled."""
    i = 0
    while i < len(dm_name):
        if dm_name[i] == "-":
            if dm_name[i + 1:i + 2] == "-":
                i += 2
                continue
            vg, lv = dm_name[:i], dm_name[i + 1:]
            if vg and lv:
                return f"{vg.replace('--', '-')}/{lv.replace('--', '-')}"
            break
        i += 1
    raise KernelRejected(f"{dm_name}: not a device-mapper name LVM made (vg-lv)")


def classify_lvchange(argv: Sequence[str], r: ToolResult) -> CachepilotError:
    lines = [x.strip() for x in r.stderr.splitlines() if x.strip() and not x.strip().startswith("WARNING")]
    text = f"{' '.join(argv)} failed: {lines[-1] if lines else f'exit status {r.returncode}'}"
    if any(s in r.stderr for s in _RETRY):
        return RetryLater(text)
    if any(s in r.stderr for s in _GONE):
        return DeviceGone(text)
    return KernelRejected(text)


class LvmCacheBackend(dmcache.DmCacheBackend):
    """dm-cache's operations (drain with the cleaner, switch once clean, passthrough only from clean), with every
    change made by ``lvchange`` on the LV."""

    kind = NAME
    busy_hold = LVM_BUSY

    @property
    def lv(self) -> str:
        return lv_of_dm_name(self.dm_name)

    def lvchange(self, *args: str) -> None:
        argv = ("lvchange", *args, self.lv)
        r = self.host.tool(argv, LVCHANGE_TIMEOUT_S)
        if r.returncode != 0:
            raise classify_lvchange(argv, r)

    def lvm_mode(self) -> str:
        """The cache mode in LVM's metadata (the live table says writethrough while the cleaner runs)."""
        argv = ("lvs", "--noheadings", "-o", "cache_mode", self.lv)
        r = self.host.tool(argv, 30.0)
        if r.returncode != 0:
            raise classify_lvchange(argv, r)
        return r.stdout.strip()

    def table_setting(self, what: str) -> Setting:
        """Mode and policy as one setting (``mode/policy``), read from the live table, changed by lvchange. The
        cleaner is asked for alone (a mode change would wait inside lvchange until the cache is clean); LVM loads
        it in writethrough (seen with lvm2 2.03.16), so no new dirty blocks appear while it runs. Any other value
        names both, so that LVM's metadata holds the mode the table shows."""

        def get() -> str:
            t = self.table()
            return f"{t.mode}/{t.policy}"

        def put(value: str) -> None:
            mode, policy = value.split("/")
            if policy == "cleaner":
                self.lvchange("--cachepolicy", policy)
            else:
                self.lvchange("--cachemode", mode, "--cachepolicy", policy)

        def matches(readback: str, wanted: str) -> bool:
            return readback == wanted or (wanted.endswith("/cleaner") and readback.endswith("/cleaner"))

        return Setting(f"{self.lv} cache mode/policy ({what})", get, put, matches)

    def lvs(self, field: str, lv: str | None = None) -> str:
        """One field of ``lvs`` for the LV (or ``lv``), stripped."""
        argv = ("lvs", "--noheadings", "-o", field, lv or self.lv)
        r = self.host.tool(argv, 30.0)
        if r.returncode != 0:
            raise classify_lvchange(argv, r)
        return r.stdout.strip()

    def _detach(self, op: Operation, a: Detach) -> bool:
        """``lvconvert --splitcache``: LVM writes back what is dirty (it loads the cleaner and waits), then takes
        the cache pool off the LV and keeps it (lvm2 tools/lvconvert.c, _lvconvert_split_and_keep_cachevol), so
        ``attach`` can put the same pool back; the LV reads back as a plain linear LV. A failed cache with
        accept_loss: ``--uncache --force`` would drop the pool; not done here (said so)."""
        if a.accept_loss:
            raise KernelRejected(f"{self.lv}: accept_loss is not carried out on lvmcache: lvconvert --uncache"
                                 " --force drops the pool and its dirty blocks; run it yourself if you accept that")
        attached = self.lvs("pool_lv").strip("[]")  # lvs brackets a hidden LV
        vg = self.lv.split("/")[0]
        argv = ("lvconvert", "--yes", "--splitcache", self.lv)
        if op.dry_run:
            op.writes.append(Write(f"{self.lv} cache pool", f"{vg}/{kept_pool_name(attached)}", "splitcache",
                                   "(dry run)"))
            return True
        r = self.host.tool(argv, LVCHANGE_TIMEOUT_S)
        if r.returncode != 0:
            raise classify_lvchange(argv, r)
        seg = self.lvs("segtype")
        if seg == "cache" or self.lvs("pool_lv").strip("[]"):
            raise KernelRejected(f"{self.lv}: still cached after lvconvert --splitcache (segtype {seg})")
        pool = f"{vg}/{kept_pool_name(attached)}"
        pool_seg = self._segtype_or_none(pool)
        if pool_seg != "cache-pool":
            raise KernelRejected(f"{self.lv}: split from its cache, but the pool it kept is not {pool} (lvs reads"
                                 f" {pool_seg or 'no such LV'}): find it with lvs -a {vg} before attach")
        op.writes.append(Write(f"{self.lv} cache pool", pool, "splitcache", f"segtype {seg}, {pool} {pool_seg}"))
        op.phase = f"split from {pool} (kept for attach)"
        return True

    def _segtype_or_none(self, lv: str) -> str:
        """``lvs -o segtype`` of ``lv``, "" when LVM has no such LV."""
        try:
            return self.lvs("segtype", lv)
        except DeviceGone:
            return ""

    def migration_threshold_setting(self) -> Setting:
        return Setting(f"{self.lv} migration_threshold",
                       lambda: self.status().core_args.get("migration_threshold", ""),
                       lambda v: self.lvchange("--cachesettings", f"migration_threshold={v}"))

    def _begin_drain(self, op: Operation, mode: str, reason: str) -> bool:
        """Clean: load ``mode`` (True). Dirty: the cleaner (by itself: see :meth:`table_setting`); the end of the
        cleaner loads the saved mode with the saved policy in one lvchange, the cache clean by then."""
        if isinstance(op.action, Drain) and self.table().policy == "cleaner":
            # a cleaner left live (a daemon that died mid-drain) shows writethrough: LVM keeps the mode to go back to
            mode = op.data["mode"] = self.lvm_mode()
        return super()._begin_drain(op, mode, reason)

    def _undo(self, op: Operation) -> None:
        """An abandoned drain puts back the saved policy in the mode LVM's metadata still has: asking lvchange for
        another mode on a cache that is still dirty would block until it is clean."""
        if op.data.pop("cleaner", None):
            op.put(self.table_setting("policy"), f"{self.lvm_mode()}/{op.data['policy']}", f"undo {op.action.kind}")


POOL_SUFFIX = "_cpool"


def kept_pool_name(attached: str) -> str:
    """The name a cache pool has once ``lvconvert --splitcache`` kept it, from the name ``lvs -o pool_lv`` printed
    while it was attached: lvm2 (2.03) renames a pool it attaches to ``NAME_cpool`` and back to ``NAME`` when it
    splits it off (seen in the lab, lvm2 2.03.16: ``[cpool_cpool]`` attached, ``cpool`` after the split). The
    backend reads the name back with lvs before it saves it."""
    return attached[:-len(POOL_SUFFIX)] if attached.endswith(POOL_SUFFIX) and attached != POOL_SUFFIX else attached


def attach(host: Host, name: str, dm_name: str, pool: str) -> Write:  # noqa: ARG001 (the LV is named by dm name)
    """``lvconvert --type cache --cachepool VG/POOL VG/LV`` (the pool detach split off and LVM kept); read back as
    the LV's segment type."""
    lv = lv_of_dm_name(dm_name)
    argv = ("lvconvert", "--yes", "--type", "cache", "--cachepool", pool, lv)
    r = host.tool(argv, LVCHANGE_TIMEOUT_S)
    if r.returncode != 0:
        raise classify_lvchange(argv, r)
    seg = host.tool(("lvs", "--noheadings", "-o", "segtype", lv), 30.0).stdout.strip()
    if seg != "cache":
        raise KernelRejected(f"{lv}: segtype {seg!r} after lvconvert --type cache --cachepool {pool}")
    return Write(f"{lv} cache pool", "", pool, f"segtype {seg}")


def saved_pool(cache_id: str, writes: tuple[Write, ...]) -> str:  # noqa: ARG001 (the pool names the cache)
    return next((w.before for w in writes if w.target.endswith(" cache pool")), "")


_LV = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*/[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$")
REATTACH = Reattach("VG/POOL, the cache pool detach split off", lambda c: bool(_LV.match(c)), attach, saved_pool)


# ------------------------------------------------------------------ the kind: discovery, description, samples
def detect(dev: BlockDev) -> bool:
    """A dm cache target whose uuid LVM gave it (``LVM-<vg uuid><lv uuid>``); before dm-cache in precedence."""
    return dev.dm_target == "cache" and dev.dm_uuid.startswith("LVM-")


def sample(host: Host, info: VolumeInfo, now: int) -> VolumeSample:
    return dmcache.sample(host, info, now, busy=LVM_BUSY)


# Modes, drain and the knob's range: cachepilot.capabilities (as dm-cache's, the drain by lvchange).
KIND = Kind(NAME, LvmCacheBackend, detect, dmcache.describe, sample,
            knobs=(KnobDef("migration_threshold", LvmCacheBackend.migration_threshold_setting),),
            precedence=10,  # an LVM cache LV is a dm cache target too: this kind claims it first
            reattach=REATTACH)
