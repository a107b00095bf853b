"""Durable storage: round trips, suffix overwrite, snapshots and compaction, and recovery
from torn and corrupt files. Checksum and truncation rules are each shown to matter by a
broken variant made here with monkeypatch."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from system.kv import snapshot_file, storage, wal
from system.kv.storage import CorruptStorage, DurableStorage, StorageFailed, StorageLocked
from system.raft.types import Entry, EntryKind, HardState, SnapshotMeta

SMALL_SEGMENT_BYTES = 4096


def entries(first: int, last: int, term: int = 1, size: int = 20) -> list[Entry]:
    return [
        Entry(term=term, index=index, data=f"{term}:{index}:".encode().ljust(size, b"."))
        for index in range(first, last + 1)
    ]


def reopen(data_dir: Path, **kwargs) -> DurableStorage:
    return DurableStorage.open(data_dir, segment_bytes=SMALL_SEGMENT_BYTES, **kwargs)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "node"


def segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


def record_offsets(path: Path) -> list[int]:
    return [offset for offset, _ in wal.SegmentScan(path, is_last=True)]


# --- round trips ---------------------------------------------------------------------------


def test_a_fresh_directory_loads_as_empty(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        state = store.load()
        assert state.hard_state == HardState() and state.snapshot is None
        assert state.entries == () and state.snapshot_data == b""
        assert (store.first_index, store.last_index) == (1, 0)


def test_entries_and_hard_state_survive_reopen(data_dir: Path) -> None:
    written = entries(1, 50) + [Entry(term=2, index=51, kind=EntryKind.NOOP)]
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=2, vote="n2", commit=40))
        store.append(written)
        store.sync()
    with reopen(data_dir) as store:
        state = store.load()
        assert state.entries == tuple(written)
        assert state.hard_state == HardState(term=2, vote="n2", commit=40)
        assert store.last_index == 51 and store.term(51) == 2
        assert store.log_entries_since_snapshot == 51
        assert store.log_bytes_since_snapshot == 50 * 20
        assert store.load() == state  # a second load reads the files again


def test_hard_state_with_no_vote_and_an_empty_vote_are_kept_apart(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=3, vote="", commit=0))
    with reopen(data_dir) as store:
        assert store.load().hard_state.vote == ""
        store.set_hard_state(HardState(term=4, vote=None))
    with reopen(data_dir) as store:
        assert store.load().hard_state == HardState(term=4, vote=None)


def test_segments_rotate_by_size_and_all_are_read_back(data_dir: Path) -> None:
    written = entries(1, 400, size=100)
    with reopen(data_dir) as store:
        store.append(written[:150])
        store.append(written[150:])
        store.sync()
    assert len(segments(data_dir)) > 5
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(written)


def test_an_entry_larger_than_a_segment_is_stored_whole(data_dir: Path) -> None:
    big = Entry(term=1, index=1, data=bytes(range(256)) * 100)  # 25,600 bytes > 4,096
    with reopen(data_dir) as store:
        store.append([big, *entries(2, 3)])
    with reopen(data_dir) as store:
        assert store.load().entries[0] == big


def test_overwriting_a_suffix_drops_it(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 10, term=1))
        store.append(entries(6, 8, term=2))
        assert store.last_index == 8 and store.term(6) == 2
        store.sync()
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(1, 5, term=1) + entries(6, 8, term=2))
        store.append(entries(3, 4, term=3))  # again, after a reopen
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(1, 2, term=1) + entries(3, 4, term=3))


def test_append_refuses_gaps_and_compacted_indexes(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 5))
        with pytest.raises(ValueError, match="no gaps"):
            store.append(entries(7, 8))
        with pytest.raises(ValueError, match="consecutive"):
            store.append([*entries(6, 6), *entries(8, 8)])
        store.save_snapshot(SnapshotMeta(3, 1, ("n1",)), b"s")
        with pytest.raises(ValueError, match="compacted"):
            store.append(entries(3, 4, term=2))
        assert store.last_index == 5


def test_a_second_process_cannot_open_the_same_directory(data_dir: Path) -> None:
    with reopen(data_dir), pytest.raises(StorageLocked, match="in use"):
        reopen(data_dir)


def test_a_closed_storage_refuses_writes(data_dir: Path) -> None:
    store = reopen(data_dir)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StorageFailed, match="closed"):
        store.append(entries(1, 1))


def test_after_a_failed_fsync_every_call_is_refused(data_dir: Path, monkeypatch) -> None:
    store = reopen(data_dir)
    store.append(entries(1, 1))

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(storage.os, "fdatasync", failing_fdatasync)
    with pytest.raises(OSError):
        store.sync()
    monkeypatch.undo()
    with pytest.raises(StorageFailed, match="failed earlier"):
        store.sync()  # never retry an fsync that failed: the pages may be gone
    store.close()


# --- snapshots -----------------------------------------------------------------------------


def test_save_snapshot_compacts_the_log_and_survives_reopen(data_dir: Path) -> None:
    written = entries(1, 300, size=100)
    with reopen(data_dir) as store:
        store.append(written)
        before = len(segments(data_dir))
        store.save_snapshot(SnapshotMeta(250, 1, ("n1", "n2", "n3")), b"state@250")
        assert len(segments(data_dir)) < before
        assert (store.first_index, store.last_index) == (251, 300)
        assert store.log_entries_since_snapshot == 50
        assert store.log_bytes_since_snapshot == 50 * 100
        store.save_snapshot(SnapshotMeta(260, 1, ("n1", "n2", "n3")), b"state@260")
    assert [p.name for p in (data_dir / "snapshots").iterdir()] == [
        snapshot_file.snapshot_name(SnapshotMeta(260, 1, ()))
    ]
    with reopen(data_dir) as store:
        state = store.load()
        assert state.snapshot == SnapshotMeta(260, 1, ("n1", "n2", "n3"))
        assert state.snapshot_data == b"state@260"
        assert state.entries == tuple(written[260:])
        assert store.term(260) == 1 and store.term(259) is None


def test_save_snapshot_refuses_what_the_log_does_not_support(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 10, term=2))
        with pytest.raises(ValueError, match="beyond the log"):
            store.save_snapshot(SnapshotMeta(11, 2, ()), b"")
        with pytest.raises(ValueError, match="term"):
            store.save_snapshot(SnapshotMeta(5, 1, ()), b"")
        store.save_snapshot(SnapshotMeta(5, 2, ()), b"")
        with pytest.raises(ValueError, match="not newer"):
            store.save_snapshot(SnapshotMeta(5, 2, ()), b"")


def test_install_snapshot_matching_the_log_keeps_the_entries_after_it(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 20, term=1))
        store.install_snapshot(SnapshotMeta(12, 1, ("n1",)), b"leader@12")
        assert (store.first_index, store.last_index) == (13, 20)
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(13, 20, term=1))


def test_install_snapshot_conflicting_with_the_log_discards_all_of_it(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 20, term=1))
        store.install_snapshot(SnapshotMeta(12, 2, ("n1",)), b"leader@12")
        assert (store.first_index, store.last_index) == (13, 12)
        store.append(entries(13, 14, term=2))
        store.sync()
    with reopen(data_dir) as store:
        state = store.load()
        assert state.snapshot == SnapshotMeta(12, 2, ("n1",))
        assert state.entries == tuple(entries(13, 14, term=2))


def test_install_snapshot_beyond_the_log_discards_it_and_continues_after(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 10))
        store.install_snapshot(SnapshotMeta(100, 3, ("n1",)), b"leader@100")
        assert store.last_index == 100
        store.append(entries(101, 103, term=3))
    with reopen(data_dir) as store:
        state = store.load()
        assert state.snapshot.index == 100 and state.entries == tuple(entries(101, 103, term=3))


def test_a_crash_between_snapshot_install_and_log_truncation_is_finished_at_open(
    data_dir: Path, caplog
) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 20, term=1))
    # The snapshot file of an install landed, the TRUNCATE after it did not.
    snapshot_file.write_snapshot_file(data_dir / "snapshots", SnapshotMeta(12, 2, ()), b"s")
    with caplog.at_level(logging.WARNING), reopen(data_dir) as store:
        assert store.load().entries == ()
        assert store.last_index == 12
    assert "interrupted snapshot install" in caplog.text
    with reopen(data_dir) as store:  # and the repair itself is durable
        store.append(entries(13, 13, term=2))
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(13, 13, term=2))


def test_stale_snapshot_temp_files_are_removed_at_open(data_dir: Path) -> None:
    reopen(data_dir).close()
    temp = data_dir / "snapshots" / "snapshot-x.snap.tmp"
    temp.write_bytes(b"half written")
    reopen(data_dir).close()
    assert not temp.exists()


# --- torn tails ----------------------------------------------------------------------------


def write_log(data_dir: Path, count: int = 10) -> list[Entry]:
    written = entries(1, count)
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=1, vote="n1", commit=0))
        store.append(written)
    return written


def log_end(path: Path) -> int:
    """Where the segment's log ends (a preallocated segment is longer than its data)."""
    scan = wal.SegmentScan(path, is_last=True)
    for _ in scan:
        pass
    return scan.end


def zero_range(path: Path, start: int, end: int) -> None:
    with path.open("r+b") as file:
        file.seek(start)
        file.write(bytes(end - start))


def write_log_with_a_big_last_record(data_dir: Path) -> tuple[list[Entry], Path, int, int]:
    """Ten small entries, then an 9000-byte one whose record starts 5 bytes before a block
    boundary (so a crash can split its header too). Returns the small entries, the
    segment, and the big record's start and end."""
    written = entries(1, 10)
    with DurableStorage.open(data_dir, segment_bytes=64 * 1024) as store:
        store.set_hard_state(HardState(term=1, vote="n1", commit=0))
        store.append(written)
        [segment] = segments(data_dir)
        filler = 4096 - 5 - log_end(segment) - wal.RECORD_HEADER_BYTES - 17
        store.append([Entry(term=1, index=11, data=b"f" * filler)])
        assert log_end(segment) == 4091
        store.append([Entry(term=1, index=12, data=b"z" * 9000)])
    return [*written, Entry(term=1, index=11, data=b"f" * filler)], segment, 4091, log_end(segment)


def test_a_torn_last_record_is_zeroed_with_a_warning_naming_file_and_offset(
    data_dir: Path, caplog
) -> None:
    """A crash that left a page-aligned prefix of the last record (the rest of the file
    zero): the record was never synced, so it is dropped, in place: the size stays."""
    kept, segment, start, end = write_log_with_a_big_last_record(data_dir)
    size = segment.stat().st_size
    zero_range(segment, 8192, end)
    with caplog.at_level(logging.WARNING), reopen(data_dir) as store:
        assert store.load().entries == tuple(kept)
    assert f"{segment}: torn last record at byte offset {start}" in caplog.text
    assert segment.stat().st_size == size
    # The torn bytes are gone: the record now at that offset is the hard state that every
    # open re-records.
    records = dict(wal.SegmentScan(segment, is_last=True))
    assert records[start] == HardState(term=1, vote="n1", commit=0)


def test_every_crash_prefix_of_the_last_record_recovers_the_prefix(
    data_dir: Path, tmp_path: Path, caplog
) -> None:
    """Zero from each block boundary inside the last record (a killed write leaves a
    page-aligned prefix; a power cut loses whole blocks), including one that splits its
    header, or the whole record: the log before it is recovered and continues."""
    kept, segment, start, end = write_log_with_a_big_last_record(data_dir)
    big = Entry(term=1, index=12, data=b"z" * 9000)
    for cut in [start, 4096, 8192, 12288]:
        assert start <= cut < end
        trial = tmp_path / f"cut-{cut}"
        shutil.copytree(data_dir, trial)
        trial_segment = trial / "wal" / segment.name
        zero_range(trial_segment, cut, end)
        caplog.clear()
        with caplog.at_level(logging.WARNING), reopen(trial) as store:
            assert store.load().entries == tuple(kept), f"cut at {cut}"
            store.append([big])  # the log continues cleanly after the repair
        assert (cut == start) == ("torn" not in caplog.text), f"cut at {cut}"
        with reopen(trial) as store:
            assert store.load().entries == (*kept, big)
        shutil.rmtree(trial)


@pytest.mark.parametrize("where", ["1 byte", "60% mid-record", "record boundary",
                                   "after the header"])
def test_a_cut_preallocated_segment_is_refused(data_dir: Path, where: str) -> None:
    """Cutting the end off a segment (what a crash never does to a preallocated file) loses
    records that may have been synced and acknowledged: refused, naming the file."""
    with DurableStorage.open(data_dir, segment_bytes=64 * 1024) as store:
        store.set_hard_state(HardState(term=1, vote="n1", commit=0))
        store.append(entries(1, 100, size=100))
    [segment] = segments(data_dir)
    offsets = record_offsets(segment)
    end = log_end(segment)
    cut = {
        "1 byte": segment.stat().st_size - 1,
        "60% mid-record": int(end * 0.6),
        "record boundary": offsets[60],
        "after the header": offsets[1],
    }[where]
    if where == "60% mid-record":
        assert cut not in offsets
    with segment.open("r+b") as file:
        file.truncate(cut)
    with pytest.raises(CorruptStorage) as caught:
        reopen(data_dir)
    assert caught.value.path == segment
    assert "preallocated" in str(caught.value)


def test_a_cut_newest_segment_after_a_rotation_is_refused(data_dir: Path) -> None:
    """Also when several segments exist, and when the cut leaves no header: the segment
    before it names the size it was created with."""
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
    files = segments(data_dir)
    assert len(files) > 2
    for cut in (int(log_end(files[-1]) * 0.6), 0):
        with files[-1].open("r+b") as file:
            file.truncate(cut)
        with pytest.raises(CorruptStorage, match="preallocated") as caught:
            reopen(data_dir)
        assert caught.value.path == files[-1]


def test_non_zero_bytes_after_the_logs_end_are_corruption(data_dir: Path) -> None:
    write_log(data_dir)
    [segment] = segments(data_dir)
    end = log_end(segment)
    with segment.open("r+b") as file:
        file.seek(end + 100)
        file.write(b"x")
    with pytest.raises(CorruptStorage, match="not zero") as caught:
        reopen(data_dir)
    assert caught.value.offset == end


def test_the_log_continues_after_a_torn_tail_only_because_it_was_zeroed(
    data_dir: Path, monkeypatch
) -> None:
    """Broken variant: recovery that reports but does not zero the torn bytes leaves
    them after the records written next, and the next open must refuse it."""
    _, segment, _, end = write_log_with_a_big_last_record(data_dir)
    zero_range(segment, 8192, end)
    monkeypatch.setattr(storage, "_zero_range", lambda path, start, end: None)
    with reopen(data_dir) as store:
        store.append(entries(12, 14, term=2))
    monkeypatch.undo()
    with pytest.raises(CorruptStorage):
        reopen(data_dir)


# --- corruption ----------------------------------------------------------------------------


def test_every_flipped_byte_of_a_middle_record_is_refused_with_file_and_offset(
    data_dir: Path, tmp_path: Path
) -> None:
    write_log(data_dir)
    [segment] = segments(data_dir)
    offsets = record_offsets(segment)
    start, end = offsets[5], offsets[6]
    for position in range(start, end):
        trial = tmp_path / f"flip-{position}"
        shutil.copytree(data_dir, trial)
        trial_segment = trial / "wal" / segment.name
        data = bytearray(trial_segment.read_bytes())
        data[position] ^= 0x01
        trial_segment.write_bytes(bytes(data))
        with pytest.raises(CorruptStorage) as caught:
            reopen(trial)
        assert caught.value.path == trial_segment and caught.value.offset == start
        assert f"{trial_segment}: corrupt at byte offset {start}" in str(caught.value)
        shutil.rmtree(trial)


def test_flipped_byte_check_fails_without_checksums(data_dir: Path, monkeypatch) -> None:
    """Broken variant: with every checksum computed as 0, a flipped data byte is served."""

    class NoChecksum:
        @staticmethod
        def crc32c(data, value=0) -> int:
            return 0

    monkeypatch.setattr(wal, "crc32c", NoChecksum)
    written = write_log(data_dir)
    [segment] = segments(data_dir)
    middle = record_offsets(segment)[5]
    data = bytearray(segment.read_bytes())
    data[middle + wal.RECORD_HEADER_BYTES + 17] ^= 0x01  # first data byte of the entry
    segment.write_bytes(bytes(data))
    with reopen(data_dir) as store:
        served = store.load().entries
    assert served != tuple(written)  # corrupt data served: what the checksums prevent


def test_a_damaged_last_record_in_a_segment_that_is_not_the_last_is_corruption(
    data_dir: Path,
) -> None:
    """Damage that would be a torn tail in the newest segment (zero from a block boundary
    inside a record) is corruption in an older one: it was synced before the next began."""
    with DurableStorage.open(data_dir, segment_bytes=16 * 1024) as store:
        store.append(entries(1, 40, size=1000))
    first = segments(data_dir)[0]
    assert len(segments(data_dir)) > 1
    offsets = record_offsets(first)
    pairs = zip(offsets, offsets[1:], strict=False)
    spanning = [o for o, n in pairs if o // 4096 != (n - 1) // 4096]
    victim = spanning[-1]
    zero_range(first, -(-(victim + 1) // 4096) * 4096, log_end(first))
    with pytest.raises(CorruptStorage, match="not the last") as caught:
        reopen(data_dir)
    assert caught.value.path == first and caught.value.offset == victim


def test_a_segment_that_lost_its_sealing_record_is_corruption(data_dir: Path) -> None:
    """An older segment whose NEXT_SEGMENT record reads as zero lost its end."""
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
    first = segments(data_dir)[0]
    last_offset = record_offsets(first)[-1]
    zero_range(first, last_offset, log_end(first))
    with pytest.raises(CorruptStorage, match="NEXT_SEGMENT") as caught:
        reopen(data_dir)
    assert caught.value.path == first


def test_a_missing_middle_segment_is_corruption(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
    files = segments(data_dir)
    files[1].unlink()
    with pytest.raises(CorruptStorage, match="missing"):
        reopen(data_dir)


def test_a_missing_first_segment_is_detected_as_a_gap(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
    segments(data_dir)[0].unlink()
    with pytest.raises(CorruptStorage, match="gap"):
        reopen(data_dir)


def test_a_corrupt_snapshot_file_is_refused(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 10))
        store.save_snapshot(SnapshotMeta(8, 1, ("n1",)), b"snapshot-bytes" * 10)
    [path] = (data_dir / "snapshots").iterdir()
    original = path.read_bytes()
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 0x10
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptStorage) as caught:
            reopen(data_dir)
        assert caught.value.path == path
    path.write_bytes(original[:-1])
    with pytest.raises(CorruptStorage, match="file ends inside"):
        reopen(data_dir)
    path.write_bytes(original)
    with reopen(data_dir) as store:
        assert store.load().snapshot_data == b"snapshot-bytes" * 10


def test_corrupt_snapshot_check_fails_without_the_checksum(data_dir: Path, monkeypatch) -> None:
    class NoChecksum:
        @staticmethod
        def crc32c(data, value=0) -> int:
            return 0

    monkeypatch.setattr(snapshot_file, "crc32c", NoChecksum)
    with reopen(data_dir) as store:
        store.append(entries(1, 10))
        store.save_snapshot(SnapshotMeta(8, 1, ("n1",)), b"snapshot-bytes")
    [path] = (data_dir / "snapshots").iterdir()
    damaged = bytearray(path.read_bytes())
    damaged[-6] ^= 0x10  # a data byte
    path.write_bytes(bytes(damaged))
    with reopen(data_dir) as store:
        assert store.load().snapshot_data != b"snapshot-bytes"


def test_hard_state_survives_when_a_rotation_was_cut_before_its_copy(data_dir: Path) -> None:
    """A crash between creating a segment and writing its hard-state copy must not let a
    later compaction delete the only record of the term and vote."""
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=5, vote="n1", commit=0))
        store.append(entries(1, 60, size=100))
    first, second = segments(data_dir)[:2]
    second_offsets = record_offsets(second)
    zero_range(second, second_offsets[1], log_end(second))  # only the header was synced
    for extra in segments(data_dir)[2:]:
        extra.unlink()
    with reopen(data_dir) as store:
        last = store.last_index
        store.save_snapshot(SnapshotMeta(last, 1, ("n1",)), b"s")
        assert not first.exists()
    with reopen(data_dir) as store:
        assert store.load().hard_state == HardState(term=5, vote="n1", commit=0)


# --- model check: any sequence of operations reads back as a simple in-memory model -------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 30), st.integers(1, 9)),
        st.tuples(st.just("hard_state"), st.integers(0, 9), st.sampled_from([None, "", "n2"]),
                  st.integers(0, 50)),
        st.tuples(st.just("save_snapshot"), st.integers(0, 40), st.just(0), st.just(0)),
        st.tuples(st.just("install_snapshot"), st.integers(0, 45), st.booleans(), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=25,
)


class LogModel:
    def __init__(self) -> None:
        self.snapshot: SnapshotMeta | None = None
        self.snapshot_data = b""
        self.entries: list[Entry] = []
        self.hard_state = HardState()

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot else 0

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self.entries)

    def term(self, index: int) -> int | None:
        if self.snapshot and index == self.snapshot.index:
            return self.snapshot.term
        position = index - self.snapshot_index - 1
        return self.entries[position].term if 0 <= position < len(self.entries) else None


def apply_operation(store: DurableStorage, model: LogModel, operation) -> None:
    kind, a, b, c = operation
    if kind == "append":
        first = max(model.snapshot_index + 1, model.last_index + 1 - a)
        new = [Entry(c, index, b"%d/%d" % (c, index) * (index % 7)) for index in
               range(first, first + b)]
        store.append(new)
        model.entries = model.entries[: first - model.snapshot_index - 1] + new
    elif kind == "hard_state":
        state = HardState(term=a, vote=b, commit=c)
        store.set_hard_state(state)
        model.hard_state = state
    elif kind == "save_snapshot" and model.entries:
        index = model.snapshot_index + 1 + a % len(model.entries)
        meta = SnapshotMeta(index, model.term(index), ("n1",))
        store.save_snapshot(meta, b"own@%d" % index)
        model.entries = model.entries[index - model.snapshot_index :]
        model.snapshot, model.snapshot_data = meta, b"own@%d" % index
    elif kind == "install_snapshot":
        index = model.snapshot_index + 1 + a % (len(model.entries) + 5)
        term = model.term(index) if b and model.term(index) else 100
        meta = SnapshotMeta(index, term, ("n1", "n2"))
        store.install_snapshot(meta, b"leader@%d" % index)
        keep = model.term(index) == term
        model.entries = model.entries[index - model.snapshot_index :] if keep else []
        model.snapshot, model.snapshot_data = meta, b"leader@%d" % index


def assert_matches(store: DurableStorage, model: LogModel) -> None:
    state = store.load()
    assert state.entries == tuple(model.entries)
    assert (state.snapshot, state.snapshot_data) == (model.snapshot, model.snapshot_data)
    assert state.hard_state == model.hard_state
    assert (store.first_index, store.last_index) == (model.snapshot_index + 1, model.last_index)
    assert store.log_entries_since_snapshot == len(model.entries)
    assert store.log_bytes_since_snapshot == sum(len(entry.data) for entry in model.entries)


@settings(max_examples=150, deadline=None)
@given(steps=operations)
def test_any_sequence_of_operations_reads_back_like_the_model(steps) -> None:
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        model = LogModel()
        store = DurableStorage.open(data_dir, segment_bytes=4096)
        try:
            for operation in steps:
                if operation[0] == "reopen":
                    store.close()
                    store = DurableStorage.open(data_dir, segment_bytes=4096)
                    assert_matches(store, model)
                else:
                    apply_operation(store, model, operation)
            assert_matches(store, model)
        finally:
            store.close()
        with DurableStorage.open(data_dir, segment_bytes=4096) as reopened:
            assert_matches(reopened, model)


def test_a_truncation_that_fills_a_segment_never_pushes_it_past_its_preallocated_size(
        data_dir: Path) -> None:
    """Found by the test above (CI, 2026-12-06): an append that overwrote the last entry
    of a nearly full segment wrote its truncation record into the room kept for the
    NEXT_SEGMENT record, so the rotation that followed grew the file past its capacity,
    and the next start refused the segment as cut."""
    model = LogModel()
    with DurableStorage.open(data_dir, segment_bytes=4096) as store:
        for step in [("append", 0, 19, 1), ("append", 0, 22, 1), ("append", 1, 24, 1),
                     ("append", 0, 30, 1), ("append", 1, 1, 1)]:
            apply_operation(store, model, step)
        store.sync()
    sizes = {path.name: path.stat().st_size for path in segments(data_dir)}
    assert len(sizes) == 2 and set(sizes.values()) == {4096}, sizes
    with DurableStorage.open(data_dir, segment_bytes=4096) as reopened:
        assert_matches(reopened, model)


def test_64_mib_entries_round_trip_and_rotate_segments(data_dir: Path) -> None:
    value = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    with DurableStorage.open(data_dir) as store:  # default 64 MiB segments
        store.append([Entry(1, 1, value), Entry(1, 2, value), Entry(1, 3, b"small")])
        store.sync()
        assert store.log_bytes_since_snapshot == 2 * len(value) + 5
    assert len(segments(data_dir)) == 3  # each value fills a segment; "small" starts a third
    with DurableStorage.open(data_dir) as store:
        state = store.load()
        assert [entry.data == value for entry in state.entries] == [True, True, False]
        del state
        store.save_snapshot(SnapshotMeta(2, 1, ("n1",)), b"s")
    assert len(segments(data_dir)) == 1


# --- complete records and missing files (issue: membership, point 3 and 4) ---------------


def test_a_complete_last_record_that_fails_its_checksum_is_corruption(
    data_dir: Path, tmp_path: Path
) -> None:
    """Every byte of the last record is there, and one is wrong: that record may have
    been synced and acknowledged, so it is corruption naming file and offset, not a torn
    write to drop (the rule before: any checksum failure at the tail was 'torn')."""
    write_log(data_dir)
    [segment] = segments(data_dir)
    last_offset = record_offsets(segment)[-1]
    data = bytearray(segment.read_bytes())
    data[log_end(segment) - 3] ^= 0x40  # a data byte of the last record
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptStorage) as caught:
        reopen(data_dir)
    assert caught.value.path == segment and caught.value.offset == last_offset


def test_a_last_record_ending_in_a_never_written_block_is_torn(data_dir: Path, caplog) -> None:
    """After a power cut the file's size may cover a block that never reached the disk:
    its bytes read as zeros. That last record was never synced, so it is torn."""
    written = write_log(data_dir)
    with reopen(data_dir) as store:
        store.append([Entry(term=1, index=11, data=b"z" * 9000)])
    segment = segments(data_dir)[-1]
    last_offset = record_offsets(segment)[-1]
    data = bytearray(segment.read_bytes())
    boundary = -(-(last_offset + 1) // 4096) * 4096
    data[boundary:] = bytes(len(data) - boundary)
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING), reopen(data_dir) as store:
        assert store.load().entries == tuple(written)
    assert "zero-filled" in caplog.text


def test_a_missing_newest_segment_is_reported_as_missing(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
    files = segments(data_dir)
    assert len(files) > 2
    files[-1].unlink()
    with pytest.raises(CorruptStorage, match="newest WAL segment is missing") as caught:
        reopen(data_dir)
    assert caught.value.path == files[-1]


def test_a_missing_snapshot_file_is_reported_as_missing(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
        store.save_snapshot(SnapshotMeta(150, 1, ("n1",)), b"state")
    [snapshot] = (data_dir / "snapshots").iterdir()
    snapshot.unlink()
    with pytest.raises(CorruptStorage, match="snapshot file is missing"):
        reopen(data_dir)


def test_a_missing_wal_beside_a_snapshot_is_reported_as_missing(data_dir: Path) -> None:
    with reopen(data_dir) as store:
        store.append(entries(1, 200, size=100))
        store.save_snapshot(SnapshotMeta(150, 1, ("n1",)), b"state")
    for path in segments(data_dir):
        path.unlink()
    with pytest.raises(CorruptStorage, match="WAL is missing"):
        reopen(data_dir)


def test_the_catch_up_index_of_a_voter_that_lost_entries_survives_reopen(data_dir: Path) -> None:
    """HardState.catch_up_to (no vote until caught up) must outlive a crash, or a voter
    that lost entries and then restarts would vote again on its shortened log."""
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=3, vote="n2", commit=0, catch_up_to=300))
    with reopen(data_dir) as store:
        assert store.load().hard_state == HardState(term=3, vote="n2", commit=0, catch_up_to=300)


# --- a log that went backwards (issue 20): refused, never served as a shorter log --------


def give_identity(data_dir: Path) -> None:
    from system.kv.identity import STATE_MEMBER, Identity, save_identity

    save_identity(data_dir, Identity("c-1", "n1", "m-1", STATE_MEMBER))


@pytest.mark.parametrize("how", ["wal folder deleted", "wal folder emptied"])
def test_a_member_directory_without_its_wal_is_refused(data_dir: Path, how: str) -> None:
    """IDENTITY is written after the first segment is synced, so a directory that has it but
    no WAL lost its log; starting on an empty log as the same member would let it vote
    and count toward commits without the entries it acknowledged."""
    write_log(data_dir)
    give_identity(data_dir)
    if how == "wal folder deleted":
        shutil.rmtree(data_dir / "wal")
    else:
        for path in segments(data_dir):
            path.unlink()
    with pytest.raises(CorruptStorage, match="WAL is missing") as caught:
        reopen(data_dir)
    assert caught.value.path == data_dir / "wal"
    assert "IDENTITY" in str(caught.value)
    assert not (data_dir / "wal").exists() or how == "wal folder emptied"  # nothing created


def test_without_an_identity_a_missing_wal_is_a_fresh_start(data_dir: Path) -> None:
    write_log(data_dir)
    shutil.rmtree(data_dir / "wal")
    with reopen(data_dir) as store:
        assert store.load().entries == ()


def test_the_only_segment_cut_to_nothing_is_refused_once_the_directory_has_an_identity(
    data_dir: Path,
) -> None:
    """Without an identity an empty first segment is a first start cut short (nothing was
    ever acknowledged); with one, its header was synced before the identity was written."""
    write_log(data_dir)
    [segment] = segments(data_dir)
    segment.write_bytes(b"")
    with reopen(data_dir) as store:
        assert store.load().entries == ()
    segment.write_bytes(b"")
    give_identity(data_dir)
    with pytest.raises(CorruptStorage, match="no header") as caught:
        reopen(data_dir)
    assert caught.value.path == segment


def test_a_rotation_cut_before_its_sealing_record_drops_the_unused_new_segment(
    data_dir: Path, caplog
) -> None:
    """A crash after the next segment was created but before NEXT_SEGMENT was synced: the
    new file (full size, all zero) holds nothing; the log goes on in the older one."""
    written = entries(1, 5)
    with reopen(data_dir) as store:
        store.append(written)
    [segment] = segments(data_dir)
    leftover = segment.with_name(wal.segment_name(2))
    with leftover.open("wb") as file:
        file.truncate(4096)
    with caplog.at_level(logging.WARNING), reopen(data_dir) as store:
        assert store.load().entries == tuple(written)
        store.append(entries(6, 100))
    assert "rotation never finished" in caplog.text
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(1, 100))


def write_format_1_segment(data_dir: Path, written: list[Entry]) -> Path:
    """A segment as the code before preallocation wrote it: its size is its data's end."""
    (data_dir / "wal").mkdir(parents=True)
    (data_dir / "snapshots").mkdir()
    path = data_dir / "wal" / wal.segment_name(1)
    buffers = [*wal.encode_segment_header_v1(1),
               *wal.encode_hard_state(HardState(term=2, vote="n1", commit=3))]
    for entry in written:
        buffers += wal.encode_entry(entry)
    path.write_bytes(b"".join(buffers))
    return path


def test_format_1_segments_still_open_and_the_log_goes_on_preallocated(data_dir: Path) -> None:
    written = entries(1, 30)
    old = write_format_1_segment(data_dir, written)
    with reopen(data_dir) as store:
        state = store.load()
        assert state.entries == tuple(written)
        assert state.hard_state == HardState(term=2, vote="n1", commit=3)
        store.append(entries(31, 40))
    files = segments(data_dir)
    assert files[0] == old and len(files) >= 2
    headers = [next(iter(wal.SegmentScan(path, is_last=False)))[1] for path in files]
    assert [header.format_version for header in headers] == [1] + [2] * (len(files) - 1)
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(1, 40))


def test_a_format_1_torn_tail_is_still_truncated(data_dir: Path, caplog) -> None:
    written = entries(1, 30)
    old = write_format_1_segment(data_dir, written)
    with old.open("r+b") as file:
        file.truncate(old.stat().st_size - 5)  # the old rules: a cut tail is a crash
    with caplog.at_level(logging.WARNING), reopen(data_dir) as store:
        assert store.load().entries == tuple(written[:-1])
    assert "truncating" in caplog.text


def test_a_new_segment_whose_header_was_never_synced_is_reused_in_place(
    data_dir: Path,
) -> None:
    """A crash after NEXT_SEGMENT was synced but before anything in the new segment was:
    it reads as all zero at its full size, holds nothing acknowledged, and is reused."""
    with reopen(data_dir) as store:
        store.set_hard_state(HardState(term=4, vote="n2", commit=0))
        store.append(entries(1, 200, size=100))
    files = segments(data_dir)
    newest = files[-1]
    in_newest = [r.index for _, r in wal.SegmentScan(newest, is_last=True) if isinstance(r, Entry)]
    size = newest.stat().st_size
    zero_range(newest, 0, size)
    kept = entries(1, in_newest[0] - 1, size=100)
    with reopen(data_dir) as store:
        state = store.load()
        assert state.entries == tuple(kept)
        assert state.hard_state == HardState(term=4, vote="n2", commit=0)
        store.append(entries(in_newest[0], 250, size=100))
    assert newest.exists() and newest.stat().st_size == size
    with reopen(data_dir) as store:
        assert store.load().entries == tuple(entries(1, 250, size=100))
