"""How a standby learns at once that the lease holder's process is gone, not just silent.

The holder listens on a second TCP port (its `watch` address, in the lease record) that
accepts connections and never reads or writes. A standby keeps one connection open to it.
When the holder's process ends — SIGKILL, a crash, any exit — the kernel closes its
sockets, and the standby's connection reads end-of-file (or a reset) at once. A paused
process (SIGSTOP, a long GC) keeps its sockets open, so a pause never looks like a death;
nor does a slow or partitioned network (a dropped packet closes nothing). A connection
*refused* by the watch address (nothing listens there any more) means the same as a close.

What the standby does with it (coordinator.py): it takes the lease without waiting for
it to lapse, by the same compare-and-swap on the version it has just read. The holder
is gone, so no coordinator still believes it leads; and should the signal ever be wrong
(a holder alive whose watch connection was reset), the takeover stays safe by the
fences — the CAS on the lease version (the old holder's next renewal fails and it steps
down) and the head rewrite (its next checkpoint CAS fails) — and costs only that holder's
lead, as a lapse would.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time


class WatchListener:
    """Holder side: accept and hold connections until the process ends."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host.strip("[]"), 0))
        self._sock.listen(16)
        port = self._sock.getsockname()[1]
        self.address = f"{host}:{port}"
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="watch-listener", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            # Forget the connections of standbys that have gone (their end closed: a
            # watcher never writes, so readable means closed). A live one is never
            # closed here: that would look like this holder's death to its standby.
            self._held = [held for held in self._held if not _peer_closed(held)]
            self._held.append(conn)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for conn in self._held:
            conn.close()


def _peer_closed(conn: socket.socket) -> bool:
    try:
        closed = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        closed = True
    if closed:
        conn.close()
    return closed


class HolderWatch:
    """Standby side: one connection to the current holder's watch address."""

    def __init__(self, connect_timeout_s: float = 0.5) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.key: tuple[str, int] | None = None  # (holder id, term) watched
        self._sock: socket.socket | None = None
        self._gone = False

    def follow(self, holder: str, term: int, address: str) -> None:
        """Watch this holder (a no-op if it is already the one watched)."""
        if (holder, term) == self.key:
            return
        self.drop()
        self.key = (holder, term)
        if not address:
            return  # a holder without a watch address: only the lease's lapse tells
        host, _, port = address.rpartition(":")
        try:
            self._sock = socket.create_connection((host.strip("[]"), int(port)),
                                                  timeout=self.connect_timeout_s)
        except ConnectionRefusedError:
            self._gone = True  # nothing listens there: the holder's process has ended
        except (OSError, ValueError):
            self._sock = None  # unreachable or unknown: no early signal, the lapse decides

    def gone(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`; True once the watched holder's process has ended."""
        if self._gone:
            return True
        if self._sock is None:
            time.sleep(max(timeout_s, 0.0))  # the standby's polling period
            return False
        readable, _, _ = select.select([self._sock], [], [], max(timeout_s, 0.0))
        if not readable:
            return False
        try:
            self._sock.setblocking(False)
            data = self._sock.recv(1)
        except BlockingIOError:
            return False
        except OSError:  # reset: the peer's kernel closed it
            data = b""
        if data:  # the holder never writes; something else answers there: stop trusting it
            self.drop()
            return False
        self._gone = True
        return True

    def drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self.key, self._gone = None, None, False
