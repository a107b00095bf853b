"""A loopback TCP proxy that a test can cut: the network fault a single machine can inject.

Put one between two processes (one per directed link, so links are cut one way) and
switch its mode: FORWARD passes bytes both ways; DROP_REPLIES forwards what the
client sends but silently discards what the server answers (the request arrives and
takes effect, the caller never hears: the "commit, then the reply is lost" case);
CUT closes every connection and refuses new ones (a partition, seen by gRPC as
UNAVAILABLE). Threads, blocking sockets, bounded buffers (one recv at a time).

Packet loss (`set_loss(p)`): a byte stream cannot lose a packet without corrupting what
follows, and TCP never shows loss to the application anyway: it retransmits, and the
application sees the lost segment arrive one retransmission timeout late, with everything
behind it held up. So with probability p each chunk is held for Linux's minimum
retransmission timeout (200 ms) before it is forwarded — what loss looks like from above
TCP. Real packet drops are the Docker platform's (iptables `statistic`).

What it must never do: listen anywhere but loopback, or outlive `close()` (all sockets
closed, threads joined with a deadline).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from enum import Enum

# Linux's TCP_RTO_MIN: the least a lost segment delays the stream behind it.
RETRANSMIT_DELAY_S = 0.2


class ProxyMode(Enum):
    FORWARD = "forward"
    DROP_REPLIES = "drop-replies"
    CUT = "cut"


class TcpProxy:
    """Listens on 127.0.0.1:<port> and forwards each connection to `target` (host:port)."""

    def __init__(self, target: str, listen_port: int = 0, *, seed: int | None = None) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._mode = ProxyMode.FORWARD
        self._loss = 0.0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"proxy-{self.address}")
        self._acceptor.start()

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    def set_mode(self, mode: ProxyMode) -> None:
        with self._lock:
            self._mode = mode
            if mode is ProxyMode.CUT:
                self._close_connections()

    @property
    def loss(self) -> float:
        return self._loss

    def set_loss(self, probability: float) -> None:
        """Hold each chunk, with this probability, for one retransmission timeout (0 = off)."""
        if not 0.0 <= probability < 1.0:
            raise ValueError(f"loss probability must be in [0, 1), got {probability}")
        self._loss = probability

    def _close_connections(self) -> None:
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        self._connections.clear()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._mode is ProxyMode.CUT or self._closed.is_set():
                    client.close()
                    continue
                try:
                    server = socket.create_connection(self.target, timeout=2)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._connections += [client, server]
                for src, dst, is_reply in ((client, server, False), (server, client, True)):
                    t = threading.Thread(target=self._pump, args=(src, dst, is_reply), daemon=True)
                    self._threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if is_reply and self._mode is ProxyMode.DROP_REPLIES:
                    continue
                if self._loss and self._random.random() < self._loss:
                    time.sleep(RETRANSMIT_DELAY_S)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            self._close_connections()
        self._acceptor.join(timeout=2)
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
