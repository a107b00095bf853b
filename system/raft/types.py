"""Records shared by the Raft core, its durable storage and its transports.

These are plain frozen values: the core produces them, the shell persists and ships
them. Nothing here does I/O. Field comments state units and invariants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

NodeId = str


class EntryKind(Enum):
    """What a log entry carries."""

    NORMAL = "normal"  # an opaque client command for the replicated state machine
    NOOP = "noop"  # appended by every new leader at the start of its term (Raft §8)


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
class SnapshotMeta:
    """Describes a state-machine snapshot that replaces the log prefix up to `index`."""

    index: int  # last log index the snapshot covers; 0 means "no snapshot"
    term: int  # term of the entry at `index`
    voters: tuple[NodeId, ...]  # cluster membership as of `index`


@dataclass(frozen=True, slots=True)
class PersistentState:
    """What durable storage hands back to a restarting node: exactly what the node had
    synced before it stopped. The core is rebuilt from it; volatile state starts empty."""

    hard_state: HardState
    snapshot: SnapshotMeta | None  # latest durable snapshot, None if none was ever taken
    snapshot_data: bytes  # the state machine's bytes for `snapshot`; b"" if None
    entries: tuple[Entry, ...]  # the log after the snapshot, in index order, contiguous
