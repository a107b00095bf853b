"""The snapshot transfers a leader is making, as an operator (or a test harness) sees them.

The Raft core knows which followers are in the SNAPSHOT state (`RaftCore.snapshot_transfers`)
but keeps no clock; the node looks after each Ready and notes when each transfer began, so
that Status can say "sending the snapshot at index I to X for S seconds, B of N bytes
acknowledged" and the log has one line when a transfer begins and one when it ends. A
fault injector aims at these windows (docs/nemesis.md, "Windows").
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("kv.node")


class SnapshotSends:
    """Follower -> (snapshot index, monotonic start) of each transfer in progress."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.started: dict[str, tuple[int, float]] = {}
        self.sent = 0  # transfers begun since the process started

    def observe(self, transfers: dict[str, tuple[int, int, int]]) -> None:
        """After a Ready: note transfers that began or ended since the last look."""
        if not transfers and not self.started:
            return
        now = time.monotonic()
        for peer, (index, _, size) in transfers.items():
            known = self.started.get(peer)
            if known is None or known[0] != index:
                self.started[peer] = (index, now)
                self.sent += 1
                log.info("sending snapshot", extra={
                    "node": self.node_id, "peer": peer, "snapshot_index": index,
                    "snapshot_bytes": size})
        for peer in [p for p in self.started if p not in transfers]:
            index, since = self.started.pop(peer)
            # Ended: installed, or abandoned because this node stopped leading.
            log.info("snapshot send ended", extra={
                "node": self.node_id, "peer": peer, "snapshot_index": index,
                "seconds": round(now - since, 3)})

    def seconds(self, peer: str) -> float:
        """How long the transfer to `peer` has been going on (0 if none is noted)."""
        known = self.started.get(peer)
        return 0.0 if known is None else time.monotonic() - known[1]
