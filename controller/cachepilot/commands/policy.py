"""`cachepilot policy check FILE...`: validate policy files; errors name the file, line and key. Several files are
also checked together, as one daemon combines them (`policies:` in its configuration): no rule of one may overlap a
rule of another."""

from __future__ import annotations

import argparse

from cachepilot.policy import load_policy
from cachepilot.policy.model import VolumePolicy
from cachepilot.policy.overlaps import check_combined


def _large(vp: VolumePolicy) -> str:
    lf = vp.promotion.large_files
    return f", large files <= {lf.max_size} B read whole {lf.min_reads:g}x" if lf.enabled else ""


def _summary(name: str, vp: VolumePolicy) -> str:
    p, d = vp.promotion, vp.discard_on_delete
    return (
        f"  {name}: failure_model={vp.failure_model} exposure<= {vp.exposure.max_dirty} B/"
        f"{vp.exposure.max_age_s:g} s promotion={'on' if p.enabled else 'off'}"
        f"({p.rate} B/s, <= {p.max_cache_fraction:g} of cache, sieve {p.sieve_size} B{_large(vp)}) "
        f"discard={'on' if d.enabled else 'off'}({d.interval_s:g} s, >= {d.min_extent} B)"
        + (f" knobs={vp.knobs}" if vp.knobs else "")
    )


def check(args: argparse.Namespace) -> int:
    policies = []
    for path in args.files:
        pol = load_policy(path)
        policies.append(pol)
        print(f"{path}: OK ({len(pol.rules)} volume rule(s), half-life {pol.half_life_s:g} s"
              f"{', dry-run' if pol.dry_run else ''})")
        if args.verbose:
            print(_summary("defaults", pol.defaults))
            for r in pol.rules:
                print(_summary(f"{r.name} [{r.selector}] line {r.line}", r.policy))
    if len(policies) > 1:
        check_combined(policies)
        print(f"{len(policies)} files together: OK (no rule of one overlaps a rule of another)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("policy", help="work with policy files")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    c = psub.add_parser("check", help="validate policy files (errors name file, line and key); several files are "
                        "also checked together, as one daemon combines them")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("-v", "--verbose", action="store_true", help="print the resolved settings")
    c.set_defaults(handler=check)
