"""Peer transport of a KV node: Raft messages to and from the other nodes over gRPC.

What it does: converts `system.raft.messages.Message` to and from the protobuf records of
`proto/raft.proto`, and keeps one sender per peer that batches everything queued for that
peer into a single `RaftPeer.Send` call, with at most one call in flight per peer (so
messages to one peer leave in the order the core produced them).

What it must never do: block the node's event loop, grow without bound, or retry a
message on its own. Raft tolerates lost, duplicated and reordered messages and
retransmits what matters (Raft §5.3), so a failed batch is dropped and the sender backs
off; each per-peer queue is bounded in messages and bytes and sheds its OLDEST messages
when full (newer messages carry newer terms and indexes). It never decides anything about
Raft itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping

import grpc

from system.kv.proto import raft_pb2, raft_pb2_grpc
from system.raft.messages import Message, MessageType
from system.raft.types import Entry, EntryKind, NodeId, SnapshotMeta

log = logging.getLogger("kv.transport")

# gRPC's default limit is 4 MiB; a 64 MiB value must fit in one APPEND with room to spare.
MAX_GRPC_MESSAGE_BYTES = 256 * 1024 * 1024

# Reconnect quickly to a restarted peer: gRPC's default reconnect backoff grows to 120 s,
# which would keep a rejoining follower out of the cluster for minutes.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)

_TYPE_TO_PROTO = {t: raft_pb2.MessageType.Value(t.name) for t in MessageType}
_TYPE_FROM_PROTO = {v: k for k, v in _TYPE_TO_PROTO.items()}
_KIND_TO_PROTO = {
    EntryKind.NORMAL: raft_pb2.ENTRY_KIND_NORMAL,
    EntryKind.NOOP: raft_pb2.ENTRY_KIND_NOOP,
}
_KIND_FROM_PROTO = {v: k for k, v in _KIND_TO_PROTO.items()}

# Fixed per-message overhead assumed when bounding queues by size (headers, ids, terms).
_MESSAGE_OVERHEAD_BYTES = 64


class BadPeerMessage(ValueError):
    """A peer sent a record that does not describe a valid Raft message."""


def message_to_proto(message: Message) -> raft_pb2.RaftMessage:
    """The protobuf record carrying `message`, field for field."""
    pb = raft_pb2.RaftMessage(
        type=_TYPE_TO_PROTO[message.type],
        src=message.src,
        dst=message.dst,
        term=message.term,
        log_term=message.log_term,
        index=message.index,
        commit=message.commit,
        reject=message.reject,
        reject_hint=message.reject_hint,
        reject_term=message.reject_term,
        context=message.context,
        offset=message.offset,
        data=message.data,
        done=message.done,
    )
    if message.entries:
        pb.entries.extend(
            raft_pb2.Entry(term=e.term, index=e.index, data=e.data, kind=_KIND_TO_PROTO[e.kind])
            for e in message.entries
        )
    if message.snapshot is not None:
        snap = message.snapshot
        pb.snapshot.CopyFrom(
            raft_pb2.SnapshotMeta(index=snap.index, term=snap.term, voters=list(snap.voters))
        )
    return pb


def message_from_proto(pb: raft_pb2.RaftMessage) -> Message:
    """The Message a peer sent; raises BadPeerMessage for a record no valid peer sends."""
    message_type = _TYPE_FROM_PROTO.get(pb.type)
    if message_type is None:
        raise BadPeerMessage(f"unknown message type {pb.type} from {pb.src!r}")
    entries = []
    for e in pb.entries:
        kind = _KIND_FROM_PROTO.get(e.kind)
        if kind is None:
            raise BadPeerMessage(f"unknown entry kind {e.kind} at index {e.index} from {pb.src!r}")
        entries.append(Entry(term=e.term, index=e.index, data=e.data, kind=kind))
    snapshot = None
    if pb.HasField("snapshot"):
        snapshot = SnapshotMeta(
            index=pb.snapshot.index, term=pb.snapshot.term, voters=tuple(pb.snapshot.voters)
        )
    return Message(
        type=message_type,
        src=pb.src,
        dst=pb.dst,
        term=pb.term,
        log_term=pb.log_term,
        index=pb.index,
        entries=tuple(entries),
        commit=pb.commit,
        reject=pb.reject,
        reject_hint=pb.reject_hint,
        reject_term=pb.reject_term,
        context=pb.context,
        snapshot=snapshot,
        offset=pb.offset,
        data=pb.data,
        done=pb.done,
    )


def message_size_bytes(message: Message) -> int:
    """Rough wire size of `message`, used to bound queues and batches."""
    return (
        _MESSAGE_OVERHEAD_BYTES
        + len(message.data)
        + len(message.context)
        + sum(len(e.data) + 24 for e in message.entries)
    )


class PeerSender:
    """Sends the messages for one peer: a bounded queue drained by one task.

    Invariant: at most one Send RPC in flight, so a peer receives batches in queue order.
    """

    def __init__(
        self,
        src: NodeId,
        peer_id: NodeId,
        address: str,
        *,
        max_queue_messages: int = 4096,
        max_queue_bytes: int = 512 * 1024 * 1024,
        max_batch_bytes: int = 64 * 1024 * 1024,
        rpc_timeout_s: float = 2.0,
    ) -> None:
        self.src = src
        self.peer_id = peer_id
        self.address = address
        self._max_queue_messages = max_queue_messages
        self._max_queue_bytes = max_queue_bytes
        self._max_batch_bytes = max_batch_bytes
        self._rpc_timeout_s = rpc_timeout_s
        self._queue: collections.deque[tuple[Message, int]] = collections.deque()
        self._queued_bytes = 0
        # Created in start(): gRPC aio channels and asyncio events bind to the running loop.
        self._wakeup: asyncio.Event | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: raft_pb2_grpc.RaftPeerStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped_messages = 0  # shed because the queue was full or a Send failed
        self._failing = False  # for logging only: log transitions, not every failure

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = raft_pb2_grpc.RaftPeerStub(self._channel)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"send-{self.peer_id}")

    def enqueue(self, message: Message) -> None:
        """Queue `message`; never blocks. Sheds the oldest messages beyond the bounds."""
        size = message_size_bytes(message)
        self._queue.append((message, size))
        self._queued_bytes += size
        while len(self._queue) > 1 and (
            len(self._queue) > self._max_queue_messages or self._queued_bytes > self._max_queue_bytes
        ):
            _, old_size = self._queue.popleft()
            self._queued_bytes -= old_size
            self.dropped_messages += 1
        if self._wakeup is not None:
            self._wakeup.set()

    def _take_batch(self) -> list[Message]:
        batch: list[Message] = []
        batch_bytes = 0
        while self._queue:
            message, size = self._queue[0]
            if batch and batch_bytes + size > self._max_batch_bytes:
                break
            self._queue.popleft()
            self._queued_bytes -= size
            batch.append(message)
            batch_bytes += size
        return batch

    async def _run(self) -> None:
        assert self._wakeup is not None and self._stub is not None
        backoff_s = 0.02
        while not self._closed:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._take_batch()
            request = raft_pb2.MessageBatch(
                src=self.src, messages=[message_to_proto(m) for m in batch]
            )
            batch_bytes = sum(message_size_bytes(m) for m in batch)
            # Big batches (snapshot chunks, 64 MiB values) need longer than heartbeats.
            timeout_s = self._rpc_timeout_s + batch_bytes / (20 * 1024 * 1024)
            try:
                await self._stub.Send(request, timeout=timeout_s, wait_for_ready=False)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self.dropped_messages += len(batch)
                if not self._failing:
                    log.warning(
                        "peer unreachable: dropping messages, will retry with backoff",
                        extra={"peer": self.peer_id, "address": self.address,
                               "code": exc.code().name, "details": exc.details()},
                    )
                    self._failing = True
                # Whatever queued up meanwhile is probably stale too; the core resends.
                self.dropped_messages += len(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 0.5)
                continue
            if self._failing:
                log.info("peer reachable again", extra={"peer": self.peer_id})
                self._failing = False
            backoff_s = 0.02

    async def close(self) -> None:
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._channel is not None:
            await self._channel.close(grace=None)


class Transport:
    """All outbound peer links of one node."""

    def __init__(self, node_id: NodeId, peers: Mapping[NodeId, str]) -> None:
        self.node_id = node_id
        self._senders = {pid: PeerSender(node_id, pid, addr) for pid, addr in peers.items()}

    def start(self) -> None:
        for sender in self._senders.values():
            sender.start()

    def send(self, messages: Iterable[Message]) -> None:
        for message in messages:
            sender = self._senders.get(message.dst)
            if sender is None:
                log.error("message for unknown peer dropped", extra={"dst": message.dst})
                continue
            sender.enqueue(message)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._senders.values()))


class PeerService(raft_pb2_grpc.RaftPeerServicer):
    """Receives batches from peers and hands each message to `deliver`."""

    def __init__(self, node_id: NodeId, known_peers: Iterable[NodeId],
                 deliver: Callable[[list[Message]], None]) -> None:
        self._node_id = node_id
        self._known = frozenset(known_peers)
        self._deliver = deliver

    async def Send(self, request: raft_pb2.MessageBatch, context: grpc.aio.ServicerContext
                   ) -> raft_pb2.SendAck:  # noqa: N802 - gRPC method name
        if request.src not in self._known:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node {self._node_id} does not know peer {request.src!r}; check --peers",
            )
        messages: list[Message] = []
        for pb in request.messages:
            if pb.dst != self._node_id or pb.src != request.src:
                continue  # misrouted: a peer's address map is wrong; Raft treats it as loss
            try:
                messages.append(message_from_proto(pb))
            except BadPeerMessage as exc:
                log.warning("bad peer message dropped", extra={"peer": request.src, "reason": str(exc)})
        if messages:
            self._deliver(messages)
        return raft_pb2.SendAck()
