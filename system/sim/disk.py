"""The simulator's fake disk: what one node wrote, and what survived its last fsync.

What it is for: a node shell persists each Ready here exactly as the real node does to its
WAL and snapshot files, so a crash can keep the OS's page cache (a process crash) or roll
back to the last fsync (a power loss, `lose_unsynced=True`). What it must never do: touch
a real file, or hand back state that was never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from system.raft.types import Entry, HardState, PersistentState, SnapshotMeta


@dataclass
class _DiskImage:
    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    entries: list[Entry] = field(default_factory=list)  # contiguous, after the snapshot

    def copy(self) -> _DiskImage:
        return _DiskImage(self.hard_state, self.snapshot, self.snapshot_data, list(self.entries))

    def last_index(self) -> int:
        if self.entries:
            return self.entries[-1].index
        return self.snapshot.index if self.snapshot else 0


class FakeDisk:
    """One node's disk: what the OS holds (`current`) and what survived the last fsync
    (`durable`). A process crash keeps the OS's page cache; a power loss
    (`lose_unsynced=True`) rolls back to the last fsync."""

    def __init__(self) -> None:
        self.durable = _DiskImage()
        self.current = _DiskImage()
        self.sync_count = 0

    def write_hard_state(self, hard_state: HardState) -> None:
        self.current.hard_state = hard_state

    def append(self, entries: tuple[Entry, ...]) -> None:
        """Append, first dropping the stored suffix from entries[0].index on (Ready rule)."""
        image = self.current
        first = entries[0].index
        base = image.snapshot.index if image.snapshot else 0
        if first <= base:
            raise ValueError(
                f"asked to persist entry {first} at or below the snapshot index {base}"
            )
        if first > image.last_index() + 1:
            raise ValueError(
                f"asked to persist entries from {first} after last index {image.last_index()}"
            )
        del image.entries[first - base - 1 :]
        image.entries.extend(entries)

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """A snapshot from the leader: store it and drop ALL stored entries (the Ready
        contract: it is only emitted when the log lacks the snapshot's last entry, so every
        stored entry is covered by it or from a divergent history)."""
        self.current.entries = []
        self.current.snapshot, self.current.snapshot_data = meta, data

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """The shell's own snapshot (before `compact`): written and fsynced at once."""
        for image in (self.current, self.durable):
            image.entries = [e for e in image.entries if e.index > meta.index]
            image.snapshot, image.snapshot_data = meta, data

    def sync(self) -> None:
        self.durable = self.current.copy()
        self.sync_count += 1

    def crash(self, lose_unsynced: bool) -> None:
        if lose_unsynced:
            self.current = self.durable.copy()
        else:
            self.durable = self.current.copy()

    def load(self) -> PersistentState:
        image = self.current
        return PersistentState(
            hard_state=image.hard_state,
            snapshot=image.snapshot,
            snapshot_data=image.snapshot_data,
            entries=tuple(image.entries),
        )


