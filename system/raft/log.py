"""The in-memory Raft log of one node: entries after a snapshot, plus commit bookkeeping.

Holds a Python list of entries whose first element has index `snapshot_index + 1`, so
index -> position is one subtraction and ranges are list slices (no per-entry copies on
the hot path). It also tracks which suffix the shell has not yet been handed to persist
(`unstable_from`) and which committed entries it has been handed to apply.

It must never do I/O and never decide Raft rules about *whom* to believe: it answers
questions about its own contents and refuses changes that would break its invariants
(committed entries are never truncated, the commit index never decreases).
"""

from __future__ import annotations

from system.raft.types import Entry, EntryKind, SnapshotMeta


class RaftLog:
    """Entries after the snapshot point, with commit and apply indexes."""

    def __init__(
        self,
        snapshot: SnapshotMeta | None = None,
        entries: tuple[Entry, ...] | list[Entry] = (),
        committed: int = 0,
    ) -> None:
        self.snapshot_index: int = snapshot.index if snapshot else 0  # >= 0; covered by snapshot
        self.snapshot_term: int = snapshot.term if snapshot else 0  # term of snapshot_index
        # entries[i].index == snapshot_index + 1 + i: contiguous, terms non-decreasing.
        self.entries: list[Entry] = list(entries)
        # Highest index known committed. Invariant: snapshot_index <= committed <= last_index;
        # never decreases (Raft §5.3: committed entries are durable on a majority).
        self.committed: int = max(committed, self.snapshot_index)
        # Highest index the shell has applied (confirmed by advance). applied <= applying.
        self.applied: int = self.snapshot_index
        # Highest index handed to the shell to apply (in a Ready). applying <= committed.
        self.applying: int = self.snapshot_index
        # First index not yet handed to the shell to persist. Entries at or after it are
        # "unstable". A truncation moves it back to the truncation point.
        self.unstable_from: int = self.last_index() + 1
        self._check_contiguous()
        if not self.snapshot_index <= self.committed <= self.last_index():
            raise ValueError(
                f"restored commit index {committed} is outside the restored log "
                f"[{self.snapshot_index}, {self.last_index()}]: the durable state is inconsistent"
            )

    # -- queries ---------------------------------------------------------------------

    def first_index(self) -> int:
        """Index of the first entry held in memory (may be last_index()+1 if none)."""
        return self.snapshot_index + 1

    def last_index(self) -> int:
        return self.snapshot_index + len(self.entries)

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot_term

    def term(self, index: int) -> int | None:
        """Term of the entry at `index`; None when compacted away or beyond the end."""
        offset = index - self.snapshot_index
        if offset == 0:
            return self.snapshot_term
        if 0 < offset <= len(self.entries):
            return self.entries[offset - 1].term
        return None

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def slice(self, low: int, high: int) -> list[Entry]:
        """Entries with low <= index < high. Caller guarantees low > snapshot_index."""
        assert low > self.snapshot_index, f"slice({low}) reaches into the snapshot"
        base = self.snapshot_index + 1
        return self.entries[low - base : high - base]

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: a log ending (last_term, last_index) is at least as up to date as
        ours if its last term is higher, or equal with an index at least as high."""
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index())

    def find_conflict(self, entries: tuple[Entry, ...]) -> int:
        """Index of the first of `entries` that is new or disagrees with our log; 0 if
        all of them are already present with the same terms."""
        if not entries:
            return 0
        last = self.last_index()
        if entries[0].index > last:  # the common case: a pure append
            return entries[0].index
        for entry in entries:
            if entry.index > last or not self.match_term(entry.index, entry.term):
                # Entries at or below the snapshot are committed, hence match (§5.4).
                if entry.index <= self.snapshot_index:
                    continue
                return entry.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """The largest index <= `index` whose term is <= `term` (cf. etcd's
        findConflictByTerm): every entry above it has a term above `term`, so it cannot
        match an entry of term `term`; the other side skips them all in one round trip."""
        index = min(index, self.last_index())
        while index > self.snapshot_index:
            entry_term = self.entries[index - self.snapshot_index - 1].term
            if entry_term <= term:
                return index
            index -= 1
        return index  # the snapshot point: the best we can say

    def unstable_entries(self) -> list[Entry]:
        if self.unstable_from > self.last_index():
            return []
        return self.slice(self.unstable_from, self.last_index() + 1)

    def has_unstable(self) -> bool:
        return self.unstable_from <= self.last_index()

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet handed to the shell to apply."""
        if self.committed <= self.applying:
            return []
        return self.slice(self.applying + 1, self.committed + 1)

    # -- changes -------------------------------------------------------------------

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Append `entries`, first truncating any suffix from entries[0].index on.
        Committed entries are never truncated (Raft §5.3 / Leader Completeness)."""
        if not entries:
            return
        first = entries[0].index
        last = self.last_index()
        assert first > self.committed, (
            f"refusing to truncate committed entry {first} (committed={self.committed})"
        )
        assert first <= last + 1, f"gap: appending {first} after last index {last}"
        if first <= last:
            del self.entries[first - self.snapshot_index - 1 :]
            self.unstable_from = min(self.unstable_from, first)
        self.entries.extend(entries)

    def append_new(self, term: int, data: bytes, kind: EntryKind) -> int:
        """Leader's hot path: create one entry at the end of the log; returns its index."""
        index = self.snapshot_index + len(self.entries) + 1
        self.entries.append(Entry(term, index, data, kind))
        return index

    def commit_to(self, index: int) -> bool:
        """Raise the commit index to `index` if higher; returns whether it moved."""
        if index <= self.committed:
            return False
        assert index <= self.last_index(), f"commit {index} beyond last index {self.last_index()}"
        self.committed = index
        return True

    def mark_applying(self, index: int) -> None:
        """Entries up to `index` were handed to the shell to apply. (applying <= committed
        is checked by RaftCore.check_invariants, so a test can break that rule.)"""
        assert self.applying <= index, f"applying went backwards: {self.applying} -> {index}"
        self.applying = index

    def applied_to(self, index: int) -> None:
        if index > self.applied:
            self.applied = index
        if index > self.applying:  # after a snapshot restore handed out by a Ready
            self.applying = index

    def stable_to(self, index: int) -> None:
        """Everything up to `index` has been handed to the shell to persist."""
        if index + 1 > self.unstable_from:
            self.unstable_from = index + 1

    def compact(self, index: int) -> None:
        """Drop entries up to and including `index` (which the caller has snapshotted)."""
        term = self.term(index)
        assert term is not None, f"compact({index}) outside the log"
        del self.entries[: index - self.snapshot_index]
        self.snapshot_index = index
        self.snapshot_term = term
        # The snapshot stands for everything up to `index`, handed out to persist or not.
        self.unstable_from = max(self.unstable_from, index + 1)

    def restore(self, snapshot: SnapshotMeta) -> None:
        """Replace the whole log by `snapshot` (InstallSnapshot, Raft §7)."""
        assert snapshot.index > self.committed, "restoring a snapshot older than commit"
        self.entries = []
        self.snapshot_index = snapshot.index
        self.snapshot_term = snapshot.term
        self.committed = snapshot.index
        self.unstable_from = snapshot.index + 1

    def _check_contiguous(self) -> None:
        expected = self.snapshot_index + 1
        previous_term = self.snapshot_term
        for entry in self.entries:
            if entry.index != expected or entry.term < previous_term:
                raise ValueError(
                    f"restored log is not contiguous at index {expected}: found entry "
                    f"(index={entry.index}, term={entry.term}) after term {previous_term}"
                )
            expected += 1
            previous_term = entry.term
