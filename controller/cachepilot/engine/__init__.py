"""The decision engine: models + policy + backend state -> actions with reasons."""

from cachepilot.actions import Action, DiscardRanges, Drain, Outcome, Promote, SetKnob, SetWritePolicy
from cachepilot.engine.engine import Engine
from cachepilot.engine.volumectl import VolumeCtl, normalise_mode

__all__ = ["Action", "DiscardRanges", "Drain", "Engine", "Outcome", "Promote", "SetKnob", "SetWritePolicy",
           "VolumeCtl", "normalise_mode"]
