"""The daemon's configuration file (YAML): which policies, where the state and the control socket live, the tick,
the metrics listener, dry run, extra devices to observe.

Read with the policy loader's YAML reader, so an error names ``FILE:LINE: key: message`` the same way. Relative
paths are relative to the configuration file's directory. Several policy files combine: the first one gives the
defaults and the hotness half-life, every file adds its volume rules (each rule inheriting its own file's defaults),
and any file saying ``dry_run: true`` makes the whole daemon dry. Rules of different files may not overlap (the same
check as within one file): a volume both selected could not be managed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachepilot.daemon.control import DEFAULT_SOCKET
from cachepilot.errors import UserError
from cachepilot.exporter.listen import DEFAULT_LISTEN, parse_listen
from cachepilot.policy.loader import load_policy
from cachepilot.policy.model import DEFAULT_POLICY, Policy
from cachepilot.policy.overlaps import check_combined
from cachepilot.policy.reader import raise_first, read_yaml, schema_errors
from cachepilot.policy.values import parse_duration
from cachepilot.safeio import read_text

DEFAULT_STATE_DIR = "/var/lib/cachepilot"
DEFAULT_METRICS = DEFAULT_LISTEN
MAX_CONFIG_BYTES = 1 << 20  # a real one is a few hundred bytes
MAX_POLICY_FILES = 64  # each up to MAX_POLICY_BYTES: a bound on what one reload reads
# The loop pings the systemd watchdog (WatchdogSec=30s in the shipped unit) once a tick: a longer tick is a kill.
MAX_TICK_S = 10.0
MAX_INTERVAL_S = 3600.0  # rescan, state_interval: beyond an hour a new volume or a crash costs too much

_DURATION = {
    "oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)? ?(ms|s|m|h|d)$"}],
    "description": "a duration: seconds, or e.g. 500ms, 10s, 5m",
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {
        "version": {"const": 1},
        "policies": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_POLICY_FILES},
        "state_dir": {"type": "string", "minLength": 1},
        "socket": {"type": "string", "minLength": 1},
        "tick": _DURATION,
        "rescan": _DURATION,
        "state_interval": _DURATION,
        "dry_run": {"type": "boolean"},
        "advisor": {"type": "boolean"},
        "observe": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "max_files": {"type": "integer", "minimum": 64, "maximum": 1 << 26},
        "bpf_object": {"type": "string", "minLength": 1},
        "metrics": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "listen": {"type": "string"},
                "textfile": {"type": "string"},
            },
        },
    },
}


@dataclass(frozen=True)
class DaemonConfig:
    source: str = "<built-in>"
    policies: tuple[Path, ...] = ()
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    socket: Path = Path(DEFAULT_SOCKET)
    tick_s: float = 1.0
    rescan_s: float = 10.0
    state_interval_s: float = 30.0
    dry_run: bool = False
    # the live sizing advisor: Python work per file touched each tick (offline `advise --trace` needs none)
    advisor: bool = False
    observe: tuple[str, ...] = ()
    max_files: int = 1 << 18
    metrics_listen: str = DEFAULT_METRICS  # "" = no HTTP listener
    metrics_textfile: str = ""  # node_exporter textfile collector file, "" = none
    bpf_object: Path | None = None  # the compiled probe; None = the packaged one, else a checkout's bpf/.output
    policy: Policy = field(default=DEFAULT_POLICY)

    @property
    def effective_dry_run(self) -> bool:
        return self.dry_run or self.policy.dry_run


def _listen(value: str, doc: Any) -> str:
    """The exporter's own rule (an IP, not a host name: what it binds), checked here so a bad address is a
    configuration error at load, not a failure once the daemon runs."""
    if value == "":
        return ""
    try:
        parse_listen(value)
    except UserError:
        raise doc.err(("metrics", "listen"), f"expected IP:PORT (e.g. {DEFAULT_METRICS}) or \"\", got {value!r}") \
            from None
    return value


def combine_policies(policies: list[Policy]) -> Policy:
    if not policies:
        return DEFAULT_POLICY
    first = policies[0]
    return Policy(
        source=" + ".join(p.source for p in policies),
        defaults=first.defaults,
        rules=tuple(r for p in policies for r in p.rules),
        half_life_s=first.half_life_s,
        dry_run=any(p.dry_run for p in policies),
    )


def _document(text: str, source: str) -> Any:
    """The configuration file itself, schema-checked (not the policies it names)."""
    doc = read_yaml(text, source, what="configuration file")
    if not isinstance(doc.value, dict):
        raise UserError(f"{source}:{doc.line(())}: a configuration file is a mapping (version, policies, ...)")
    raise_first(schema_errors(doc, SCHEMA))
    return doc


def _resolve(v: str, base_dir: Path) -> Path:
    p = Path(v)
    return p if p.is_absolute() else base_dir / p


def parse_config(text: str, source: str, base_dir: Path) -> DaemonConfig:
    """The configuration and the policies it names, all validated; UserError (one line, FILE:LINE) otherwise."""
    doc = _document(text, source)
    raw = doc.value

    def path(v: str) -> Path:
        return _resolve(v, base_dir)

    def dur(key: str, default: float, minimum: float, maximum: float) -> float:
        if key not in raw:
            return default
        try:
            v = parse_duration(raw[key])
        except ValueError as exc:  # not finite, negative, over a year
            raise doc.err((key,), str(exc)) from None
        if v < minimum:
            raise doc.err((key,), f"must be at least {minimum:g} s, got {v:g} s")
        if v > maximum:
            raise doc.err((key,), f"must be at most {maximum:g} s, got {v:g} s")
        return v

    policy_paths = tuple(path(p) for p in raw.get("policies", []))
    policies = []
    for i, p in enumerate(policy_paths):
        try:
            policies.append(load_policy(p))
        except UserError as exc:
            if str(exc).startswith(f"{p}: no such policy file"):
                raise doc.err(("policies", i), f"{p}: no such policy file") from None
            raise
    check_combined(policies)  # each file is valid alone; together no rule may overlap another file's
    metrics = raw.get("metrics", {})
    return DaemonConfig(
        source=source,
        policies=policy_paths,
        state_dir=path(raw.get("state_dir", DEFAULT_STATE_DIR)),
        socket=path(raw.get("socket", DEFAULT_SOCKET)),
        tick_s=dur("tick", 1.0, 0.05, MAX_TICK_S),
        rescan_s=dur("rescan", 10.0, 0.1, MAX_INTERVAL_S),
        state_interval_s=dur("state_interval", 30.0, 0.1, MAX_INTERVAL_S),
        dry_run=bool(raw.get("dry_run", False)),
        advisor=bool(raw.get("advisor", False)),
        observe=tuple(raw.get("observe", [])),
        max_files=int(raw.get("max_files", 1 << 18)),
        metrics_listen=_listen(metrics.get("listen", DEFAULT_METRICS), doc),
        metrics_textfile=metrics.get("textfile", ""),
        bpf_object=path(raw["bpf_object"]) if "bpf_object" in raw else None,
        policy=combine_policies(policies),
    )


def _read(p: Path) -> str:
    return read_text(p, "configuration file", MAX_CONFIG_BYTES)  # never blocks on a FIFO, never slurps /dev/zero


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    return parse_config(_read(p), str(p), p.resolve().parent)


def load_socket(path: str | Path) -> Path:
    """Only the control socket's path from a configuration, for the clients (status, top, explain...): they must
    reach a daemon still running on its last good policies after a broken one landed on disk, so nothing else in
    the file (the policies least of all) is read or checked."""
    p = Path(path)
    doc = read_yaml(_read(p), str(p), what="configuration file")
    value = doc.value.get("socket", DEFAULT_SOCKET) if isinstance(doc.value, dict) else None
    if not isinstance(value, str) or not value:
        where = ("socket",) if isinstance(doc.value, dict) else ()
        raise doc.err(where, "expected the control socket's path (a configuration file is a mapping with socket:)")
    sock = Path(value)
    return sock if sock.is_absolute() else p.resolve().parent / sock
