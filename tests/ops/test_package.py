"""`make package`: the wheel carries the CO-RE object; the Debian package installs the program under Debian's Python
and Debian's modules, the unit, an example configuration, the default policy and a man page, and its dependencies
are satisfiable from Debian. Both run from outside the checkout and find the object from package data (the probe
really loads here, as root). The systemd guest that installs the .deb for real: tests/vm/test_package_lab.py."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from ops_support import ROOT, free_port, need_tool

from cachepilot import __version__

pytestmark = pytest.mark.ops

DEB = ROOT / "dist" / f"cachepilot_{__version__}_amd64.deb"
WHEEL = ROOT / "dist" / f"cachepilot-{__version__}-py3-none-any.whl"
OBJECT = "cachepilot/data/cachepilot.bpf.o"


@pytest.fixture(scope="module")
def built() -> None:
    r = subprocess.run(["make", "-s", "package"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert DEB.is_file() and WHEEL.is_file(), r.stdout


def _outside(tmp: Path) -> dict[str, str]:
    """An environment that cannot import the checkout: no virtualenv, no PYTHONPATH, cwd elsewhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    env["HOME"] = str(tmp)
    return env


def test_the_wheel_carries_the_object_and_the_unit(built: None) -> None:
    names = set(zipfile.ZipFile(WHEEL).namelist())
    assert {OBJECT, "cachepilot/data/cachepilot.service", "cachepilot/data/config.yaml"} <= names
    # the bcc capture path's sources (kernels without BTF compile them at the first start)
    bcc = {f"cachepilot/data/bcc/{p.name}" for p in (ROOT / "bpf").iterdir() if p.name.endswith((".bpf.h", ".bcc.c"))}
    assert bcc | {"cachepilot/data/bcc/cachepilot.h"} <= names
    built_obj = (ROOT / "bpf" / ".output" / "cachepilot.bpf.o").read_bytes()
    assert zipfile.ZipFile(WHEEL).read(OBJECT) == built_obj
    assert not (ROOT / "controller" / OBJECT).exists()  # staged: the checkout is not modified


def test_the_deb_is_built_by_dpkg_and_depends_on_debian_packages(built: None) -> None:
    info = subprocess.run([need_tool("dpkg-deb"), "-f", str(DEB)], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line and not line.startswith(" "))
    assert fields["Package"] == "cachepilot" and fields["Version"] == __version__
    depends = {d.split()[0] for d in fields["Depends"].split(", ")}
    assert {"libbpf1", "python3", "python3-yaml", "python3-jsonschema", "python3-numpy", "python3-zstandard",
            "python3-rich"} <= depends
    assert "python3-prometheus-client" not in depends  # the exporter writes its own exposition (issue 32)
    files = subprocess.run([need_tool("dpkg-deb"), "-c", str(DEB)], capture_output=True, text=True,
                           check=True).stdout
    for path in ("./usr/bin/cachepilot", "./lib/systemd/system/cachepilot.service", "./etc/cachepilot/config.yaml",
                 "./etc/cachepilot/policy.yaml", "./usr/share/man/man8/cachepilot.8.gz",
                 f"./usr/lib/python3/dist-packages/{OBJECT}"):
        assert f" {path}\n" in files + "\n", path
    conffiles = subprocess.run([need_tool("dpkg-deb"), "-I", str(DEB), "conffiles"], capture_output=True, text=True,
                               check=True).stdout.split()
    assert conffiles == ["/etc/cachepilot/config.yaml", "/etc/cachepilot/policy.yaml"]
    # every dependency is satisfiable from this Debian (a dry run of the install that the lab guest does)
    r = subprocess.run([need_tool("apt-get"), "-s", "install", str(DEB)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Inst cachepilot" in r.stdout, r.stdout + r.stderr


def test_the_deb_runs_under_debians_python_and_finds_its_object(built: None, tmp_path: Path) -> None:
    root = tmp_path / "root"
    subprocess.run([need_tool("dpkg-deb"), "-x", str(DEB), str(root)], check=True)
    unit = (root / "lib/systemd/system/cachepilot.service").read_text()
    assert "ExecStart=/usr/bin/cachepilot run --config /etc/cachepilot/config.yaml" in unit
    assert "ExecReload=/usr/bin/cachepilot reload --config /etc/cachepilot/config.yaml" in unit
    assert "/usr/local" not in unit
    assert "\nCacheDirectory=cachepilot\n" in unit  # the bcc compile's cache: writable under ProtectSystem=strict
    assert b".SH EXIT STATUS" in gzip.decompress((root / "usr/share/man/man8/cachepilot.8.gz").read_bytes())
    env = _outside(tmp_path) | {"PYTHONPATH": str(root / "usr/lib/python3/dist-packages")}
    exe = ["/usr/bin/python3", str(root / "usr/bin/cachepilot")]  # its shebang: Debian's Python

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert run("--version").stdout == f"cachepilot {__version__}\n"
    # no checkout here: the bcc path finds its sources in the package
    where = "from cachepilot.probe import bccload; print(bccload.bpf_source_dir())"
    r = subprocess.run(["/usr/bin/python3", "-c", where], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout == f"{root}/usr/lib/python3/dist-packages/cachepilot/data/bcc\n", r.stdout + r.stderr
    config = tmp_path / "config.yaml"  # the example configuration, pointed at the extracted policy
    config.write_text((root / "etc/cachepilot/config.yaml").read_text().replace("/etc/cachepilot/", f"{root}/etc/"
                                                                                 "cachepilot/"))
    r = run("run", "--config", str(config), "--check")
    assert r.returncode == 0 and f"policies: {root}/etc/cachepilot/policy.yaml" in r.stdout, r.stdout + r.stderr
    # the exporter under Debian's Python, on its own encoder and server (no prometheus-client in the package)
    code = ("import sys, urllib.request; from cachepilot import exporter as e; box = e.SnapshotBox(); "
            f"s = e.serve('127.0.0.1:{free_port()}', e.make_registry(box)); "
            "t = urllib.request.urlopen(f'http://127.0.0.1:{s.port}/metrics', timeout=10).read().decode(); "
            "s.close(); print('cachepilot_ready' in t, 'prometheus_client' in sys.modules)")
    r = subprocess.run(["/usr/bin/python3", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout == "True False\n", r.stderr
    if os.geteuid() == 0:  # the probe loads and attaches the packaged object on this kernel
        r = run("probe", "--check")
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"probe ok: {root}/usr/lib/python3/dist-packages/{OBJECT}\n"


def test_the_wheel_installs_into_a_fresh_virtualenv_and_finds_its_object(built: None, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _outside(tmp_path)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(WHEEL)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = str(venv / "bin/cachepilot")
    r = subprocess.run([exe, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout == f"cachepilot {__version__}\n", r.stderr
    if os.geteuid() == 0:
        r = subprocess.run([exe, "probe", "--check"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        assert r.stdout == f"probe ok: {site}/{OBJECT}\n"


def test_ansible_galaxy_installs_the_role_from_its_tarball(built: None, tmp_path: Path) -> None:
    """The role as users install it: no symlinks out of the role (the rules, unit and runbooks are copied in), and a
    playbook using the installed copy passes a syntax check."""
    tarball = ROOT / "dist" / f"cachepilot-role-{__version__}.tar.gz"
    (tmp_path / "requirements.yml").write_text(f"- src: {tarball}\n  name: cachepilot\n")
    env = _outside(tmp_path) | {"ANSIBLE_ROLES_PATH": str(tmp_path / "roles"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run([need_tool("ansible-galaxy"), "role", "install", "-p", str(tmp_path / "roles"), "-r",
                        str(tmp_path / "requirements.yml")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "cachepilot was installed successfully" in r.stdout, r.stdout + r.stderr
    role = tmp_path / "roles" / "cachepilot"
    assert not [p for p in role.rglob("*") if p.is_symlink()]
    assert (role / "files" / "cachepilot.service").read_text() == (
        ROOT / "controller/cachepilot/data/cachepilot.service").read_text()
    assert (role / "files" / "cachepilot.rules.yml").is_file() and list((role / "files" / "runbooks").glob("*.md"))
    (tmp_path / "play.yml").write_text("- hosts: all\n  roles: [cachepilot]\n")
    r = subprocess.run([need_tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", "play.yml"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def _hashes() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "dist").iterdir()
            if p.name.startswith(f"cachepilot_{__version__}_") or p.name.startswith(f"cachepilot-{__version__}-")
            or p.name.startswith(f"cachepilot-role-{__version__}.")}


def test_two_builds_of_one_commit_are_byte_identical(built: None) -> None:
    """Issue 34 item 8: the role pins the .deb's SHA-256, so a rebuild of the same commit must give the same bytes
    (SOURCE_DATE_EPOCH from the last commit; file order, owners and modes fixed)."""
    first = _hashes()
    assert len(first) == 3, first
    r = subprocess.run(["make", "-s", "package"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _hashes() == first


def _control(deb: Path, name: str) -> str:
    return subprocess.run([need_tool("dpkg-deb"), "-I", str(deb), name], capture_output=True, text=True,
                          check=True).stdout


def test_the_version_is_set_at_build_time_with_a_changelog_and_a_real_maintainer(built: None, tmp_path: Path) -> None:
    """`make package VERSION=...` builds that version (the wheel, the .deb, --version and the changelog say it) without
    touching the checkout; the maintainer is an address mail can reach, not localhost."""
    version = "0.1.3" if __version__ != "0.1.3" else "0.1.4"
    r = subprocess.run(["make", "-s", "package", f"VERSION={version}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    made = list((ROOT / "dist").glob(f"*{version}*"))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        deb = ROOT / "dist" / f"cachepilot_{version}_amd64.deb"
        assert sorted(p.name for p in made) == sorted([deb.name, f"cachepilot-{version}-py3-none-any.whl",
                                                       f"cachepilot-role-{version}.tar.gz",
                                                       f"cachepilot-cachepilot-{version}.tar.gz"])
        fields = _control(deb, "control")
        assert f"\nVersion: {version}\n" in fields
        maintainer = next(line for line in fields.splitlines() if line.startswith("Maintainer: "))
        assert re.fullmatch(r"Maintainer: [^<]+ <[^@<>\s]+@[a-z0-9.-]+\.[a-z]{2,}>", maintainer), maintainer
        assert "localhost" not in maintainer
        root = tmp_path / "root"
        subprocess.run([need_tool("dpkg-deb"), "-x", str(deb), str(root)], check=True)
        env = _outside(tmp_path) | {"PYTHONPATH": str(root / "usr/lib/python3/dist-packages")}
        out = subprocess.run(["/usr/bin/python3", str(root / "usr/bin/cachepilot"), "--version"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=60).stdout
        assert out == f"cachepilot {version}\n"
        log = gzip.decompress((root / "usr/share/doc/cachepilot/changelog.Debian.gz").read_bytes()).decode()
        assert log.startswith(f"cachepilot ({version}) ") and f"cachepilot ({__version__}) " in log
        assert not (ROOT / "controller/cachepilot/__init__.py").read_text().count(version)  # the checkout untouched
    finally:
        for p in made:
            p.unlink()


def test_a_downgrade_is_warned_on_stderr(built: None, tmp_path: Path) -> None:
    """The package's preinst, as dpkg runs it: `upgrade OLD` from a newer OLD warns; from an older one, or a fresh
    install, it says nothing. Either way it succeeds (a rollback is allowed, never silent)."""
    subprocess.run([need_tool("dpkg-deb"), "-e", str(DEB), str(tmp_path / "ctl")], check=True)
    preinst = str(tmp_path / "ctl" / "preinst")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([preinst, *args], capture_output=True, text=True, timeout=30)

    down = run("upgrade", "99.0.0")
    assert down.returncode == 0 and down.stdout == ""
    assert down.stderr == (f"cachepilot: warning: downgrading from 99.0.0 to {__version__} (the state file and "
                           "configuration stay as 99.0.0 left them)\n")
    for args in (("upgrade", "0.0.1"), ("upgrade", __version__), ("install",), ("install", "0.0.1")):
        r = run(*args)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), args


def test_the_man_page_names_every_command_the_parser_has(built: None) -> None:
    """Generated from the CLI's own parser at build time: every command and subcommand (advise and hotlist too),
    with each of its options."""
    from cachepilot.cli import build_parser

    page = gzip.decompress(_member(DEB, "./usr/share/man/man8/cachepilot.8.gz")).decode()
    text = page.replace("\\-", "-")

    def walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
        out = []
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    out += [(f"{path} {name}", sub), *walk(sub, f"{path} {name}")]
        return out

    commands = walk(build_parser(), "cachepilot")
    assert {"cachepilot advise", "cachepilot hotlist", "cachepilot policy check", "cachepilot run"} <= \
        {c for c, _ in commands}
    for name, sub in commands:
        assert f'.SS "{name}"' in text, name
        for a in sub._actions:
            for opt in a.option_strings:
                assert f"{opt}" in text, (name, opt)
    assert ".SH EXIT STATUS" in text and ".SH FILES" in text and "@" not in text.split(".SH COMMANDS")[0]


def _member(deb: Path, name: str) -> bytes:
    tar = subprocess.run([need_tool("dpkg-deb"), "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        f = t.extractfile(name)
        assert f is not None, name
        return f.read()
