"""Membership changes of a running cluster, from outside: what `python -m system.kv member`
and the harness's `member` fault both call.

One change at a time, sent to the leader (followed through the "leader-address" hint of a
refusal), answered once committed and applied on the leader. A change the leader cannot
make yet — a learner not caught up, another change in flight, the leader's term not yet
committed — is retried until the deadline; a change it refuses for good is
`MembershipRefused`; bad arguments are `MembershipInvalid`; no answer in time is
`MembershipTimeout` (the change may still happen: the caller checks the membership).
With `tls`, calls are mutual TLS with that certificate: a change needs an admin's
(`MembershipDenied` with the node's reason otherwise), and a handshake that fails for a
reason of certificates is `MembershipTls` at once, with what to check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc

from system.kv.proto import kv_pb2, kv_pb2_grpc
from system.kv.tls import TlsFiles, open_channel
from system.kv.tls_failure import explain
from system.kv.transport import CHANNEL_OPTIONS

CHANGES = {"add": "add-learner", "promote": "promote", "remove": "remove"}
# Refusals that go away by waiting (server.py / node.py wording).
_TRANSIENT = ("not caught up", "in progress", "not yet committed")


class MembershipError(Exception):
    """Base of the errors below; the message says what happened and where."""


class MembershipInvalid(MembershipError):
    """The request itself is wrong (unknown member, missing address...)."""


class MembershipRefused(MembershipError):
    """The leader refused the change for good (e.g. removing the last voter)."""


class MembershipTimeout(MembershipError):
    """No member made or refused the change before the deadline."""


class MembershipUnavailable(MembershipError):
    """`change_once`: the member is not the leader (or did not answer): not applied there."""


class MembershipDenied(MembershipError):
    """The node refused the caller's certificate for this call (PERMISSION_DENIED: a
    change needs an admin certificate); the message is the node's reason."""


class MembershipTls(MembershipError):
    """The TLS handshake with a member failed for a reason of certificates."""


def _channel(target: str, tls: TlsFiles | None) -> grpc.Channel:
    return open_channel(target, tls, CHANNEL_OPTIONS)


def _check_handshake(target: str, exc: grpc.RpcError, tls: TlsFiles | None) -> None:
    """Raise MembershipTls when `exc` is a failed handshake that retrying will not mend."""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        reason = explain(target, exc.details() or "", tls)
        if reason:
            raise MembershipTls(f"TLS handshake with {target} failed: {reason}") from None


def change(addresses: Sequence[str], action: str, node_id: str, address: str = "", *,
           peer_address: str = "", timeout_s: float = 30.0,
           on_retry=None,  # noqa: ANN001
           tls: TlsFiles | None = None) -> kv_pb2.ChangeMembershipResponse:
    """Carry out `action` ("add", "promote" or "remove") of `node_id` through any of
    `addresses` (HOST:PORT of members); returns the leader's answer once committed.
    `peer_address` (add): the new member's --peer-listen, reached over plain TCP."""
    if action not in CHANGES:
        raise MembershipInvalid(f"unknown membership action {action!r}; one of {', '.join(CHANGES)}")
    request = kv_pb2.ChangeMembershipRequest(change=CHANGES[action], node_id=node_id,
                                             address=address, peer_address=peer_address)
    deadline = time.monotonic() + timeout_s
    queue = list(addresses)
    last_error = "no member answered"
    while time.monotonic() < deadline:
        target = queue.pop(0)
        queue.append(target)
        with _channel(target, tls) as channel:
            remaining = max(0.5, deadline - time.monotonic())
            try:
                return kv_pb2_grpc.KVStub(channel).ChangeMembership(request,
                                                                    timeout=min(10.0, remaining))
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or exc.code().name
                last_error = f"{target}: {details}"
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise MembershipInvalid(details) from None
                if code == grpc.StatusCode.PERMISSION_DENIED:
                    raise MembershipDenied(f"{target}: {details}") from None
                _check_handshake(target, exc, tls)
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    if not any(t in details for t in _TRANSIENT):
                        raise MembershipRefused(details) from None
                    if on_retry is not None:
                        on_retry(details)
                    time.sleep(0.3)
                    continue
                hint = dict(exc.trailing_metadata() or ()).get("leader-address", "")
                if hint:
                    if hint in queue:
                        queue.remove(hint)
                    queue.insert(0, hint)
                time.sleep(0.1)
    raise MembershipTimeout(f"member {action} {node_id}: no answer within {timeout_s:g}s "
                            f"({last_error})")


def member_channel(address: str, tls: TlsFiles | None = None) -> grpc.Channel:
    """A channel to the member at `address` for `change_once(channel=...)`: a caller that
    asks again and again (the harness, waiting for a new leader) keeps one connection."""
    return _channel(address, tls)


def change_once(address: str, action: str, node_id: str, *, timeout_s: float = 10.0,
                tls: TlsFiles | None = None,
                channel: grpc.Channel | None = None) -> kv_pb2.ChangeMembershipResponse:
    """One attempt of `action` of `node_id` at the member `address`, as an operator's
    second command sent while the first is still in flight: no retry, no following of a
    leader hint. Returns the answer once committed; MembershipRefused with the node's
    reason for any refusal (also "in progress" and "not yet committed", which `change`
    waits out), MembershipTimeout when nothing came back in time, MembershipUnavailable
    when the member is not the leader or unreachable (also when it lost its leadership
    while the change was pending), MembershipError for any other failure."""
    if action not in CHANGES:
        raise MembershipInvalid(f"unknown membership action {action!r}; one of {', '.join(CHANGES)}")
    request = kv_pb2.ChangeMembershipRequest(change=CHANGES[action], node_id=node_id)
    if channel is None:
        with _channel(address, tls) as own:
            return change_once(address, action, node_id, timeout_s=timeout_s, channel=own)
    try:
        return kv_pb2_grpc.KVStub(channel).ChangeMembership(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or exc.code().name
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise MembershipInvalid(details) from None
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            raise MembershipRefused(details) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise MembershipTimeout(f"member {action} {node_id} at {address}: no answer "
                                    f"within {timeout_s:g}s") from None
        if code == grpc.StatusCode.UNAVAILABLE:
            raise MembershipUnavailable(f"member {action} {node_id} at {address}: "
                                        f"{details}") from None
        raise MembershipError(f"member {action} {node_id} at {address}: "
                              f"{code.name}: {details}") from None


def status_with_leader(addresses: Sequence[str], *, timeout_s: float = 10.0,
                       leader_only: bool = False,
                       tls: TlsFiles | None = None) -> kv_pb2.StatusResponse:
    """The Status of the first of `addresses` that knows a leader (with `leader_only`: of
    the leader itself, whose membership is the newest); MembershipTimeout if none does
    before the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error = "no member answered"
    while time.monotonic() < deadline:
        for target in addresses:
            with _channel(target, tls) as channel:
                try:
                    st = kv_pb2_grpc.KVStub(channel).Status(
                        kv_pb2.StatusRequest(),
                        timeout=min(2.0, max(0.2, deadline - time.monotonic())))
                except grpc.RpcError as exc:
                    _check_handshake(target, exc, tls)
                    last_error = f"{target}: {exc.details() or exc.code().name}"
                    continue
            if st.role == "leader" or (st.leader_id and not leader_only):
                return st
            last_error = (f"{target} follows {st.leader_id}" if st.leader_id
                          else f"{target} knows no leader yet")
        time.sleep(0.2)
    raise MembershipTimeout(f"no member knew a leader within {timeout_s:g}s ({last_error})")
