"""Issue 34 item 5: the Ansible collection cachepilot.cachepilot as users get it: `ansible-galaxy collection build`
then `ansible-galaxy collection install` into a temporary directory; it carries the role (argument specs readable by
ansible-doc), the site, prometheus and teardown playbooks (each passing a syntax check by its full name), the rules
builder (which still builds promtool-valid rules from there) and the dashboard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ops_support import ROOT, need_tool, promtool

from cachepilot import __version__

pytestmark = pytest.mark.ops


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("collection")
    r = subprocess.run([str(ROOT / "controller/packaging/build-collection.sh"), str(ROOT), __version__,
                        str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    tarball = Path(r.stdout.strip())
    assert tarball == tmp / "dist" / f"cachepilot-cachepilot-{__version__}.tar.gz" and tarball.is_file()
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(tmp / "collections"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible"), "HOME": str(tmp)}
    r = subprocess.run([need_tool("ansible-galaxy"), "collection", "install", "-p", str(tmp / "collections"),
                        str(tarball)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
    assert r.returncode == 0 and "cachepilot.cachepilot:" in r.stdout and "was installed successfully" in r.stdout, \
        r.stdout + r.stderr
    where = tmp / "collections" / "ansible_collections" / "cachepilot" / "cachepilot"
    assert json.loads((where / "MANIFEST.json").read_text())["collection_info"]["version"] == __version__
    return where, env


def test_the_collection_carries_the_role_playbooks_rules_builder_and_dashboard(
        installed: tuple[Path, dict[str, str]]) -> None:
    where, _ = installed
    for rel in ("roles/cachepilot/tasks/main.yml", "roles/cachepilot/meta/argument_specs.yml",
                "roles/cachepilot/files/cachepilot.service", "roles/cachepilot/files/cachepilot.rules.yml",
                "plugins/modules/cachepilot_files.py", "plugins/modules/cachepilot_service.py",
                "playbooks/site.yml", "playbooks/prometheus.yml", "playbooks/teardown.yml",
                "playbooks/templates/prometheus.yml.j2", "files/prometheus/build_rules.py",
                "files/grafana/cachepilot.json", "files/runbooks/daemon-down.md"):
        assert (where / rel).is_file(), rel
    assert not [p for p in where.rglob("*") if p.is_symlink()]
    assert json.loads((where / "files/grafana/cachepilot.json").read_text())["panels"]


def test_each_playbook_passes_a_syntax_check_by_its_full_name(installed: tuple[Path, dict[str, str]],
                                                              tmp_path: Path) -> None:
    _, env = installed
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {
        "cachepilot": {"hosts": {"h1": {}}}, "prometheus": {"hosts": {"p1": {}}}}}}))
    for book in ("site", "prometheus", "teardown"):
        r = subprocess.run([need_tool("ansible-playbook"), "--syntax-check", "-i", str(tmp_path / "inventory.yml"),
                            f"cachepilot.cachepilot.{book}"], capture_output=True, text=True, timeout=120, env=env,
                           cwd=tmp_path)
        assert r.returncode == 0, (book, r.stdout + r.stderr)
    r = subprocess.run([need_tool("ansible-playbook"), "--list-tasks", "--tags", "run", "-i",
                        str(tmp_path / "inventory.yml"), "cachepilot.cachepilot.site"], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "Enable and start cachepilot" in r.stdout, r.stdout + r.stderr
    assert "Install the package" not in r.stdout  # tagged install, not run


def test_the_role_documents_its_arguments(installed: tuple[Path, dict[str, str]]) -> None:
    _, env = installed
    r = subprocess.run([need_tool("ansible-doc"), "-t", "role", "--json", "cachepilot.cachepilot.cachepilot"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    main = json.loads(r.stdout)["cachepilot.cachepilot.cachepilot"]["entry_points"]["main"]["options"]
    assert main["cachepilot_install_method"]["default"] == "deb" and "cachepilot_runbook_base_url" in main
    assert not main["cachepilot_policy"].get("required")


def test_the_rules_builder_works_from_the_collection(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    where, _ = installed
    r = subprocess.run([sys.executable, str(where / "files/prometheus/build_rules.py"), "--job", "cp",
                        "--runbook-base", "https://wiki.example.org/cp/"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "runbook_url: https://wiki.example.org/cp/daemon-down.md" in r.stdout, r.stderr
    (tmp_path / "r.yml").write_text(r.stdout)
    check = promtool("check", "rules", str(tmp_path / "r.yml"))
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_installed_collection_rolls_out_into_a_throwaway_root(installed: tuple[Path, dict[str, str]],
                                                                  tmp_path: Path) -> None:
    """The role's modules resolve from the collection's plugins: site.yml by its full name writes the files."""
    _, env = installed
    root = tmp_path / "root"
    host = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3", "ansible_become": False,
            "cachepilot_install_method": "preinstalled", "cachepilot_executable": str(ROOT / ".venv/bin/cachepilot"),
            "cachepilot_root": str(root), "cachepilot_unit_from_package": True,
            "cachepilot_policy": {"version": 1, "defaults": {"failure_model": "recoverable"}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"cachepilot": {"hosts": {
        "h1": host}}}}}))
    r = subprocess.run([need_tool("ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                        "cachepilot.cachepilot.site"], capture_output=True, text=True, timeout=300,
                       env={**env, "ANSIBLE_PIPELINING": "1"}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert yaml.safe_load((root / "etc/cachepilot/ansible/policy.yaml").read_text())["defaults"] == {
        "failure_model": "recoverable"}
    assert (root / "etc/systemd/system/cachepilot.service.d/ansible.conf").is_file()
