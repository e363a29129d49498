"""README and docs/ stay true: their policy examples pass `cachepilot policy check`, their daemon configuration
`cachepilot run --check`; every relative link (file and #anchor) resolves; README stays a short front door."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cachepilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_policy_and_config_examples_are_valid(tmp_path, capsys):
    blocks = [b for page in PAGES for b in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)]
    assert blocks, "no yaml policy example in README or docs/"
    for i, block in enumerate(blocks):
        f = tmp_path / f"example{i}.yaml"
        f.write_text(block)
        argv = ["run", "--config", str(f), "--check"] if "state_dir:" in block else ["policy", "check", str(f)]
        assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_readme_is_a_front_door_that_links_every_doc() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert {"make demo", "make test"} <= set(re.findall(r"make [a-z]+", text))
    linked = {(README.parent / t).resolve() for t in LINK.findall(text)}
    assert not [d.name for d in DOCS if d.resolve() not in linked]
