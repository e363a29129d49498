"""Policies: the operator's YAML files, their schema, and the typed policy the engine reads."""

from cachepilot.policy.loader import PolicyStore, load_policy, parse_duration, parse_policy, parse_size
from cachepilot.policy.model import DEFAULT_POLICY, Policy, Rule, Selector, VolumePolicy

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
