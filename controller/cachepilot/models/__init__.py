"""Models: what the controller believes about files, epochs, freed extents and volumes.

Everything here is pure Python, fed by :mod:`cachepilot.events` and by backend samples, and cheap per
event: the hot structures are parallel arrays indexed by a slot number, not one object per file.
"""

from cachepilot.models.admission import CachedSet
from cachepilot.models.epochs import EpochStats, EpochTracker
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.hotness import HotnessTable, inverse_bitmap_score
from cachepilot.models.volume import Health, VolumeInfo, VolumeSample, VolumeState

__all__ = [
    "CachedSet",
    "EpochStats",
    "EpochTracker",
    "FreedExtentQueue",
    "Health",
    "HotnessTable",
    "VolumeInfo",
    "VolumeSample",
    "VolumeState",
    "inverse_bitmap_score",
]
