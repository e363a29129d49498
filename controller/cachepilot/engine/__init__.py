"""The decision engine: models + policy + backend state -> actions with reasons."""

from cachepilot.engine.actions import Action, DiscardRanges, Drain, Promote, SetKnob, SetWritePolicy
from cachepilot.engine.engine import Engine, Result, VolumeCtl, normalise_mode

__all__ = ["Action", "DiscardRanges", "Drain", "Engine", "Promote", "Result", "SetKnob", "SetWritePolicy",
           "VolumeCtl", "normalise_mode"]
