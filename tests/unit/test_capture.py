"""Which capture path a kernel gets (cachepilot.probe.capture): CO-RE with BTF, bcc without it when bcc and the
release's headers are there, else one line naming what is missing. Fixture trees stand in for /sys and /lib/modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot.errors import UserError
from cachepilot.probe.capture import BCC, CORE, kernel_headers, select

RELEASE = "6.1.0-56-amd64"


def _tree(root: Path, *, split: bool) -> Path:
    """A kernel headers tree: Debian's split build/ + source/, or one merged directory."""
    build = root / "build"
    (build / "include" / "generated").mkdir(parents=True)
    (build / "include" / "generated" / "autoconf.h").write_text("#define CONFIG_X 1\n")
    src = root / "source" if split else build
    (src / "include" / "linux").mkdir(parents=True, exist_ok=True)
    (src / "include" / "linux" / "fs.h").write_text("/* fs */\n")
    return build


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    bcc = tmp_path / "dist-packages" / "bcc" / "__init__.py"
    bcc.parent.mkdir(parents=True)
    bcc.write_text("")
    btf = tmp_path / "sys" / "kernel" / "btf" / "vmlinux"
    btf.parent.mkdir(parents=True)
    return {"btf": btf, "bcc": bcc, "modules": tmp_path / "lib" / "modules"}


def test_btf_means_core_whatever_else_is_there(host: dict[str, Path]) -> None:
    host["btf"].write_bytes(b"\x9f\xeb")
    _tree(host["modules"] / RELEASE, split=True)
    assert select(host["btf"], RELEASE, bcc_package=host["bcc"], modules=host["modules"], env={}).path == CORE


def test_no_btf_with_bcc_and_debian_headers_means_bcc(host: dict[str, Path]) -> None:
    build = _tree(host["modules"] / RELEASE, split=True)
    c = select(host["btf"], RELEASE, bcc_package=host["bcc"], modules=host["modules"], env={})
    assert (c.path, c.headers) == (BCC, build)


def test_headers_elsewhere_through_bccs_own_variable(host: dict[str, Path], tmp_path: Path) -> None:
    merged = _tree(tmp_path / "cache" / RELEASE, split=False)
    env = {"BCC_KERNEL_SOURCE": str(merged)}
    c = select(host["btf"], RELEASE, bcc_package=host["bcc"], modules=host["modules"], env=env)
    assert (c.path, c.headers) == (BCC, merged)
    assert kernel_headers("other-release", host["modules"], env) == merged  # the variable wins


def test_no_btf_and_no_bcc_is_one_line(host: dict[str, Path]) -> None:
    _tree(host["modules"] / RELEASE, split=True)
    host["bcc"].unlink()
    with pytest.raises(UserError) as e:
        select(host["btf"], RELEASE, bcc_package=host["bcc"], modules=host["modules"], env={})
    msg = str(e.value)
    assert "\n" not in msg and "no BTF" in msg and "python3-bpfcc" in msg and "still work" in msg


@pytest.mark.parametrize("what", ["nothing", "build without source", "source without generated headers"])
def test_no_btf_and_no_usable_headers_is_one_line(host: dict[str, Path], what: str) -> None:
    kdir = host["modules"] / RELEASE
    if what != "nothing":
        build = _tree(kdir, split=True)
        if what == "build without source":
            (kdir / "source" / "include" / "linux" / "fs.h").unlink()
        else:
            (build / "include" / "generated" / "autoconf.h").unlink()
    with pytest.raises(UserError) as e:
        select(host["btf"], RELEASE, bcc_package=host["bcc"], modules=host["modules"], env={})
    msg = str(e.value)
    assert "\n" not in msg and f"no kernel headers for {RELEASE} at {kdir / 'build'}" in msg
    assert f"linux-headers-{RELEASE}" in msg
