"""gRPC services of a KV node: the client API (`proto/kv.proto`) and the peer API (`proto/raft.proto`).

What it does: validates every client request against the node's limits, turns it into a
call on `Node`, and maps the outcome to a response or a gRPC status with a message that
says what was wrong and what the limit is. Put, Get and Delete come as unary calls or on
a client's long-lived `Session` stream (the leader's puts, deletes and linearizable gets
answered in a callback, everything else in a task of its own; each answer or error
tagged with its seq); a follower forwards writes and linearizable reads to the
leader (system/kv/forward.py) unless the request was forwarded already. Requests arrive as raw bytes and are parsed
here, so a payload that is not a valid protobuf gets INVALID_ARGUMENT instead of gRPC's
generic INTERNAL.

Status codes (see kv.proto): INVALID_ARGUMENT (bad request), RESOURCE_EXHAUSTED (rate
limit; or, from gRPC itself with no "kv-outcome", a request larger than the port reads:
system/kv/limits.py), UNAVAILABLE (not the leader / no leader; trailing metadata "leader-id" and
"leader-address"; certainly not applied), UNKNOWN (outcome unknown). Every error this
module decides carries trailing metadata "kv-outcome" = "not-applied" or "unknown", so a
client can tell it from a broken connection.

What it must never do: let any input crash the node, or answer a write before the node
says it is committed and applied.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from system.kv.forward import FORWARDED_BY, ForwardFailed
from system.kv.limits import request_limit_bytes
from system.kv.node import Node, NodeError, NotLeaderError
from system.kv.proto import kv_pb2
from system.kv.session import take_batch
from system.kv.stage_trace import now_ns, received_ns
from system.kv.state_machine import CommandRejected, DeleteResult, PutResult
from system.kv.tls import Identity, check_role, grpc_identity, grpc_server_credentials
from system.kv.transport import CHANNEL_OPTIONS, PeerService
from system.raft.core import MembershipChangeRefused

log = logging.getLogger("kv.server")

KV_SERVICE = "manyasone.kv.KV"

# gRPC turns SO_REUSEPORT on by default: a second node (or a whole second cluster) started
# on ports already in use then starts without error, the kernel spreads connections over
# both listeners, and clients reach either cluster at random. Every server binds alone.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.so_reuseport", 0),)


class _Reject(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, outcome: str = "not-applied",
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = (("kv-outcome", outcome), *metadata)


class RateLimiter:
    """Token bucket: at most `rate_per_s` requests per second, bursts up to one second's worth."""

    def __init__(self, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s
        self._capacity = max(1.0, rate_per_s)
        self._tokens = self._capacity
        self._last = time.monotonic()

    def try_acquire(self) -> bool:
        if self.rate_per_s <= 0:
            return True
        now = time.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class KVService:
    """Handlers of the client API; each runs on the node's event loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.limiter = RateLimiter(self.config.max_requests_per_s)

    # ----- helpers ---------------------------------------------------------------------

    def _header(self) -> kv_pb2.Header:
        core = self.node.core
        return kv_pb2.Header(
            node_id=self.config.node_id,
            term=core.term,
            applied_index=self.node.state_machine.applied_index,
            leader_id=core.leader_id or "",
        )

    def _check_rate(self) -> None:
        if not self.limiter.try_acquire():
            raise _Reject(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request rate limit of {self.config.max_requests_per_s:g} requests/s on node "
                f"{self.config.node_id} exceeded; slow down and retry later")

    def _check_key(self, key: str) -> None:
        if not key:
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, "key is empty; give a non-empty key")
        size = len(key.encode("utf-8"))
        if size > self.config.max_key_bytes:
            raise _Reject(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"key is {size} bytes long; the limit is {self.config.max_key_bytes} bytes (UTF-8)")

    def _check_value(self, value: bytes) -> None:
        if len(value) > self.config.max_value_bytes:
            raise _Reject(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"value is {len(value)} bytes; the limit is {self.config.max_value_bytes} bytes "
                f"(node flag --max-value-bytes)")

    def _check_request_id(self, request_id: str) -> None:
        if len(request_id.encode("utf-8")) > 256:
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                          "request_id is longer than 256 bytes; use a shorter id")

    @staticmethod
    def _not_leader(exc: NotLeaderError) -> _Reject:
        return _Reject(grpc.StatusCode.UNAVAILABLE, str(exc), "not-applied",
                       (("leader-id", exc.leader_id or ""), ("leader-address", exc.leader_address)))

    def _node_error(self, exc: NodeError) -> _Reject:
        if isinstance(exc, NotLeaderError):
            return self._not_leader(exc)
        if exc.outcome_known:
            leader_id, address = self.node.leader_hint()
            return _Reject(grpc.StatusCode.UNAVAILABLE, str(exc), "not-applied",
                           (("leader-id", leader_id or ""), ("leader-address", address)))
        return _Reject(grpc.StatusCode.UNKNOWN, str(exc), "unknown")

    # ----- handlers --------------------------------------------------------------------

    async def put(self, request: kv_pb2.PutRequest, timeout_s: float | None = None,
                  forwarded: bool = False) -> kv_pb2.PutResponse:
        self._check_rate()
        self._check_key(request.key)
        value = request.value  # each access copies the bytes: read a 64 MiB value once
        self._check_value(value)
        self._check_request_id(request.request_id)
        expected = request.expected_version if request.HasField("expected_version") else None
        try:
            result = await self.node.put(request.key, value, expected, request.request_id)
        except NotLeaderError as exc:
            return await self._forward(exc, "put", request, timeout_s, forwarded, write=True)
        except NodeError as exc:
            raise self._node_error(exc) from None
        return self._put_response(result)

    def _put_response(self, result: PutResult | CommandRejected) -> kv_pb2.PutResponse:
        if isinstance(result, CommandRejected):
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, f"rejected by the state machine: {result}")
        return kv_pb2.PutResponse(applied=result.applied, version=result.version,
                                  header=self._header())

    async def delete(self, request: kv_pb2.DeleteRequest, timeout_s: float | None = None,
                     forwarded: bool = False) -> kv_pb2.DeleteResponse:
        self._check_rate()
        self._check_key(request.key)
        self._check_request_id(request.request_id)
        expected = request.expected_version if request.HasField("expected_version") else None
        try:
            result = await self.node.delete(request.key, expected, request.request_id)
        except NotLeaderError as exc:
            return await self._forward(exc, "delete", request, timeout_s, forwarded,
                                       write=True)
        except NodeError as exc:
            raise self._node_error(exc) from None
        return self._delete_response(result)

    def _delete_response(self, result: DeleteResult | CommandRejected) -> kv_pb2.DeleteResponse:
        if isinstance(result, CommandRejected):
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, f"rejected by the state machine: {result}")
        return kv_pb2.DeleteResponse(applied=result.applied, existed=result.existed,
                                     version=result.version, header=self._header())

    def start_write(self, which: str, request: kv_pb2.PutRequest | kv_pb2.DeleteRequest
                    ) -> asyncio.Future | None:
        """The proposal of a put or delete this node serves as it stands (the leader, a
        valid request, no rate limit), for a caller that answers it in the future's
        callback (`write_answer`); None, with nothing proposed, for every other write,
        which takes the general path (`put`, `delete`) and gets its answer there."""
        if self.limiter.rate_per_s > 0:
            return None
        try:
            self._check_key(request.key)
            self._check_request_id(request.request_id)
            expected = request.expected_version if request.HasField("expected_version") else None
            if which == "put":
                value = request.value  # type: ignore[union-attr]
                self._check_value(value)
                return self.node.start_put(request.key, value, expected, request.request_id)
            return self.node.start_delete(request.key, expected, request.request_id)
        except _Reject:
            return None  # the general path answers with the reason

    def write_answer(self, seq: int, which: str, future: asyncio.Future) -> kv_pb2.SessionResponse:
        """The Session answer to a write started by `start_write`, once its future is done;
        the same answer `put`/`delete` give on the general path."""
        response = kv_pb2.SessionResponse(seq=seq)
        try:
            result = future.result()
            if which == "put":
                response.put.CopyFrom(self._put_response(result))
            else:
                response.delete.CopyFrom(self._delete_response(result))
        except _Reject as rej:
            response.error.CopyFrom(_session_error(rej))
        except NodeError as exc:
            response.error.CopyFrom(_session_error(self._node_error(exc)))
        return response

    async def get(self, request: kv_pb2.GetRequest, timeout_s: float | None = None,
                  forwarded: bool = False) -> kv_pb2.GetResponse:
        self._check_rate()
        self._check_key(request.key)
        if request.consistency not in (kv_pb2.LINEARIZABLE, kv_pb2.STALE):
            raise _Reject(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"consistency {request.consistency} is not one of LINEARIZABLE (0) or STALE (1)")
        stale = request.consistency == kv_pb2.STALE
        if not stale:
            try:
                await self.node.read_barrier()
            except NotLeaderError as exc:
                return await self._forward(exc, "get", request, timeout_s, forwarded,
                                           write=False)
            except NodeError as exc:
                raise self._node_error(exc) from None
        elif self.node.core.log_diverged:
            # Our state holds writes the cluster no longer has (docs/raft.md, "A follower
            # whose committed log diverged"): not even a stale read may see them. The
            # client asks another node.
            leader_id, address = self.node.leader_hint()
            raise _Reject(grpc.StatusCode.UNAVAILABLE,
                          f"node {self.node.config.node_id} refuses stale reads until the "
                          f"leader repairs it: {self.node.core.log_diverged}", "not-applied",
                          (("leader-id", leader_id or ""), ("leader-address", address)))
        # No await between the barrier and this read: the state is at least the barrier's.
        return self.read_local(request.key, stale)

    def read_local(self, key: str, stale: bool) -> kv_pb2.GetResponse:
        """The answer to a get from this node's state machine as it is now."""
        found = self.node.state_machine.get(key)
        response = kv_pb2.GetResponse(stale=stale, header=self._header())
        if found is not None:
            value, version = found
            response.found = True
            response.value = value
            response.version = version
        return response

    def start_linearizable_get(self, request: kv_pb2.GetRequest) -> asyncio.Future[int] | None:
        """The ReadIndex round of a linearizable get this node serves as it stands (the
        leader, a valid key, no rate limit), for a caller that answers it in the round's
        callback; None for every other get, which takes the general path (`get`)."""
        if request.consistency != kv_pb2.LINEARIZABLE or self.limiter.rate_per_s > 0:
            return None
        try:
            self._check_key(request.key)
        except _Reject:
            return None  # the general path answers with the reason
        return self.node.start_read_barrier()

    async def _forward(self, exc: NotLeaderError, method: str, request: ProtoMessage,
                       timeout_s: float | None, forwarded: bool, write: bool) -> ProtoMessage:
        """Send a request this node cannot serve on to the leader it knows (one hop), or
        refuse it with the leader hint: when it came forwarded already, when no leader is
        known, or when forwarding is off (--no-forward)."""
        if forwarded or not exc.leader_address or not self.config.forward_to_leader:
            raise self._not_leader(exc)
        try:
            return await self.node.forwarder.call(exc.leader_address, method, request,
                                                  timeout_s, write, leader_id=exc.leader_id or "")
        except ForwardFailed as failed:
            raise _Reject(failed.code, failed.message, failed.outcome, failed.metadata) from None

    async def status(self, request: kv_pb2.StatusRequest) -> kv_pb2.StatusResponse:
        core = self.node.core
        st = core.status()
        return kv_pb2.StatusResponse(
            node_id=self.config.node_id,
            role=st.role.value,
            term=st.term,
            leader_id=st.leader_id or "",
            commit_index=st.commit_index,
            applied_index=self.node.state_machine.applied_index,
            last_index=st.last_index,
            snapshot_index=st.snapshot_index,
            peers=dict(self.config.peers),
            snapshots_installed=self.node.snapshots_installed,
            unsafe_mode=self.config.unsafe_mode or "",
            last_snapshot_index=self.node.last_installed_snapshot_index,
            cluster_id=self.node.identity.cluster_id if self.node.identity else "",
            member_id=self.node.identity.member_id if self.node.identity else "",
            voters=list(core.membership.voters),
            learners=list(core.membership.learners),
            vote_withheld=core.vote_withheld,
            catch_up_to=core.catch_up_to,
            member_addresses=self.node.member_addresses(),
            peer_transports=self.node.transport.describe(),
            snapshots_sending=[
                kv_pb2.SnapshotSend(peer=peer, index=index, offset=offset, size=size,
                                    seconds=self.node.snapshot_sends.seconds(peer))
                for peer, (index, offset, size) in sorted(core.snapshot_transfers().items())],
            snapshots_sent=self.node.snapshot_sends.sent,
            config_index=core.config_index,
            lead_transferee=core.lead_transferee or "",
            match_index={peer: p.match for peer, p in core.progress.items()},
        )

    async def change_membership(self, request: kv_pb2.ChangeMembershipRequest
                                ) -> kv_pb2.ChangeMembershipResponse:
        if not request.node_id:
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, "node_id is empty; name the member")
        try:
            index = await self.node.change_membership(request.change, request.node_id,
                                                      request.address, request.peer_address)
        except MembershipChangeRefused as exc:
            raise _Reject(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        except ValueError as exc:
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except NodeError as exc:
            raise self._node_error(exc) from None
        membership = self.node.core.membership
        return kv_pb2.ChangeMembershipResponse(
            index=index, voters=list(membership.voters), learners=list(membership.learners),
            header=self._header())

    async def introduce(self, request: kv_pb2.IntroduceRequest) -> kv_pb2.IntroduceResponse:
        if not request.node_id or not request.member_id:
            raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, "node_id and member_id are required")
        verdict, message, is_voter, is_learner = self.node.handle_introduce(
            request.cluster_id, request.node_id, request.member_id)
        return kv_pb2.IntroduceResponse(
            verdict=verdict, message=message, is_voter=is_voter, is_learner=is_learner,
            last_index=self.node.core.log.last_index(),
            cluster_id=self.node.identity.cluster_id if self.node.identity else "",
            node_id=self.node.config.node_id)


def _call_info(context: grpc.aio.ServicerContext) -> tuple[float | None, bool]:
    """(what is left of the caller's deadline in seconds, whether another node forwarded it)."""
    forwarded = any(key == FORWARDED_BY for key, _ in context.invocation_metadata() or ())
    return context.time_remaining(), forwarded


# Who may call what on a TLS port: a verified certificate of any role may use the KV
# operations and Status (the handshake already required one); these need more. Each
# returns None when `caller` may make the call, else the one line that says why not.
Authorize = Callable[[Identity | None, ProtoMessage], "str | None"]


def admin_only(caller: Identity | None, request: ProtoMessage) -> str | None:
    return check_role(caller, ("admin",), "ChangeMembership")


def introducing_node(caller: Identity | None, request: ProtoMessage) -> str | None:
    """Introduce: only a node, and only as itself (n2's certificate cannot introduce n3:
    a welcome is what lets a node vote)."""
    refusal = check_role(caller, ("node",), "Introduce")
    if refusal is None and caller is not None and caller.name != request.node_id:
        refusal = (f"Introduce as node {request.node_id!r} needs that node's certificate; "
                   f"the caller's names {caller}")
    return refusal


def _refuse_unauthorized(authorize: Authorize, context: grpc.aio.ServicerContext,
                         request: ProtoMessage, method_name: str) -> None:
    caller = grpc_identity(context)
    refusal = authorize(caller, request)
    if refusal is not None:
        log.warning("refused a call: %s", refusal, extra={
            "method": method_name, "caller": str(caller) if caller else "none",
            "peer": context.peer(), "reason": refusal})
        raise _Reject(grpc.StatusCode.PERMISSION_DENIED, refusal)


def _handler(parse: type[ProtoMessage], method: Callable[..., Awaitable[ProtoMessage]],
             tracing: bool = False, forwardable: bool = False,
             authorize: Authorize | None = None) -> grpc.RpcMethodHandler:
    """A unary handler taking raw bytes, so bad payloads get INVALID_ARGUMENT with a reason.
    `forwardable` methods get the caller's deadline and whether the call was forwarded.
    `authorize` (TLS ports only) may refuse the caller with PERMISSION_DENIED."""

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if tracing:
            received_ns.set(now_ns())
        request = None
        try:
            try:
                request = parse.FromString(raw)
            except (DecodeError, ValueError) as exc:
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                              f"request is not a valid {parse.DESCRIPTOR.full_name} protobuf: {exc}"
                              ) from None
            if authorize is not None:
                _refuse_unauthorized(authorize, context, request, parse.DESCRIPTOR.name)
            if forwardable:
                response = await method(request, *_call_info(context))
            else:
                response = await method(request)
            return response.SerializeToString()
        except _Reject as rej:
            refusal = (rej.code, rej.message, rej.metadata)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("unexpected error serving a request")
            refusal = (grpc.StatusCode.INTERNAL,
                       "internal error on the node; see its log; outcome unknown",
                       (("kv-outcome", "unknown"),))
        # Abort outside the except clause, with the request dropped: an abort raised in
        # it chains the refusal (its traceback, the frames, the request and its value) to
        # gRPC's AbortError, and that chain outlived the call: each refused 16 MiB put
        # left the node about 50 MiB larger for good.
        del raw, request
        code, message, metadata = refusal
        await context.abort(code, message, trailing_metadata=metadata)
        raise AssertionError("unreachable")

    return grpc.unary_unary_rpc_method_handler(handle)


class _Outbox:
    """The answers of one session stream: one write at a time (gRPC allows no more), the
    answers that finish meanwhile leave right after it, in the order they finished."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._queue: collections.deque[bytes] = collections.deque()
        self._writing = False
        self._writer: asyncio.Task[None] | None = None  # started by `post`
        # Set once the other side sent a batch: it reads batches, so the answers that
        # queue during a write leave as one message (see SessionBatch).
        self.batching = False

    async def send(self, data: bytes) -> None:
        """Write `data` from a task of the caller's, or leave it to the one writing now."""
        self._queue.append(data)
        if self._writing:
            return  # the task writing now takes it
        self._writing = True
        await self._write_queued()

    def post(self, data: bytes) -> None:
        """The same from a callback, which cannot await: a writer task is started if none
        is writing."""
        self._queue.append(data)
        if not self._writing:
            self._writing = True
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())

    async def _write_queued(self) -> None:
        try:
            while self._queue:
                await self._context.write(take_batch(self._queue, kv_pb2.SessionResponse)
                                          if self.batching else self._queue.popleft())
        finally:
            self._writing = False

    async def flush(self) -> None:
        """Wait for the writer task `post` started, if any (its error is the stream's)."""
        if self._writer is not None:
            await self._writer

    def abandon(self) -> None:
        """The stream is over: stop writing, and retrieve the writer's error if it had one
        (nobody else will)."""
        self._queue.clear()
        if self._writer is not None:
            if self._writer.done():
                if not self._writer.cancelled():
                    self._writer.exception()
            else:
                self._writer.cancel()


def _session_error(rej: _Reject) -> kv_pb2.SessionError:
    metadata = dict(rej.metadata)
    return kv_pb2.SessionError(
        code=rej.code.value[0], message=rej.message, outcome=metadata.get("kv-outcome", ""),
        leader_id=metadata.get("leader-id", ""), leader_address=metadata.get("leader-address", ""))


def _session_handler(kv: KVService, tracing: bool) -> grpc.RpcMethodHandler:
    """KV.Session: requests on one long-lived stream, served concurrently (a slow write
    does not hold up the reads behind it), answers tagged with their seq. On the leader a
    put, delete or linearizable get is answered in the callback of its proposal or
    ReadIndex round; every other request is served in a task of its own."""
    methods = {"put": kv.put, "get": kv.get, "delete": kv.delete}

    async def serve_one(request: kv_pb2.SessionRequest, outbox: _Outbox, forwarded: bool
                        ) -> None:
        if tracing:
            received_ns.set(now_ns())
        which = request.WhichOneof("request")
        response = kv_pb2.SessionResponse(seq=request.seq)
        try:
            if which is None:
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT,
                              "session request carries no put, get or delete")
            timeout_s = request.timeout_ms / 1000 if request.timeout_ms else None
            answer = await methods[which](getattr(request, which), timeout_s, forwarded)
            getattr(response, which).CopyFrom(answer)
        except _Reject as rej:
            response.error.CopyFrom(_session_error(rej))
        except Exception:
            log.exception("unexpected error serving a session request")
            response.error.CopyFrom(kv_pb2.SessionError(
                code=grpc.StatusCode.INTERNAL.value[0], outcome="unknown",
                message="internal error on the node; see its log; outcome unknown"))
        await outbox.send(response.SerializeToString())

    async def session(request_iterator, context: grpc.aio.ServicerContext) -> None:  # noqa: ANN001
        outbox = _Outbox(context)
        _, forwarded = _call_info(context)  # a follower's forwarding stream: one hop only
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()
        # Linearizable gets the leader answers in their ReadIndex round's callback, without
        # a task each: a task per request cost the leader up to a fifth of its loop's CPU
        # per read (0.136-0.146 -> 0.111-0.115 ms in one A/B at 64 clients).
        rounds: set[asyncio.Future[int]] = set()
        # Puts and deletes the leader proposes at once and answers in their result's
        # callback, for the same reason.
        writes: set[asyncio.Future] = set()

        def serve_in_task(request: kv_pb2.SessionRequest) -> None:
            task = loop.create_task(serve_one(request, outbox, forwarded))
            pending.add(task)
            task.add_done_callback(pending.discard)

        def answer_read(request: kv_pb2.SessionRequest, round_: asyncio.Future[int]) -> None:
            rounds.discard(round_)
            if round_.cancelled():
                return  # the stream ended
            if (round_.exception() is not None
                    or kv.node.state_machine.applied_index < round_.result()):
                # Leadership lost (the general path forwards or refuses), or the state is
                # behind the read index (it waits): take the general path from the start.
                serve_in_task(request)
                return
            # In the round's callback, no await between the barrier and the read.
            answer = kv.read_local(request.get.key, stale=False)
            outbox.post(kv_pb2.SessionResponse(seq=request.seq, get=answer).SerializeToString())

        def answer_write(request: kv_pb2.SessionRequest, which: str, write: asyncio.Future
                         ) -> None:
            writes.discard(write)
            if write.cancelled():
                return  # the stream ended
            try:
                response = kv.write_answer(request.seq, which, write)
            except Exception:
                log.exception("unexpected error answering a session write")
                response = kv_pb2.SessionResponse(seq=request.seq, error=kv_pb2.SessionError(
                    code=grpc.StatusCode.INTERNAL.value[0], outcome="unknown",
                    message="internal error on the node; see its log; outcome unknown"))
            outbox.post(response.SerializeToString())

        def take(raw: bytes, nested: bool = False) -> None:
            try:
                request = kv_pb2.SessionRequest.FromString(raw)
            except (DecodeError, ValueError) as exc:
                refuse(f"request is not a valid manyasone.kv.SessionRequest protobuf: {exc}")
                return
            which = request.WhichOneof("request")
            if which == "batch":
                if nested:
                    refuse("a session batch inside a batch; batches are never nested",
                           request.seq)
                    return
                outbox.batching = True  # the sender reads batched answers too
                for frame in request.batch.frames:
                    take(frame, nested=True)
                return
            if which == "get":
                round_ = kv.start_linearizable_get(request.get)
                if round_ is not None:
                    rounds.add(round_)
                    round_.add_done_callback(functools.partial(answer_read, request))
                    return
            elif which is not None:
                if tracing:
                    received_ns.set(now_ns())
                write = kv.start_write(which, getattr(request, which))
                if write is not None:
                    writes.add(write)
                    write.add_done_callback(functools.partial(answer_write, request, which))
                    return
            serve_in_task(request)

        def refuse(message: str, seq: int = 0) -> None:
            rej = _Reject(grpc.StatusCode.INVALID_ARGUMENT, message)
            outbox.post(kv_pb2.SessionResponse(seq=seq, error=_session_error(rej))
                        .SerializeToString())

        try:
            async for raw in request_iterator:
                take(raw)
            # The client is done sending: answer everything it sent before the stream ends.
            while pending or rounds or writes:
                await asyncio.gather(*pending, *rounds, *writes, return_exceptions=True)
            await outbox.flush()
        finally:
            for task in pending:
                task.cancel()
            for future in (*rounds, *writes):
                future.cancel()
            outbox.abandon()

    return grpc.stream_stream_rpc_method_handler(session)


def build_server(node: Node) -> grpc.aio.Server:
    """A gRPC server carrying both services of `node`, bound to its listen address."""
    from system.kv.proto import raft_pb2_grpc

    # The port reads no message larger than the largest legal request: gRPC refuses a
    # larger one from its length, before reading it (system/kv/limits.py); peers send
    # their batches here in pieces below that limit (transport.batch_pieces).
    limit = request_limit_bytes(node.config.max_value_bytes, node.config.max_key_bytes)
    options = [(k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.max_receive_message_length"]
    server = grpc.aio.server(options=[*options, *SERVER_OPTIONS,
                                      ("grpc.max_receive_message_length", limit)])
    kv = KVService(node)
    tracing = node.trace is not None
    secure = node.config.tls is not None
    handlers = {
        "Put": _handler(kv_pb2.PutRequest, kv.put, tracing=tracing, forwardable=True),
        "Get": _handler(kv_pb2.GetRequest, kv.get, forwardable=True),
        "Delete": _handler(kv_pb2.DeleteRequest, kv.delete, forwardable=True),
        "Session": _session_handler(kv, tracing),
        "Status": _handler(kv_pb2.StatusRequest, kv.status),
        "ChangeMembership": _handler(kv_pb2.ChangeMembershipRequest, kv.change_membership,
                                     authorize=admin_only if secure else None),
        "Introduce": _handler(kv_pb2.IntroduceRequest, kv.introduce,
                              authorize=introducing_node if secure else None),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(KV_SERVICE, handlers),))
    peer = PeerService(node.config.node_id, node.is_known_peer, node.deliver,
                       require_identity=secure)
    raft_pb2_grpc.add_RaftPeerServicer_to_server(peer, server)
    try:
        if secure:
            # Client certificates always required: grpc cannot ask for an optional one,
            # and nodes identify themselves here (Introduce, Raft over gRPC).
            port = server.add_secure_port(node.config.listen_address, grpc_server_credentials(
                node.config.tls.client, require_client_auth=True))
        else:
            port = server.add_insecure_port(node.config.listen_address)
    except RuntimeError:  # grpc >= 1.50 raises where older versions returned 0
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {node.config.listen_address}: address in use or invalid")
    return server
