"""What a leader knows about one follower's log, and how fast it may send to it.

A leader keeps one `Progress` per follower (Raft Figure 2's nextIndex/matchIndex) plus
a flow-control state, as etcd's tracker does:

- PROBE: we do not know where the follower's log diverges; send one APPEND at a time
  and wait for its answer (or a heartbeat response) before sending the next.
- REPLICATE: the follower is known to match up to `match`; send APPENDs optimistically
  (advancing `next` before the answer), at most `max_inflight` unacknowledged at once.
- SNAPSHOT: the follower needs entries we compacted away; send it our snapshot in
  chunks, one chunk in flight, and send no APPENDs until it reports the snapshot done.

This module must never decide commit or election questions; it only tracks one peer.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    """Replication state of one follower, as seen by the leader."""

    __slots__ = (
        "match",
        "next",
        "state",
        "probe_sent",
        "inflight",
        "max_inflight",
        "recent_active",
        "sent_commit",
        "pending_snapshot",
        "snapshot_offset",
        "snapshot_idle_ticks",
        "catch_up_to",
        "verify_nonce",
        "diverged",
        "reported_divergence",
    )

    def __init__(self, next_index: int, max_inflight: int) -> None:
        # Highest index known replicated on the follower. Never decreases, except when the
        # follower proves it lost entries it had acknowledged (`reset_after_lost_entries`).
        self.match: int = 0
        self.next: int = next_index  # next index to send; match < next
        self.state: ProgressState = ProgressState.PROBE
        self.probe_sent: bool = False  # PROBE/SNAPSHOT: a message is out, wait for its answer
        # REPLICATE: last index of each unacknowledged APPEND, oldest first; len <= max_inflight.
        self.inflight: deque[int] = deque()
        self.max_inflight: int = max_inflight
        # The follower answered since the last CheckQuorum check (reset every election timeout).
        self.recent_active: bool = False
        self.sent_commit: int = 0  # highest commit index sent in an APPEND (to skip repeats)
        self.pending_snapshot: int = 0  # SNAPSHOT: index of the snapshot being sent
        self.snapshot_offset: int = 0  # SNAPSHOT: offset of the next chunk to send, in bytes
        self.snapshot_idle_ticks: int = 0  # SNAPSHOT: ticks since a chunk was sent or answered
        # The follower lost acknowledged entries up to here (0 = none): every APPEND tells
        # it so until `match` reaches this index again.
        self.catch_up_to: int = 0
        # A verify probe is out (core.verify_follower_match): its nonce, 0 = none.
        self.verify_nonce: int = 0
        # Its committed log conflicts with ours: (index where, its commit index); () = no.
        # Its match stays 0 and only heartbeat answers re-open a probe, or start the
        # snapshot that replaces its log (core.py, `maybe_send_repair_snapshot`).
        self.diverged: tuple[int, int] | tuple[()] = ()
        self.reported_divergence: tuple[int, int] | tuple[()] = ()  # said once per indexes

    def __repr__(self) -> str:
        return (
            f"Progress(match={self.match}, next={self.next}, state={self.state.value}, "
            f"inflight={len(self.inflight)}, probe_sent={self.probe_sent})"
        )

    def is_paused(self) -> bool:
        """Whether the leader must not send this follower another APPEND now."""
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        return True  # SNAPSHOT: entries wait until the snapshot is installed

    def become_probe(self) -> None:
        """After a rejection, a reconnect or a finished snapshot: find the match again."""
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.pending_snapshot = 0
        self.snapshot_offset = 0

    def become_replicate(self) -> None:
        """The follower's log matches ours up to `match`: stream from there."""
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, snapshot_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snapshot_index
        self.snapshot_offset = 0
        self.snapshot_idle_ticks = 0
        self.probe_sent = False
        self.inflight.clear()

    def sent_entries(self, last_index: int) -> None:
        """An APPEND ending at `last_index` (with entries) was just sent."""
        if self.state is ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflight.append(last_index)
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """The follower acknowledged it matches up to `index`. Returns whether `match`
        moved (a stale or duplicated acknowledgement changes nothing)."""
        updated = False
        if index > self.match:
            self.match = index
            updated = True
            self.probe_sent = False
        if index + 1 > self.next:
            self.next = index + 1
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
        return updated

    def reset_after_lost_entries(self, last_index: int) -> None:
        """The follower's log ends at `last_index`, below `match`: it lost entries it had
        acknowledged. Forget what we believed and probe from its real end."""
        self.catch_up_to = max(self.catch_up_to, self.match)
        self.match = 0
        self.next = last_index + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.pending_snapshot = 0
        self.snapshot_offset = 0

    def maybe_decrease_to(self, rejected: int, hint: int) -> bool:
        """The follower rejected the APPEND whose previous index was `rejected`, and
        suggests `hint` as the last index that may match. Returns whether `next` moved
        (False for a stale rejection, e.g. of an APPEND sent before a newer probe)."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # stale: we already know it matches there
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # not the answer to the probe we are waiting for
        self.next = max(min(rejected, hint + 1), self.match + 1)
        self.probe_sent = False
        return True
