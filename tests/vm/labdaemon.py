"""The daemon a lab script runs in the guest (tests/vm/lifecycle/, tests/vm/daemon/, and the benchmarks' guests through
tests/bench/guest/common.Daemon): `cachepilot run` on one policy (YAML text) or on policy files, in a directory of
its own, its stderr kept in a file, ready when its socket exists and it said so; stopped by SIGTERM, its exit code
and whether it logged a traceback said to the host (guestkit.say)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from guestkit import cli_in_process, say, wait

CLI = str(Path(sys.executable).with_name("cachepilot"))


class LabDaemon:
    """Started on construction in ``tmp`` with ``policy``: YAML text (written to tmp/policy.yaml) or the policy files
    to load; tick, rescan, state interval and the metrics listener ("" for none) as the script asks."""

    def __init__(self, tmp: Path, policy: str | list[Path], *, tick: str = "1s", rescan: str = "5s",
                 state_interval: str = "5s", metrics: str = "") -> None:
        self.tmp, self.socket = tmp, tmp / "ctl.sock"
        if isinstance(policy, str):
            (tmp / "policy.yaml").write_text(policy)
        files = "policy.yaml" if isinstance(policy, str) else ", ".join(str(p) for p in policy)
        (tmp / "c.yaml").write_text(f"version: 1\npolicies: [{files}]\nstate_dir: state\nsocket: ctl.sock\n"
                                    f"tick: {tick}\nrescan: {rescan}\nstate_interval: {state_interval}\n"
                                    f"metrics: {{listen: '{metrics}'}}\n")
        self.err = open(tmp / "stderr", "w+")  # noqa: SIM115 - kept open for the daemon's life
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([CLI, "run", "--config", str(tmp / "c.yaml")], stderr=self.err,
                                     stdout=subprocess.DEVNULL)

    def ready(self, timeout: float) -> bool:
        """Whether it said ready with its socket in place within ``timeout`` seconds (under TCG: tens of them)."""
        return wait(lambda: self.socket.exists() and "ready" in (self.tmp / "stderr").read_text(), timeout)

    def log(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def fail(self, *more: object, tail: int = 3000) -> NoReturn:
        """The end of a script that could not start: the log's last ``tail`` characters (and ``more``) printed for
        the host's explain(), exit 1."""
        rc = self.proc.poll()
        state = "still running" if rc is None else f"exited {rc}"
        print(f"daemon {state}, {time.monotonic() - self.t0:.0f} s after its start", self.log()[-tail:], *more)
        sys.exit(1)

    def cli(self, *args: str) -> tuple[int, str]:
        """`cachepilot ARGS` against this daemon (in this process: guestkit.cli_in_process)."""
        return cli_in_process(self.socket, *args)

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM, and its exit code once it has stopped."""
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 120) -> str:
        """SIGTERM; says ``exit`` (its code) and ``traceback`` (yes/no); its whole log."""
        say("exit", self.terminate(timeout))
        log = self.log()
        say("traceback", "yes" if "Traceback" in log else "no")
        return log
