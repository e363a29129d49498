"""The Ansible role and site.yml, run for real on this host against throw-away roots (`cachepilot_root`): lint
(production profile), syntax, convergence (files only: no systemd here), idempotence, check mode, variables
rejected early naming the variable, a policy the host's cachepilot refuses stopping the rollout after the first
batch. Service management and the health gate run only on real hosts (the lab test waits for `cachepilot run`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ops_support import ROOT, need_tool

pytestmark = pytest.mark.ops

PLAYBOOKS = ROOT / "playbooks"
EXE = ROOT / ".venv" / "bin" / "cachepilot"
POLICY = {"version": 1, "defaults": {"failure_model": "destructive", "exposure": {"max_dirty": "32MiB",
                                                                                 "max_age": "20s"}}}
LOGS = {"version": 1, "volumes": [{"name": "logs", "match": {"mountpoint": "/var/log"},
                                   "failure_model": "recoverable"}]}


def playbook(tmp: Path, hosts: dict[str, dict], *args: str, prometheus: dict[str, dict] | None = None,
             book: str = "site.yml") -> tuple[int, str]:
    """Run a playbook (site.yml) over local hosts (each with its own vars; `prometheus`: the Prometheus hosts and
    theirs) and return (rc, output)."""
    common = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
              "ansible_become": False, "cachepilot_install_method": "preinstalled",
              "cachepilot_executable": str(EXE)}
    inventory = {"all": {"children": {
        "cachepilot": {"hosts": {h: {**common, **v} for h, v in hosts.items()}},
        "prometheus": {"hosts": {h: {**common, **v} for h, v in (prometheus or {}).items()}}}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible"), "ANSIBLE_REMOTE_TEMP": str(tmp / ".ansible"),
           "ANSIBLE_PIPELINING": "1"}
    r = subprocess.run([need_tool("ansible-playbook"), "-i", str(tmp / "inventory.yml"),
                        str(PLAYBOOKS / book), *args], capture_output=True, text=True, env=env, timeout=300)
    return r.returncode, (r.stdout + r.stderr).replace('\\"', '"')  # messages appear inside JSON


def recap(out: str) -> dict[str, dict[str, int]]:
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", out, re.M)}


def files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_text())
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def test_ansible_lint_production_profile() -> None:
    r = subprocess.run([need_tool("ansible-lint"), "--nocolor", "--profile", "production", "playbooks/"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_syntax_check() -> None:
    r = subprocess.run([need_tool("ansible-playbook"), "--syntax-check", "-i",
                        str(PLAYBOOKS / "inventory" / "example.yml"), str(PLAYBOOKS / "site.yml")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_converges_idempotent_check_mode_and_a_refused_policy_stops_the_rollout(tmp_path: Path) -> None:
    root = tmp_path / "root"
    host = {"cachepilot_root": str(root), "cachepilot_policy": POLICY, "cachepilot_extra_policies": {"logs": LOGS},
            "cachepilot_textfile_enabled": True, "cachepilot_metrics_allow": ["localhost", "10.0.0.0/8"],
            "cachepilot_runbook_base_url": "https://docs.example.net/cachepilot/runbooks/"}
    rc, out = playbook(tmp_path, {"h1": host}, prometheus={"h1": {}})
    assert rc == 0, out
    assert recap(out)["h1"]["failed"] == 0 and recap(out)["h1"]["changed"] > 0
    got = files(root)
    unit = (ROOT / "controller" / "cachepilot" / "data" / "cachepilot.service").read_text()
    assert got["etc/systemd/system/cachepilot.service"] == unit  # the packaged unit, unchanged
    dropin = got["etc/systemd/system/cachepilot.service.d/ansible.conf"]
    assert "IPAddressAllow=localhost 10.0.0.0/8" in dropin
    assert "ReadWritePaths=/var/lib/prometheus/node-exporter" in dropin
    assert f"\nExecStart=\nExecStart={EXE} run --config /etc/cachepilot/ansible/config.yaml\n" in dropin
    config = yaml.safe_load(got["etc/cachepilot/ansible/config.yaml"])
    assert config["policies"] == ["/etc/cachepilot/ansible/policy.yaml", "/etc/cachepilot/ansible/policies/logs.yaml"]
    assert config["metrics"] == {"listen": "127.0.0.1:9854",
                                 "textfile": "/var/lib/prometheus/node-exporter/cachepilot.prom"}
    assert yaml.safe_load(got["etc/cachepilot/ansible/policy.yaml"]) == POLICY
    assert yaml.safe_load(got["etc/cachepilot/ansible/policies/logs.yaml"]) == LOGS
    assert "etc/cachepilot/config.yaml" not in got and "etc/cachepilot/policy.yaml" not in got  # the package's
    assert got["usr/local/bin/cachepilot"] == str(EXE)
    assert (root / "var/lib/prometheus/node-exporter").is_dir()
    rules = got["etc/prometheus/rules/cachepilot.rules.yml"]
    assert "runbook_url: https://docs.example.net/cachepilot/runbooks/daemon-down.md" in rules
    assert "dashboards/runbooks/" not in rules

    rc, out = playbook(tmp_path, {"h1": host}, prometheus={"h1": {}})
    assert rc == 0 and recap(out)["h1"]["changed"] == 0, out  # idempotent
    assert files(root) == got

    # check mode with a changed policy and one extra policy dropped: reports the changes, makes none
    changed = {**host, "cachepilot_policy": {**POLICY, "dry_run": True}, "cachepilot_extra_policies": {}}
    rc, out = playbook(tmp_path, {"h1": changed}, "--check", "--diff")
    assert rc == 0, out
    assert recap(out)["h1"]["changed"] == 1, out  # the one task that writes every file
    for changed_path in ("policy.yaml", "policies/logs.yaml", "config.yaml"):
        assert f"--- before: {root}/etc/cachepilot/ansible/{changed_path}" in out, (changed_path, out)
    assert "+dry_run: true" in out
    assert files(root) == got

    # a policy that passes the early checks (they do not know every key) but cachepilot on h1 refuses: h1 fails
    # and keeps its last good policy; h2, in the second batch, is never touched
    refused = {**POLICY, "defaults": {**POLICY["defaults"], "exposure": {"max_dirty": "32MiB", "max_agee": "20s"}}}
    rc, out = playbook(tmp_path, {"h1": {**host, "cachepilot_policy": refused},
                                  "h2": {**host, "cachepilot_root": str(tmp_path / "r2")}})
    assert rc != 0
    assert "max_agee" in out, out  # cachepilot policy check names the key
    assert recap(out)["h1"]["failed"] == 1 and "h2" in recap(out), out
    assert files(root) == got
    assert not (tmp_path / "r2").exists(), "the second batch ran after the first failed"


def test_the_role_never_edits_the_packages_conffiles_nor_shadows_its_unit(tmp_path: Path) -> None:
    """Issue 34 items 1 and 4: with the package's unit (install method deb, or cachepilot_unit_from_package), the role
    writes its own configuration and policies under /etc/cachepilot/ansible/ and a drop-in pointing the packaged unit
    at them; the package's conffiles stay byte for byte, and a unit of the role's own that an older role left in
    /etc/systemd/system (it shadowed every new package's unit) is removed."""
    root = tmp_path / "root"
    conffiles = {"etc/cachepilot/config.yaml": "# the package's\npolicies: [/etc/cachepilot/policy.yaml]\n",
                 "etc/cachepilot/policy.yaml": "# the package's\nversion: 1\n",
                 "lib/systemd/system/cachepilot.service": "[Service]\nExecStart=/usr/bin/cachepilot run\n",
                 "etc/systemd/system/cachepilot.service": "[Service]\nExecStart=/usr/local/bin/cachepilot run\n"}
    for rel, text in conffiles.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    host = {"cachepilot_root": str(root), "cachepilot_policy": POLICY, "cachepilot_unit_from_package": True}
    rc, out = playbook(tmp_path, {"h1": host})
    assert rc == 0, out
    got = files(root)
    for rel in ("etc/cachepilot/config.yaml", "etc/cachepilot/policy.yaml", "lib/systemd/system/cachepilot.service"):
        assert got[rel] == conffiles[rel], rel
    assert "etc/systemd/system/cachepilot.service" not in got  # no unit of the role's own
    dropin = got["etc/systemd/system/cachepilot.service.d/ansible.conf"]
    assert f"ExecStart={EXE} run --config /etc/cachepilot/ansible/config.yaml" in dropin
    assert f"ExecReload={EXE} reload --config /etc/cachepilot/ansible/config.yaml" in dropin
    assert yaml.safe_load(got["etc/cachepilot/ansible/policy.yaml"]) == POLICY
    rc, out = playbook(tmp_path, {"h1": host})
    assert rc == 0 and recap(out)["h1"]["changed"] == 0, out
    # check mode on a host where nothing is installed yet: no failure on a service that does not exist
    fresh = {"cachepilot_root": str(tmp_path / "fresh"), "cachepilot_policy": POLICY,
             "cachepilot_unit_from_package": True}
    rc, out = playbook(tmp_path, {"h2": fresh}, "--check")
    assert rc == 0 and recap(out)["h2"]["failed"] == 0, out
    assert not (tmp_path / "fresh").exists()


def test_argument_specs_are_consistent_with_the_defaults() -> None:
    """Issue 34 item 5: no option both required and defaulted; every documented default equals defaults/main.yml's;
    every variable in defaults/main.yml is in the spec."""
    role = PLAYBOOKS / "roles" / "cachepilot"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    main = specs["main"]["options"]
    assert set(defaults) <= set(main), sorted(set(defaults) - set(main))
    for name, spec in main.items():
        assert not (spec.get("required") and name in defaults), f"{name}: required and defaulted"
        if "default" in spec:
            assert spec["default"] == defaults[name], (name, spec["default"], defaults[name])
    assert defaults["cachepilot_install_method"] == "deb"  # the package: the pip default named no index


def test_policies_that_overlap_each_other_are_refused_together(tmp_path: Path) -> None:
    # each policy is valid alone; the daemon combines them and could only leave the volume both select unmanaged
    main = {**POLICY, "volumes": [{"name": "db", "match": {"device": "bcache*"}}]}
    extra = {"version": 1, "volumes": [{"name": "db0", "match": {"device": "bcache0"}}]}
    root = tmp_path / "root"
    rc, out = playbook(tmp_path, {"h1": {"cachepilot_root": str(root), "cachepilot_policy": main,
                                         "cachepilot_extra_policies": {"db0": extra}}})
    assert rc != 0 and recap(out)["h1"]["failed"] == 1, out
    assert "cachepilot_extra_policies.db0:" in out and "overlaps rule 'db' (cachepilot_policy:" in out, out
    assert not (root / "etc" / "cachepilot").exists(), out  # nothing written


def test_bad_variables_fail_early_naming_the_variable(tmp_path: Path) -> None:
    roots = {h: tmp_path / h for h in ("model", "size", "listen", "fine")}
    bad_model = {**POLICY, "volumes": [{"name": "db", "match": {"device": "bcache*"}, "failure_model": "sometimes"}]}
    bad_size = {**POLICY, "defaults": {"exposure": {"max_dirty": "lots"}}}
    rc, out = playbook(tmp_path, {
        "model": {"cachepilot_root": str(roots["model"]), "cachepilot_policy": bad_model},
        "size": {"cachepilot_root": str(roots["size"]), "cachepilot_policy": bad_size},
        "listen": {"cachepilot_root": str(roots["listen"]), "cachepilot_policy": POLICY,
                   "cachepilot_metrics_listen": "localhost:9854"},
        "fine": {"cachepilot_root": str(roots["fine"]), "cachepilot_policy": POLICY},
    })
    assert rc != 0
    # one run names every problem of every host
    assert 'cachepilot_policy.volumes[0].failure_model: "sometimes" is not one of recoverable, destructive, auto' \
        in out, out
    assert 'cachepilot_policy.defaults.exposure.max_dirty: "lots" is not a size' in out, out
    assert 'cachepilot_metrics_listen: "localhost:9854" is not IP:PORT' in out, out
    assert "fine" in recap(out) and recap(out)["fine"]["failed"] == 0
    # the valid host was not touched either: nothing changes anywhere until every host's settings are valid
    assert not any(r.exists() for r in roots.values()), out


def _every_key() -> dict:
    """A valid policy naming every key of the policy's field table (each at its default, as the reference shows it),
    a pin and a rule whose selector names every selector key."""
    from cachepilot.policy.fields import SETTINGS, TOP, leaves
    from cachepilot.policy.reference import shown

    doc: dict = {"version": 1}
    for table, where in ((TOP, doc), (SETTINGS, doc.setdefault("defaults", {}))):
        for path, row in leaves(table):
            at = where
            for k in path[:-1]:
                at = at.setdefault(k, {})
            at[path[-1]] = yaml.safe_load(shown(row))
    doc["defaults"]["pin"] = {"paths": ["db/", "conf/*.idx"], "max_bytes": "1GiB", "refresh": "10s"}
    doc["volumes"] = [{"name": "db", "match": {"device": "bcache*", "fs_uuid": "0123abcd-0000", "mountpoint": "/srv",
                                               "kind": "bcache"}, "knobs": {"sequential_cutoff": "4MiB"}}]
    return doc


def test_every_policy_key_is_checked_early_from_the_field_table(tmp_path: Path) -> None:
    """Issue 35 item 4: the role's early checks come from the policy's field table (files/policy_fields.json), so the
    keys its own list had lost (max_hold, refresh_interval, max_cutoff, window) are checked, and a policy naming every
    key at its default passes them (and the host's check)."""
    roots = {h: tmp_path / h for h in ("bad", "every")}
    bad = {"version": 1, "defaults": {"lifetime_hold": {"max_hold": "forever"},
                                      "promotion": {"refresh_interval": "often", "large_files": {"min_reads": 0}},
                                      "sequential_steering": {"max_cutoff": "big", "window": "wide"}},
           "volumes": [{"name": "z", "match": {"kind": "zfs"}, "health": {"scan_drop": 2}}]}
    rc, out = playbook(tmp_path, {"bad": {"cachepilot_root": str(roots["bad"]), "cachepilot_policy": bad},
                                  "every": {"cachepilot_root": str(roots["every"]), "cachepilot_policy": _every_key()}})
    assert rc != 0
    for name, value, expected in (
            ("defaults.lifetime_hold.max_hold", '"forever"', "a duration"),
            ("defaults.promotion.refresh_interval", '"often"', "a duration"),
            ("defaults.promotion.large_files.min_reads", "0", "a number of at least 1"),
            ("defaults.sequential_steering.max_cutoff", '"big"', "a size"),
            ("defaults.sequential_steering.window", '"wide"', "a duration"),
            ("volumes[0].match.kind", '"zfs"', "one of bcache, dm-cache, lvmcache, dm-writecache"),
            ("volumes[0].health.scan_drop", "2", "a number from 0 to 1")):
        assert f"cachepilot_policy.{name}: {value} is not {expected}" in out, (name, out)
    assert recap(out)["every"]["failed"] == 0, out
    assert not any(r.exists() for r in roots.values()), out
    rc, out = playbook(tmp_path, {"every": {"cachepilot_root": str(roots["every"]), "cachepilot_policy": _every_key()}})
    assert rc == 0 and recap(out)["every"]["failed"] == 0, out  # the host's `cachepilot policy check` agrees


def test_the_hosts_policy_check_loads_only_the_policy_command(tmp_path: Path) -> None:
    # the role runs `cachepilot policy check` on every host for every changed policy: on a slow host its start-up
    # is its cost, so it must not import the other commands (the simulator, the recorder...)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(POLICY))
    code = ("import sys; from cachepilot.cli import main; rc = main(['policy', 'check', sys.argv[1]]); "
            "print(sorted(m for m in sys.modules if m.startswith('cachepilot.commands.'))); sys.exit(rc)")
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code, str(tmp_path / "p.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "['cachepilot.commands.policy']", r.stdout


def test_batches_come_from_the_inventory(tmp_path: Path) -> None:
    """cachepilot_serial set in the inventory sizes the rollout's batches (a play's `serial` sees only extra vars and
    the role's default otherwise); an extra var still wins; hosts that disagree stop the rollout naming the values.
    (`--tags` matching nothing: only the batching runs, one play banner per batch.)"""
    hosts = {h: {"cachepilot_serial": 2, "cachepilot_policy": POLICY} for h in ("a", "b", "c")}
    rc, out = playbook(tmp_path, hosts, "--tags", "none_such")
    assert rc == 0 and out.count("PLAY [Roll out cachepilot in batches]") == 2, out
    rc, out = playbook(tmp_path, hosts, "--tags", "none_such", "-e", "cachepilot_serial=3")
    assert rc == 0 and out.count("PLAY [Roll out cachepilot in batches]") == 1, out
    hosts["c"]["cachepilot_serial"] = 1
    rc, out = playbook(tmp_path, hosts, "--tags", "none_such")
    # smallest first whatever order the hosts joined their groups in (a fresh clone's CI once saw "(1, 2)" here
    # against the "(2, 1)" of every earlier run: group_by's order follows the forks)
    assert rc != 0 and "cachepilot_serial differs between hosts (1, 2)" in out, out
    assert "PLAY [Roll out cachepilot in batches]" not in out


def test_argument_specs_describe_every_option() -> None:
    role = PLAYBOOKS / "roles" / "cachepilot"
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    for entry, spec in specs.items():
        assert spec.get("description"), entry
        for name, opt in spec["options"].items():
            assert isinstance(opt.get("description"), str) and len(opt["description"]) > 10, (entry, name)
    assert set(defaults) <= set(specs["main"]["options"])  # every variable of the role is described


def test_a_package_that_does_not_match_its_pin_stops_the_run(tmp_path: Path) -> None:
    """Install method deb: the .deb's SHA-256 and name are checked against the pin on the controller before any
    host changes (check mode: nothing on this host is touched either way)."""
    deb = tmp_path / "cachepilot_0.1.0_amd64.deb"
    deb.write_bytes(b"not the package")
    host = {"cachepilot_policy": POLICY, "cachepilot_install_method": "deb", "cachepilot_executable": str(EXE),
            "cachepilot_deb_src": str(deb), "cachepilot_version": "0.1.0", "cachepilot_deb_sha256": "ab" * 32}
    rc, out = playbook(tmp_path, {"h1": host}, "--check")
    assert rc != 0 and "Check the package against its pin" in out, out
    assert f"is not cachepilot_0.1.0_amd64.deb with cachepilot_deb_sha256 {'ab' * 32}" in out, out
    assert "Copy the package to the host" not in out.split("Check the package against its pin")[1].split("RECAP")[0]


def test_teardown_removes_everything_the_role_wrote(tmp_path: Path) -> None:
    """Issue 34 item 3: playbooks/teardown.yml after a rollout leaves none of the role's files (under a throw-away
    root: files only; the lab's systemd guest stops the daemon, restores the knobs and purges the package). The
    package's own files (here stand-ins) and another tool's drop-in stay."""
    root = tmp_path / "root"
    keep = {"etc/cachepilot/config.yaml": "# the package's\n", "lib/systemd/system/cachepilot.service": "[Service]\n",
            "etc/systemd/system/cachepilot.service.d/other.conf": "[Service]\nNice=5\n"}
    for rel, text in keep.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    host = {"cachepilot_root": str(root), "cachepilot_policy": POLICY, "cachepilot_extra_policies": {"logs": LOGS},
            "cachepilot_textfile_enabled": True}
    rc, out = playbook(tmp_path, {"h1": host})
    assert rc == 0, out
    assert len(files(root)) > len(keep) + 3
    rc, out = playbook(tmp_path, {"h1": host}, "--check", book="teardown.yml")
    assert rc == 0 and len(files(root)) > len(keep) + 3, out  # check mode removes nothing
    rc, out = playbook(tmp_path, {"h1": host}, book="teardown.yml")
    assert rc == 0, out
    assert files(root) == keep
    rc, out = playbook(tmp_path, {"h1": host}, book="teardown.yml")
    assert rc == 0 and recap(out)["h1"]["changed"] == 0, out  # nothing left to do
