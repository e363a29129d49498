"""The policy file schema (JSON Schema 2020-12). ``policies/schema.json`` is generated from this module:

    python -m cachepilot.policy.schema > policies/schema.json

and a unit test keeps the two identical.
"""

from __future__ import annotations

import json
from typing import Any

from cachepilot.capabilities import KINDS, KNOBS

SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)? ?(B|K|M|G|T|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$"
DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)? ?(ms|s|m|h|d)$"


_size: dict[str, Any] = {
    "description": "bytes: an integer or a string with a unit (KiB, MiB, GiB, K, M, G ...)",
    "oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}],
}
_duration: dict[str, Any] = {
    "description": "seconds: a number or a string with a unit (ms, s, m, h, d)",
    "oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}],
}
_fraction: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, **extra}


def _settings(knobs: list[str]) -> dict[str, Any]:
    return {
    "failure_model": {"enum": ["recoverable", "destructive", "auto"]},
    "exposure": _obj({"max_dirty": {"$ref": "#/$defs/size"}, "max_age": {"$ref": "#/$defs/duration"},
                      "pace": {"type": "boolean",
                               "description": "periodic drains write back at half the measured full rate"}}),
    "lifetime_hold": _obj(
        {
            "enabled": {"type": "boolean", "description": "recoverable: hold new data dirty while it is likely to die"},
            "share": {"$ref": "#/$defs/fraction", "description": "hold until this share of deleted bytes had died"},
            "max_hold": {"$ref": "#/$defs/duration"},
            "headroom": {"$ref": "#/$defs/fraction", "description": "cache share kept below its write cutoff"},
        }
    ),
    "promotion": _obj(
        {
            "enabled": {"type": "boolean"},
            "rate": {"$ref": "#/$defs/size", "description": "bytes per second read to promote"},
            "max_cache_fraction": {"$ref": "#/$defs/fraction"},
            "sieve_size": {"$ref": "#/$defs/size"},
            "refresh_interval": {
                "$ref": "#/$defs/duration",
                "description": "re-read the believed-cached set this often so the cache keeps it (0 = never)",
            },
            "only_uncached": {
                "type": "boolean",
                "description": "bcache: promote only while the cache bypasses reads, never a resident file; "
                "dm-cache: leave admitted files to smq",
            },
            "large_files": _obj(
                {
                    "enabled": {"type": "boolean", "description": "admit files above sieve_size once read whole "
                                "min_reads times (bcache bypasses them as sequential however often they are read)"},
                    "min_reads": {"type": "number", "minimum": 1,
                                  "description": "whole reads below the page cache (aged with the half-life)"},
                    "max_size": {"$ref": "#/$defs/size", "description": "larger files are never promoted"},
                }
            ),
        }
    ),
    "discard_on_delete": _obj(
        {
            "enabled": {"type": "boolean"},
            "interval": {"$ref": "#/$defs/duration"},
            "min_extent": {"$ref": "#/$defs/size", "description": "discards go in multiples of at least this; 0: the "
                           "cache's own discard unit (and one filesystem block)"},
            "max_rate": {"$ref": "#/$defs/size", "description": "bytes per second trimmed at most"},
        }
    ),
    "hysteresis": _obj(
        {
            "min_switch_interval": {"$ref": "#/$defs/duration"},
            "resume_below": {"$ref": "#/$defs/fraction"},
        }
    ),
    "health": _obj(
        {
            "error_threshold": {"type": "integer", "minimum": 1},
            "scan_drop": {"$ref": "#/$defs/fraction"},
            "stall_after": {"$ref": "#/$defs/duration", "description": "dirty data that has not fallen this long "
                            "while write-back should run is a stall (metric, alert, explain); 0: not looked for"},
        }
    ),
    "sequential_steering": _obj(
        {
            "enabled": {"type": "boolean", "description": "bcache: raise sequential_cutoff while bypassed sequential "
                        "runs are small-file creates, lower it back for streams (a pinned knob wins)"},
            "max_cutoff": {"$ref": "#/$defs/size", "description": "never raised above this"},
            "window": {"$ref": "#/$defs/duration", "description": "at most one step per window"},
        }
    ),
    "pin": _obj(
        {
            "paths": {
                "type": "array", "maxItems": 256,
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "description": "path prefixes or file globs relative to the mount point",
            },
            "max_bytes": {"$ref": "#/$defs/size", "description": "bytes pinned at most (within the cache's room)"},
            "refresh": {
                "$ref": "#/$defs/duration",
                "description": "re-read pinned files at most this often while the cache misses reads",
            },
        },
        required=["paths", "max_bytes"],
    ),
    "knobs": {
        "type": "object",
        "propertyNames": {"enum": knobs},
        "additionalProperties": {"type": ["string", "integer", "number"]},
    },
    }


def _selector(kind_names: list[str]) -> dict[str, Any]:
    return _obj(
    {
        "device": {"type": "string", "minLength": 1, "description": "glob on the device name"},
        "fs_uuid": {"type": "string", "pattern": "^[0-9a-fA-F-]{8,36}$"},
        "mountpoint": {"type": "string", "pattern": "^/"},
        "kind": {"enum": kind_names, "description": "the kind of cache (knobs and modes are checked against it)"},
    },
    minProperties=1,
    )


def build(kind_names: list[str], knobs: list[str]) -> dict[str, Any]:
    """The schema for these kinds and knobs (the table's: :data:`SCHEMA`)."""
    settings = _settings(knobs)
    return {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://cachepilot.invalid/policy.schema.json",
    "title": "cachepilot policy",
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {
        "version": {"const": 1},
        "dry_run": {"type": "boolean"},
        "hotness": _obj({"half_life": {"$ref": "#/$defs/duration"}}),
        "defaults": _obj(settings),
        "volumes": {
            "type": "array",
            "items": _obj(
                {"name": {"type": "string"}, "match": _selector(kind_names), **settings},
                required=["match"],
            ),
        },
    },
    "$defs": {"size": _size, "duration": _duration, "fraction": _fraction},
    }


# The table's kinds and knobs (cachepilot.capabilities, the declarative half of the table of kinds).
SCHEMA: dict[str, Any] = build(list(KINDS), list(KNOBS))


if __name__ == "__main__":
    print(json.dumps(SCHEMA, indent=2))
