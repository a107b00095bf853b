"""A follower's one hop to the leader: writes and linearizable reads it cannot serve itself.

What it does: sends the client's request, unchanged (same key, value, request id), to the
node this follower believes leads, on one `Session` stream per leader shared by every
forwarded request, with what is left of the client's deadline, and hands back the
leader's answer. The stream carries the metadata `kv-forwarded-by: <this node>`; a node
that receives a request on such a stream never forwards it again (one hop), it answers
"not the leader" with its own hint, which the follower passes on to the client as is.

Outcomes: an answer or an error the leader decided (a SessionError) is passed through
unchanged. A hop that failed on the way: for a read it certainly changed
nothing; for a write it is "not applied" only when the connection was never made, else
"unknown" — the leader may have applied it, and the client's retry under the same request
id is deduplicated (docs/kv-node.md, "request ids").

What it must never do: forward twice, change the request id, or report "not applied" for
a write the leader may have applied.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools

import grpc
from google.protobuf.message import Message as ProtoMessage

from system.kv.proto import kv_pb2
from system.kv.session import take_batch
from system.kv.tls import TlsFiles, open_channel
from system.kv.tls_failure import explain
from system.kv.transport import CHANNEL_OPTIONS

FORWARDED_BY = "kv-forwarded-by"
# Used when the client gave no deadline (a unary call without one): the client library
# always sends one.
DEFAULT_TIMEOUT_S = 5.0


class ForwardFailed(Exception):
    """The hop ended in an error; fields as a unary call's status and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, outcome: str,
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome
        self.metadata = metadata  # leader-id / leader-address from the leader, if any


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _never_connected(error: grpc.aio.AioRpcError) -> bool:
    text = (error.details() or "").lower()
    return error.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in text or "connection refused" in text or "name resolution" in text)


class _LeaderSession:
    """One Session stream to one leader carrying every request this node forwards there
    (a unary call costs the leader about three times a stream message)."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str) -> None:
        rpc = channel.stream_stream("/manyasone.kv.KV/Session", request_serializer=None,
                                    response_deserializer=None)
        self._call = rpc(metadata=((FORWARDED_BY, node_id),))
        self._pending: dict[int, asyncio.Future[kv_pb2.SessionResponse]] = {}
        self._seq = itertools.count(1)
        self._queue: collections.deque[bytes] = collections.deque()
        self._writing = False
        self._writer: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="forward-read")

    async def _read(self) -> None:
        error: BaseException
        try:
            async for raw in self._call:
                answer = kv_pb2.SessionResponse.FromString(raw)
                if answer.WhichOneof("response") == "batch":
                    for frame in answer.batch.frames:
                        self._resolve(kv_pb2.SessionResponse.FromString(frame))
                else:
                    self._resolve(answer)
            error = ConnectionError("the leader ended the forwarding stream")
        except asyncio.CancelledError:
            error = ConnectionError("forwarding stream closed")
        except Exception as exc:  # noqa: BLE001 - any end of the stream fails what waits on it
            error = exc
        self._fail(error)

    def _resolve(self, answer: kv_pb2.SessionResponse) -> None:
        future = self._pending.pop(answer.seq, None)
        if future is not None and not future.done():
            future.set_result(answer)

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _send(self, data: bytes) -> None:
        """Queue `data`; a writer task drains the queue (one write at a time, as gRPC
        allows; what queued meanwhile goes in one batch). The caller never waits on a
        write, so its deadline also covers a stream that cannot be written (a paused
        leader that never finished the handshake)."""
        self._queue.append(data)
        if not self._writing:
            self._writing = True
            self._writer = asyncio.get_running_loop().create_task(self._drain(),
                                                                  name="forward-write")

    async def _drain(self) -> None:
        try:
            while self._queue:
                # What queued during the last write leaves as one message (SessionBatch):
                # the leader proposes it in one Ready, one fsync for the burst.
                await self._call.write(take_batch(self._queue, kv_pb2.SessionRequest))
        except Exception as exc:  # noqa: BLE001 - a broken stream: fail every waiter
            self._fail(exc)
        finally:
            self._writing = False

    async def call(self, frame: kv_pb2.SessionRequest, timeout_s: float) -> kv_pb2.SessionResponse:
        if self.failure is not None:
            raise self.failure
        frame.seq = next(self._seq)
        frame.timeout_ms = max(1, int(timeout_s * 1000))
        future: asyncio.Future[kv_pb2.SessionResponse] = (
            asyncio.get_running_loop().create_future())
        self._pending[frame.seq] = future
        try:
            self._send(frame.SerializeToString())
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._pending.pop(frame.seq, None)

    def close(self) -> None:
        self._reader.cancel()
        if self._writer is not None:
            self._writer.cancel()
        self._call.cancel()


class Forwarder:
    """One channel and one Session stream per leader (address and id), shared by every
    request this node forwards there.

    With `tls` (the node's own certificate for the client port), the hop is mutual TLS:
    the leader sees this node's certificate, and this node checks that the leader's
    certificate names the leader id it meant, whatever address it dialled."""

    def __init__(self, node_id: str, tls: TlsFiles | None = None) -> None:
        self.node_id = node_id
        self.tls = tls
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        self._sessions: dict[tuple[str, str], _LeaderSession] = {}
        self.forwarded = 0  # requests sent on (for the operator and the tests)

    def _session(self, address: str, leader_id: str) -> _LeaderSession:
        key = (address, leader_id)
        session = self._sessions.get(key)
        if session is None or session.failure is not None:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = self._channel(address, leader_id)
            session = self._sessions[key] = _LeaderSession(channel, self.node_id)
        return session

    def _channel(self, address: str, leader_id: str) -> grpc.aio.Channel:
        # Without a leader id (never, from server.py) the address is what is checked.
        return open_channel(address, self.tls, CHANNEL_OPTIONS, peer_name=leader_id, aio=True)

    async def call(self, address: str, kind: str, request: ProtoMessage,
                   timeout_s: float | None, write: bool, leader_id: str = "") -> ProtoMessage:
        """The leader's answer to `request` (`kind`: "put", "get" or "delete");
        raises ForwardFailed."""
        frame = kv_pb2.SessionRequest()
        getattr(frame, kind).CopyFrom(request)
        self.forwarded += 1
        timeout_s = timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S
        try:
            answer = await self._session(address, leader_id).call(frame, timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - timeout, broken stream, no connection
            if isinstance(error, TimeoutError | asyncio.TimeoutError):
                what = "no answer within the deadline"
            elif isinstance(error, grpc.aio.AioRpcError):
                what = f"{error.code().name}: {error.details()}"
                if self.tls is not None and _never_connected(error):
                    # A failed handshake: say why (in a thread: it may probe the leader).
                    reason = await asyncio.to_thread(explain, address, error.details() or "",
                                                     self.tls, leader_id)
                    what = f"TLS handshake failed: {reason}" if reason else what
            else:
                what = str(error) or type(error).__name__
            never_sent = isinstance(error, grpc.aio.AioRpcError) and _never_connected(error)
            if not write or never_sent:
                raise ForwardFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"forwarding to the leader at {address} failed ({what}); not applied; "
                    f"retry", "not-applied") from None
            raise ForwardFailed(
                grpc.StatusCode.UNKNOWN,
                f"forwarding to the leader at {address} failed ({what}); the write may have "
                f"applied: retry with the same request id", "unknown") from None
        if answer.WhichOneof("response") == "error":  # the leader decided: pass it through
            error = answer.error
            hints = ((("leader-id", error.leader_id), ("leader-address", error.leader_address))
                     if error.leader_id or error.leader_address else ())
            code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
            raise ForwardFailed(code, error.message, error.outcome or "unknown", hints)
        return getattr(answer, kind)

    async def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close(grace=None)
        self._channels.clear()
