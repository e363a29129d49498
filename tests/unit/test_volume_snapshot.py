"""The exporter's per-volume snapshot is declared once (exporter/snapshot.py: each field with its metric) and built
once a tick from the volume's state (daemon/status.volume_snapshot): a metric is one field and one value. A field
the builder forgets, or a field no collector exports, fails here."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from cachepilot.daemon.volumes import Found
from cachepilot.exporter import collectors
from cachepilot.exporter.snapshot import VolumeSnapshot, volume_metrics
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import DEV, Rig

# the fields a collector of its own reads (labels, state sets, the cache-set info, the epoch histogram, the advisor)
READ_BY_THEIR_OWN_COLLECTOR = {"volume", "device", "kind", "mode", "target_mode", "cache_set", "epoch_bytes",
                               "advice"}


def test_no_field_has_a_default_so_none_can_be_forgotten() -> None:
    """A builder that leaves a field out fails at once (TypeError; mypy in make lint), instead of exporting a
    made-up default."""
    missing = dataclasses.MISSING
    assert [f.name for f in dataclasses.fields(VolumeSnapshot)
            if f.default is not missing or f.default_factory is not missing] == []


def test_every_field_is_exported() -> None:
    """Each field carries its metric (read by the collector it names) or is read by a collector of its own."""
    with_metric = {name for c in collectors.COLLECTORS for name, _ in volume_metrics(c)}
    names = {f.name for f in dataclasses.fields(VolumeSnapshot)}
    assert names - with_metric == READ_BY_THEIR_OWN_COLLECTOR
    rows = [r for t in (collectors.VOLUME, collectors.EXPOSURE, collectors.CACHE, collectors.ACTUATION,
                        collectors.EPOCHS) for r in t]
    assert {r[3] for r in rows} == with_metric and len({r[1] for r in rows}) == len(rows)


def test_the_daemon_builds_the_snapshot_from_the_volumes_state(tmp_path: Path) -> None:
    """The tick's status carries the volume's snapshot, every field given by the builder (one missing: TypeError),
    and the exporter serves that very object (no copy): each metric the volume has a value for is in the textfile."""
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    r.backends["bcache0"].dirty = 8 << 20
    r.tick(1)
    r.tick(2)
    status = r.d.snapshot
    assert status is not None
    snap = status.volumes[0].metrics
    assert isinstance(snap, VolumeSnapshot) and snap.dirty_bytes == 8 << 20 and snap.volume == "bcache0"
    assert r.d.metrics is not None
    latest = r.d.metrics.box.latest()
    assert latest is not None and len(latest.volumes) == 1 and latest.volumes[0] is snap
    text = (tmp_path / "m.prom").read_text()
    for c in collectors.COLLECTORS:
        for name, m in volume_metrics(c):
            if getattr(snap, name) is not None:
                assert f'{m.name}{{device="bcache0",volume="bcache0"}}' in text, name
    r.d.shutdown()


def test_a_volume_whose_label_the_exporter_refuses_is_left_out_and_said(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The label check runs where the tick builds the snapshot; status keeps the volume, the exporter leaves it out
    and says why (once), the other metrics are served."""
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.found = [Found(VolumeInfo(dev=DEV, name="dm-3", kind="dm-cache", fs_uuid="u-1", mountpoint="/mnt/x",
                                cache_bytes=1 << 30), dm_name='lab"cached')]
    r.d.start()
    with caplog.at_level(logging.WARNING, logger="cachepilot"):
        r.tick(1)
        r.tick(2)
    status = r.d.snapshot
    assert status is not None and status.volumes[0].metrics is None
    assert "is not a usable label value" in str(status.volumes[0].metrics_refused)
    said = [m for m in caplog.messages if m.startswith("metrics: dm-3 left out: volume: 'lab\"cached'")]
    assert len(said) == 1, caplog.messages
    text = (tmp_path / "m.prom").read_text()
    assert "cachepilot_ready 1.0" in text and "cachepilot_volume_info{" not in text
    r.d.shutdown()
