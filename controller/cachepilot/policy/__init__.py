"""Policies: the operator's YAML files, their schema, and the typed policy the engine reads.

The names below load on first use (PEP 562): a module that needs only a leaf of this package (``pinpaths``, for
``hotlist import``'s path resolution) does not load the loader with jsonschema, yaml and the models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cachepilot.policy.loader import PolicyStore, load_policy, parse_policy
    from cachepilot.policy.model import DEFAULT_POLICY, Policy, Rule, Selector, VolumePolicy
    from cachepilot.policy.values import parse_duration, parse_size

_WHERE = {
    "PolicyStore": "loader", "load_policy": "loader", "parse_duration": "values", "parse_policy": "loader",
    "parse_size": "values", "DEFAULT_POLICY": "model", "Policy": "model", "Rule": "model", "Selector": "model",
    "VolumePolicy": "model",
}

__all__ = [
    "DEFAULT_POLICY",
    "Policy",
    "PolicyStore",
    "Rule",
    "Selector",
    "VolumePolicy",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where}"), name)
