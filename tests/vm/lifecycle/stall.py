"""Lab: a write-back stall provoked behind the daemon's back on the lab's bcache (writeback) volume (issue 36 item 3).
The daemon runs with the shipped defaults but ``health.stall_after: 20s`` and ``writeback_delay`` 10 (recoverable:
no drain of its own); Debian's prometheus runs in the guest too, scraping the daemon every 5 s with the shipped
rules. Then ``echo 0 > writeback_running`` with ~8 MiB dirty; measured: when the daemon's status says stalled, when
``CachepilotWriteBackStalled`` fires in Prometheus, what explain says -- and that writeback_running still reads 0
(the daemon does not undo the operator's knob). Then ``echo 1`` ends it. key=value lines on stdout."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from cachepilot.backends.inspect import parse_bcache_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import quiet_policy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "dashboards" / "prometheus" / "cachepilot.rules.yml"
METRICS, PROM = "127.0.0.1:9854", "127.0.0.1:9090"
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
tmp = Path(tempfile.mkdtemp(prefix="cp-stall-"))
# A stall is judged after max(stall_after, 2 x writeback_delay) (bcache may rest that long by design: the models'
# WritebackView.quiet_s): 20 s each here, where stock writeback_delay 30 made it 60 s (62 and 61 measured with
# stall_after 45s) -- 40 s of the suite. The dirty data the stall needs: neither a sequential nor a congestion
# bypass of the writes (labkit.NO_CONGESTION; 16 files of 1 MiB in a row were 13 MiB bypassed as sequential once).
POLICY = quiet_policy("health: {stall_after: 20s}", "knobs: {writeback_percent: 40, writeback_delay: 10,"
                      " sequential_cutoff: 0, congested_read_threshold_us: 0, congested_write_threshold_us: 0}")


def dirty() -> int:
    return parse_bcache_size((sysfs / "dirty_data").read_text())


def volume_status() -> dict[str, Any]:
    rc, out = d.cli("status", "--json")
    vols = json.loads(out).get("volumes", []) if rc == 0 else []
    return next((v for v in vols if v["name"] == "bcache0"), {})


def firing() -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{PROM}/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
    except OSError:
        return []
    return [a for a in alerts if a["labels"].get("alertname") == "CachepilotWriteBackStalled"
            and a["labels"].get("volume") == "bcache0" and a["state"] == "firing"]


def prom_query(expr: str) -> list[dict[str, Any]]:
    url = f"http://{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]  # type: ignore[no-any-return]
    except OSError:
        return []


# the busybox guest leaves lo down (only the systemd one brings it up): the metrics are scraped over it
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
# Prometheus first: it takes a while to start under TCG, the daemon meanwhile
# every 5 s: a scrape of the daemon under TCG can take seconds (a 2 s scrape timed out: up stayed 0)
(tmp / "prometheus.yml").write_text(yaml.safe_dump({
    "global": {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"},
    "rule_files": [str(RULES)],
    "scrape_configs": [{"job_name": "cachepilot", "static_configs": [{"targets": [METRICS]}]}]}))
plog = open(tmp / "prometheus.log", "w")
prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                         f"--web.listen-address={PROM}"], stdout=subprocess.DEVNULL, stderr=plog)
d = LabDaemon(tmp, POLICY, metrics=METRICS)
ok = d.ready(180) and wait(lambda: prom_query('up{job="cachepilot"} == 1'), 180, step=1)
say("ready", "yes" if ok else "no")
if not ok:
    targets = ""
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{PROM}/api/v1/targets", timeout=5) as r:
        targets = "targets: " + r.read().decode()[-2000:]
    d.fail((tmp / "prometheus.log").read_text()[-2000:], targets)

# dirty data that stays, then write-back stopped behind the daemon's back
# 8 MiB: twice what the test asks; the stall is judged from when dirty data stops falling, and with 20 MiB the
# write-back bcache had in flight at the echo took 30 s to land (detected 55 s after it, 23 s with 3.5 MiB)
for i in range(8):
    with open(mnt / f"s{i:02d}", "wb") as f:
        f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
(sysfs / "writeback_running").write_text("0\n")
t_stop = time.monotonic()
say("dirty_before", dirty())
say("running_after_echo", (sysfs / "writeback_running").read_text().strip())

found = wait(lambda: (volume_status().get("writeback") or {}).get("stalled"), 150, step=1)
say("detected_s", f"{time.monotonic() - t_stop:.0f}" if found else "never")
wb = volume_status().get("writeback") or {}
say("cause_names_knob", "yes" if "writeback_running is 0" in str(wb.get("cause")) else "no")
print("cause:", wb.get("cause"))
fired = wait(firing, 150, step=1)
say("alert_s", f"{time.monotonic() - t_stop:.0f}" if fired else "never")
say("alert_severity", firing()[0]["labels"]["severity"] if fired else "none")
gauge = prom_query('cachepilot_volume_writeback_stalled{volume="bcache0"}')
say("gauge_in_prometheus", gauge[0]["value"][1] if gauge else "none")
rc, out = d.cli("explain", "--volume", "bcache0")
say("explain_says", "yes" if "writeback_stall => found" in out and "writeback_running is 0" in out else "no")
print(out[-1500:])
# the daemon left the operator's knob as it was, and wrote nothing to it
say("running_still", (sysfs / "writeback_running").read_text().strip())
rc, out = d.cli("explain", "--volume", "bcache0", "--json")
wrote = [w for dec in json.loads(out) for w in dec["writes"] if "writeback_running" in w["target"]] if rc == 0 else [1]
say("daemon_wrote_running", "yes" if wrote else "no")

# the operator turns it back on: the stall ends (bcache holds this little dirty data below its target on purpose)
(sysfs / "writeback_running").write_text("1\n")
ended = wait(lambda: not (volume_status().get("writeback") or {}).get("stalled"), 60, step=1)
say("ended", "yes" if ended else "no")
log = d.stop()
prom.terminate()
prom.wait(timeout=60)
say("logged", "yes" if "writeback_stall found" in log else "no")
