"""The kv workload's client for etcd v3: the surface and outcomes of our KVClient
(system/kv/client.py), over etcd's gRPC API (nemesis/systems/etcd/proto/etcd.proto).

Mapping (etcd's per-key `version` is our store's version: 1 on creation, +1 per write,
0 once deleted, so the versioned-kv model checks etcd unchanged):
- get, linearizable: Range with serializable=false (etcd confirms it through the leader);
  get, stale: Range with serializable=true (the member's local state);
- put: Put with prev_kv, the new version being the previous one + 1 (1 when absent);
- put with expected_version: Txn(if version(key) == expected then Put(prev_kv) else
  Range(key)): a failed compare reports the current version from the same transaction;
- delete (with or without expected_version) the same way with DeleteRange(prev_kv).

Outcomes, as the harness needs them:
- a result: applied; `CasMismatch` / `DeleteVersionMismatch` (current version) and
  `NotFound`: answered, nothing changed;
- `Unavailable`: certainly not applied — no member could be reached before the deadline,
  or every member that answered refused the request before proposing it (`NOT_APPLIED`);
- `Indeterminate`: a write was sent and no answer settles it (a timeout, a connection lost
  after sending, etcd's "request timed out", any error not known to be refused before
  proposing). etcd has no request ids, so a write is NEVER retried once it may have been
  sent: a second try of a put that did apply would apply twice (two versions for one
  operation), and a second try of a compare-and-swap that did apply would report a
  mismatch. `request_id` is accepted for the history's sake and sent nowhere.
- `InvalidArgument`: refused as malformed (etcd's "request is too large"), not applied.
- `TlsFailure`: the TLS handshake failed for a reason of certificates; one line says which.

Which etcd errors prove "not applied" (etcd 3.4, etcdserver/v3_server.go,
api/v3rpc/interceptor.go and rpctypes/error.go): the interceptor's refusals run before the
request is handled at all ("no leader" — only because we send the require-leader metadata
etcd's own client sends —, "rpc not supported for learner", "not capable"); "too many
requests" and "request is too large" are checked before proposing; "raft proposal dropped"
is raft refusing to append (no leader known, a leader transfer in progress); "database
space exceeded" is the quota check before proposing or a capped applier that refuses
every put. Everything after the proposal — "request timed out" (all three forms), "server
stopped", a deadline, a lost connection — may have been applied. "leader changed" only
ends linearizable reads in 3.4; on a write it would be treated as unknown.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

import grpc
from grpc._cython import cygrpc

from nemesis.systems.etcd.proto import etcd_pb2, etcd_pb2_grpc
from system.kv.client import (
    CasMismatch,
    DeleteResult,
    DeleteVersionMismatch,
    GetResult,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TlsFailure,
    Unavailable,
    WriteResult,
)
from system.kv.tls import TlsFiles, grpc_channel_credentials, open_channel
from system.kv.tls_failure import explain

__all__ = [
    "CasMismatch", "DeleteResult", "DeleteVersionMismatch", "EtcdClient", "GetResult",
    "Indeterminate", "InvalidArgument", "NotFound", "PermissionDenied", "TlsFailure",
    "Unavailable", "WriteResult", "outcome_of",
]

# etcd's messages that prove the request was refused before it was proposed (see above).
NOT_APPLIED = (
    "etcdserver: no leader",
    "etcdserver: rpc not supported for learner",
    "etcdserver: not capable",
    "etcdserver: too many requests",
    "raft proposal dropped",
    "etcdserver: mvcc: database space exceeded",
)
INVALID = ("etcdserver: request is too large", "etcdserver: key is not provided")
# Sent on writes and linearizable reads, as etcd's Go client does (WithRequireLeader): a
# member that knows no leader refuses at once, before proposing, instead of holding the
# request until its own timeout.
REQUIRE_LEADER = (("hasleader", "true"),)
CONNECT_TIMEOUT_S = 0.5  # one member's connection attempt, doubled per round; a paused
# or cut member costs this, then the next member is tried
READ_ATTEMPT_TIMEOUT_S = 1.0  # a read is retried elsewhere after this (doubled per round)
_INT64_MAX = 2**63 - 1
_READY = cygrpc.ConnectivityState.ready
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),  # gRPC must never send a write a second time
)


def outcome_of(code: grpc.StatusCode, details: str) -> str:
    """What an error from a member says about a request it got: "not-applied" (refused
    before proposing, or never sent), "invalid" (malformed: not applied, do not retry),
    "denied" (permission), or "unknown" (may have been applied)."""
    text = details or ""
    if any(message in text for message in INVALID):
        return "invalid"
    if any(message in text for message in NOT_APPLIED):
        return "not-applied"
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return "denied"
    lowered = text.lower()
    if code == grpc.StatusCode.UNAVAILABLE and (
            "failed to connect" in lowered or "connection refused" in lowered
            or "name resolution" in lowered):
        return "not-applied"  # gRPC could not connect: nothing was sent
    return "unknown"


def _check_key(key: object) -> bytes:
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"key must be a non-empty str, got {key!r}")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"key is not valid Unicode: {exc.reason}") from None


def _check_expected(expected_version: object) -> None:
    if expected_version is None:
        return
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or not (
            0 <= expected_version <= _INT64_MAX):
        raise InvalidArgument(f"expected_version must be an int in 0..2**63-1 (etcd's "
                              f"versions are int64; 0 = must not exist), got {expected_version!r}")


def _version_compare(key: bytes, expected: int) -> etcd_pb2.Compare:
    # A missing key's version compares as 0, so expected 0 means "must not exist".
    return etcd_pb2.Compare(result=etcd_pb2.Compare.EQUAL, target=etcd_pb2.Compare.VERSION,
                            key=key, version=expected)


class EtcdClient:
    """A client of one etcd cluster. `addresses`: the members' client host:port, or a
    mapping member name -> host:port (names are then reported as `node_id`), preferred
    first. `timeout_s` bounds each call; `tls` is this client's certificate, key and the
    cluster's CA (mutual TLS, etcd's --client-cert-auth). Thread-safe: calls share one
    channel per member."""

    def __init__(self, addresses: Sequence[str] | Mapping[str, str], *, timeout_s: float = 5.0,
                 client_id: str | None = None, tls: TlsFiles | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        if not addresses:
            raise ValueError("EtcdClient needs at least one member address")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.node_addresses: dict[str, str] = (
            dict(addresses) if isinstance(addresses, Mapping) else {a: a for a in addresses})
        self._names = {address: name for name, address in self.node_addresses.items()}
        self.addresses = list(dict.fromkeys(self.node_addresses.values()))
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.client_id = client_id or uuid.uuid4().hex[:12]
        self.tls = tls
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._diagnosed: set[str] = set()  # members whose failed connection was explained
        self._preferred = self.addresses[0]

    # ----- public API ------------------------------------------------------------------

    def new_request_id(self) -> str:
        """An id for the history (etcd has no request ids: nothing is sent)."""
        return f"{self.client_id}:{next(self._counter)}"

    def get(self, key: str, *, consistency: str = "linearizable",
            timeout_s: float | None = None, via: str | None = None) -> GetResult:
        """Read `key` ("linearizable" or "stale"); NotFound when absent. `via`: a member
        name or address to ask first."""
        k = _check_key(key)
        if consistency not in ("linearizable", "stale"):
            raise InvalidArgument(f"consistency must be 'linearizable' or 'stale', got {consistency!r}")
        stale = consistency == "stale"
        request = etcd_pb2.RangeRequest(key=k, serializable=stale)
        first = self.node_addresses.get(via, via) if via else None
        address, response = self._call("Range", request, write=False, timeout_s=timeout_s,
                                        first=first, require_leader=not stale)
        node = self._names.get(address, address)
        if not response.kvs:
            raise NotFound(key, node, response.header.revision)
        kv = response.kvs[0]
        return GetResult(kv.value, kv.version, stale, node, response.header.revision)

    def put(self, key: str, value: bytes, *, expected_version: int | None = None,
            request_id: str | None = None, timeout_s: float | None = None) -> WriteResult:
        """Write `value`; with `expected_version` a compare-and-swap (0 = must not exist)
        raising CasMismatch with the current version when it does not match."""
        k = _check_key(key)
        if not isinstance(value, bytes):
            raise InvalidArgument(f"value must be bytes, got {type(value).__name__}")
        _check_expected(expected_version)
        rid = request_id or self.new_request_id()
        put = etcd_pb2.PutRequest(key=k, value=value, prev_kv=True)
        if expected_version is None:
            address, response = self._call("Put", put, write=True, timeout_s=timeout_s,
                                           request_id=rid)
            previous = response.prev_kv.version if response.HasField("prev_kv") else 0
            header = response.header
        else:
            txn = etcd_pb2.TxnRequest(
                compare=[_version_compare(k, expected_version)],
                success=[etcd_pb2.RequestOp(request_put=put)],
                failure=[etcd_pb2.RequestOp(request_range=etcd_pb2.RangeRequest(key=k))])
            address, response = self._call("Txn", txn, write=True, timeout_s=timeout_s,
                                           request_id=rid)
            header = response.header
            if not response.succeeded:
                raise CasMismatch(key, expected_version, _current(response),
                                  self._names.get(address, address))
            answer = response.responses[0].response_put
            previous = answer.prev_kv.version if answer.HasField("prev_kv") else 0
        # The new version from etcd's own answer: the version before this put, plus one.
        return WriteResult(previous + 1, self._names.get(address, address), header.raft_term,
                           header.revision, rid)

    def cas(self, key: str, value: bytes, expected_version: int, *, request_id: str | None = None,
            timeout_s: float | None = None) -> WriteResult:
        return self.put(key, value, expected_version=expected_version, request_id=request_id,
                        timeout_s=timeout_s)

    def delete(self, key: str, *, expected_version: int | None = None,
               request_id: str | None = None, timeout_s: float | None = None) -> DeleteResult:
        """Delete `key` (existed=False when absent); with `expected_version`, only at that
        version (DeleteVersionMismatch with the current version otherwise)."""
        k = _check_key(key)
        _check_expected(expected_version)
        rid = request_id or self.new_request_id()
        delete = etcd_pb2.DeleteRangeRequest(key=k, prev_kv=True)
        if expected_version is None:
            address, response = self._call("DeleteRange", delete, write=True,
                                           timeout_s=timeout_s, request_id=rid)
            answer, header = response, response.header
        else:
            txn = etcd_pb2.TxnRequest(
                compare=[_version_compare(k, expected_version)],
                success=[etcd_pb2.RequestOp(request_delete_range=delete)],
                failure=[etcd_pb2.RequestOp(request_range=etcd_pb2.RangeRequest(key=k))])
            address, response = self._call("Txn", txn, write=True, timeout_s=timeout_s,
                                           request_id=rid)
            header = response.header
            if not response.succeeded:
                raise DeleteVersionMismatch(key, expected_version, _current(response),
                                            self._names.get(address, address))
            answer = response.responses[0].response_delete_range
        version = answer.prev_kvs[0].version if answer.prev_kvs else 0
        return DeleteResult(answer.deleted > 0, version, self._names.get(address, address),
                            header.raft_term, header.revision, rid)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- attempts --------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, self._credentials, CHANNEL_OPTIONS)
                self._channels[address] = channel
            return channel

    def _connected(self, address: str, timeout_s: float) -> bool:
        """Whether the channel to `address` is (or gets, within `timeout_s`) connected:
        a request is only sent on a connected channel, so a member that cannot be reached
        costs a write nothing but time (it is certainly not applied there)."""
        channel = self._channel(address)
        raw = getattr(channel, "_channel", None)  # grpc's core channel
        if raw is None or not hasattr(raw, "watch_connectivity_state"):
            ready = grpc.channel_ready_future(channel)
            try:
                ready.result(timeout=timeout_s)
                return True
            except grpc.FutureTimeoutError:
                return False
            finally:
                ready.cancel()
        # Asked in this thread, not through channel_ready_future: its watcher thread
        # outlives the wait by up to 0.2 s and raises "Channel closed!" when the client
        # is closed meanwhile.
        deadline = time.time() + timeout_s
        state = raw.check_connectivity_state(True)
        while state != _READY:
            if time.time() >= deadline:
                return False
            raw.watch_connectivity_state(state, min(deadline, time.time() + 0.05))
            state = raw.check_connectivity_state(True)
        return True

    def _diagnose(self, address: str) -> None:
        """Once per member: why it could not be connected to, if it is about TLS (a
        plaintext client to a TLS member, a certificate refused): TlsFailure, one line.
        Asks Status (read-only) for gRPC's own error text."""
        if address in self._diagnosed:
            return
        self._diagnosed.add(address)
        stub = etcd_pb2_grpc.MaintenanceStub(self._channel(address))
        try:
            stub.Status(etcd_pb2.StatusRequest(), timeout=self.connect_timeout_s)
        except grpc.RpcError as exc:
            reason = explain(address, exc.details() or "", self.tls)
            if reason:
                raise TlsFailure(f"TLS handshake with etcd member {address} failed: {reason}") from None

    def _order(self, first: str | None) -> list[str]:
        start = first if first in self.addresses else self._preferred
        i = self.addresses.index(start)
        return self.addresses[i:] + self.addresses[:i]

    def _call(self, method: str, request: object, *, write: bool, timeout_s: float | None,
              request_id: str = "", first: str | None = None,
              require_leader: bool = True) -> tuple[str, object]:
        """(address that answered, response), trying the members in turn while an attempt
        certainly did not apply; a write that may have been sent and got no answer that
        settles it raises Indeterminate at once (never sent twice)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        order = self._order(first)
        metadata = REQUIRE_LEADER if require_leader else ()
        last = "no member tried"
        backoff_s = 0.02
        for attempt in itertools.count():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            round_no, position = divmod(attempt, len(order))
            if attempt and position == 0:  # a full round refused: let an election finish
                time.sleep(min(backoff_s, remaining))
                backoff_s = min(backoff_s * 2, 0.2)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
            address = order[position]
            scale = 2 ** min(round_no, 4)
            if not self._connected(address, min(remaining, self.connect_timeout_s * scale)):
                self._diagnose(address)
                last = f"{address}: could not connect"
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # A write gets the whole deadline: once sent, giving up early only turns an
            # answer into "unknown". A read is retried elsewhere after its attempt time.
            attempt_s = remaining if write else min(remaining, READ_ATTEMPT_TIMEOUT_S * scale)
            stub = etcd_pb2_grpc.KVStub(self._channel(address))
            try:
                response = getattr(stub, method)(request, timeout=attempt_s, metadata=metadata)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                verdict = outcome_of(code, details)
                last = f"{address}: {code.name} {details}"
                if verdict == "invalid":
                    raise InvalidArgument(f"etcd refused the request: {details}") from None
                if verdict == "denied":
                    raise PermissionDenied(f"etcd member {address} refused: {details}") from None
                if verdict == "not-applied":
                    if code == grpc.StatusCode.UNAVAILABLE:
                        reason = explain(address, details, self.tls)
                        if reason:
                            raise TlsFailure(f"TLS handshake with etcd member {address} "
                                             f"failed: {reason}") from None
                    continue
                if write:
                    raise Indeterminate(f"etcd write sent to {last}", request_id) from None
                continue  # a read changes nothing: ask another member
            self._preferred = address
            return address, response
        raise Unavailable(f"no etcd member could serve the request before the deadline; "
                          f"last error {last}")


def _current(response: etcd_pb2.TxnResponse) -> int:
    """The key's version from a failed transaction's Range (0: absent)."""
    kvs = response.responses[0].response_range.kvs if response.responses else ()
    return kvs[0].version if kvs else 0
