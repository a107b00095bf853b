"""Bookkeeping of a leader's linearizable reads (ReadIndex, Raft thesis §6.4).

A read is confirmed in two steps, both decided by `RaftCore` (so a test can break either
rule there): (1) the leader must have committed an entry of its own term, so its commit
index is current; until then reads wait here, queued; (2) a heartbeat round started
after the read must be acknowledged by a majority, proving no newer leader existed when
the round began. The read may then be served at the commit index recorded when its
round started, once the state machine has applied that far.

This module only remembers reads, rounds and acknowledgements, in order. It must never
decide whether a round is confirmed, send messages or read a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from system.raft.types import NodeId

ROUND_ID_BYTES = 8  # a round id travels in HEARTBEAT.context as 8 big-endian bytes


@dataclass(frozen=True)
class ReadState:
    """The read whose id is `context` may be served once applied index >= `index`."""

    context: bytes
    index: int


@dataclass(frozen=True, slots=True)
class _PendingRead:
    context: bytes  # the client's read id
    index: int  # commit index when the read's round started; serve at applied >= index
    round: int  # the heartbeat round whose majority acknowledgement confirms it


def encode_round(round_id: int) -> bytes:
    return round_id.to_bytes(ROUND_ID_BYTES, "big")


def decode_round(context: bytes) -> int:
    """The round id in a HEARTBEAT_RESPONSE's context (garbage decodes to some id that
    matches no round, never to an error)."""
    return int.from_bytes(context[:ROUND_ID_BYTES], "big")


class ReadIndexQueue:
    """Reads waiting for the leader's first own-term commit, and reads waiting for their
    heartbeat round. Invariants: `pending` is ordered by round; every round in `acks` is
    a round of some pending read or newer; round ids only increase."""

    def __init__(self) -> None:
        self.awaiting_barrier: list[bytes] = []  # contexts queued before the own-term commit
        self.pending: list[_PendingRead] = []  # ordered by round
        self.acks: dict[int, set[NodeId]] = {}  # round -> peers that acknowledged it
        self.last_round: int = 0  # the latest round started; never decreases, even across terms

    def __bool__(self) -> bool:
        return bool(self.pending or self.awaiting_barrier)

    def wait_for_barrier(self, context: bytes) -> None:
        self.awaiting_barrier.append(context)

    def take_awaiting_barrier(self) -> list[bytes]:
        queued, self.awaiting_barrier = self.awaiting_barrier, []
        return queued

    def start_round(self, contexts: list[bytes], commit_index: int) -> int:
        """Start a new heartbeat round for `contexts`, to be served at `commit_index`."""
        self.last_round += 1
        round_id = self.last_round
        self.pending.extend(_PendingRead(c, commit_index, round_id) for c in contexts)
        self.acks[round_id] = set()
        return round_id

    def acknowledge(self, round_id: int, peer: NodeId) -> set[NodeId] | None:
        """Record `peer`'s answer to `round_id`; the round's acknowledgers so far, or None
        if the round is unknown (already confirmed, or from an earlier leadership)."""
        acks = self.acks.get(round_id)
        if acks is not None:
            acks.add(peer)
        return acks

    def release_through(self, round_id: int) -> list[ReadState]:
        """`round_id` was confirmed: it and every earlier round (started before it, so
        also confirmed by it) are done. Returns their reads, oldest first."""
        released = [ReadState(r.context, r.index) for r in self.pending if r.round <= round_id]
        self.pending = [r for r in self.pending if r.round > round_id]
        for old in [r for r in self.acks if r <= round_id]:
            del self.acks[old]
        return released

    def latest_round_context(self) -> bytes:
        """What a periodic heartbeat carries: the latest round while reads are pending
        (a later heartbeat of that round confirms it just as well), else nothing."""
        return encode_round(self.last_round) if self.pending else b""

    def abandon(self) -> list[bytes]:
        """Leadership is lost: these reads will never be confirmed. Returns their
        contexts (to answer "not leader") and forgets every round."""
        dropped = [r.context for r in self.pending] + self.awaiting_barrier
        self.pending = []
        self.awaiting_barrier = []
        self.acks = {}
        return dropped
