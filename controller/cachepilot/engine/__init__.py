"""The decision engine: models + policy + backend state -> actions with reasons."""

from cachepilot.engine.actions import Action, DiscardRanges, Promote, SetKnob, SetWritePolicy
from cachepilot.engine.engine import Engine, VolumeCtl, normalise_mode

__all__ = ["Action", "DiscardRanges", "Engine", "Promote", "SetKnob", "SetWritePolicy", "VolumeCtl",
           "normalise_mode"]
