"""Models: what the controller believes about files, epochs, freed extents and volumes.

Everything here is pure Python, fed by :mod:`cachepilot.events` and by backend samples, and cheap per
event: the hot structures are parallel arrays indexed by a slot number, not one object per file.

No re-exports here: a module imports the model it needs (``cachepilot.models.volume``), so a light command that
needs a dataclass does not load numpy with the rest (most of a command's start-up on a slow host).
"""
