"""Hostile clients of the daemon's servers, run as a process of their own (standard library only: the tests pass this
file's text to ``python -I -c`` under ``setpriv``, so it runs as ``nobody`` without reading the checkout).

``python -c SRC MODE ADDRESS SECONDS [N]``: prints ``on`` once the attack is established, then at the end one JSON
line of what the attacker saw. ADDRESS is ``HOST:PORT`` or a unix socket path.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import threading
import time
from collections import Counter


def connect(address: str, blocking: bool = True) -> socket.socket:
    if address.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address)
    else:
        host, port = address.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
    s.setblocking(blocking)
    return s


def hold(address: str, seconds: float, n: int, first: bytes, every: float, byte: bytes) -> dict[str, int]:
    """Keep ``n`` connections open for ``seconds``: each sends ``first``, then ``byte`` every ``every`` s (never
    completing a request); one the server closes is opened again at once, as an attacker would."""
    sel = selectors.DefaultSelector()
    seen: Counter[str] = Counter()

    def one() -> None:
        try:
            s = connect(address, blocking=False)
        except OSError as exc:
            seen[f"connect failed: {exc.strerror}"] += 1
            return
        try:
            s.send(first)
        except OSError:
            pass
        sel.register(s, selectors.EVENT_READ)
        seen["connections"] += 1

    for _ in range(n):
        one()
    print("on", flush=True)
    end = time.monotonic() + seconds
    next_byte = time.monotonic() + every
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                s.close()
                seen["closed by the server"] += 1
                one()
        if every and time.monotonic() >= next_byte:
            next_byte += every
            for key in list(sel.get_map().values()):
                try:
                    key.fileobj.send(byte)  # type: ignore[union-attr]
                except OSError:
                    pass
    return dict(seen)


def exchange(address: str, payload: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send ``payload``, read to the end: (the answer, seconds it took)."""
    t0 = time.monotonic()
    s = connect(address)
    s.settimeout(timeout)
    answer = b""
    try:
        try:
            s.sendall(payload)
        except OSError:
            pass  # closed early (a too big request): read what the server said
        while chunk := s.recv(1 << 16):
            answer += chunk
    except TimeoutError:
        answer += b"<timeout>"
    except OSError as exc:
        answer += f"<{exc.strerror}>".encode()
    finally:
        s.close()
    return answer, time.monotonic() - t0


def repeat(address: str, seconds: float, payload: bytes) -> dict[str, int]:
    """Send the same request again and again; count the distinct first lines of the answers."""
    seen: Counter[str] = Counter()
    print("on", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        answer, _ = exchange(address, payload)
        seen[answer.split(b"\n", 1)[0].strip().decode(errors="replace")[:200]] += 1
    return dict(seen)


def trickle(address: str, seconds: float, n: int) -> dict[str, object]:
    """``n`` clients each sending a whole request a byte every 0.9 s: how long until the server gave up on them."""
    results: list[tuple[bytes, float]] = []

    def one() -> None:
        t0 = time.monotonic()
        s = connect(address)
        s.settimeout(seconds + 5)
        answer = b""
        try:
            for b in b'{"cmd": "status"}\n':
                s.send(bytes([b]))
                time.sleep(0.9)
        except OSError:
            pass  # closed by the server
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except OSError:
            pass
        s.close()
        results.append((answer, time.monotonic() - t0))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    print("on", flush=True)
    for t in threads:
        t.join()
    return {"answers": sorted({a.decode(errors="replace") for a, _ in results}),
            "longest_s": max(d for _, d in results)}


def flood(address: str, seconds: float, concurrency: int) -> dict[str, object]:
    """Rounds of 1 000 whole GET /metrics requests, ``concurrency`` at a time, for ``seconds``: the status lines and
    the slowest."""
    seen: Counter[str] = Counter()
    slowest = [0.0]
    left = [1000]
    end = time.monotonic() + seconds
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left[0] == 0 and time.monotonic() < end:
                    left[0] = 1000
                if left[0] == 0:
                    return
                left[0] -= 1
            answer, took = exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
            with lock:
                seen[answer.split(b"\r\n", 1)[0].decode(errors="replace")] += 1
                slowest[0] = max(slowest[0], took)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    print("on", flush=True)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"status": dict(seen), "slowest_s": slowest[0]}


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # an unprivileged user may raise its own soft limit
    mode, address, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    slow_http = b"GET /metrics HTTP/1.1\r\n"
    out: object
    if mode == "slow-http":
        out = hold(address, seconds, n, slow_http, 0.5, b"X")
    elif mode == "idle":
        out = hold(address, seconds, n, b"", 0, b"")
    elif mode == "trickle":
        out = trickle(address, seconds, n)
    elif mode == "flood":
        out = flood(address, seconds, n)
    elif mode == "deep-json":
        out = repeat(address, seconds, b'{"cmd": ' + b"[" * 2000 + b"]" * 2000 + b"}\n")
    elif mode == "huge-json":
        out = repeat(address, seconds, b'{"cmd": "status", "x": "' + b"a" * (1 << 20) + b'"}\n')
    elif mode == "huge-http":
        out = repeat(address, seconds, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n")
    elif mode == "paths":
        out = {p.decode(): exchange(address, p)[0].split(b"\r\n", 1)[0].decode()
               for p in (b"GET /nope HTTP/1.1\r\n\r\n", b"GET /metrics/x HTTP/1.1\r\n\r\n",
                         b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n",
                         b"HEAD /metrics HTTP/1.1\r\n\r\n", b"nonsense\r\n\r\n")}
        out["repeat"] = repeat(address, seconds, b"GET /../etc/passwd HTTP/1.1\r\n\r\n")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
