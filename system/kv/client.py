"""Client library of the KV store: `KVClient([addresses])` with put, get, delete and cas.

What it does: finds the leader (following the "leader-address" hint a follower returns),
retries on another node when one cannot serve, and gives every call one deadline. Every
write carries a request id — the caller's, or one generated as "<client id>:<counter>" —
and EVERY retry of that write reuses it, so the store applies it at most once
(docs/kv-node.md, "request ids").

Outcomes, as the harness needs them (Jepsen's ok / fail / info):
- a return value: the operation happened (ok);
- `CasMismatch(current_version)`, `NotFound`, `InvalidArgument`: it certainly did not
  change anything (fail);
- `Unavailable`: no node could take it before the deadline and no attempt could have
  applied it (fail);
- `Indeterminate`: at least one attempt may have applied (timeout, broken connection,
  leader lost mid-write) and no later attempt settled it (info). Retrying the same call
  with the same `request_id` is safe and settles it.
- `PermissionDenied` (a TLS cluster refused this client's certificate for the call) and
  `TlsFailure` (the handshake failed: plaintext to a TLS node, a CA that does not match,
  a certificate that does not name the node or has expired): nothing was applied; the
  message says what to check. Raised at once: retrying cannot mend a certificate.

What it must never do: retry a write under a new request id, or report "certainly failed"
for a write that might have applied. Not thread-safe per instance beyond gRPC's own
channel safety: share one client between threads only if they use distinct request ids
(the generated ones are).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from system.kv.limits import value_limit_of_refusal
from system.kv.proto import kv_pb2, kv_pb2_grpc
from system.kv.session import Session, error_of
from system.kv.tls import TlsFiles, grpc_channel_credentials, open_channel
from system.kv.tls_failure import explain
from system.kv.transport import CHANNEL_OPTIONS

if TYPE_CHECKING:
    from system.kv.unsafe import ClientNewRequestId

# One attempt's default timeout: short enough that a paused leader costs about an election
# timeout, not the whole deadline; plus transfer time for large values.
ATTEMPT_TIMEOUT_S = 0.5
ATTEMPT_BYTES_PER_S = 2 * 1024 * 1024  # generous: a loaded 2-core machine moves a 64 MiB put in 2-10 s
_U64_MAX = 2**64 - 1
# Values above this go as unary calls: on the shared stream a large message would hold up
# every request behind it, and next to its transfer the cost of a call does not matter
# (1 MiB puts measured no faster on the stream, docs/benchmarks.md).
SESSION_MAX_PAYLOAD_BYTES = 256 * 1024


def _check_expected_version(expected_version: object) -> None:
    if expected_version is None:
        return
    if isinstance(expected_version, bool) or not isinstance(expected_version, int):
        raise InvalidArgument(f"expected_version must be an int or None, got "
                              f"{type(expected_version).__name__}")
    if not 0 <= expected_version <= _U64_MAX:
        raise InvalidArgument(f"expected_version must be in 0..2**64-1 (0 = must not exist), "
                              f"got {expected_version}")


def _utf8(text: str, name: str) -> bytes:
    """`text` as UTF-8, or InvalidArgument: a lone surrogate (e.g. from a mis-decoded file
    name) has no UTF-8 form, and protobuf would raise UnicodeEncodeError mid-call."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{name} is not valid Unicode: {exc.reason} at character "
                              f"{exc.start} ({text[exc.start:exc.end]!r}); give UTF-8 text") from None


def _check_request_id(request_id: object) -> None:
    if request_id is None:
        return
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument(f"request_id must be a non-empty str or None, got {request_id!r}")
    if len(_utf8(request_id, "request_id")) > 256:
        raise InvalidArgument("request_id is longer than 256 bytes (UTF-8); use a shorter id")


def _check_timeout(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")


class KVError(Exception):
    """Base of the client's typed errors."""


class CasMismatch(KVError):
    """The compare-and-swap did not match: nothing changed. `current_version` is the key's
    version when the write was applied in log order (0 = absent)."""

    def __init__(self, key: str, expected_version: int, current_version: int,
                 node_id: str = "") -> None:
        super().__init__(f"compare-and-swap on {key!r} expected version {expected_version}, "
                         f"found {current_version}")
        self.key = key
        self.expected_version = expected_version
        self.current_version = current_version
        self.node_id = node_id  # the node that answered


class DeleteVersionMismatch(CasMismatch):
    """A delete with `expected_version` found another version: nothing was deleted."""

    def __init__(self, key: str, expected_version: int, current_version: int,
                 node_id: str = "") -> None:
        super().__init__(key, expected_version, current_version, node_id)
        found = "the key does not exist" if current_version == 0 else (
            f"the key is at version {current_version}")
        self.args = (f"delete of {key!r} refused: expected version {expected_version}, but "
                     f"{found}; nothing was deleted",)


class NotFound(KVError):
    """The key does not exist."""

    def __init__(self, key: str, node_id: str = "", applied_index: int | None = None) -> None:
        super().__init__(f"key {key!r} not found")
        self.key = key
        self.node_id = node_id  # the node that answered
        self.applied_index = applied_index  # its state's index when it answered, if told


class InvalidArgument(KVError):
    """The request was refused as malformed (the message says what and the limit)."""


class Unavailable(KVError):
    """No node could serve the request before the deadline; certainly not applied."""


class TlsFailure(Unavailable):
    """The TLS handshake with a node failed for a reason of certificates (or TLS on one
    side only); nothing was sent. The message names the node and what to check."""


class PermissionDenied(KVError):
    """The node verified this client's certificate and refused it this call (e.g. a
    membership change without the admin role); the message is the node's reason."""


class Indeterminate(KVError):
    """The write may or may not have applied; retry with the same request id to settle it."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(f"{message} (request id {request_id!r}; outcome unknown)")
        self.request_id = request_id


@dataclass(frozen=True)
class WriteResult:
    version: int  # the key's version after the write (for delete: the version it had)
    node_id: str  # node that answered
    term: int
    applied_index: int
    request_id: str


@dataclass(frozen=True)
class DeleteResult:
    existed: bool
    version: int  # version the key had before the delete (0 if it did not exist)
    node_id: str
    term: int
    applied_index: int
    request_id: str


@dataclass(frozen=True)
class GetResult:
    value: bytes
    version: int
    stale: bool  # True when served without the ReadIndex barrier (consistency="stale")
    node_id: str
    applied_index: int  # the answer reflects the node's state after this log index


class _Attempt:
    """Outcome of one RPC attempt, classified."""

    def __init__(self, error: grpc.RpcError) -> None:
        self.code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        self.details = error.details() if hasattr(error, "details") else str(error)
        metadata = {}
        if hasattr(error, "trailing_metadata"):
            for key, value in error.trailing_metadata() or ():
                metadata[key] = value
        self.outcome = metadata.get("kv-outcome", "")
        self.leader_id = metadata.get("leader-id", "")
        self.leader_address = metadata.get("leader-address", "")

    @property
    def from_server(self) -> bool:
        return bool(self.outcome)

    @property
    def never_sent(self) -> bool:
        # gRPC fails fast with UNAVAILABLE when it could not connect: nothing was sent.
        text = (self.details or "").lower()
        return self.code == grpc.StatusCode.UNAVAILABLE and not self.from_server and (
            "failed to connect" in text or "connection refused" in text
            or "name resolution" in text)


class KVClient:
    """A client of one KV cluster. `addresses` are the nodes' host:port (any order), or a
    mapping node id -> host:port. With the mapping, a follower's hint is followed by the
    leader's id, not by the address the leader advertises to its peers — which a client
    outside the nodes' network (a Docker bridge, a proxy per link) may not be able to reach.

    Requests travel on one long-lived `Session` stream per node, shared by the client's
    threads (values above 256 KiB as unary calls); a node that does not offer the stream is
    spoken to with unary calls, as is every node when `session=False`. Both paths give the
    same answers and errors.

    `timeout_s` bounds each call (all attempts together); `attempt_timeout_s` bounds one
    attempt, so a paused or partitioned node costs at most that before the client tries
    the NEXT node with the same request id (default: 0.5 s plus 1 s per 2 MiB of payload,
    doubled after each attempt that timed out, never more than what remains of the
    call); `retries` bounds the attempts (100: while an election goes on, nodes answer
    "no leader known" at once, and 20 quick attempts ran out long before a 10 s
    deadline on a loaded machine — the deadline is the bound that matters). Arguments
    are checked before anything is sent (InvalidArgument naming the field); keys longer
    than `max_key_bytes` (UTF-8; the node's default limit) are refused here too.

    `tls`: this client's certificate, key and the cluster's CA, for a cluster started with
    certificates (mutual TLS; each node's certificate must name the address dialled). The
    files are read here: TlsError now, not at the first call.
    """

    def __init__(self, addresses: Sequence[str] | Mapping[str, str], *, timeout_s: float = 5.0,
                 retries: int = 100, attempt_timeout_s: float | None = None,
                 client_id: str | None = None, max_key_bytes: int = 1024,
                 session: bool = True, unsafe: ClientNewRequestId | None = None,
                 tls: TlsFiles | None = None) -> None:
        if not addresses:
            raise ValueError("KVClient needs at least one node address")
        _check_timeout("timeout_s", timeout_s)
        if attempt_timeout_s is not None:
            _check_timeout("attempt_timeout_s", attempt_timeout_s)
        self.max_key_bytes = max_key_bytes
        self.node_addresses: dict[str, str] = (
            dict(addresses) if isinstance(addresses, Mapping) else {})
        self.addresses = list(dict.fromkeys(
            addresses.values() if isinstance(addresses, Mapping) else addresses))
        self.timeout_s = timeout_s
        self.retries = retries
        self.attempt_timeout_s = attempt_timeout_s
        self.client_id = client_id or uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, kv_pb2_grpc.KVStub] = {}
        self.use_session = session
        self._sessions: dict[str, Session] = {}
        self._unary_only: set[str] = set()  # nodes that answered UNIMPLEMENTED to Session
        self._leader: str | None = None
        self._next = 0
        # Test-only: a client-library canary (system/kv/unsafe.py); None in every real use.
        self.unsafe = unsafe
        self.tls = tls
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None

    # ----- public API ------------------------------------------------------------------

    def new_request_id(self) -> str:
        with self._lock:
            return f"{self.client_id}:{next(self._counter)}"

    def put(self, key: str, value: bytes, *, expected_version: int | None = None,
            request_id: str | None = None, timeout_s: float | None = None) -> WriteResult:
        """Write `value` at `key`; with `expected_version` it is a compare-and-swap
        (0 = must not exist) and raises CasMismatch when it does not match."""
        self._check_key(key)
        if value is None:
            raise InvalidArgument("value is None; pass bytes (b'' for an empty value)")
        if not isinstance(value, bytes):
            raise InvalidArgument(f"value must be bytes, got {type(value).__name__}")
        _check_expected_version(expected_version)
        _check_request_id(request_id)
        _check_timeout("timeout_s", timeout_s)
        rid = request_id or self.new_request_id()
        request = kv_pb2.PutRequest(key=key, value=value, request_id=rid)
        if expected_version is not None:
            request.expected_version = expected_version
        response = self._call("put", request, write=True,
                              request_id=rid, timeout_s=timeout_s, payload_bytes=len(value))
        if not response.applied:
            raise CasMismatch(key, expected_version if expected_version is not None else -1,
                              response.version, response.header.node_id)
        h = response.header
        return WriteResult(response.version, h.node_id, h.term, h.applied_index, rid)

    def cas(self, key: str, value: bytes, expected_version: int, *, request_id: str | None = None,
            timeout_s: float | None = None) -> WriteResult:
        """Compare-and-swap: write only if the key's version is `expected_version`."""
        return self.put(key, value, expected_version=expected_version, request_id=request_id,
                        timeout_s=timeout_s)

    def delete(self, key: str, *, expected_version: int | None = None,
               request_id: str | None = None, timeout_s: float | None = None) -> DeleteResult:
        """Delete `key`. Deleting a missing key succeeds with existed=False, unless
        `expected_version` is set and does not match (CasMismatch)."""
        self._check_key(key)
        _check_expected_version(expected_version)
        _check_request_id(request_id)
        _check_timeout("timeout_s", timeout_s)
        rid = request_id or self.new_request_id()
        request = kv_pb2.DeleteRequest(key=key, request_id=rid)
        if expected_version is not None:
            request.expected_version = expected_version
        response = self._call("delete", request, write=True,
                              request_id=rid, timeout_s=timeout_s)
        if not response.applied:
            raise DeleteVersionMismatch(
                key, expected_version if expected_version is not None else -1, response.version,
                response.header.node_id)
        h = response.header
        return DeleteResult(response.existed, response.version, h.node_id, h.term,
                            h.applied_index, rid)

    def get(self, key: str, *, consistency: str = "linearizable",
            timeout_s: float | None = None, via: str | None = None) -> GetResult:
        """Read `key`. "linearizable" (default) goes through the leader's ReadIndex barrier;
        "stale" is served by whichever node answers and may lag (see applied_index).
        `via` (a node id of the address map, or an address) is asked first, as a client
        bound to its nearest node would (a follower sends a linearizable read on to the
        leader's hint). Raises NotFound when the key does not exist."""
        self._check_key(key)
        _check_timeout("timeout_s", timeout_s)
        levels = {"linearizable": kv_pb2.LINEARIZABLE, "stale": kv_pb2.STALE}
        if consistency not in levels:
            raise InvalidArgument(f"consistency must be 'linearizable' or 'stale', got {consistency!r}")
        request = kv_pb2.GetRequest(key=key, consistency=levels[consistency])
        response = self._call("get", request, write=False,
                              request_id="", timeout_s=timeout_s,
                              any_node=consistency == "stale",
                              first=self.node_addresses.get(via, via) if via else None)
        if not response.found:
            raise NotFound(key, response.header.node_id, response.header.applied_index)
        return GetResult(response.value, response.version, response.stale,
                         response.header.node_id, response.header.applied_index)

    def status(self, address: str, timeout_s: float = 1.0) -> kv_pb2.StatusResponse:
        return self._stub(address).Status(kv_pb2.StatusRequest(), timeout=timeout_s)

    def close(self) -> None:
        # Under the lock: another thread of the caller may be opening a channel right now
        # (a coordinator closed its client while its lease thread still called: "dictionary
        # changed size during iteration", and the process exited 1 instead of stepping down).
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            channels, self._channels = list(self._channels.values()), {}
            self._stubs = {}
        for session in sessions:
            session.close()
        for channel in channels:
            channel.close()

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- retries ---------------------------------------------------------------------

    def _stub(self, address: str) -> kv_pb2_grpc.KVStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = open_channel(address, self._credentials, CHANNEL_OPTIONS)
                self._channels[address] = channel
                stub = self._stubs[address] = kv_pb2_grpc.KVStub(channel)
            return stub

    def _raise_tls_failure(self, address: str, details: str) -> None:
        """TlsFailure when a connection that was never made failed for a reason of
        certificates (or TLS on one side only); else nothing: the node is down, retry."""
        reason = explain(address, details, self.tls)
        if reason:
            raise TlsFailure(f"TLS handshake with {address} failed: {reason}")

    def _check_key(self, key: object) -> None:
        if not isinstance(key, str):
            raise InvalidArgument(f"key must be a str, got {type(key).__name__}")
        if not key:
            raise InvalidArgument("key is empty; give a non-empty key")
        size = len(_utf8(key, "key"))
        if size > self.max_key_bytes:
            raise InvalidArgument(
                f"key is {size} bytes long; the limit is {self.max_key_bytes} bytes (UTF-8)")

    def _too_large(self, details: str, payload_bytes: int) -> str:
        """The error of a request gRPC refused for its size: the store's own words for a
        value over the limit when a node's port refused it unread."""
        limit = value_limit_of_refusal(details, self.max_key_bytes)
        if limit is None:
            return f"request too large for the transport: {details}"
        return (f"value is {payload_bytes} bytes; the limit is {limit} bytes (node flag "
                f"--max-value-bytes); the node refused the request unread")

    def _pick(self, hint: str | None, avoid: dict[str, float] | None = None) -> str:
        """Where the next attempt goes: the hint, else the known leader, else the next
        node in turn -- skipping nodes that timed out during this call (`avoid`: address
        -> until when), as long as another node is left to try."""
        now = time.monotonic()
        avoided = {a for a, until in (avoid or {}).items() if until > now}
        with self._lock:
            if hint and hint not in avoided:
                return hint
            if self._leader is not None and self._leader not in avoided:
                return self._leader
            for _ in range(len(self.addresses)):
                address = self.addresses[self._next % len(self.addresses)]
                self._next += 1
                if address not in avoided:
                    return address
            address = self.addresses[self._next % len(self.addresses)]
            self._next += 1
            return address

    def _session(self, address: str) -> Session:
        self._stub(address)  # the channel
        with self._lock:
            session = self._sessions.get(address)
            if session is None or session.failure is not None:
                session = self._sessions[address] = Session(self._channels[address])
            return session

    def _invoke(self, address: str, kind: str, request: Any, timeout_s: float,
                payload_bytes: int) -> Any:
        """One attempt of `kind` ("put", "get", "delete") at `address`: on the node's
        session stream when it has one, else a unary call. Raises grpc.RpcError."""
        if (self.use_session and address not in self._unary_only
                and payload_bytes <= SESSION_MAX_PAYLOAD_BYTES):
            frame = kv_pb2.SessionRequest()
            getattr(frame, kind).CopyFrom(request)
            try:
                answer = self._session(address).call(frame, timeout_s)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                with self._lock:  # nothing was served: ask again the unary way
                    self._unary_only.add(address)
            else:
                if answer.WhichOneof("response") == "error":
                    raise error_of(answer.error)
                return getattr(answer, kind)
        method = getattr(self._stub(address), kind.capitalize())
        return method(request, timeout=timeout_s)

    def _call(self, kind: str, request: Any, *, write: bool,
              request_id: str, timeout_s: float | None, any_node: bool = False,
              payload_bytes: int = 0, first: str | None = None) -> Any:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        maybe_applied = False  # some attempt of this write may have taken effect
        last = "no attempt made"
        hint: str | None = first
        backoff_s = 0.01
        per_attempt_s = (self.attempt_timeout_s if self.attempt_timeout_s is not None
                         else ATTEMPT_TIMEOUT_S + payload_bytes / ATTEMPT_BYTES_PER_S)
        avoid: dict[str, float] = {}  # nodes that timed out in this call -> until when
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            address = self._pick(hint, avoid)
            hint = None
            if self.unsafe is not None and maybe_applied:
                request.request_id = self.unsafe.retry_request_id(self.new_request_id,
                                                                request.request_id)
            try:
                response = self._invoke(address, kind, request, min(remaining, per_attempt_s),
                                        payload_bytes)
            except grpc.RpcError as exc:
                result = _Attempt(exc)
                last = f"{address}: {result.code.name}: {result.details}"
                if result.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    # Paused, partitioned or overloaded: the retry (same request id) goes
                    # to the next node; hints naming this one are ignored for a while.
                    # The next attempts get twice as long: an answer that is merely slow
                    # (a large value on a loaded machine) must still get through.
                    avoid[address] = time.monotonic() + 2 * per_attempt_s
                    per_attempt_s *= 2
                if result.code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(result.details) from None
                if result.code == grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionDenied(f"{address} refused: {result.details}") from None
                if result.never_sent:
                    self._raise_tls_failure(address, result.details)
                if result.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not result.from_server:
                    # gRPC itself refused the message: the node's port, unread, because it
                    # is over what --max-value-bytes allows (system/kv/limits.py), or this
                    # channel (over 256 MiB). Nothing was applied.
                    raise InvalidArgument(self._too_large(result.details, payload_bytes)
                                          ) from None
                if result.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    pass  # the node's rate limit: certainly not applied; back off and retry
                elif result.from_server and result.outcome == "not-applied":
                    hinted = self.node_addresses.get(result.leader_id) or (
                        "" if self.node_addresses else result.leader_address)
                    if (hinted and hinted != address
                            and avoid.get(hinted, 0.0) <= time.monotonic()):
                        # (a hint naming a node that just timed out is stale: the cluster
                        # is electing; wait and ask around instead)
                        hint = hinted
                elif result.never_sent:
                    pass
                else:
                    # Timeout, broken connection, "unknown" from the server: may have applied.
                    maybe_applied = maybe_applied or write
                with self._lock:
                    if self._leader == address:
                        self._leader = None
                    if hint:
                        self._leader = hint
                if hint is None and attempt > 0:
                    time.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))
                    backoff_s = min(backoff_s * 2, 0.2)
                continue
            if not any_node:
                with self._lock:
                    self._leader = address
            return response
        if maybe_applied:
            raise Indeterminate(f"write not confirmed before the deadline; last error {last}",
                                request_id)
        raise Unavailable(f"no node could serve the request before the deadline; last error {last}")
