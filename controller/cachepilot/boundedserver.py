"""A bounded stream server: one thread runs a ``selectors`` loop over non-blocking sockets, so a local user who
opens many connections, sends a byte at a time or never reads the answer can neither stall it nor make it spawn
threads. The metrics endpoint and the control socket both run on it; what they say is their :class:`Dialogue`.

The bounds, each a constructor argument:
- at most ``max_conns`` connections: new ones close the oldest still waiting for a request (a flood churns its own
  connections; a client that sends its request as it connects is answered in the pass that accepts it, and each
  connection is read once more just before the cap would close it);
- the whole request within ``request_deadline_s`` of the connect — one deadline per request, not per ``recv``, so
  trickling does not extend it — and at most ``max_request`` bytes of it;
- the answer taken by the client within ``reply_deadline_s``.
The kernel's queue of connects not yet taken is long (``BACKLOG``): when it is full, a TCP client's SYN is dropped
(it retries a second later) and a unix socket client with a time-out is refused at once (EAGAIN). The server takes
the whole queue every pass, so a flood of connects makes a newcomer wait for accepts, not for answers.
What misbehaving clients get is counted and logged as one line a minute at most, never a traceback.
An answer that must wait for someone else (the control socket's ``reload`` waits for the daemon's loop) is a
:class:`Later`: worked out on a thread of its own (at most ``MAX_LATER`` at a time) and sent when ready, so the
server goes on answering everyone else meanwhile (``status`` waited up to 30 s behind a reload).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
BACKLOG = 1024
SWEEP_S = 0.1  # how often deadlines are checked (their precision)
ACCEPT_BATCH = 4096  # connects taken per pass (a listener's backlog is at most somaxconn, 4096)
MAX_LATER = 4  # answers being worked out on their own threads at once


@dataclass(frozen=True)
class Later:
    """An answer worked out off the server's thread: ``work`` (bounded in time by its own means) returns it."""

    work: Callable[[], bytes]


class Dialogue:
    """What a server answers. ``reply`` gets all bytes received so far (``eof`` once the client shut its side):
    the answer to send (``b""``: close without one), or None while the request is incomplete."""

    def admit(self, conn: socket.socket) -> bytes | None:
        """None to go on with this client; else the refusal to send before closing."""
        return None

    def reply(self, data: bytes, eof: bool) -> bytes | Later | None:
        raise NotImplementedError

    def busy(self) -> bytes:
        """What a request whose answer is a :class:`Later` gets while ``MAX_LATER`` others are being worked out."""
        return b""

    def too_big(self) -> bytes:
        return b""

    def too_slow(self) -> bytes:
        return b""


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None  # set once answering: the rest of the answer to send
    watched: bool = False  # registered with the selector
    admitted: bool = False  # the dialogue's admit() said yes
    later: bool = False  # its answer is being worked out on another thread (no deadline, not evicted)


class BoundedServer:
    def __init__(self, listener: socket.socket, dialogue: Dialogue, *, name: str, max_conns: int,
                 request_deadline_s: float, reply_deadline_s: float, max_request: int) -> None:
        self.name = name
        self.dialogue = dialogue
        self.max_conns = max_conns
        self.request_deadline_s = request_deadline_s
        self.reply_deadline_s = reply_deadline_s
        self.max_request = max_request
        self.served = 0
        self.closed: Counter[str] = Counter()  # why connections were closed unanswered (over the cap, too slow, ...)
        self._unreported: Counter[str] = Counter()
        self._last_report = -LOG_EVERY_S
        self._listener = listener
        listener.listen(BACKLOG)
        listener.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}  # in accept order: the first is the oldest
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stop = False
        self._paused = False  # the listener is not watched until the next sweep (accept failed)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._done: deque[tuple[_Conn, bytes]] = deque()  # answers made by Later threads, for the loop to send
        self._later = 0  # Later threads running (touched by the loop thread only)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the loop (within milliseconds), close every connection and the listener."""
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for c in list(self._conns.values()):
            self._drop(c)
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP_S
        while not self._stop:
            try:
                for key, mask in self._sel.select(timeout=self._sleep_s()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._finish_later()
                    elif isinstance(key.data, _Conn):
                        self._ready(key.data, mask)
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + SWEEP_S
            except Exception as exc:  # noqa: BLE001 - e.g. out of fds or memory: the server outlives it
                self._count(f"server error ({type(exc).__name__})")
                time.sleep(SWEEP_S)  # no busy loop if it recurs

    def _sleep_s(self) -> float | None:
        """How long the loop may wait for a socket: the sweep's period while a sweep has work (a connection's
        deadline, a paused listener), until the next report when only that waits, else until a connect or close()
        wakes it. An idle server that woke every SWEEP_S cost the daemon ten thread wakeups a second, ~4% of its
        CPU on the lab's TCG guest (issue 23 item 5)."""
        if self._conns or self._paused:
            return SWEEP_S
        if self._unreported:
            return max(SWEEP_S, self._last_report + LOG_EVERY_S - time.monotonic())
        return None

    def _sweep(self, now: float) -> None:
        if self._paused:
            self._sel.register(self._listener, selectors.EVENT_READ)
            self._paused = False
        self._expire(now)
        self._report(now)

    def _accept(self) -> None:
        """Take the whole backlog (up to ACCEPT_BATCH) at once: a newcomer whose request is there is answered at
        once, instead of waiting behind every connect queued before it; then the oldest connections still waiting
        for a request go, down to the cap. Only the survivors are watched by the selector: a connection dropped in
        the pass that took it cost an accept, a recv and a close (every recv and send says MSG_DONTWAIT: no
        fcntl per connection)."""
        fresh = []
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # e.g. EMFILE: the backlog waits for the next sweep, no busy loop meanwhile
                self._count(f"accept failed ({exc.strerror})")
                self._sel.unregister(self._listener)
                self._paused = True
                break
            conn = _Conn(sock, time.monotonic() + self.request_deadline_s)
            self._conns[sock] = conn
            self._read(conn)
            fresh.append(conn)
        self._evict()
        for conn in fresh:
            if conn.outbox is None and conn.sock in self._conns:
                self._watch(conn, selectors.EVENT_READ)

    def _evict(self) -> None:
        """Down to the cap: the oldest connections still without a whole request go first, each read once more
        before it goes (a client's request can land between its accept and now: it is answered, not dropped); then,
        if still over, the oldest clients slow to read their answer."""
        for conn in [c for c in self._conns.values() if c.outbox is None and not c.later]:  # oldest first
            if len(self._conns) <= self.max_conns:
                return
            self._read(conn)
            if conn.sock in self._conns and conn.outbox is None:
                self._drop(conn, "over the connection cap")
        excess = max(0, len(self._conns) - self.max_conns)
        for conn in [c for c in self._conns.values() if c.outbox is not None][:excess]:
            self._drop(conn, "over the connection cap")

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.watched:
            self._sel.modify(conn.sock, events, conn)
        else:
            self._sel.register(conn.sock, events, conn)
            conn.watched = True

    def _ready(self, conn: _Conn, mask: int) -> None:
        if conn.sock not in self._conns:
            return  # dropped earlier in this pass
        if conn.outbox is not None:
            self._write(conn)
        elif mask & selectors.EVENT_READ:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(self.max_request + 1 - len(conn.inbox), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, "reset by the client")
            return
        if chunk and not conn.admitted:  # checked before anything is answered; an idle connection costs none
            conn.admitted = True
            refusal = self._guarded(self.dialogue.admit, conn.sock)
            if isinstance(refusal, bytes):
                self._answer(conn, refusal)
                return
        conn.inbox += chunk
        answer = self._guarded(self.dialogue.reply, bytes(conn.inbox), not chunk)
        if answer is None and len(conn.inbox) > self.max_request:
            self._count("request too big")
            answer = self.dialogue.too_big()
        if answer is None and not chunk:
            answer = b""  # closed before a whole request: nothing to answer
        if isinstance(answer, Later):
            self._start_later(conn, answer)
        elif answer is not None:
            self._answer(conn, answer)

    def _start_later(self, conn: _Conn, later: Later) -> None:
        if self._later >= MAX_LATER:
            self._count("busy")
            self._answer(conn, self.dialogue.busy())
            return
        self._later += 1
        conn.later = True
        if conn.watched:  # nothing more is read from it; its answer comes from the thread
            self._sel.unregister(conn.sock)
            conn.watched = False

        def run() -> None:
            answer = self._guarded(later.work)
            self._done.append((conn, answer if isinstance(answer, bytes) else b""))  # deque.append is atomic: no lock
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass  # closed: the server is stopping

        threading.Thread(target=run, name=f"{self.name}-later", daemon=True).start()

    def _finish_later(self) -> None:
        try:
            while self._wake_r.recv(4096, socket.MSG_DONTWAIT):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._done:
            conn, answer = self._done.popleft()
            self._later -= 1
            conn.later = False
            if conn.sock in self._conns:
                self._answer(conn, answer)

    def _guarded(self, call: Callable[..., bytes | Later | None], *args: object) -> bytes | Later | None:
        """The dialogue's answer; a bug in it closes this connection (counted by the exception's type), never the
        server."""
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - one client's answer must not end the loop for everyone
            self._count(f"internal error ({type(exc).__name__})")
            return b""

    def _answer(self, conn: _Conn, answer: bytes) -> None:
        self.served += bool(answer)
        conn.outbox = memoryview(answer)
        conn.deadline = time.monotonic() + self.reply_deadline_s
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.outbox is not None
        try:
            while conn.outbox:
                conn.outbox = conn.outbox[conn.sock.send(conn.outbox, socket.MSG_DONTWAIT):]
        except (BlockingIOError, InterruptedError):
            self._watch(conn, selectors.EVENT_WRITE)  # the rest when the client reads
            return
        except OSError:
            pass  # the client went away; nothing more to send
        self._drop(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now and not c.later]:
            if conn.outbox is not None:
                self._drop(conn, "answer not read in time")
                continue
            try:  # one try to say why, never waiting for the client
                conn.sock.send(self.dialogue.too_slow(), socket.MSG_DONTWAIT)
            except OSError:
                pass
            self._drop(conn, "request not complete in time")

    def _drop(self, conn: _Conn, why: str = "") -> None:
        if why:
            self._count(why)
        self._conns.pop(conn.sock, None)
        if conn.watched:
            self._sel.unregister(conn.sock)
            conn.watched = False
        conn.sock.close()

    # ------------------------------------------------------------------ the log: one line a minute at most
    def _count(self, why: str) -> None:
        self.closed[why] += 1
        self._unreported[why] += 1

    def _report(self, now: float) -> None:
        if not self._unreported or now - self._last_report < LOG_EVERY_S:
            return
        what = ", ".join(f"{n} {why}" for why, n in sorted(self._unreported.items(), key=lambda i: -i[1]))
        log.warning("%s: connections closed unanswered: %s", self.name, what)
        self._unreported.clear()
        self._last_report = now
