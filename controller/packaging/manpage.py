"""The man page, generated at build time from the CLI's own argparse parser, so it cannot drift from the program:
every command and subcommand with its help, usage and options, between the hand-written sections of a template.
  python3 manpage.py TEMPLATE VERSION DATE > cachepilot.8   (DATE: YYYY-MM-DD, from SOURCE_DATE_EPOCH)
Run with the staged package's directory on sys.path (build-package.sh does)."""

from __future__ import annotations

import argparse
import sys

from cachepilot.cli import build_parser


def roff(text: str) -> str:
    """Plain text as roff: backslashes and dashes escaped, no line starting a request."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in out.splitlines())


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return []


def options(parser: argparse.ArgumentParser) -> list[str]:
    """One .TP entry per argument (positional or option), but --help and the subcommand choice itself."""
    out: list[str] = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._SubParsersAction) or a.help == argparse.SUPPRESS:
            continue
        name = ", ".join(a.option_strings) or (a.metavar if isinstance(a.metavar, str) else a.dest)
        if a.option_strings and a.nargs != 0:
            meta = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
            name += f" {meta}"
        text = parser._get_formatter()._expand_help(a) if a.help else ""  # %(default)s and the like, filled in
        out += [".TP", f".B {roff(name)}", roff(text)]
    return out


def command(path: str, help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    usage = " ".join(parser.format_usage().split()[1:])  # without "usage:"
    out = [f'.SS "{roff(path)}"', roff(help_text or parser.description or ""), ".PP", f".B {roff(usage)}",
           *options(parser)]
    for name, sub_help, sub in subcommands(parser):
        out += command(f"{path} {name}", sub_help, sub)
    return out


def render(template: str, version: str, date: str) -> str:
    parser = build_parser()
    body: list[str] = []
    for name, help_text, sub in subcommands(parser):
        body += command(f"cachepilot {name}", help_text, sub)
    return (template.replace("@VERSION@", version).replace("@DATE@", date)
            .replace("@COMMANDS@\n", "\n".join(body) + "\n"))


if __name__ == "__main__":
    template, version, date = sys.argv[1:4]
    with open(template, encoding="utf-8") as f:
        sys.stdout.write(render(f.read(), version, date))
