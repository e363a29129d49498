"""The README's examples stay true: its policy example passes `cachepilot policy check`, its daemon configuration
`cachepilot run --check`."""

from __future__ import annotations

import re
from pathlib import Path

from cachepilot.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_policy_example_is_valid(tmp_path, capsys):
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no yaml policy example"
    for i, block in enumerate(blocks):
        f = tmp_path / f"example{i}.yaml"
        f.write_text(block)
        argv = ["run", "--config", str(f), "--check"] if "state_dir:" in block else ["policy", "check", str(f)]
        assert main(argv) == 0, capsys.readouterr().err
