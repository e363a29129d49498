#!/usr/bin/env python3
"""cachepilot's rules for your Prometheus, mixin-style: the shipped cachepilot.rules.yml with your selectors.

    python3 dashboards/prometheus/build_rules.py [--job NAME] [--selector 'MATCHERS'] [--runbook-base URL] [RULES] \
        > cachepilot.rules.yml

``--job`` (default ``cachepilot``): the scrape job of the daemons' HTTP exporters; ``CachepilotDaemonDown`` watches
``up{job="NAME"}``. ``--selector`` (default none): label matchers added to every selector of a cachepilot metric in
every rule, e.g. ``job="cachepilot"`` (only that job's series; leave it out when the metrics also come through
node_exporter's textfile collector, whose job is node_exporter's) or ``env="prod", job=~"cachepilot|node"``.
``--runbook-base`` (default: the repository paths ``dashboards/runbooks/``): where the site publishes the runbooks;
every alert's ``runbook_url`` becomes URL + the runbook's file name (the Ansible role's cachepilot_runbook_base_url).
With the defaults the output is the shipped file unchanged: the shipped rules are this build's default output
(tests/ops/test_rules.py checks both, and builds with other values through promtool).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_JOB = "cachepilot"
RUNBOOKS = "dashboards/runbooks/"  # the shipped runbook_url prefix: repository paths
_RUNBOOK_URL = re.compile(r"^(\s*runbook_url:\s*)" + re.escape(RUNBOOKS), re.M)
_BASE = re.compile(r"(https?://[^\s\"'#?]+|/?[\w.-]+(/[\w.-]+)*)/?")
# A cachepilot metric in PromQL: not a recording rule's name (volume:cachepilot_...), not a function call.
_METRIC = re.compile(r"(?<![\w:])(cachepilot_[a-z0-9_]+)(?![\w:(])(\{[^}]*\})?")
_UP = re.compile(r'\bup\{job="' + DEFAULT_JOB + r'"\}')
_MATCHERS = re.compile(r'\s*[a-zA-Z_]\w*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*(,\s*[a-zA-Z_]\w*\s*(=|!=|=~|!~)\s*'
                       r'"(?:[^"\\]|\\.)*"\s*)*,?\s*')


def _with_selector(expr: str, selector: str) -> str:
    def add(m: re.Match[str]) -> str:
        inner = (m.group(2) or "{}")[1:-1].strip()
        return m.group(1) + "{" + selector + (", " + inner if inner else "") + "}"

    return _METRIC.sub(add, expr)


def with_runbook_base(text: str, base: str) -> str:
    """Every runbook_url under ``base`` (a URL or a path; a missing final / added) instead of the repository path."""
    if not _BASE.fullmatch(base):
        raise ValueError(f"--runbook-base: {base!r} is not a URL or a path (e.g. https://wiki.example.org/runbooks/)")
    base = base if base.endswith("/") else base + "/"
    return _RUNBOOK_URL.sub(lambda m: m.group(1) + base, text)


def build(text: str, job: str = DEFAULT_JOB, selector: str = "", runbook_base: str = RUNBOOKS) -> str:
    """The rules text with ``job`` and ``selector`` applied to every ``expr`` (line-wise: comments and layout
    stay; an ``expr: >-`` block is the indented lines that follow it) and the runbook links under
    ``runbook_base``."""
    if runbook_base != RUNBOOKS:
        text = with_runbook_base(text, runbook_base)
    if not re.fullmatch(r"[a-zA-Z_][\w:-]*", job):
        raise ValueError(f"--job: {job!r} is not a job name")
    selector = selector.strip().rstrip(",").strip()
    if selector and not _MATCHERS.fullmatch(selector):
        raise ValueError(f'--selector: {selector!r} is not label matchers (e.g. job="cachepilot", env="prod")')
    out, block_indent = [], -1
    for line in text.splitlines(keepends=True):
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        in_block = block_indent >= 0 and (indent > block_indent or not stripped)
        if not in_block:
            block_indent = -1
        if stripped.startswith("expr:") or in_block:
            if stripped.startswith("expr:") and stripped.rstrip() in ("expr: >-", "expr: >", "expr: |"):
                block_indent = indent
            if job != DEFAULT_JOB:
                line = _UP.sub(f'up{{job="{job}"}}', line)
            if selector:
                line = _with_selector(line, selector)
        out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rules", nargs="?", default=str(HERE / "cachepilot.rules.yml"), help="the shipped rules file")
    p.add_argument("--job", default=DEFAULT_JOB, help="scrape job of the daemons' HTTP exporters (up{job=...})")
    p.add_argument("--selector", default="", help='label matchers for every cachepilot metric, e.g. job="cachepilot"')
    p.add_argument("--runbook-base", default=RUNBOOKS, metavar="URL",
                   help=f"where the runbooks are published (default: the repository paths {RUNBOOKS})")
    args = p.parse_args(argv)
    try:
        sys.stdout.write(build(Path(args.rules).read_text(encoding="utf-8"), args.job, args.selector,
                               args.runbook_base))
    except (OSError, ValueError) as exc:
        print(f"build_rules: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
