"""`cachepilot run --config FILE [--dry-run]`: the daemon.

Exit codes: 0 stopped cleanly (SIGTERM/SIGINT: every cache left safe and stable); 2 bad configuration or policy
(one line, FILE:LINE); 3 cannot run here (the eBPF probe is unusable, another daemon holds the lock, the control
socket is taken or the state directory unusable; one line with the reason); 1 an unexpected internal error.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from cachepilot.errors import FatalError

EXIT_FATAL = 3


def _probe_factory(object_path: Path | None) -> Any:
    def make(max_files: int) -> Any:
        from cachepilot.daemon.intake import RING_WAKE_EVERY_NS
        from cachepilot.probe import Probe  # lazy: loading libbpf only when the daemon really starts

        return Probe(object_path, max_files=max_files, bulk_deletes=True, wake_every_ns=RING_WAKE_EVERY_NS)

    return make


def run(args: argparse.Namespace) -> int:
    from cachepilot.daemon.config import load_config
    from cachepilot.daemon.daemon import Daemon

    config = load_config(args.config)  # UserError → exit 2 (cli)
    if args.dry_run:
        config = replace(config, dry_run=True)
    if args.bpf_object:
        config = replace(config, bpf_object=Path(args.bpf_object))
    if args.check:
        print(f"{config.source}: ok (policies: {config.policy.source}; state {config.state_dir}; "
              f"socket {config.socket}; tick {config.tick_s:g} s; dry run {config.effective_dry_run})")
        return 0
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="cachepilot: %(levelname)s: %(message)s")
    if not args.verbose:  # the daemon logs each action with its outcome and read-back once; their own lines repeat it
        for name in ("cachepilot.backends", "cachepilot.actuators"):
            logging.getLogger(name).setLevel(logging.WARNING)
    probe = None if args.no_probe else _probe_factory(config.bpf_object)
    daemon = Daemon(config, config_path=Path(args.config), probe_factory=probe)
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
    try:
        daemon.start()
    except FatalError as exc:
        print(f"cachepilot: cannot run: {exc}", file=sys.stderr)
        daemon.abandon()
        return EXIT_FATAL
    try:
        daemon.run()
    finally:
        daemon.shutdown()
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="the daemon: watch the host's cached volumes and steer them (root)",
                       description=__doc__)
    p.add_argument("--config", required=True, metavar="FILE", help="daemon configuration (YAML)")
    p.add_argument("--dry-run", action="store_true", help="decide and log what would be written; write nothing")
    p.add_argument("--check", action="store_true", help="validate the configuration and its policies, then exit")
    p.add_argument("--no-probe", action="store_true",
                   help="run without the eBPF probe (samples and mode decisions only; for hosts without eBPF)")
    p.add_argument("--bpf-object", metavar="FILE",
                   help="the compiled probe (overrides bpf_object; default: the packaged one, else the checkout's)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(handler=run)
