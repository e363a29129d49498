"""What an installed cachepilot needs to find and check on its own: the BPF object (packaged, configured, or a
checkout's), the version, and one exit-3 line when this host cannot run the probe (too old a kernel, Python or
libbpf; no object)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cachepilot import __version__
from cachepilot.cli import main
from cachepilot.daemon.config import load_config
from cachepilot.errors import UserError
from cachepilot.probe import checks as P


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"cachepilot {__version__}\n"


@pytest.mark.parametrize(("kernel", "python", "libbpf", "expect"), [
    ("5.4.0-150-generic", (3, 11), (1, 1), "kernel 5.4.0-150-generic is too old: the probe needs 5.8 or newer"),
    ("4.19", (3, 12), None, "kernel 4.19 is too old"),
    ("weird", (3, 11), None, "kernel weird is too old"),
    ("6.1.0-28-amd64", (3, 9), (1, 1), "Python 3.9 is too old: cachepilot needs 3.11 or newer"),
    ("6.1.0-28-amd64", (3, 11), (0, 8), "the system libbpf 0.8 is too old: the probe needs 1.1 or newer"),
])
def test_too_old_names_the_component(kernel: str, python: tuple[int, int], libbpf: tuple[int, int] | None,
                                     expect: str) -> None:
    with pytest.raises(UserError, match=expect.replace(".", r"\.")):
        P.too_old(kernel, python, libbpf)


@pytest.mark.parametrize("kernel", ["5.8.0", "5.10.0-30-amd64", "6.18.0", "10.0"])
def test_new_enough_passes(kernel: str) -> None:
    P.too_old(kernel, (3, 11), (1, 1))


def test_the_packaged_object_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packaged = tmp_path / "cachepilot.bpf.o"
    monkeypatch.setattr(P, "PACKAGED_OBJECT", packaged)
    assert P.default_object() == P.CHECKOUT_OBJECT  # a checkout without package data: make bpf's output
    packaged.write_bytes(b"\x7fELF")
    assert P.default_object() == packaged


def test_bpf_object_config_key_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("version: 1\nbpf_object: obj/cp.bpf.o\n")
    assert load_config(tmp_path / "c.yaml").bpf_object == tmp_path / "obj" / "cp.bpf.o"
    (tmp_path / "c.yaml").write_text("version: 1\n")
    assert load_config(tmp_path / "c.yaml").bpf_object is None


def _config(tmp_path: Path, extra: str = "") -> str:
    (tmp_path / "c.yaml").write_text(f"version: 1\nstate_dir: st\nsocket: ctl.sock\nmetrics: {{listen: ''}}\n{extra}")
    return str(tmp_path / "c.yaml")


@pytest.mark.skipif(os.geteuid() != 0, reason="the probe's root check comes first")
def test_run_with_a_missing_object_exits_3_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, f"bpf_object: {tmp_path}/none.bpf.o\n")
    assert main(["run", "--config", cfg]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"cachepilot: cannot run: the eBPF probe is unusable: BPF object {tmp_path}/none.bpf.o "
                          "not found: set bpf_object"), err
    # the command-line flag wins over the key
    assert main(["run", "--config", cfg, "--bpf-object", f"{tmp_path}/flag.bpf.o"]) == 3
    assert f"BPF object {tmp_path}/flag.bpf.o not found" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="the probe's root check comes first")
def test_run_on_too_old_a_kernel_exits_3_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    obj = tmp_path / "cp.bpf.o"
    obj.write_bytes(b"\x7fELF")  # found; the kernel check comes before libbpf ever opens it
    real = os.uname()
    monkeypatch.setattr(P.os, "uname", lambda: os.uname_result((*real[:2], "5.4.0-old", *real[3:])))
    assert main(["run", "--config", _config(tmp_path, f"bpf_object: {obj}\n")]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the eBPF probe is unusable: kernel 5.4.0-old is too old: the probe needs 5.8 or newer" in err, err
