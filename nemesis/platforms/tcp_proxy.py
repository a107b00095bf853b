"""A loopback TCP proxy that a test can cut: the network fault a single machine can inject.

Put one between two processes (one per directed link, so links are cut one way) and
switch its mode: FORWARD passes bytes both ways; DROP_REPLIES forwards what the
client sends but silently discards what the server answers (the request arrives and
takes effect, the caller never hears: the "commit, then the reply is lost" case);
CUT closes every connection and refuses new ones (a partition, seen by gRPC as
UNAVAILABLE). Threads, blocking sockets, bounded buffers (one recv at a time).

Late delivery (`hold()` / `release()`, TcpProxy): what the client sends is kept, in order,
instead of forwarded — on every connection, those opened meanwhile too — while the server
hears nothing and the client's writes succeed; `release()` writes each connection's kept
bytes to its server, then forwards as before. The receiver gets them whole and in order,
only late: a byte stream can be delayed, not reordered, but a sender that keeps writing
through a hold is heard, at the release, after everything its peers said meanwhile (the
nemesis's `hold` on local: a deposed leader's APPENDs arriving in a newer term). At most
MAX_HELD_BYTES are kept per connection; beyond that the proxy stops reading, and TCP's
flow control stalls the client.

Reordering (`set_reorder(p)`): a peer lane of the store is a sequence of self-contained
frames, so its frames can be written in another order and some twice
(nemesis/platforms/frame_reorder.py); any other stream passes untouched.

Packet loss (`set_loss(p)`): a byte stream cannot lose a packet without corrupting what
follows, and TCP never shows loss to the application anyway: it retransmits, and the
application sees the lost segment arrive one retransmission timeout late, with everything
behind it held up. So with probability p each chunk is held for Linux's minimum
retransmission timeout (200 ms) before it is forwarded — what loss looks like from above
TCP. Real packet drops are the Docker platform's (iptables `statistic`).

What it must never do: listen anywhere but loopback, or outlive `close()` (all sockets
closed, threads joined with a deadline). A connection's sockets are closed once both of
its directions have ended, so reconnections do not hold descriptors until `close()`.

`Forwarder` is the forwarding machinery; `TcpProxy` applies one mode to every connection,
`source_proxy.SourceAwareProxy` one mode per sending process.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Hashable
from enum import Enum
from typing import Self

from nemesis.platforms.frame_reorder import FrameReorderer

# Linux's TCP_RTO_MIN: the least a lost segment delays the stream behind it.
RETRANSMIT_DELAY_S = 0.2
MAX_HELD_BYTES = 64 * 1024 * 1024


class ProxyMode(Enum):
    FORWARD = "forward"
    DROP_REPLIES = "drop-replies"
    CUT = "cut"


# `_close_connections(ALL)`: every source's connections (None is a source: TcpProxy's one).
ALL = object()


def check_loss(probability: float) -> float:
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"loss probability must be in [0, 1), got {probability}")
    return probability


class _Pair:
    """One proxied connection: the accepted socket, the one to the target, whose it is."""

    __slots__ = ("client", "server", "source", "pumps", "held", "held_bytes", "holding",
                 "released", "detached", "watched", "reorderer")

    def __init__(self, client: socket.socket, server: socket.socket, source: Hashable,
                 holding: bool = False) -> None:
        self.client, self.server, self.source = client, server, source
        self.pumps = 2  # the pump that ends last closes both sockets
        # Client bytes kept while the proxy holds (`Forwarder.hold`); `released` is set
        # once they are written, and wakes a pump stalled at MAX_HELD_BYTES.
        self.holding = holding
        self.held: list[bytes] = []
        self.held_bytes = 0
        self.released = threading.Condition()
        # Overtaken (`Forwarder.overtake`): the client side closed, the server side kept
        # open for the held bytes, which the release writes and then closes it.
        self.detached = False
        self.watched = False  # accepted while a watcher was set: it sees every client byte
        self.reorderer: FrameReorderer | None = None  # frames late or twice (`set_reorder`)

    def shutdown(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shutdown()
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.close()


class Forwarder:
    """The listener, the accept loop and two pumps per connection. Subclasses say whose a
    connection is (`_source_of`, called outside the lock before anything is forwarded)
    and what applies to that source (`_mode_for`, `_loss_for`); `_close_connections`
    closes one source's connections or all. `TcpProxy` has a single source (None)."""

    def __init__(self, target: str, listen_port: int = 0, *, seed: int | None = None) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._holding = False
        self._reorder = 0.0
        self.frames_reordered = 0  # frames written behind later ones (`set_reorder`)
        self.frames_duplicated = 0
        # `watch`: called with (pair, chunk) for every chunk a client sends on a connection
        # accepted while it is set, in the pump's thread, before the chunk is forwarded or
        # kept (`pair.holding` says which, unless the watcher starts a hold).
        self._watcher: Callable[[_Pair, bytes], None] | None = None
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"proxy-{self.address}")
        self._acceptor.start()

    def _source_of(self, client: socket.socket, peer: tuple[str, int]) -> Hashable:
        return None

    def _mode_for(self, source: Hashable) -> ProxyMode:
        raise NotImplementedError

    def _loss_for(self, source: Hashable) -> float:
        raise NotImplementedError

    def _close_connections(self, source: Hashable = ALL) -> None:
        """Close the connections of `source` (every connection with ALL); hold the lock."""
        keep = []
        for pair in self._pairs:
            if source is ALL or pair.source == source:
                pair.close()
            else:
                keep.append(pair)
        self._pairs = keep

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            source = self._source_of(client, peer)
            with self._lock:
                if self._mode_for(source) is ProxyMode.CUT or self._closed.is_set():
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
                pair = _Pair(client, server, source, holding=self._holding)
                pair.watched = self._watcher is not None
                self._pairs.append(pair)
                # Forget finished pumps, so a long run's reconnections do not pile up.
                self._threads = [t for t in self._threads if t.is_alive()]
                for src, dst, is_reply in ((client, server, False), (server, client, True)):
                    t = threading.Thread(target=self._pump, args=(pair, src, dst, is_reply),
                                         daemon=True)
                    self._threads.append(t)
                    t.start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if is_reply and self._mode_for(pair.source) is ProxyMode.DROP_REPLIES:
                    continue
                if not is_reply:
                    self._see(pair, data)  # before: the watcher may start a hold for it
                    if self._keep(pair, data):
                        continue
                    if self._reorder or pair.reorderer is not None:
                        data = self._reordered(pair, data)
                        if not data:
                            continue
                loss = self._loss_for(pair.source)
                if loss and self._random.random() < loss:
                    time.sleep(RETRANSMIT_DELAY_S)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if pair.detached and not is_reply:
                pass  # the server side waits for the release (`overtake`)
            else:
                pair.shutdown()  # the other direction's recv returns, and that pump ends too
            with self._lock:
                pair.pumps -= 1
                if pair.pumps == 0:  # both directions done: nobody uses the sockets now
                    pair.close()
                    with contextlib.suppress(ValueError):
                        self._pairs.remove(pair)

    def _keep(self, pair: _Pair, data: bytes) -> bool:
        """While holding: keep `data` (True), stalling at MAX_HELD_BYTES until released."""
        if not pair.holding:
            # Every chunk of every run passes here: no lock unless a hold is on. A hold
            # that starts meanwhile keeps from the next chunk on; a release clears the
            # flag only once the kept bytes are written, so nothing passes them.
            return False
        with pair.released:
            while pair.holding and pair.held_bytes >= MAX_HELD_BYTES \
                    and not self._closed.is_set():
                pair.released.wait(0.2)
            if not pair.holding:
                return False
            pair.held.append(data)
            pair.held_bytes += len(data)
            return True

    def _reordered(self, pair: _Pair, data: bytes) -> bytes:
        """What to write now of `data` and the frames held back (the pump's thread)."""
        reorderer = pair.reorderer
        if reorderer is None:
            reorderer = pair.reorderer = FrameReorderer(self._random)
        late, twice = reorderer.reordered, reorderer.duplicated
        out = reorderer.feed(data, self._reorder)
        self.frames_reordered += reorderer.reordered - late  # one pump per pair: no race
        self.frames_duplicated += reorderer.duplicated - twice  # worth a lock on the count
        return out

    def set_reorder(self, probability: float) -> None:
        """Frames of a peer lane late (behind up to MAX_LATE_FRAMES later ones) with this
        probability, half of those also on time (twice); 0 = off, the late ones written
        with the next bytes (nemesis/platforms/frame_reorder.py)."""
        self._reorder = check_loss(probability)

    def _see(self, pair: _Pair, data: bytes) -> None:
        watcher = self._watcher
        if watcher is not None and pair.watched:
            watcher(pair, data)

    def watch(self, watcher: Callable[[_Pair, bytes], None] | None) -> None:
        """Set (None: clear) the watcher of the connections accepted from now on."""
        self._watcher = watcher

    def reset(self) -> None:
        """Close every connection (a blip: both ends reconnect and go on)."""
        with self._lock:
            self._close_connections()

    def hold(self) -> None:
        """Keep what clients send, on every connection and those opened until `release`."""
        with self._lock:
            self._holding = True
            for pair in self._pairs:
                with pair.released:
                    pair.holding = True

    def overtake(self) -> int:
        """Let what clients send next overtake what is held: every held connection's client
        side is closed (the sender sees it drop, reconnects and sends anew through a
        connection that forwards), its server side kept open for `release`, which writes
        the held bytes there after the newer ones arrived. Returns the connections cut."""
        with self._lock:
            self._holding = False
            pairs = [p for p in self._pairs if p.holding and not p.detached]
            for pair in pairs:
                pair.detached = True
                with contextlib.suppress(OSError):
                    pair.client.shutdown(socket.SHUT_RDWR)
        return len(pairs)

    def release(self) -> int:
        """Write every connection's kept bytes to its server, oldest connection first, and
        forward as before (an overtaken connection is then closed). Returns how many
        bytes were kept."""
        with self._lock:
            self._holding = False
            pairs = list(self._pairs)
        total = 0
        for pair in pairs:
            with pair.released:
                data = b"".join(pair.held)
                if data:
                    total += len(data)
                    with contextlib.suppress(OSError):  # the receiver went away meanwhile
                        pair.server.sendall(data)
                self._unhold(pair)
            if pair.detached:
                # End of stream after the held bytes (not a reset, which could discard
                # them at the receiver); the receiver closes, the reply pump ends, and
                # the pair is forgotten.
                with contextlib.suppress(OSError):
                    pair.server.shutdown(socket.SHUT_WR)
        return total

    def discard(self) -> int:
        """Drop every kept byte and close those connections: what a crashed sender had on
        the wire is lost. Returns how many bytes were dropped."""
        with self._lock:
            self._holding = False
            pairs = list(self._pairs)
        dropped = 0
        for pair in pairs:
            with pair.released:
                if not (pair.holding or pair.held_bytes):
                    continue
                dropped += pair.held_bytes
                self._unhold(pair)
            pair.shutdown()
        return dropped

    @staticmethod
    def _unhold(pair: _Pair) -> None:
        """Forget what `pair` kept and forward from now on (hold `pair.released`)."""
        pair.held, pair.held_bytes, pair.holding = [], 0, False
        pair.released.notify_all()

    def held_bytes(self) -> int:
        with self._lock:
            return sum(p.held_bytes for p in self._pairs)

    @property
    def holding(self) -> bool:
        return self._holding

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            self._close_connections()
        self._acceptor.join(timeout=2)
        for t in list(self._threads):
            t.join(timeout=2)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpProxy(Forwarder):
    """Listens on 127.0.0.1:<port> and forwards each connection to `target` (host:port)."""

    def __init__(self, target: str, listen_port: int = 0, *, seed: int | None = None) -> None:
        self._mode = ProxyMode.FORWARD
        self._loss = 0.0
        super().__init__(target, listen_port, seed=seed)

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
        self._loss = check_loss(probability)

    def _mode_for(self, source: Hashable) -> ProxyMode:
        return self._mode

    def _loss_for(self, source: Hashable) -> float:
        return self._loss
