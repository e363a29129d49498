#!/usr/bin/python3
"""Ansible module of the cachepilot role: the service enabled and started (or stopped), then the health gate — in
one round trip.

Why a module: `systemd` + `uri` tasks cost a connection and a Python start on the host each (seconds apiece on a
slow host, times every host of every batch). Here: `systemctl enable/start` as needed, wait until the unit is
active (with Type=notify: the daemon said READY=1), then read the metrics endpoint (or the textfile) until it says
`cachepilot_ready 1`, and optionally that a cached volume was adopted.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cachepilot_service
short_description: Enable and start cachepilot, then wait until it is ready and its metrics answer
description:
  - Enables and starts the unit (or stops and disables it), waits until it is active, then reads C(metrics_url)
    (or C(textfile)) until it contains C(cachepilot_ready 1.0).
options:
  name: {description: The unit., type: str, default: cachepilot}
  enabled: {description: Enabled and running, or stopped and disabled., type: bool, default: true}
  metrics_url: {description: The daemon's metrics URL ("" = use textfile)., type: str, default: ""}
  textfile: {description: node_exporter textfile the daemon writes ("" = none)., type: str, default: ""}
  require_cached_volume: {description: Fail when the daemon runs observe-only., type: bool, default: false}
  timeout: {description: Seconds to wait for active and ready., type: int, default: 90}
author: cachepilot
"""

RETURN = r"""
active_state: {description: The unit's ActiveState at the end., type: str, returned: always}
main_pid: {description: The daemon's pid., type: int, returned: always}
"""

READY = "cachepilot_ready 1.0"


def _show(module: AnsibleModule, name: str) -> dict[str, str]:
    rc, out, err = module.run_command(["systemctl", "show", name, "-p", "ActiveState", "-p", "UnitFileState",
                                       "-p", "MainPID", "-p", "LoadState"])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {name}: {err.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _systemctl(module: AnsibleModule, *args: str) -> None:
    rc, _, err = module.run_command(["systemctl", *args])
    if rc != 0:
        module.fail_json(msg=f"systemctl {' '.join(args)}: {err.strip()}")


def _exported(url: str, textfile: str) -> str:
    try:
        if url:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - the daemon's own local endpoint
                return str(r.read().decode())
        with open(textfile, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _converge(module: AnsibleModule, name: str, enabled: bool) -> tuple[bool, dict[str, str]]:
    state = _show(module, name)
    if state.get("LoadState") != "loaded":
        if module.check_mode:  # a first install in check mode: the unit is not there yet, it would be started
            module.exit_json(changed=True, active_state="", main_pid=0)
        module.fail_json(msg=f"{name}.service is not loaded ({state.get('LoadState')})")
    changed = False
    if enabled and state.get("UnitFileState") != "enabled":
        changed = True
        if not module.check_mode:
            _systemctl(module, "enable", name)
    if not enabled and state.get("UnitFileState") == "enabled":
        changed = True
        if not module.check_mode:
            _systemctl(module, "disable", name)
    running = state.get("ActiveState") in ("active", "activating", "reloading")
    if running != enabled:
        changed = True
        if not module.check_mode:
            _systemctl(module, "start" if enabled else "stop", name)  # Type=notify: start returns once ready
    return changed, state


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "default": "cachepilot"},
            "enabled": {"type": "bool", "default": True},
            "metrics_url": {"type": "str", "default": ""},
            "textfile": {"type": "str", "default": ""},
            "require_cached_volume": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 90},
        },
        supports_check_mode=True,
    )
    p: dict[str, Any] = module.params
    name = p["name"]
    changed, state = _converge(module, name, p["enabled"])
    if module.check_mode or not p["enabled"]:
        module.exit_json(changed=changed, active_state=state.get("ActiveState", ""),
                         main_pid=int(state.get("MainPID") or 0))
    deadline = time.monotonic() + p["timeout"]
    while True:
        state = _show(module, name)
        text = _exported(p["metrics_url"], p["textfile"]) if state.get("ActiveState") == "active" else ""
        if READY in text:
            break
        if time.monotonic() > deadline:
            where = p["metrics_url"] or p["textfile"]
            module.fail_json(msg=f"{name} not ready after {p['timeout']} s: ActiveState={state.get('ActiveState')}, "
                                 f"{where} {'answers' if text else 'does not answer'} without '{READY}'")
        time.sleep(1)
    if p["require_cached_volume"] and "cachepilot_observe_only 0.0" not in text:
        module.fail_json(msg="cachepilot_require_cached_volume: no cached volume here (cachepilot runs "
                             "observe-only)")
    module.exit_json(changed=changed, active_state=state["ActiveState"], main_pid=int(state.get("MainPID") or 0))


if __name__ == "__main__":
    main()
