"""The loop's stop request is safe from a signal handler (daemon/stopflag.py). With ``threading.Event`` a handler's
``set`` that lands while the main thread is inside ``Event.wait`` (holding the event's lock) never returns: a daemon
seen ignoring SIGTERM for 14 minutes. Here a thread pelts the process with signals whose handler does what
SIGTERM's does (``TickLoop.stop``) while the main thread waits as the loop does, in short waits; it must finish."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from cachepilot.daemon.stopflag import StopFlag

CHILD = textwrap.dedent("""
    import os, signal, threading, time
    from cachepilot.daemon.loop import TickLoop

    loop = TickLoop(1.0, lambda now: None)
    hits = 0

    def handler(*_):
        global hits
        hits += 1
        loop.stop()  # what `cachepilot run`'s SIGTERM handler does (Daemon.request_stop)

    signal.signal(signal.SIGUSR1, handler)
    done = False

    def pelt():
        while not done:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.0002)

    threading.Thread(target=pelt, daemon=True).start()
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        loop.stop_event.wait(0.0001)  # as Intake.wait / TickLoop.wait do between ticks
    done = True
    print("stopped" if loop.stopping else "not stopped", hits > 10)
""")


def test_a_stop_from_a_signal_handler_during_the_loops_waits_never_hangs() -> None:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "stopped True\n", (r.returncode, r.stdout, r.stderr[-1000:])


def test_the_flag_waits_then_wakes_at_once_once_set() -> None:
    f = StopFlag()
    t0 = time.monotonic()
    assert not f.wait(0.05) and time.monotonic() - t0 >= 0.04 and not f.is_set()
    f.set()
    f.set()  # again: harmless
    t0 = time.monotonic()
    assert f.wait(5) and f.wait(None) and time.monotonic() - t0 < 0.5
