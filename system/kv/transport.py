"""Peer transport of a KV node: Raft messages to and from the other nodes over gRPC.

What it does: converts `system.raft.messages.Message` to and from the protobuf records of
`proto/raft.proto`, and keeps per peer two lanes (control and bulk), each a sender that
writes everything queued as one batch to a long-lived `RaftPeer.StreamPieces`, cut in
pieces (so messages on one lane leave in the order the core produced them).

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
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import grpc
from google.protobuf.message import DecodeError

from system.kv.proto import raft_pb2, raft_pb2_grpc
from system.kv.stage_trace import StageTrace
from system.kv.tls import (
    Identity,
    TlsFiles,
    check_role,
    grpc_identity,
    identity_of_pem,
    open_channel,
)
from system.raft.messages import Message, MessageType
from system.raft.types import Entry, EntryKind, NodeId, SnapshotMeta

log = logging.getLogger("kv.transport")

# gRPC's default limit is 4 MiB; a 64 MiB value must fit in one APPEND with room to spare.
# (What a channel sends and a client reads; a node's port reads less: system/kv/limits.py.)
MAX_GRPC_MESSAGE_BYTES = 256 * 1024 * 1024
# A batch goes to a peer's gRPC port in pieces of at most this many bytes (StreamPieces in
# proto/raft.proto): that port reads no message larger than the peer's largest legal
# client request, and a batch can be larger than that.
PEER_PIECE_BYTES = 256 * 1024
_PIECES_METHOD = "/manyasone.raft.RaftPeer/StreamPieces"

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
    EntryKind.CONFIG: raft_pb2.ENTRY_KIND_CONFIG,
}
_KIND_FROM_PROTO = {v: k for k, v in _KIND_TO_PROTO.items()}

# After a peer refused this node's streams, a new stream counts as accepted once it has
# stayed open this long (the refusal comes a round trip after the write that it refuses).
_TRUSTED_AFTER_S = 1.0

# Fixed per-message overhead assumed when bounding queues by size (headers, ids, terms).
_MESSAGE_OVERHEAD_BYTES = 64


class BadPeerMessage(ValueError):
    """A peer sent a record that does not describe a valid Raft message."""


def _snapshot_meta_to_proto(snap: SnapshotMeta) -> raft_pb2.SnapshotMeta:
    return raft_pb2.SnapshotMeta(
        index=snap.index, term=snap.term, voters=list(snap.voters),
        learners=list(snap.learners), member_info=dict(snap.member_info),
    )


def _snapshot_meta_from_proto(pb: raft_pb2.SnapshotMeta) -> SnapshotMeta:
    return SnapshotMeta(
        index=pb.index, term=pb.term, voters=tuple(pb.voters), learners=tuple(pb.learners),
        member_info=tuple(sorted(pb.member_info.items())),
    )


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
        pb.snapshot.CopyFrom(_snapshot_meta_to_proto(snap))
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
        snapshot = _snapshot_meta_from_proto(pb.snapshot)
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


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


_TAG_BATCH_MESSAGES = b"\x12"  # MessageBatch.messages = 2, length-delimited
_TAG_MESSAGE_ENTRIES = b"\x3a"  # RaftMessage.entries = 7
_TAG_MESSAGE_DATA = b"\x7a"  # RaftMessage.data = 15
_TAG_ENTRY_DATA = b"\x1a"  # Entry.data = 3


def encode_batch(src: NodeId, messages: Iterable[Message]) -> bytes:
    """The wire bytes of MessageBatch(src, messages), built so that each entry's data and
    each snapshot chunk is copied ONCE (into the result).

    Building the protobuf objects instead copies a 64 MiB value four times or more (into
    each Entry, into the repeated field, into the batch, into the serialized string):
    about 1.3 s of event-loop time per follower on this machine, long enough for followers
    to start an election. Protobuf wire format lets a message be the concatenation of its
    fields in any order, so the small fields are serialized by protobuf and the bulky
    ones are appended as length-delimited fields (tests/kv/test_transport.py checks that
    protobuf parses the result to exactly message_to_proto's record).
    """
    parts: list[bytes] = [raft_pb2.MessageBatch(src=src).SerializeToString()]
    for message in messages:
        header = raft_pb2.RaftMessage(
            type=_TYPE_TO_PROTO[message.type], src=message.src, dst=message.dst,
            term=message.term, log_term=message.log_term, index=message.index,
            commit=message.commit, reject=message.reject, reject_hint=message.reject_hint,
            reject_term=message.reject_term, context=message.context,
            offset=message.offset, done=message.done,
        )
        if message.snapshot is not None:
            snap = message.snapshot
            header.snapshot.CopyFrom(
                _snapshot_meta_to_proto(snap))
        body: list[bytes] = [header.SerializeToString()]
        for entry in message.entries:
            entry_header = raft_pb2.Entry(
                term=entry.term, index=entry.index, kind=_KIND_TO_PROTO[entry.kind]
            ).SerializeToString()
            data_field = (_TAG_ENTRY_DATA + _varint(len(entry.data))) if entry.data else b""
            entry_len = len(entry_header) + len(data_field) + len(entry.data)
            body += [_TAG_MESSAGE_ENTRIES, _varint(entry_len), entry_header, data_field]
            if entry.data:
                body.append(entry.data)
        if message.data:
            body += [_TAG_MESSAGE_DATA, _varint(len(message.data)), message.data]
        body_len = sum(len(b) for b in body)
        parts += [_TAG_BATCH_MESSAGES, _varint(body_len), *body]
    return b"".join(parts)


_TAG_PIECE_DATA = b"\x0a"  # BatchPiece.data = 1
_PIECE_MORE = b"\x10\x01"  # BatchPiece.more = 2, true


def batch_pieces(batch: bytes, piece_bytes: int = PEER_PIECE_BYTES) -> list[bytes]:
    """The wire bytes of the BatchPiece messages that carry `batch` (each piece's data
    copied once; the last one's `more` is false)."""
    view = memoryview(batch)
    pieces = []
    for start in range(0, max(len(batch), 1), piece_bytes):
        data = view[start:start + piece_bytes]
        more = start + piece_bytes < len(batch)
        pieces.append(b"".join((_TAG_PIECE_DATA, _varint(len(data)), data,
                                _PIECE_MORE if more else b"")))
    return pieces


def message_size_bytes(message: Message) -> int:
    """Rough wire size of `message`, used to bound queues and batches."""
    return (
        _MESSAGE_OVERHEAD_BYTES
        + len(message.data)
        + len(message.context)
        + sum(len(e.data) + 24 for e in message.entries)
    )


def _retransmission_key(message: Message) -> tuple[object, ...] | None:
    """Identity of a bulky message a leader may send again unchanged (None: never coalesce)."""
    if message.type is MessageType.APPEND and message.entries:
        return ("append", message.term, message.index, message.entries[0].index,
                message.entries[-1].index, message.entries[-1].term)
    if message.type is MessageType.SNAPSHOT and message.snapshot is not None:
        return ("snapshot", message.term, message.snapshot.index, message.offset)
    return None


def _check_own_certificate(node_id: NodeId, tls: TlsFiles) -> None:
    """Say at start, once, what every peer would otherwise refuse message by message:
    this node's certificate must name it, as a node."""
    cert, _, _ = tls.read()
    identity = identity_of_pem(cert)
    if identity.role != "node" or identity.name != node_id:
        log.error("this node's peer certificate does not name it: peers will refuse its "
                  "Raft messages", extra={"node": node_id, "certificate": str(tls.cert),
                                          "names": str(identity)})


def peer_refusal(identity: Identity | None, src: str) -> str | None:
    """None when a peer holding `identity`'s certificate may send Raft messages as
    `src`, else the one line that says why not (a node holding n2's certificate cannot
    speak as n3; a client's or an admin's cannot speak at all)."""
    why = check_role(identity, ("node",), "Raft traffic")
    if why is None and identity is not None and identity.name != src:
        why = (f"the peer's certificate names {identity} but its messages claim to come "
               f"from {src!r}")
    return why


class RefusalLog:
    """One warning per refused peer and reason a minute: a refused peer retries every
    half second or so, and each attempt would otherwise be a line. The next line after
    a quiet minute says how many were left out."""

    WINDOW_S = 60.0

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._last: dict[tuple[str, ...], float] = {}
        self._left_out: dict[tuple[str, ...], int] = {}

    def refused(self, key: tuple[str, ...], message: str, **extra: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.WINDOW_S:
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return
        if len(self._last) > 1024:  # strangers' varied names must not grow it forever
            self._last.clear()
            self._left_out.clear()
        self._last[key] = now
        left_out = self._left_out.pop(key, 0)
        if left_out:
            extra["same_refusals_not_logged"] = str(left_out)
        self._log.warning(message, extra=extra)


class PeerSender:
    """Sends one lane's messages for one peer: a bounded queue drained by one task into one
    stream at a time, so the peer receives batches in queue order."""

    def __init__(
        self,
        src: NodeId,
        peer_id: NodeId,
        address: str,
        *,
        lane: str = "control",
        max_queue_messages: int = 4096,
        max_queue_bytes: int = 512 * 1024 * 1024,
        max_batch_bytes: int = 64 * 1024 * 1024,
        trace: StageTrace | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.src = src
        self.tls = tls  # mutual TLS: present this node's certificate, check the peer's
        self.trace = trace  # KV_STAGE_TRACE: when appends and answers are handed to gRPC
        self.peer_id = peer_id
        self.address = address
        self.lane = lane
        self._max_queue_messages = max_queue_messages
        self._max_queue_bytes = max_queue_bytes
        self._max_batch_bytes = max_batch_bytes
        self._queue: collections.deque[tuple[Message, int]] = collections.deque()
        self._queued_bytes = 0
        # Created in start(): gRPC aio channels and asyncio events bind to the running loop.
        self._wakeup: asyncio.Event | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stream_rpc: grpc.aio.StreamUnaryMultiCallable | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped_messages = 0  # shed because the queue was full or a Send failed
        self.coalesced_messages = 0  # duplicates of a message still queued or in flight
        self._pending_keys: dict[tuple[object, ...], int] = {}
        self._failing = False  # for logging only: log transitions, not every failure

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        # A channel of its own per lane (local subchannel pool = its own TCP connection).
        options = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
        # With TLS the peer's certificate must name the peer id, whatever address it has.
        self._channel = open_channel(self.address, self.tls, options, peer_name=self.peer_id,
                                     aio=True)
        # BatchPiece bytes in (see encode_batch, batch_pieces), SendAck out.
        self._stream_rpc = self._channel.stream_unary(
            _PIECES_METHOD, request_serializer=None,
            response_deserializer=raft_pb2.SendAck.FromString)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"send-{self.peer_id}-{self.lane}")

    def enqueue(self, message: Message) -> None:
        """Queue `message`; never blocks. Sheds the oldest messages beyond the bounds.

        A retransmission identical to one still queued or in flight is dropped: a leader
        probing a slow follower re-sends its pending APPEND on every heartbeat answer, and
        with 64 MiB entries those copies would swamp the link and the follower.
        """
        key = _retransmission_key(message)
        if key is not None:
            if key in self._pending_keys:
                self.coalesced_messages += 1
                return
            self._pending_keys[key] = self._pending_keys.get(key, 0) + 1
        size = message_size_bytes(message)
        self._queue.append((message, size))
        self._queued_bytes += size
        while len(self._queue) > 1 and (
            len(self._queue) > self._max_queue_messages or self._queued_bytes > self._max_queue_bytes
        ):
            old, old_size = self._queue.popleft()
            self._queued_bytes -= old_size
            self._forget(old)
            self.dropped_messages += 1
        self._queued()

    def _queued(self) -> None:
        """A message was queued: wake the writer task."""
        if self._wakeup is not None:
            self._wakeup.set()

    def flush(self) -> None:
        """Called after a Ready's messages were queued; the gRPC lanes write from their
        task, so there is nothing to do here."""

    @property
    def has_queued(self) -> bool:
        return bool(self._queue)

    def _forget(self, message: Message) -> None:
        key = _retransmission_key(message)
        if key is not None and key in self._pending_keys:
            self._pending_keys[key] -= 1
            if self._pending_keys[key] <= 0:
                del self._pending_keys[key]

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
        """Write each batch to a long-lived stream; open a new one after any failure.

        A write returns once gRPC has buffered the batch (HTTP/2 flow control is the
        backpressure), so several batches can be on the wire at once, in order.
        """
        assert self._wakeup is not None and self._stream_rpc is not None
        loop = asyncio.get_running_loop()
        backoff_s = 0.02
        call: grpc.aio.StreamUnaryCall | None = None
        opened = 0.0
        refused = False  # the peer refused a stream: a new one is not proof it accepts
        while not self._closed:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._take_batch()
            try:
                if call is not None and call.done():
                    await self._raise_if_refused(call)
                    call = None
                if call is None:
                    call = self._stream_rpc(wait_for_ready=False)
                    opened = loop.time()
                if self.trace is not None:
                    self.trace.hops_sent(batch)
                for piece in batch_pieces(encode_batch(self.src, batch)):
                    await call.write(piece)
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: new stream after backoff
                for message in batch:
                    self._forget(message)
                self.dropped_messages += len(batch)
                code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else ""
                if call is not None:
                    call.cancel()
                    call = None
                if code == "PERMISSION_DENIED":
                    refused = True
                self._failed(code=code, details=str(exc)[:300], **self._grpc_reason(exc))
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 0.5)
                continue
            for message in batch:
                self._forget(message)
            # A write only says gRPC buffered the batch; a peer that refuses this node
            # ends the stream a round trip later. After a refusal, a stream is trusted
            # once it stayed open a while (else "reachable again" and "unreachable"
            # would alternate on every batch).
            if refused and loop.time() - opened < _TRUSTED_AFTER_S:
                continue
            refused = False
            self._reached()
            backoff_s = 0.02

    async def _raise_if_refused(self, call: grpc.aio.StreamUnaryCall) -> None:
        """A stream the peer ended between writes: a refusal is a failure to report (it
        would otherwise be replaced by a new stream without a word); anything else (the
        peer restarting) just means a new stream."""
        if await call.code() is grpc.StatusCode.PERMISSION_DENIED:
            raise grpc.aio.AioRpcError(grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(),
                                       await call.trailing_metadata(),
                                       details=await call.details())

    def _grpc_reason(self, exc: Exception) -> dict[str, str]:
        """What to fix, where gRPC only says UNAVAILABLE: a TLS lane that cannot connect
        failed its handshake, or the peer refused this node's certificate (its log says
        which). Empty when there is nothing to add."""
        if not isinstance(exc, grpc.aio.AioRpcError):
            return {}
        if exc.code() is grpc.StatusCode.PERMISSION_DENIED:
            return {"reason": f"peer {self.peer_id} refused: {exc.details()}"}
        if self.tls is None or exc.code() is not grpc.StatusCode.UNAVAILABLE:
            return {}
        peer, details = self.peer_id, exc.details() or ""
        if "Hostname Verification" in details:
            why = (f"peer {peer}'s certificate does not name {peer!r}: {self.address} is not "
                   f"{peer}'s address, or {peer} holds another node's certificate")
        elif "certificate verify failed" in details.lower():
            why = (f"peer {peer}'s certificate is not signed by this node's CA "
                   f"{self.tls.ca}, or has expired")
        else:
            why = (f"TLS connection to peer {peer} at {self.address} failed: check that "
                   f"{peer} serves TLS, that its certificate names {peer!r} and is signed "
                   f"by {self.tls.ca}, and that its CA signed {self.tls.cert}")
        return {"reason": why}

    def _failed(self, **details: str) -> None:
        """A write failed: say so once per outage, and drop what is queued (probably
        stale by the time the peer is back; the core resends what matters)."""
        if not self._failing:
            log.warning("peer unreachable: dropping messages, will retry with backoff",
                        extra={"peer": self.peer_id, "lane": self.lane,
                               "address": self.address, **details})
            self._failing = True
        self.dropped_messages += len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        self._pending_keys.clear()

    def _reached(self) -> None:
        if self._failing:
            log.info("peer reachable again", extra={"peer": self.peer_id, "lane": self.lane})
            self._failing = False

    async def close(self) -> None:
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._close_connection()

    async def _close_connection(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)


# Messages that carry log entries or snapshot chunks travel on their own connection, so a
# 64 MiB APPEND never holds up heartbeats and votes behind it (which would make followers
# start elections while the leader is merely busy). Raft tolerates the reordering between
# the two lanes; within a lane, order is kept.
_BULK_TYPES = frozenset({MessageType.APPEND, MessageType.SNAPSHOT})


class Transport:
    """All outbound peer links of one node: per peer, a control lane and a bulk lane,
    over plain TCP to the peers in `tcp_links` (system/kv/peer_tcp.py, at that address)
    and over gRPC to the others (at the address they are given)."""

    def __init__(self, node_id: NodeId, peers: Mapping[NodeId, str],
                 trace: StageTrace | None = None,
                 tcp_links: Mapping[NodeId, str] | None = None,
                 tls: TlsFiles | None = None) -> None:
        self.node_id = node_id
        self.trace = trace
        self.tls = tls  # every lane, gRPC or TCP, of every peer, added ones too
        if tls is not None:
            _check_own_certificate(node_id, tls)
        self._static_links = dict(tcp_links or {})  # the command line's: they always win
        self._tcp_links = dict(self._static_links)  # in use, with those of added members
        self._control = {pid: self._sender(pid, addr, "control") for pid, addr in peers.items()}
        self._bulk = {pid: self._sender(pid, addr, "bulk") for pid, addr in peers.items()}
        self._started = False
        self._closing: set[asyncio.Future[None]] = set()

    @property
    def senders(self) -> list[PeerSender]:
        return [*self._control.values(), *self._bulk.values()]

    def describe(self) -> dict[NodeId, str]:
        """Per peer, how its messages travel: "tcp HOST:PORT" or "grpc HOST:PORT"."""
        return {pid: f"{'tcp' if pid in self._tcp_links else 'grpc'} {sender.address}"
                for pid, sender in sorted(self._control.items())}

    def peer_address(self, peer_id: NodeId) -> str | None:
        sender = self._control.get(peer_id)
        return sender.address if sender is not None else None

    def _sender(self, peer_id: NodeId, address: str, lane: str) -> PeerSender:
        link = self._tcp_links.get(peer_id)
        if link:
            from system.kv.peer_tcp import TcpPeerSender  # (it builds on PeerSender)

            return TcpPeerSender(self.node_id, peer_id, link, lane=lane, trace=self.trace,
                                 tls=self.tls)
        return PeerSender(self.node_id, peer_id, address, lane=lane, trace=self.trace,
                          tls=self.tls)

    def set_peer(self, peer_id: NodeId, address: str, link: str = "") -> None:
        """Reach `peer_id` at `address` from now on (a member added by a membership
        change, or one whose address changed): new lanes, started at once; over TCP at
        `link` if given (a link from the command line wins: it is this host's route)."""
        link = self._static_links.get(peer_id) or link
        if self.peer_address(peer_id) == (link or address):
            return
        if link:
            self._tcp_links[peer_id] = link
        else:
            self._tcp_links.pop(peer_id, None)
        self.remove_peer(peer_id)
        self._control[peer_id] = self._sender(peer_id, address, "control")
        self._bulk[peer_id] = self._sender(peer_id, address, "bulk")
        if self._started:
            self._control[peer_id].start()
            self._bulk[peer_id].start()

    def remove_peer(self, peer_id: NodeId) -> None:
        """Stop sending to `peer_id` (removed from the membership)."""
        for lanes in (self._control, self._bulk):
            sender = lanes.pop(peer_id, None)
            if sender is not None:
                task = asyncio.ensure_future(sender.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def start(self) -> None:
        self._started = True
        for sender in self.senders:
            sender.start()

    def send(self, messages: Iterable[Message]) -> None:
        touched: dict[int, PeerSender] = {}
        for message in messages:
            lanes = self._bulk if message.type in _BULK_TYPES else self._control
            sender = lanes.get(message.dst)
            if sender is None:
                log.error("message for unknown peer dropped", extra={"dst": message.dst})
                continue
            sender.enqueue(message)
            touched[id(sender)] = sender
        for sender in touched.values():
            sender.flush()  # a TCP lane writes what it can now, one batch per lane

    def has_queued(self) -> bool:
        """Whether some lane still holds messages its writer task has to hand on."""
        return any(sender.has_queued for sender in self.senders)

    def dropped_messages(self) -> dict[str, int]:
        return {f"{s.peer_id}/{s.lane}": s.dropped_messages for s in self.senders}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.senders), *self._closing)


class PeerService(raft_pb2_grpc.RaftPeerServicer):
    """Receives batches from peers and hands each message to `deliver`.

    With `require_identity` (a port that requires client certificates), a batch is
    accepted only from a node certificate that names the batch's sender; the caller's
    identity is looked up once per call (a stream carries many batches)."""

    def __init__(self, node_id: NodeId, known_peers: Iterable[NodeId] | Callable[[str], bool],
                 deliver: Callable[[list[Message]], None],
                 require_identity: bool = False) -> None:
        self._node_id = node_id
        if callable(known_peers):
            self._is_known: Callable[[str], bool] = known_peers
        else:
            known = frozenset(known_peers)
            self._is_known = known.__contains__
        self._deliver = deliver
        self._require_identity = require_identity
        self._refusals = RefusalLog(log)

    async def Send(self, request: raft_pb2.MessageBatch, context: grpc.aio.ServicerContext
                   ) -> raft_pb2.SendAck:  # noqa: N802 - gRPC method name
        await self._receive(request, context, self._caller(context))
        return raft_pb2.SendAck()

    async def Stream(self, request_iterator: AsyncIterator[raft_pb2.MessageBatch],
                     context: grpc.aio.ServicerContext) -> raft_pb2.SendAck:  # noqa: N802
        caller = self._caller(context)
        async for request in request_iterator:
            await self._receive(request, context, caller)
        return raft_pb2.SendAck()

    async def StreamPieces(self, request_iterator: AsyncIterator[raft_pb2.BatchPiece],
                           context: grpc.aio.ServicerContext) -> raft_pb2.SendAck:  # noqa: N802
        caller = self._caller(context)
        pieces: list[bytes] = []
        size = 0
        async for piece in request_iterator:
            pieces.append(piece.data)
            size += len(piece.data)
            if size > MAX_GRPC_MESSAGE_BYTES:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"a batch of more than {MAX_GRPC_MESSAGE_BYTES} bytes")
            if piece.more:
                continue
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces, size = [], 0
            try:
                request = raft_pb2.MessageBatch.FromString(data)
            except DecodeError as exc:
                request, bad = None, f"pieces that do not join into a MessageBatch: {exc}"
            del data
            if request is None:  # abort outside the except: see server._handler
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad)
            await self._receive(request, context, caller)
        return raft_pb2.SendAck()

    def _caller(self, context: grpc.aio.ServicerContext) -> Identity | None:
        return grpc_identity(context) if self._require_identity else None

    async def _receive(self, request: raft_pb2.MessageBatch,
                       context: grpc.aio.ServicerContext, caller: Identity | None) -> None:
        if self._require_identity:
            why = peer_refusal(caller, request.src)
            if why is not None:
                self._refusals.refused(
                    (context.peer().rpartition(":")[0], str(caller), request.src),
                    "peer refused", **{"from": context.peer(), "certificate": str(caller),
                                       "claimed": request.src, "reason": why})
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"node {self._node_id} refuses Raft messages: {why}")
        if not self._is_known(request.src):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node {self._node_id} does not know peer {request.src!r}; check --peers",
            )
        messages = messages_for(self._node_id, request)
        if messages:
            self._deliver(messages)


def messages_for(node_id: NodeId, batch: raft_pb2.MessageBatch) -> list[Message]:
    """The messages of a peer's batch meant for `node_id`, from that peer; a misrouted
    one (a peer's address map is wrong) or a malformed one is dropped, as Raft treats
    loss (the latter with a warning)."""
    messages: list[Message] = []
    for pb in batch.messages:
        if pb.dst != node_id or pb.src != batch.src:
            continue
        try:
            messages.append(message_from_proto(pb))
        except BadPeerMessage as exc:
            log.warning("bad peer message dropped", extra={"peer": batch.src, "reason": str(exc)})
    return messages
