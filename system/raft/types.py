"""Records shared by the Raft core, its durable storage and its transports.

These are plain frozen values: the core produces them, the shell persists and ships
them. Nothing here does I/O. Field comments state units and invariants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

NodeId = str


class EntryKind(Enum):
    """What a log entry carries."""

    NORMAL = "normal"  # an opaque client command for the replicated state machine
    NOOP = "noop"  # appended by every new leader at the start of its term (Raft §8)
    # A new cluster membership (`Membership.encode`), one server added, promoted or
    # removed. It takes effect on each node as soon as it is in that node's log, committed
    # or not (thesis §4.1); the state machine skips it.
    CONFIG = "config"


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. Log Matching: two logs holding an entry with the same
    (index, term) are identical up to and including it (Raft §5.3)."""

    term: int  # term of the leader that created the entry; >= 1
    index: int  # position in the log; >= 1; consecutive entries have consecutive indexes
    data: bytes = b""  # the command, opaque to Raft; empty for NOOP
    kind: EntryKind = EntryKind.NORMAL


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node must have on disk before it answers a vote or an append (Raft Figure 2)."""

    term: int = 0  # latest term this node has seen; never decreases
    vote: NodeId | None = None  # candidate voted for in `term`; at most one per term
    commit: int = 0  # highest index known committed; a hint, safe to lose (recomputed)
    # A leader found that this voter lost entries it had acknowledged (its log went
    # backwards: restored from an old copy, or wiped). Until its commit index reaches this
    # index again it grants no vote and no pre-vote (docs/raft.md, "A follower whose log
    # went backwards"). 0 = nothing lost.
    catch_up_to: int = 0


@dataclass(frozen=True, slots=True)
class Membership:
    """Who is in the cluster: voters (count towards every majority, may lead) and
    learners (receive the log, never vote or lead; etcd's learners). Invariant: the two
    are disjoint, without duplicates, and there is at least one voter."""

    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()
    # Opaque to Raft: one string per member that the shell attaches and reads back (the
    # KV node: its address), so a new member is reachable by every node that learns of it.
    member_info: tuple[tuple[NodeId, str], ...] = ()

    def members(self) -> tuple[NodeId, ...]:
        return self.voters + self.learners

    def info(self, node: NodeId) -> str:
        return dict(self.member_info).get(node, "")

    def problems(self) -> list[str]:
        problems = []
        if not self.voters:
            problems.append("a membership needs at least one voter")
        members = self.members()
        if len(set(members)) != len(members):
            problems.append(f"a node is listed twice in voters {self.voters} / learners {self.learners}")
        if any(not isinstance(m, str) or not m for m in members):
            problems.append(f"member ids must be non-empty strings, got {members!r}")
        return problems

    def encode(self) -> bytes:
        return json.dumps(
            {"voters": list(self.voters), "learners": list(self.learners),
             "member_info": [list(pair) for pair in self.member_info]},
            separators=(",", ":"), sort_keys=True,
        ).encode("utf-8")

    @staticmethod
    def decode(data: bytes) -> Membership:
        """The membership a CONFIG entry carries; ValueError if it is not one."""
        try:
            raw = json.loads(data.decode("utf-8"))
            membership = Membership(
                voters=tuple(raw["voters"]),
                learners=tuple(raw.get("learners", ())),
                member_info=tuple((str(a), str(b)) for a, b in raw.get("member_info", ())),
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"not a membership: {error}") from None
        problems = membership.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return membership


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Describes a state-machine snapshot that replaces the log prefix up to `index`."""

    index: int  # last log index the snapshot covers; 0 means "no snapshot"
    term: int  # term of the entry at `index`
    voters: tuple[NodeId, ...]  # cluster membership as of `index` ...
    learners: tuple[NodeId, ...] = ()  # ... its learners ...
    member_info: tuple[tuple[NodeId, str], ...] = ()  # ... and what the shell attached

    @property
    def membership(self) -> Membership:
        return Membership(self.voters, self.learners, self.member_info)


@dataclass(frozen=True, slots=True)
class PersistentState:
    """What durable storage hands back to a restarting node: exactly what the node had
    synced before it stopped. The core is rebuilt from it; volatile state starts empty."""

    hard_state: HardState
    snapshot: SnapshotMeta | None  # latest durable snapshot, None if none was ever taken
    snapshot_data: bytes  # the state machine's bytes for `snapshot`; b"" if None
    entries: tuple[Entry, ...]  # the log after the snapshot, in index order, contiguous
