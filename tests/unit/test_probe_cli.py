"""`cachepilot probe` rejects bad input with one line and exit 2, before loading anything (no root needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachepilot.cli import main


@pytest.mark.parametrize(
    ("option", "value"),
    [("--seconds", "-1"), ("--seconds", "nan"), ("--seconds", "inf"), ("--seconds", "x"), ("--tick", "0"),
     ("--tick", "-1"), ("--tick", "nan"), ("--tick", "1e9"), ("--max-files", "0"), ("--max-files", "1.5")],
)
def test_bad_numbers(option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--dev", "/", option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err, err


def test_a_regular_file_is_not_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "plain"
    f.write_text("x")
    assert main(["probe", "--dev", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a block device nor a directory" in err


def test_a_tmpfs_path_has_no_block_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert os.path.isdir("/dev/shm")
    assert main(["probe", "--dev", "/dev/shm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no block device" in err


def test_a_newline_in_a_path_stays_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--dev", str(tmp_path / "a\nb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a\\nb" in err
