#!/usr/bin/python3
"""Ansible module of the cachepilot role: every file the role manages on a host, in one round trip.

Why a module: under a slow link (or a slow host) each built-in task costs a connection and a Python start on the
host; the role's files (policies, config, unit, drop-in, the executable's link, stale extra policies) were ~15
tasks. Here they are one: policies are checked by cachepilot itself before anything is written, then every
changed file is replaced atomically, and the result says which groups changed so the handlers can tell a restart
from a reload.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cachepilot_files
short_description: Write cachepilot's files on a host in one step, checking policies first
description:
  - Compares each file, link and directory with what is wanted; policies marked C(validate) are checked together with
    C(executable policy check FILE...) before anything is written; then every changed file is replaced atomically
    (temporary file in the same directory, renamed).
  - Returns the groups that changed, for the handlers (e.g. a changed policy is a reload, a changed unit a restart).
options:
  files:
    description: Files as dicts with path, content, mode (default 0644), group, validate (bool), label (for messages).
    type: list
    elements: dict
    default: []
  links:
    description: Symbolic links as dicts with path, src, group.
    type: list
    elements: dict
    default: []
  dirs:
    description: Directories as dicts with path, mode (default 0755), group.
    type: list
    elements: dict
    default: []
  prune:
    description: Files matching pattern in dir that are not in files are removed (dicts with dir, pattern, group).
    type: list
    elements: dict
    default: []
  absent:
    description: Files or links that must not exist (dicts with path, group); removed when present.
    type: list
    elements: dict
    default: []
  unit_paths:
    description: Where the service's unit may be; the result's unit_present says whether one is there.
    type: list
    elements: str
    default: []
  executable:
    description: cachepilot's executable; must exist (except in check mode) and checks the policies.
    type: str
    required: true
  executable_label:
    description: The variable naming the executable, for the message when it is missing.
    type: str
    default: cachepilot_executable
author: cachepilot
"""

RETURN = r"""
groups:
  description: Sorted names of the groups with a change.
  type: list
  returned: always
paths:
  description: Paths changed (written, linked, created or removed).
  type: list
  returned: always
unit_present:
  description: Whether one of unit_paths exists (check mode on a new host has no unit to restart yet).
  type: bool
  returned: always
"""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _mode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _check_policies(module: AnsibleModule, exe: str, items: list[dict[str, Any]]) -> None:
    """cachepilot's own check of the policies as the daemon combines them (each alone: file:line: key: problem;
    together: no rule of one overlapping another's); fails the host before anything is written."""
    tmps: list[tuple[str, str]] = []
    try:
        for item in items:
            fd, tmp = tempfile.mkstemp(prefix="policy-", suffix=".yaml", dir=module.tmpdir)
            tmps.append((tmp, item.get("label") or item["path"]))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(item["content"])
        rc, out, err = module.run_command([exe, "policy", "check", *(t for t, _ in tmps)])
    finally:
        for tmp, _ in tmps:
            os.unlink(tmp)
    if rc != 0:
        msg = (err or out).strip()
        for tmp, label in tmps:
            msg = msg.replace(tmp, label)
        module.fail_json(msg=f"cachepilot refused the policies: {msg}", rc=rc)


def _write(path: str, content: str, mode: int) -> None:
    """Atomic replace: a temporary file in the same directory, fsynced, renamed over the old one."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ansible-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _plan(module: AnsibleModule) -> tuple[list[tuple[str, Any]], list[dict[str, str]], set[str]]:
    """What to do: (action, item) pairs, the diff and the changed groups; nothing touched yet."""
    p = module.params
    todo: list[tuple[str, Any]] = []
    diff: list[dict[str, str]] = []
    groups: set[str] = set()
    for d in p["dirs"]:
        if not os.path.isdir(d["path"]):
            todo.append(("dir", d))
            groups.add(d.get("group") or "dirs")
            diff.append({"before_header": d["path"], "after_header": d["path"], "before": "", "after": "(directory)\n"})
    managed = set()
    for f in p["files"]:
        managed.add(f["path"])
        mode = int(str(f.get("mode") or "0644"), 8)
        old = _read(f["path"])
        if old != f["content"] or _mode_of(f["path"]) != mode:
            todo.append(("file", {**f, "mode": mode}))
            groups.add(f["group"])
            diff.append({"before_header": f["path"], "after_header": f["path"], "before": old or "",
                         "after": f["content"]})
    for link in p["links"]:
        old_src = os.readlink(link["path"]) if os.path.islink(link["path"]) else None
        if old_src != link["src"]:
            todo.append(("link", link))
            groups.add(link["group"])
            diff.append({"before_header": link["path"], "after_header": link["path"],
                         "before": f"-> {old_src}\n" if old_src else "", "after": f"-> {link['src']}\n"})
    for gone in p["absent"]:
        if os.path.lexists(gone["path"]):
            todo.append(("remove", gone["path"]))
            groups.add(gone["group"])
            diff.append({"before_header": gone["path"], "after_header": gone["path"],
                         "before": _read(gone["path"]) or "", "after": ""})
    for pr in p["prune"]:
        if not os.path.isdir(pr["dir"]):
            continue
        for name in sorted(os.listdir(pr["dir"])):
            path = os.path.join(pr["dir"], name)
            if fnmatch.fnmatch(name, pr["pattern"]) and path not in managed and os.path.isfile(path):
                todo.append(("remove", path))
                groups.add(pr["group"])
                diff.append({"before_header": path, "after_header": path, "before": _read(path) or "",
                             "after": ""})
    return todo, diff, groups


def _apply(todo: list[tuple[str, Any]]) -> list[str]:
    done = []
    for action, item in todo:
        if action == "dir":
            os.makedirs(item["path"], exist_ok=True)
            os.chmod(item["path"], int(str(item.get("mode") or "0755"), 8))
            done.append(item["path"])
        elif action == "file":
            _write(item["path"], item["content"], item["mode"])
            done.append(item["path"])
        elif action == "link":
            os.makedirs(os.path.dirname(item["path"]), mode=0o755, exist_ok=True)
            tmp = f"{item['path']}.ansible-new"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(item["src"], tmp)
            os.rename(tmp, item["path"])
            done.append(item["path"])
        else:
            os.unlink(item)
            done.append(item)
    return done


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "default": []},
            "links": {"type": "list", "elements": "dict", "default": []},
            "dirs": {"type": "list", "elements": "dict", "default": []},
            "prune": {"type": "list", "elements": "dict", "default": []},
            "absent": {"type": "list", "elements": "dict", "default": []},
            "unit_paths": {"type": "list", "elements": "str", "default": []},
            "executable": {"type": "str", "required": True},
            "executable_label": {"type": "str", "default": "cachepilot_executable"},
        },
        supports_check_mode=True,
    )
    exe = module.params["executable"]
    have_exe = _is_executable(exe)
    if not have_exe and not module.check_mode:
        module.fail_json(msg=f"{module.params['executable_label']}: {exe} is not an executable file")
    todo, diff, groups = _plan(module)
    # Check every changed policy before writing anything: a refused one leaves the host exactly as it was.
    policies = [f for f in module.params["files"] if f.get("validate")]
    if have_exe and any(action == "file" and item.get("validate") for action, item in todo):
        _check_policies(module, exe, policies)
    paths = [item["path"] if isinstance(item, dict) else item for _, item in todo]
    if not module.check_mode:
        paths = _apply(todo)
    unit_present = any(os.path.exists(u) for u in module.params["unit_paths"])
    module.exit_json(changed=bool(todo), groups=sorted(groups), paths=paths, diff=diff, unit_present=unit_present)


if __name__ == "__main__":
    main()
