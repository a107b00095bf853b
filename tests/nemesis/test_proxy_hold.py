"""TcpProxy.hold/release (the local platform's `hold` fault): what a client sends is kept,
in order, on every connection — those opened during the hold too — and written to the
server at the release, late but whole; the client never notices."""

from __future__ import annotations

import socket
import threading
import time

from nemesis.platforms.tcp_proxy import TcpProxy
from tests.nemesis.waiting import wait_until


class _Sink:
    """A server that records, per connection, every byte it receives."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received: list[bytearray] = []
        self.arrivals: list[bytes] = []  # every chunk, in the order it came, all connections
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            buffer = bytearray()
            with self._lock:
                self.received.append(buffer)
            threading.Thread(target=self._read, args=(conn, buffer), daemon=True).start()

    def _read(self, conn: socket.socket, buffer: bytearray) -> None:
        with conn:
            while data := conn.recv(65536):
                with self._lock:
                    buffer.extend(data)
                    self.arrivals.append(data)

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return [bytes(b) for b in self.received]


def _dial(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_held_bytes_arrive_late_whole_and_in_order_on_every_connection() -> None:
    sink = _Sink()
    with TcpProxy(sink.address) as proxy:
        first = _dial(proxy.address)
        first.sendall(b"before;")
        wait_until(lambda: sink.snapshot() == [b"before;"], 10, "the forwarded bytes")
        proxy.hold()
        first.sendall(b"held-1;")
        second = _dial(proxy.address)  # opened during the hold: held too
        second.sendall(b"held-2;")
        first.sendall(b"held-3;")
        wait_until(lambda: len(sink.snapshot()) == 2, 10, "the second connection")
        time.sleep(0.2)  # a chance for a leak to show; the assertion below is the test
        assert sink.snapshot() == [b"before;", b""], "bytes passed during the hold"
        assert proxy.release() == len(b"held-1;held-3;held-2;")
        first.sendall(b"after;")
        wait_until(lambda: sink.snapshot() == [b"before;held-1;held-3;after;", b"held-2;"], 10,
                   "the held bytes, then the new ones, in order")
        first.close()
        second.close()
    sink.listener.close()


def test_overtaken_bytes_arrive_after_those_of_the_senders_new_connection() -> None:
    sink = _Sink()
    with TcpProxy(sink.address) as proxy:
        old = _dial(proxy.address)
        old.sendall(b"a;")
        wait_until(lambda: sink.snapshot() == [b"a;"], 10, "the forwarded bytes")
        proxy.hold()
        old.sendall(b"older;")
        wait_until(lambda: proxy.held_bytes() == len(b"older;"), 10, "the held bytes")
        assert proxy.overtake() == 1
        assert old.recv(1) == b""  # the sender sees its connection end
        new = _dial(proxy.address)  # and sends anew: forwarded at once
        new.sendall(b"newer;")
        wait_until(lambda: sink.snapshot() == [b"a;", b"newer;"], 10, "the newer bytes first")
        assert proxy.release() == len(b"older;")
        # The held bytes reach the receiver on their own (old) connection, after the newer.
        wait_until(lambda: sink.snapshot() == [b"a;older;", b"newer;"], 10, "the older bytes")
        assert sink.arrivals.index(b"older;") > sink.arrivals.index(b"newer;")
        old.close()
        new.close()
    sink.listener.close()


def test_a_watcher_sees_every_chunk_of_the_connections_opened_while_it_is_set() -> None:
    sink = _Sink()
    seen: list[tuple[bytes, bool]] = []
    with TcpProxy(sink.address) as proxy:
        before = _dial(proxy.address)
        before.sendall(b"unwatched;")
        wait_until(lambda: sink.snapshot() == [b"unwatched;"], 10, "the first bytes")
        proxy.watch(lambda pair, data: seen.append((data, pair.holding)))
        proxy.reset()  # both ends reconnect: the new connection is read from its first byte
        watched = _dial(proxy.address)
        watched.sendall(b"one;")
        wait_until(lambda: seen == [(b"one;", False)], 10, "the watched chunk")
        proxy.hold()
        watched.sendall(b"two;")
        wait_until(lambda: seen[-1:] == [(b"two;", True)], 10, "a held chunk, seen as held")
        assert proxy.discard() == len(b"two;")  # lost with the connection, never delivered
        wait_until(lambda: len(sink.snapshot()) == 2, 10, "the watched connection")
        assert sink.snapshot()[1] == b"one;"
        proxy.watch(None)
        before.close()
        watched.close()
    sink.listener.close()


def test_peer_frames_reads_the_store_lanes_messages_and_stops_at_garbage() -> None:
    from nemesis.platforms.peer_frames import APPEND, PeerFrames
    from system.kv.peer_tcp import MAGIC
    from system.kv.transport import encode_batch
    from system.raft.messages import Entry, Message, MessageType

    batch = encode_batch("n1", [Message(MessageType.APPEND, "n1", "n2", 3, log_term=3, index=9,
                                        entries=(Entry(term=3, index=10, data=b"x"),))])
    wire = MAGIC + len(batch).to_bytes(4, "big") + batch
    frames = PeerFrames()
    got = [m for i in range(len(wire)) for m in frames.feed(wire[i:i + 1])]  # byte by byte
    assert [(m.type, m.index, [e.index for e in m.entries]) for m in got] == [(APPEND, 9, [10])]
    other = PeerFrames()
    assert other.feed(b"GET / HTTP/1.1\r\n") == [] and other.broken
