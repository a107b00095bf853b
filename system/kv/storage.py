"""Durable storage of one node's Raft state: hard state, log and snapshot, in a data dir.

Layout of `data_dir`::

    LOCK                      flock'ed by the process that has the storage open
    wal/0000000000000001.wal  log segments, preallocated (records: see system/kv/wal.py)
    snapshots/snapshot-<index>-<term>.snap   the latest snapshot (system/kv/snapshot_file.py)

Rules this module keeps (and the node relies on):
  * Nothing is durable until `sync()` returns; the node calls it before sending any
    message or answer that depends on what it wrote (Raft Figure 2: persist before
    responding). Every write goes straight to the file (no user-space buffer), so `sync()`
    is one fdatasync.
  * Overwriting a suffix (`append` starting at or below the last index) writes a TRUNCATE
    record before the new entries, in one sequential write: whatever prefix of it survives
    a crash, the log read back is a valid log.
  * Snapshots are written atomically (temp, fsync, rename, fsync dir) BEFORE anything that
    depends on them: old log segments are deleted only after the snapshot covering them is
    durable; entries discarded by an installed snapshot are dropped by a TRUNCATE written
    after it. A crash between the two is repaired at open by the same rule (Raft §7: if the
    log's entry at the snapshot index has another term, the whole log is discarded).
  * Segments are preallocated to their capacity (ftruncate, fsync of file and directory)
    before any record is written to them or names them, so a crash never changes their
    size: a size other than the capacity is a cut, refused (system/kv/wal.py).
  * Recovery (`open`): the newest snapshot file must verify; every segment is scanned; a
    torn LAST record of the LAST segment (never synced) is zeroed in place (truncated in
    a format-1 segment) with a WARNING naming file and offset; any other damage raises
    CorruptStorage — it never serves corrupt data.
  * A node never votes on durable state shorter than what it acknowledged: a directory
    with IDENTITY or MEMBERS (system/kv/identity.py, written only after the first segment
    is synced) but no WAL segment lost its log, and is refused (CorruptStorage) rather
    than started empty as the same member.
  * After a failed write or fsync the storage refuses all further calls (StorageFailed):
    the node must stop and restart, which recovers.

Memory: the storage keeps only terms and sizes of the entries, never their data; entry
data read at open is handed to the first `load()` and then forgotten.

What this module must never do: acknowledge (return from sync) before fdatasync, delete
a segment or snapshot before its replacement is durable, or return unverified bytes.
Not thread-safe: one owner.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from system.kv import wal
from system.kv.identity import IDENTITY_FILE, MEMBERS_FILE
from system.kv.snapshot_file import (
    TEMP_SUFFIX,
    fsync_directory,
    parse_snapshot_name,
    read_snapshot_file,
    snapshot_name,
    write_all,
    write_snapshot_file,
)
from system.kv.storage_errors import CorruptStorage, StorageFailed, StorageLocked
from system.raft.types import Entry, HardState, PersistentState, SnapshotMeta

__all__ = ["CorruptStorage", "DurableStorage", "StorageFailed", "StorageLocked"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
WAL_DIR = "wal"
SNAPSHOT_DIR = "snapshots"
LOCK_FILE = "LOCK"


@dataclass
class _Segment:
    sequence: int
    path: Path
    size_bytes: int = 0  # where its log ends: the next record is written there
    max_entry_index: int = 0  # highest index of any ENTRY record in it (0 = none)
    capacity: int = 0  # preallocated size (format 2); 0 for a format-1 segment
    header: wal.SegmentHeader | None = None
    next_capacity: int | None = None  # its NEXT_SEGMENT record's (None: it has none)


@dataclass
class _Replay:
    """What the files say, before any repair."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    entries: list[Entry] = field(default_factory=list)  # index > snapshot index, contiguous
    term_at_snapshot_index: int | None = None  # term of the WAL's entry at that index
    segments: list[_Segment] = field(default_factory=list)
    torn: list[tuple[_Segment, wal.TornTail]] = field(default_factory=list)
    # The newest segment has no header (created, never synced): "reuse" it in place, or
    # "drop" it (its rotation never finished: the segment before it is still the last).
    headerless: tuple[str, wal.TornTail | None] | None = None


class DurableStorage:
    """One node's durable Raft state. Create with `DurableStorage.open(data_dir)`."""

    def __init__(self, data_dir: Path, segment_bytes: int, lock_fd: int) -> None:
        # Use open(): it recovers the files and fills in the rest.
        self.data_dir = data_dir
        self._used = _has_identity(data_dir)
        self.segment_bytes = segment_bytes
        self._lock_fd: int | None = lock_fd
        self._wal_dir = data_dir / WAL_DIR
        self._snapshot_dir = data_dir / SNAPSHOT_DIR
        self._hard_state = HardState()
        self._snapshot: SnapshotMeta | None = None
        self._snapshot_path: Path | None = None
        self._terms: list[int] = []  # terms of entries first_index .. last_index
        self._sizes_bytes: list[int] = []  # data bytes of the same entries
        self._bytes_since_snapshot = 0
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # the last segment, open for appending
        self._unsynced = False
        self._failure: BaseException | None = None
        self._pending_load: PersistentState | None = None

    # --- opening and recovery -----------------------------------------------------------

    @classmethod
    def open(cls, data_dir: Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> DurableStorage:
        """Open (creating if needed) and recover the storage in `data_dir`.

        Raises CorruptStorage if anything but a torn last record is damaged, StorageLocked
        if another process has it open.
        """
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be >= 4096, got {segment_bytes}")
        data_dir = Path(data_dir)
        if _has_identity(data_dir) and not (data_dir / WAL_DIR).is_dir():
            raise CorruptStorage(data_dir / WAL_DIR, 0, _lost_wal(data_dir, "does not exist"))
        for directory in (data_dir, data_dir / WAL_DIR, data_dir / SNAPSHOT_DIR):
            if not directory.is_dir():
                directory.mkdir(parents=True, exist_ok=True)
                fsync_directory(directory.parent)
        lock_fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StorageLocked(
                f"{data_dir} is in use by another process (it holds {data_dir / LOCK_FILE}); "
                f"two nodes must never share a data directory"
            ) from None
        storage = cls(data_dir, segment_bytes, lock_fd)
        try:
            storage._recover()
        except BaseException:
            storage._release()
            raise
        return storage

    def _recover(self) -> None:
        for stale in self._snapshot_dir.glob("*" + TEMP_SUFFIX):
            # A snapshot whose rename never happened: it was never used.
            stale.unlink()
        replay = _replay(self._wal_dir, self._snapshot_dir, used=self._used)
        for segment, torn in replay.torn:
            _repair_torn(segment, torn)
        self._hard_state = replay.hard_state
        self._snapshot = replay.snapshot
        self._snapshot_path = (
            self._snapshot_dir / snapshot_name(replay.snapshot) if replay.snapshot else None
        )
        self._segments = replay.segments
        self._set_entries(replay.entries)
        fresh = None
        if replay.headerless is not None:
            action, torn = replay.headerless
            if action == "drop":
                log.warning("%s: a new segment whose rotation never finished (the one before "
                            "it has no NEXT_SEGMENT record); removing it", self._segments[-1].path)
                self._segments.pop().path.unlink()
                fsync_directory(self._wal_dir)
            else:
                fresh = self._segments[-1]
                self._prepare_headerless(fresh, torn)
        if not self._segments:
            self._start_segment(1)
        else:
            last = self._segments[-1]
            self._fd = os.open(last.path, os.O_WRONLY)
            os.lseek(self._fd, last.size_bytes, os.SEEK_SET)
            if last is fresh:
                # Created before its header was synced: write it now.
                self._write(wal.encode_segment_header(last.sequence, last.capacity), last)
            if last.capacity == 0:
                # A format-1 segment (written by the old code): seal it and go on in a
                # preallocated one, whose size tells a cut from a crash.
                self._rotate()
            # The last segment may have lost its copy of the hard state to a torn
            # rotation; once older segments are compacted away it must still be here.
            self._append_records(wal.encode_hard_state(self._hard_state))
        snapshot = replay.snapshot
        if (
            snapshot is not None
            and replay.term_at_snapshot_index is not None
            and replay.term_at_snapshot_index != snapshot.term
        ):
            # Crash between installing a snapshot and writing the TRUNCATE that discards
            # the conflicting log (Raft §7): finish it now.
            log.warning(
                "%s: the log's entry at snapshot index %d has term %d, the snapshot says %d; "
                "discarding the log after the snapshot (an interrupted snapshot install)",
                self._wal_dir, snapshot.index, replay.term_at_snapshot_index, snapshot.term,
            )
            self._append_records(wal.encode_truncate(snapshot.index))
            self._set_entries([])
            replay.entries = []
        self._sync_now()
        self._pending_load = PersistentState(
            hard_state=replay.hard_state,
            snapshot=replay.snapshot,
            snapshot_data=replay.snapshot_data,
            entries=tuple(replay.entries),
        )

    def _set_entries(self, entries: list[Entry]) -> None:
        self._terms = [entry.term for entry in entries]
        self._sizes_bytes = [len(entry.data) for entry in entries]
        self._bytes_since_snapshot = sum(self._sizes_bytes)

    # --- reading ------------------------------------------------------------------------

    def load(self) -> PersistentState:
        """What is stored: hard state, latest snapshot with its data, and the log after it.

        The first call after open hands over what recovery read (and forgets it, so entry
        data is not held twice); later calls read the files again.
        """
        self._check_usable()
        if self._pending_load is not None:
            state, self._pending_load = self._pending_load, None
            return state
        self.sync()
        replay = _replay(self._wal_dir, self._snapshot_dir, used=self._used)
        if replay.torn:
            segment, torn = replay.torn[0]
            raise CorruptStorage(segment.path, torn.offset, f"unexpected torn record: {torn.reason}")
        entries = replay.entries
        snapshot = replay.snapshot
        if (
            snapshot is not None
            and replay.term_at_snapshot_index is not None
            and replay.term_at_snapshot_index != snapshot.term
        ):
            entries = []
        return PersistentState(replay.hard_state, snapshot, replay.snapshot_data, tuple(entries))

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    @property
    def snapshot_meta(self) -> SnapshotMeta | None:
        return self._snapshot

    @property
    def snapshot_index(self) -> int:
        return self._snapshot.index if self._snapshot else 0

    @property
    def first_index(self) -> int:
        """Index of the first log entry kept after the snapshot (snapshot index + 1)."""
        return self.snapshot_index + 1

    @property
    def last_index(self) -> int:
        """Index of the last stored entry; the snapshot index if the log is empty."""
        return self.snapshot_index + len(self._terms)

    def term(self, index: int) -> int | None:
        """Term of the entry at `index` (or of the snapshot at its index); None if unknown."""
        if self._snapshot is not None and index == self._snapshot.index:
            return self._snapshot.term
        position = index - self.first_index
        if 0 <= position < len(self._terms):
            return self._terms[position]
        return None

    @property
    def log_entries_since_snapshot(self) -> int:
        return len(self._terms)

    @property
    def log_bytes_since_snapshot(self) -> int:
        """Entry data bytes stored after the snapshot (excluding record overhead)."""
        return self._bytes_since_snapshot

    # --- writing ------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries (not yet durable: call sync()). If entries[0].index <= last_index,
        the stored suffix from that index on is dropped first."""
        self._check_usable()
        if not entries:
            return
        first = entries[0].index
        for offset, entry in enumerate(entries):
            if entry.index != first + offset:
                raise ValueError(
                    f"entries to append must have consecutive indexes; got {entry.index} "
                    f"after {first + offset - 1}"
                )
            if entry.term < 1:
                raise ValueError(f"entry {entry.index} has term {entry.term}; terms start at 1")
        if first <= self.snapshot_index:
            raise ValueError(
                f"cannot append entry {first}: entries up to {self.snapshot_index} are "
                f"compacted into the snapshot"
            )
        if first > self.last_index + 1:
            raise ValueError(
                f"cannot append entry {first}: the log ends at {self.last_index}, so the next "
                f"entry must be {self.last_index + 1} (no gaps)"
            )
        self._pending_load = None
        try:
            buffers: list[bytes] = []
            segment = self._segments[-1]
            if first <= self.last_index:
                buffers += wal.encode_truncate(first)
                keep = first - self.first_index
                self._bytes_since_snapshot -= sum(self._sizes_bytes[keep:])
                del self._terms[keep:]
                del self._sizes_bytes[keep:]
            pending_bytes = wal.records_bytes(buffers)
            for entry in entries:
                record_bytes = wal.entry_record_bytes(entry)
                if not self._fits(segment, pending_bytes + record_bytes):
                    if pending_bytes:
                        # What is pending (a truncation record, or entries that fitted)
                        # must fit too: written past the room kept for NEXT_SEGMENT, it
                        # pushed that record past the preallocated end, and the next
                        # start refused the segment as cut (hypothesis found it).
                        if not self._fits(segment, pending_bytes):
                            segment = self._rotate(pending_bytes)
                        self._write(buffers, segment)
                        buffers, pending_bytes = [], 0
                    if not self._fits(segment, record_bytes):
                        segment = self._rotate(record_bytes)
                buffers += wal.encode_entry(entry)
                pending_bytes += record_bytes
                segment.max_entry_index = max(segment.max_entry_index, entry.index)
                self._terms.append(entry.term)
                self._sizes_bytes.append(len(entry.data))
                self._bytes_since_snapshot += len(entry.data)
            self._write(buffers, segment)
        except OSError as error:
            self._fail(error)
            raise

    def set_hard_state(self, hard_state: HardState) -> None:
        """Record term/vote/commit (not yet durable: call sync())."""
        self._check_usable()
        if hard_state == self._hard_state:
            return
        self._pending_load = None
        try:
            self._append_records(wal.encode_hard_state(hard_state))
        except OSError as error:
            self._fail(error)
            raise
        self._hard_state = hard_state

    def sync(self) -> None:
        """Make everything written so far durable (fdatasync). Call before acting on it."""
        self._check_usable()
        if self._unsynced:
            self._sync_now()

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Durably store this node's own snapshot of its state machine at `meta.index`
        (an applied, so stored and committed, index), then drop the log it covers."""
        self._check_usable()
        if meta.index <= self.snapshot_index:
            raise ValueError(
                f"snapshot at {meta.index} is not newer than the stored one at "
                f"{self.snapshot_index}"
            )
        stored_term = self.term(meta.index)
        if stored_term is None:
            raise ValueError(
                f"snapshot at {meta.index} is beyond the log ({self.first_index}.."
                f"{self.last_index}); a node snapshots only what it applied"
            )
        if stored_term != meta.term:
            raise ValueError(
                f"snapshot at {meta.index} says term {meta.term} but the log's entry there has "
                f"term {stored_term}"
            )
        self._store_snapshot(meta, data, discard_log=False)

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Durably store a snapshot received from the leader. Entries it covers are dropped;
        if the log's entry at `meta.index` has another term (or is missing), the whole log
        is discarded, else the entries after it are kept (Raft §7)."""
        self._check_usable()
        if meta.index <= self.snapshot_index:
            raise ValueError(
                f"snapshot at {meta.index} is not newer than the stored one at "
                f"{self.snapshot_index}; the core should have ignored it"
            )
        keep_suffix = self.term(meta.index) == meta.term
        self._store_snapshot(meta, data, discard_log=not keep_suffix)

    def _store_snapshot(self, meta: SnapshotMeta, data: bytes, *, discard_log: bool) -> None:
        self._pending_load = None
        try:
            self._sync_now()
            new_path = write_snapshot_file(self._snapshot_dir, meta, data)
            if discard_log and self.last_index >= meta.index:
                # The WAL holds a conflicting entry at or after meta.index: drop it (and
                # everything after) so that a replay cannot resurrect it.
                self._append_records(wal.encode_truncate(meta.index))
                self._sync_now()
            covered = min(max(0, meta.index - self.snapshot_index), len(self._terms))
            if discard_log:
                covered = len(self._terms)
            self._bytes_since_snapshot -= sum(self._sizes_bytes[:covered])
            del self._terms[:covered]
            del self._sizes_bytes[:covered]
            old_path = self._snapshot_path
            self._snapshot, self._snapshot_path = meta, new_path
            # Only now that the new snapshot is durable may what it replaces go.
            if old_path is not None and old_path != new_path:
                old_path.unlink(missing_ok=True)
                fsync_directory(self._snapshot_dir)
            self._drop_covered_segments()
        except OSError as error:
            self._fail(error)
            raise

    def _drop_covered_segments(self) -> None:
        dropped = False
        while len(self._segments) > 1 and self._segments[0].max_entry_index <= self.snapshot_index:
            self._segments.pop(0).path.unlink()
            dropped = True
        if dropped:
            fsync_directory(self._wal_dir)

    def close(self) -> None:
        """Sync (if still healthy) and release the files. Idempotent."""
        try:
            if self._failure is None and self._fd is not None and self._unsynced:
                self._sync_now()
        finally:
            self._release()

    def __enter__(self) -> DurableStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StorageFailed(
                f"storage in {self.data_dir} failed earlier ({self._failure}); what is on disk "
                f"is unknown until the node restarts and recovers"
            ) from self._failure
        if self._lock_fd is None:
            raise StorageFailed(f"storage in {self.data_dir} is closed")

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        log.error("storage in %s failed: %s; the node must restart", self.data_dir, error)

    def _release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # also releases the flock
            self._lock_fd = None

    def _write(self, buffers: list[bytes], segment: _Segment) -> None:
        assert self._fd is not None
        segment.size_bytes += write_all(self._fd, buffers)
        self._unsynced = True

    def _fits(self, segment: _Segment, record_bytes: int) -> bool:
        """Whether `record_bytes` more fit in the segment's preallocated room, leaving
        room for the NEXT_SEGMENT record that seals it."""
        room = segment.capacity - segment.size_bytes - wal.NEXT_SEGMENT_RECORD_BYTES
        return record_bytes <= room

    def _append_records(self, buffers: list[bytes]) -> None:
        """Write records to the newest segment, first rotating if they do not fit."""
        segment = self._segments[-1]
        record_bytes = wal.records_bytes(buffers)
        if not self._fits(segment, record_bytes):
            segment = self._rotate(record_bytes)
        self._write(buffers, segment)

    def _sync_now(self) -> None:
        assert self._fd is not None
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            self._fail(error)
            raise
        self._unsynced = False

    def _new_capacity(self, record_bytes: int) -> int:
        hard_state_bytes = wal.records_bytes(wal.encode_hard_state(self._hard_state))
        return wal.segment_capacity(self.segment_bytes, hard_state_bytes + record_bytes)

    def _create_segment_file(self, sequence: int, capacity: int) -> tuple[int, _Segment]:
        """A new segment file at its full size, durable (file and directory entry) before
        anything refers to it or is written to it: from then on its size can only change
        by damage, never by a crash. ftruncate makes it sparse (posix_fallocate would be
        emulated by writing zeros where the file system lacks fallocate)."""
        segment = _Segment(sequence, self._wal_dir / wal.segment_name(sequence),
                           capacity=capacity)
        fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, capacity)
            os.fsync(fd)
            fsync_directory(self._wal_dir)
        except BaseException:
            os.close(fd)
            raise
        return fd, segment

    def _rotate(self, record_bytes: int = 0) -> _Segment:
        # The full segment must be durable before records land in the next one: a later
        # segment's records are only valid if every earlier segment is whole. The next
        # file is created at its full size (and it and its directory entry synced) BEFORE
        # the full segment says it continues there with that size, so a crash can never
        # leave that record pointing at nothing or at a shorter file: a missing or cut
        # newest segment is then damage, never a crash (see _replay).
        old = self._segments[-1]
        capacity = self._new_capacity(record_bytes)
        new_fd, segment = self._create_segment_file(old.sequence + 1, capacity)
        self._write(wal.encode_next_segment(segment.sequence, capacity), old)
        old.next_capacity = capacity
        self._sync_now()
        assert self._fd is not None
        os.close(self._fd)
        self._fd = new_fd
        self._segments.append(segment)
        self._write(wal.encode_segment_header(segment.sequence, capacity), segment)
        self._write(wal.encode_hard_state(self._hard_state), segment)
        return segment

    def _start_segment(self, sequence: int) -> _Segment:
        self._fd, segment = self._create_segment_file(sequence, self._new_capacity(0))
        self._segments.append(segment)
        self._write(wal.encode_segment_header(sequence, segment.capacity), segment)
        self._write(wal.encode_hard_state(self._hard_state), segment)
        return segment

    def _prepare_headerless(self, segment: _Segment, torn: wal.TornTail | None) -> None:
        """Make the newest segment, created but never synced with its header, an empty
        preallocated segment again, keeping its size if it had reached it."""
        size = segment.path.stat().st_size
        if size < wal.BLOCK_BYTES:
            # Empty, or a format-1 header cut by a crash: nothing refers to its size (the
            # segment before it is format 1, or there is none).
            capacity = self._new_capacity(0)
            os.truncate(segment.path, 0)
            os.truncate(segment.path, capacity)
        else:
            capacity = size
            if torn is not None:
                _repair_torn(segment, torn)
        fd = os.open(segment.path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self._wal_dir)
        segment.capacity, segment.size_bytes = capacity, 0


def _has_identity(data_dir: Path) -> bool:
    """Whether the directory says it belongs to a member (system/kv/identity.py). The
    first start creates and syncs the WAL before either file, so from then on a missing
    WAL is a lost log, never a start cut short."""
    return any((data_dir / name).exists() for name in (IDENTITY_FILE, MEMBERS_FILE))


def _lost_wal(data_dir: Path, what: str) -> str:
    return (
        f"the WAL is missing: {data_dir / WAL_DIR} {what}, but {data_dir / IDENTITY_FILE} "
        f"(or {MEMBERS_FILE}) says this directory is a member that has written its log. A "
        f"node that lost its log may have lost entries it acknowledged, and must not vote "
        f"or count toward a commit as the same member"
    )


def _repair_torn(segment: _Segment, torn: wal.TornTail) -> None:
    """Cut a torn tail: a format-1 file is truncated; a preallocated one keeps its size
    and the torn bytes are zeroed (and synced) before anything is written after them."""
    if torn.zero_until is None:
        log.warning(
            "%s: torn last record at byte offset %d (%s); truncating the file to %d "
            "bytes. Expected after a crash: that record was never synced, so never "
            "acknowledged.", segment.path, torn.offset, torn.reason, torn.offset,
        )
        os.truncate(segment.path, torn.offset)
    else:
        log.warning(
            "%s: torn last record at byte offset %d (%s); zeroing bytes %d..%d. Expected "
            "after a crash: that record was never synced, so never acknowledged.",
            segment.path, torn.offset, torn.reason, torn.offset, torn.zero_until,
        )
        _zero_range(segment.path, torn.offset, torn.zero_until)
    segment.size_bytes = torn.offset


def _zero_range(path: Path, start: int, end: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        zeros = bytes(min(end - start, 1 << 20))
        position = start
        while position < end:
            position += os.pwrite(fd, zeros[: end - position], position)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _replay(wal_dir: Path, snapshot_dir: Path, *, used: bool) -> _Replay:
    """Read the snapshot and every segment; report torn tails (the caller repairs them).
    `used`: the directory has an identity, so its first segment was synced before."""
    replay = _Replay()
    snapshots = sorted(
        (parsed, path)
        for path in snapshot_dir.iterdir()
        if (parsed := parse_snapshot_name(path.name)) is not None
    )
    if snapshots:
        _, newest = snapshots[-1]
        replay.snapshot, replay.snapshot_data = read_snapshot_file(newest)
        for _, older in snapshots[:-1]:
            # Superseded by a durable newer snapshot (a crash came before its deletion).
            older.unlink()
    snapshot_index = replay.snapshot.index if replay.snapshot else 0

    numbered = sorted(
        (sequence, path)
        for path in wal_dir.iterdir()
        if (sequence := wal.parse_segment_name(path.name)) is not None
    )
    for position, (sequence, path) in enumerate(numbered):
        if position and sequence != numbered[position - 1][0] + 1:
            raise CorruptStorage(
                path, 0,
                f"segment {numbered[position - 1][0] + 1} is missing before this one",
            )
        replay.segments.append(_Segment(sequence, path, size_bytes=path.stat().st_size))
    if numbered and numbered[0][0] > 1 and replay.snapshot is None:
        first_sequence, first_path = numbered[0]
        raise CorruptStorage(
            snapshot_dir, 0,
            f"the snapshot file is missing: WAL segments before {first_path.name} are gone "
            f"(a gap before segment {first_sequence}), which happens only once a snapshot "
            f"covers them, but {snapshot_dir} holds no snapshot",
        )
    if not numbered and used:
        raise CorruptStorage(wal_dir, 0, _lost_wal(wal_dir.parent, "holds no segment"))
    if not numbered and replay.snapshot is not None:
        raise CorruptStorage(
            wal_dir, 0,
            f"the WAL is missing: {wal_dir} holds no segment, but a snapshot at index "
            f"{replay.snapshot.index} exists (the newest segment holds the term and vote)",
        )

    entries = replay.entries
    wal_last = 0  # index of the last entry in the WAL so far, after truncations
    for position, segment in enumerate(replay.segments):
        is_last = position == len(replay.segments) - 1
        scan = wal.SegmentScan(segment.path, is_last=is_last)
        saw_header = False
        for offset, record in scan:
            if offset == 0:
                if not isinstance(record, wal.SegmentHeader):
                    raise CorruptStorage(segment.path, 0, "segment does not start with its header")
                _check_follows(replay.segments[position - 1] if position else None, segment)
                if record.sequence != segment.sequence:
                    raise CorruptStorage(
                        segment.path, 0,
                        f"segment header says sequence {record.sequence}, the name "
                        f"says {segment.sequence}",
                    )
                saw_header = True
                continue
            if isinstance(record, Entry):
                segment.max_entry_index = max(segment.max_entry_index, record.index)
                if record.index <= snapshot_index:
                    if record.index == snapshot_index:
                        replay.term_at_snapshot_index = record.term
                    wal_last = record.index
                    continue
                expected = max(wal_last, snapshot_index) + 1
                if record.index != expected:
                    raise CorruptStorage(
                        segment.path, offset,
                        f"entry {record.index} where entry {expected} was expected "
                        f"(a gap or an overwrite without a truncation record)",
                    )
                entries.append(record)
                wal_last = record.index
            elif isinstance(record, HardState):
                replay.hard_state = record
            elif isinstance(record, wal.Truncate):
                if record.index > wal_last + 1 and record.index > snapshot_index + 1:
                    raise CorruptStorage(
                        segment.path, offset,
                        f"truncation at {record.index} beyond the log's end {wal_last}",
                    )
                if record.index <= snapshot_index:
                    entries.clear()
                    replay.term_at_snapshot_index = None
                else:
                    del entries[record.index - snapshot_index - 1 :]
                wal_last = min(wal_last, record.index - 1)
            elif isinstance(record, wal.NextSegment):
                segment.next_capacity = record.capacity
                if is_last:
                    missing = wal_dir / wal.segment_name(record.sequence)
                    raise CorruptStorage(
                        missing, 0,
                        f"the newest WAL segment is missing: {segment.path.name} ends by "
                        f"saying the log continues in {missing.name}, which does not exist",
                    )
            else:
                raise CorruptStorage(segment.path, offset, "a second segment header")
        segment.header = scan.header
        segment.capacity = scan.header.capacity if scan.header else 0
        segment.size_bytes = scan.end
        if not saw_header:
            if not is_last:
                # Only the newest segment can be caught between creation and its first write.
                raise CorruptStorage(segment.path, 0, "segment is empty but is not the last one")
            previous = replay.segments[position - 1] if position else None
            replay.headerless = (_headerless_newest(previous, segment, used), scan.torn)
        elif scan.torn is not None:
            replay.torn.append((segment, scan.torn))
    return replay


def _check_follows(previous: _Segment | None, segment: _Segment) -> None:
    """A segment with records is only reached through the NEXT_SEGMENT record that seals
    the one before it (synced before anything is written here): a preallocated segment
    without it lost its end."""
    if previous is None or previous.header is None or not previous.header.preallocated:
        return  # format 1 segments written before NEXT_SEGMENT existed lack it
    if previous.next_capacity is None:
        raise CorruptStorage(
            previous.path, previous.size_bytes,
            f"the log in this segment ends without the NEXT_SEGMENT record that seals a "
            f"full segment, yet {segment.path.name} after it holds records: the end of this "
            f"segment (synced and possibly acknowledged records) was lost",
        )


def _headerless_newest(previous: _Segment | None, segment: _Segment, used: bool) -> str:
    """What to do with a newest segment that has no header: "drop" it, "reuse" it, or
    CorruptStorage if its header must have been synced (so it was lost, not unwritten)."""
    size = segment.path.stat().st_size
    if previous is None:
        if segment.sequence > 1 or used:
            raise CorruptStorage(
                segment.path, 0,
                "the only WAL segment has no header, but it was synced before this "
                "directory got its identity (or before older segments were removed): its "
                "records were lost",
            )
        return "reuse"  # the very first start was cut short
    if previous.next_capacity is None:
        return "drop"  # its rotation was cut short: nothing was written to it
    if previous.next_capacity and size != previous.next_capacity:
        raise CorruptStorage(
            segment.path, min(size, previous.next_capacity),
            f"the newest segment is {size} bytes but was preallocated to "
            f"{previous.next_capacity} ({previous.path.name} says so): it was cut. A crash "
            f"never changes a preallocated segment's size",
        )
    return "reuse"
