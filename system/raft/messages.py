"""The messages Raft nodes exchange: one flat record type for every kind.

One record (rather than a class per kind) keeps transports generic: every field is an
int, bool, bytes, a NodeId, an Entry tuple or a SnapshotMeta, so a transport can
serialize any message without knowing its kind. Which fields a kind uses is written
next to each field. This module must never do I/O or hold behaviour: the rules for
sending and answering messages live in `core.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from system.raft.types import Entry, NodeId, SnapshotMeta


class MessageType(Enum):
    """Every kind of message; the request/response pairs of the Raft paper plus PreVote
    (thesis §9.6), heartbeats split from appends (as etcd does) and leader transfer
    (thesis §3.10)."""

    PRE_VOTE = "pre_vote"  # "would you vote for me at term+1?"; changes no state
    PRE_VOTE_RESPONSE = "pre_vote_response"
    VOTE = "vote"  # RequestVote (Raft §5.2)
    VOTE_RESPONSE = "vote_response"
    APPEND = "append"  # AppendEntries carrying entries (or none, to carry the commit index)
    APPEND_RESPONSE = "append_response"
    HEARTBEAT = "heartbeat"  # leader liveness + commit index + ReadIndex round id
    HEARTBEAT_RESPONSE = "heartbeat_response"
    SNAPSHOT = "snapshot"  # one chunk of InstallSnapshot (Raft §7)
    SNAPSHOT_RESPONSE = "snapshot_response"
    TIMEOUT_NOW = "timeout_now"  # leader transfer: "campaign now, skip PreVote"


@dataclass(frozen=True, slots=True)
class Message:
    """One message from `src` to `dst`. Every message carries the sender's `term`
    (Raft §5.1: a node seeing a higher term steps down; a lower term is stale)."""

    type: MessageType
    src: NodeId
    dst: NodeId
    # Sender's current term. Exceptions (etcd's convention): PRE_VOTE carries the term the
    # pre-candidate WOULD campaign in (its term + 1) and a granted PRE_VOTE_RESPONSE echoes it.
    term: int
    # PRE_VOTE, VOTE: term of the candidate's last entry.
    # APPEND: term of the entry at `index` (the entry before `entries`).
    log_term: int = 0
    # PRE_VOTE, VOTE: candidate's last log index.
    # APPEND: index of the entry just before `entries` ("prevLogIndex").
    # APPEND_RESPONSE: accepted -> follower's last index matching the leader;
    #   rejected -> the `index` of the APPEND being rejected.
    # SNAPSHOT, SNAPSHOT_RESPONSE (not done): the snapshot's index.
    # SNAPSHOT_RESPONSE (done): the follower's last log index after handling it.
    index: int = 0
    entries: tuple[Entry, ...] = ()  # APPEND: consecutive entries starting at index + 1
    # APPEND, HEARTBEAT: leader's commit index (for HEARTBEAT capped at the follower's match).
    commit: int = 0
    reject: bool = False  # *_RESPONSE: the request was refused
    # APPEND_RESPONSE rejected: the follower's guess of the last index that may match
    # (fast back-tracking, cf. etcd findConflictByTerm), with that entry's term in
    # `reject_term` (0 when unknown).
    reject_hint: int = 0
    reject_term: int = 0
    # HEARTBEAT, HEARTBEAT_RESPONSE: the ReadIndex round this heartbeat confirms (echoed).
    # VOTE: b"leader-transfer" when the campaign was started by TIMEOUT_NOW.
    context: bytes = b""
    snapshot: SnapshotMeta | None = None  # SNAPSHOT, SNAPSHOT_RESPONSE: which snapshot
    # SNAPSHOT: byte offset of `data` in the snapshot. SNAPSHOT_RESPONSE (not done): bytes
    # assembled so far, i.e. the offset the follower expects next (0 after a restart).
    offset: int = 0
    data: bytes = b""  # SNAPSHOT: the chunk's bytes
    # SNAPSHOT: this is the last chunk. SNAPSHOT_RESPONSE: the snapshot was handled
    # (installed, or found older than the follower's commit index).
    done: bool = False
