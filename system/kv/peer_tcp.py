"""Peer transport over plain TCP: Raft message batches as length-prefixed frames.

What it does: the same batches as the gRPC lanes (`transport.encode_batch`, a protobuf
`MessageBatch`), each sent as a 4-byte big-endian length and the batch, on one TCP
connection per lane and peer, written straight from the event loop. A node listens for
them on its peer address (`serve --peer-listen`, as etcd has a client URL and a peer URL).

Why: a gRPC stream message costs a Python process a round trip through gRPC's own
threads (its event engine, the completion-queue poller that wakes the loop), about 0.1 ms
of CPU each way and 0.2-0.35 ms of latency a hop between members; a write at one client
crosses two such hops, and its follower's answer is what commits it (docs/benchmarks.md).

What it must never do: block the loop, retry a message (Raft retransmits: a batch lost
with a connection is simply dropped, as on the gRPC lanes), accept a frame from a peer it
does not know, or let a stranger's bytes crash the node: a frame that is too large or
not a MessageBatch closes that connection with a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from system.kv.proto import raft_pb2
from system.kv.transport import MAX_GRPC_MESSAGE_BYTES, PeerSender, encode_batch, messages_for
from system.raft.messages import Message

log = logging.getLogger("kv.peer_tcp")

MAGIC = b"MAOR"  # first bytes of every connection: refuses a gRPC client (or anything else)
MAX_FRAME_BYTES = MAX_GRPC_MESSAGE_BYTES
_CONNECT_TIMEOUT_S = 1.0
# Unacknowledged bytes older than this end the connection (TCP_USER_TIMEOUT): a peer cut
# off by a partition that drops packets is noticed, and the next batch opens a new
# connection, instead of TCP's retransmissions backing off for minutes.
_USER_TIMEOUT_MS = 2000
# Pause sending while this much is queued in the kernel and the transport's buffer.
_HIGH_WATER_BYTES = 8 * 1024 * 1024


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class _SenderProtocol(asyncio.Protocol):
    """The sending end: never reads anything of use; tells the sender when it may write."""

    def __init__(self) -> None:
        self._may_write = asyncio.Event()
        self._may_write.set()
        self.closed = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._may_write.set()

    def pause_writing(self) -> None:
        self._may_write.clear()

    def resume_writing(self) -> None:
        self._may_write.set()

    def data_received(self, data: bytes) -> None:
        pass  # the receiver never answers on this connection

    @property
    def may_write(self) -> bool:
        return self._may_write.is_set() and not self.closed

    async def writable(self) -> None:
        await self._may_write.wait()


class TcpPeerSender(PeerSender):
    """PeerSender's bounded queue and coalescing, written to a TCP connection.

    A connected lane that is not held back by flow control writes a Ready's messages in
    `flush`, on the caller's stack: no task wake-up between the drive loop and the socket
    (one loop iteration, 50-80 us a hop on a busy machine). Its task connects, waits out
    flow control and backs off after failures.
    """

    _transport: asyncio.Transport | None = None
    _protocol: _SenderProtocol | None = None
    _busy = False  # the task is connecting or waiting to write: flush leaves it the queue

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"send-tcp-{self.peer_id}-{self.lane}")

    def _queued(self) -> None:
        pass  # flush() decides: write now, or wake the task

    def _ready_to_write(self) -> bool:
        return (not self._busy and self._transport is not None
                and self._protocol is not None and self._protocol.may_write)

    def flush(self) -> None:
        if not self._queue or self._closed:
            return
        if self._ready_to_write():
            self._write_queued()
        if self._queue and self._wakeup is not None:
            self._wakeup.set()

    def _write_queued(self) -> None:
        """Write every queued message, a batch (bounded by max_batch_bytes) per frame,
        until flow control says stop."""
        assert self._transport is not None and self._protocol is not None
        while self._queue and self._protocol.may_write:
            batch = self._take_batch()
            if self.trace is not None:
                self.trace.hops_sent(batch)
            self._transport.write(_frame(encode_batch(self.src, batch)))
            for message in batch:
                self._forget(message)

    async def _connect(self) -> None:
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        transport, protocol = await asyncio.wait_for(
            loop.create_connection(_SenderProtocol, host.strip("[]"), int(port)),
            _CONNECT_TIMEOUT_S)
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)
        transport.set_write_buffer_limits(high=_HIGH_WATER_BYTES)
        transport.write(MAGIC)
        self._transport, self._protocol = transport, protocol

    def _drop_connection(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._transport = self._protocol = None

    async def _run(self) -> None:
        assert self._wakeup is not None
        backoff_s = 0.02
        while not self._closed:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._busy = True
            try:
                if self._protocol is None or self._protocol.closed:
                    self._drop_connection()
                    await self._connect()
                assert self._protocol is not None
                await self._protocol.writable()
                if self._protocol.closed:
                    raise ConnectionError("the connection closed")
                self._write_queued()
            except asyncio.CancelledError:
                self._drop_connection()
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: new connection after backoff
                self._drop_connection()
                self._failed(transport="tcp", details=repr(exc)[:300])
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 0.5)
                continue
            finally:
                self._busy = False
            self._reached()
            backoff_s = 0.02
        self._drop_connection()

    async def _close_connection(self) -> None:
        self._drop_connection()


class _ReceiverProtocol(asyncio.Protocol):
    """One incoming peer connection: MAGIC, then frames; each batch goes to `deliver`."""

    def __init__(self, node_id: str, is_known: Callable[[str], bool],
                 deliver: Callable[[list[Message]], None],
                 connections: set[asyncio.Transport]) -> None:
        self._connections = connections
        self._node_id = node_id
        self._is_known = is_known
        self._deliver = deliver
        self._buffer = bytearray()
        self._start = 0  # parsed up to here; compacted when it passes half the buffer
        self._greeted = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._connections.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self._transport)

    def _refuse(self, why: str) -> None:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        log.warning("peer connection refused", extra={"from": str(peer), "reason": why})
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self._greeted:
            if len(buffer) < len(MAGIC):
                return
            if buffer[:len(MAGIC)] != MAGIC:
                self._refuse("not a peer connection (wrong first bytes): is a client "
                             "pointed at the peer port?")
                return
            del buffer[:len(MAGIC)]
            self._greeted = True
        start = self._start
        while len(buffer) - start >= 4:
            size = int.from_bytes(buffer[start:start + 4], "big")
            if size > MAX_FRAME_BYTES:
                self._refuse(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
                return
            end = start + 4 + size
            if len(buffer) < end:
                break
            frame = bytes(memoryview(buffer)[start + 4:end])
            start = end
            if not self._receive(frame):
                return
        if start and start * 2 >= len(buffer):
            del buffer[:start]
            start = 0
        self._start = start

    def _receive(self, frame: bytes) -> bool:
        try:
            batch = raft_pb2.MessageBatch.FromString(frame)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
            self._refuse("a frame is not a MessageBatch")
            return False
        if not self._is_known(batch.src):
            self._refuse(f"node {self._node_id} does not know peer {batch.src!r}; check --peers")
            return False
        messages = messages_for(self._node_id, batch)
        if messages:
            self._deliver(messages)
        return True


class PeerListener:
    """The listening socket and every connection it accepted."""

    def __init__(self, server: asyncio.Server, connections: set[asyncio.Transport]) -> None:
        self.server = server
        self.connections = connections

    def close(self) -> None:
        self.server.close()
        for transport in list(self.connections):
            transport.abort()


async def serve_peers(address: str, node_id: str, is_known: Callable[[str], bool],
                      deliver: Callable[[list[Message]], None],
                      tls: object = None) -> PeerListener:  # t24-node only: see transport.py
    """Listen for peer connections on `address` (host:port); OSError says why not."""
    host, _, port = address.rpartition(":")
    loop = asyncio.get_running_loop()
    connections: set[asyncio.Transport] = set()
    try:
        server = await loop.create_server(
            lambda: _ReceiverProtocol(node_id, is_known, deliver, connections),
            host.strip("[]") or None, int(port), reuse_address=True)
    except OSError as exc:
        raise OSError(f"cannot listen for peers on {address}: {exc.strerror or exc}; "
                      "choose a free port for --peer-listen") from None
    return PeerListener(server, connections)
