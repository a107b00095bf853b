"""etcd's membership and status over its Cluster and Maintenance APIs, for the `member`
fault and the platform's view of who leads.

- `member_list`, `add_learner`, `promote`, `remove`: etcd 3.4's runtime reconfiguration.
  A member is added by its peer URL; it gets its name only when it starts (with
  `--initial-cluster-state existing`), so members are found here by name or peer URL.
  `promote` fails ("can only promote a learner member which is in sync with leader") until
  the learner has caught up: it is retried until its deadline.
- `status(address)`: role, leader and term from Maintenance.Status, member ids mapped to
  names through MemberList (Status names only ids).

Every error is `MemberError` with one line naming the member, the operation and etcd's
words. A membership change that timed out may still commit later: the caller reads
`member_list` again to know.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from nemesis.systems.etcd.client import CHANNEL_OPTIONS, REQUIRE_LEADER, outcome_of
from nemesis.systems.etcd.proto import etcd_pb2, etcd_pb2_grpc
from system.kv.tls import TlsFiles, open_channel

LEARNER_NOT_READY = "can only promote a learner member which is in sync with leader"


class MemberError(Exception):
    """A membership operation failed; the message is one line saying which and why."""


@dataclass(frozen=True)
class Member:
    id: int  # etcd's member id
    name: str  # "" until the member has started
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool

    @property
    def hex_id(self) -> str:
        return f"{self.id:x}"


@dataclass(frozen=True)
class EtcdStatus:
    """A member's view: `role` "leader", "follower" or "learner" (etcd's Status does not
    say "candidate": a member that knows no leader is a "follower" with `leader_id` "");
    `leader_id` the leader's name ("" when it knows none, its hex id when the name is not
    known yet); `applied_index` etcd's raftAppliedIndex."""

    node_id: str
    role: str
    leader_id: str
    term: int
    applied_index: int
    raft_index: int
    version: str
    vote_withheld: bool = False  # etcd 3.4 has no such notion (no PreVote by default)


def _channel(address: str, tls: TlsFiles | None) -> grpc.Channel:
    return open_channel(address, tls, CHANNEL_OPTIONS)


def _members(response: object) -> list[Member]:
    return [Member(m.ID, m.name, tuple(m.peerURLs), tuple(m.clientURLs), m.isLearner)
            for m in response.members]  # type: ignore[attr-defined]


# Refusals etcd gives before proposing a change, that pass with time (strict reconfig
# check, etcd 3.4's default): "unhealthy cluster" until the leader has been connected to
# every member for 5 s (so also just after start), "not enough started members" while a
# removal or promotion would leave too few voters up. Retried until the deadline.
TRANSIENT = ("etcdserver: unhealthy cluster",
             "etcdserver: re-configuration failed due to not enough started members")


def _cluster_call(addresses: Sequence[str], method: str, request: object, *, timeout_s: float,
                  tls: TlsFiles | None, what: str, retry_on: Sequence[str] = TRANSIENT,
                  retry_every_s: float = 0.2) -> object:
    """`method` on the first member of `addresses` that answers, again after a refusal
    in `retry_on` until `timeout_s`; MemberError with the last error otherwise."""
    if not addresses:
        raise MemberError(f"{what}: no member address given")
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        for address in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            channel = _channel(address, tls)
            try:
                stub = etcd_pb2_grpc.ClusterStub(channel)
                return getattr(stub, method)(request, timeout=remaining, metadata=REQUIRE_LEADER)
            except grpc.RpcError as exc:
                details = exc.details() or ""
                last = f"{address}: {exc.code().name} {details}"
                if any(message in details for message in retry_on):
                    break  # refused before proposing, for now: wait, then ask again
                if outcome_of(exc.code(), details) != "not-applied":
                    # Refused for good (another member would say the same), or sent and
                    # unanswered: a change that may commit is never sent twice.
                    raise MemberError(f"{what} failed: {last}") from None
            finally:
                channel.close()
        if time.monotonic() + retry_every_s >= deadline:
            raise MemberError(f"{what} failed within {timeout_s:g} s: "
                              f"{last or 'no member answered'}")
        time.sleep(retry_every_s)


def member_list(addresses: Sequence[str], *, timeout_s: float = 5.0,
                tls: TlsFiles | None = None) -> list[Member]:
    response = _cluster_call(addresses, "MemberList", etcd_pb2.MemberListRequest(),
                             timeout_s=timeout_s, tls=tls, what="member list")
    return _members(response)


def find_member(members: Sequence[Member], name_or_peer_url: str) -> Member | None:
    """The member with that name, or with that peer URL (a learner not started yet has no
    name)."""
    for m in members:
        if m.name == name_or_peer_url or name_or_peer_url in m.peer_urls:
            return m
    return None


def add_learner(addresses: Sequence[str], peer_url: str, *, timeout_s: float = 15.0,
                tls: TlsFiles | None = None) -> Member:
    """Add a learner reached at `peer_url` (http(s)://host:port); returns it (its id; no
    name until it starts). Start it with `--initial-cluster-state existing` and an
    `--initial-cluster` that lists every member, itself included (`initial_cluster`)."""
    response = _cluster_call(addresses, "MemberAdd",
                             etcd_pb2.MemberAddRequest(peerURLs=[peer_url], isLearner=True),
                             timeout_s=timeout_s, tls=tls, what=f"adding learner {peer_url}")
    m = response.member  # type: ignore[attr-defined]
    return Member(m.ID, m.name, tuple(m.peerURLs), tuple(m.clientURLs), m.isLearner)


def initial_cluster(members: Sequence[Member], name: str, peer_url: str) -> str:
    """etcd's `--initial-cluster` for a member joining as `name` at `peer_url`: every
    started member by its name, and the joining one (nameless in the list) as `name`."""
    parts = []
    for m in members:
        if peer_url in m.peer_urls:
            parts.append(f"{name}={peer_url}")
        elif m.name:
            parts.extend(f"{m.name}={url}" for url in m.peer_urls)
    return ",".join(parts)


def promote(addresses: Sequence[str], name_or_peer_url: str, *, timeout_s: float = 30.0,
            tls: TlsFiles | None = None) -> Member:
    """Promote the learner to a voting member, retrying while etcd says it is not yet in
    sync with the leader, until `timeout_s`. Returns the member as promoted."""
    deadline = time.monotonic() + timeout_s
    target = find_member(member_list(addresses, timeout_s=timeout_s, tls=tls), name_or_peer_url)
    if target is None:
        raise MemberError(f"promote {name_or_peer_url}: no such member")
    if not target.is_learner:
        return target  # already a voter (an earlier attempt that timed out committed)
    try:
        _cluster_call(addresses, "MemberPromote", etcd_pb2.MemberPromoteRequest(ID=target.id),
                      timeout_s=max(deadline - time.monotonic(), 0.5), tls=tls,
                      what=f"promoting {name_or_peer_url} ({target.hex_id})",
                      retry_on=(*TRANSIENT, LEARNER_NOT_READY))
    except MemberError as exc:
        if LEARNER_NOT_READY in str(exc):
            raise MemberError(f"promoting {name_or_peer_url}: the learner did not catch up "
                              f"with the leader within {timeout_s:g} s ({exc})") from None
        raise
    return Member(target.id, target.name, target.peer_urls, target.client_urls, False)


def remove(addresses: Sequence[str], name_or_peer_url: str, *, timeout_s: float = 15.0,
           tls: TlsFiles | None = None) -> None:
    """Remove a member (voter or learner) by name or peer URL."""
    target = find_member(member_list(addresses, timeout_s=timeout_s, tls=tls), name_or_peer_url)
    if target is None:
        raise MemberError(f"remove {name_or_peer_url}: no such member")
    _cluster_call(addresses, "MemberRemove", etcd_pb2.MemberRemoveRequest(ID=target.id),
                  timeout_s=timeout_s, tls=tls, what=f"removing {name_or_peer_url} ({target.hex_id})")


def membership(addresses: Sequence[str], *, timeout_s: float = 5.0,
               tls: TlsFiles | None = None) -> tuple[set[str], set[str]]:
    """(voters, learners) by name (a learner not started yet by its first peer URL)."""
    voters, learners = set(), set()
    for m in member_list(addresses, timeout_s=timeout_s, tls=tls):
        (learners if m.is_learner else voters).add(m.name or m.peer_urls[0])
    return voters, learners


def status(address: str, *, timeout_s: float = 1.0, tls: TlsFiles | None = None,
           names: dict[int, str] | None = None) -> EtcdStatus | None:
    """The member's view through its client address; None when it does not answer within
    `timeout_s` (never raises for an unreachable member). `names`: member id -> name, a
    cache filled here from MemberList when an id is not in it."""
    deadline = time.monotonic() + timeout_s
    names = {} if names is None else names
    channel = _channel(address, tls)
    try:
        s = etcd_pb2_grpc.MaintenanceStub(channel).Status(etcd_pb2.StatusRequest(),
                                                          timeout=timeout_s)
        wanted = [i for i in (s.header.member_id, s.leader) if i and i not in names]
        remaining = deadline - time.monotonic()
        if wanted and remaining > 0:
            try:
                listed = etcd_pb2_grpc.ClusterStub(channel).MemberList(
                    etcd_pb2.MemberListRequest(), timeout=remaining)
                names.update({m.ID: m.name for m in listed.members if m.name})
            except grpc.RpcError:
                pass  # ids stay hex: the role and term are still worth having
    except grpc.RpcError:
        return None
    finally:
        channel.close()
    me = s.header.member_id
    role = ("learner" if s.isLearner else "leader" if s.leader and s.leader == me
            else "follower")
    leader = names.get(s.leader, f"{s.leader:x}") if s.leader else ""
    return EtcdStatus(names.get(me, f"{me:x}"), role, leader, s.raftTerm, s.raftAppliedIndex,
                      s.raftIndex, s.version)
