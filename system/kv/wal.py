"""Write-ahead-log records and segment files: encoding, and scanning with damage detection.

A segment file is a sequence of records. Every record is::

    offset 0   u32  payload length (bytes)
    offset 4   u8   record type (RecordType)
    offset 5   u32  CRC32C of the payload
    offset 9   u32  CRC32C of bytes 0..8 (the header above)
    offset 13  payload

All integers are little-endian. The header has its own checksum so that a damaged length
field is detected as damage instead of being mistaken for a record cut short by a crash.

Payloads:
    SEGMENT_HEADER  b"KVWAL", u16 format version, u64 segment sequence number, and in
                    format 2 u64 capacity (the file's preallocated size)
                    (always the first record of a segment)
    HARD_STATE      u64 term, u64 commit, u8 has_vote, u16 vote length, vote (UTF-8),
                    then (optional, absent in files written before it existed) u64
                    catch_up_to (HardState.catch_up_to)
                    (re-recorded as the second record of every new segment and at every
                    open, so deleting older segments never loses it)
    ENTRY           u64 term, u64 index, u8 kind (0 normal, 1 noop, 2 config), data
    TRUNCATE        u64 index: entries with index >= this are dropped
    NEXT_SEGMENT    u64 sequence of the segment that follows, and in format 2 u64 its
                    capacity (the last record of a full segment, synced after the next
                    file exists at its full size and before anything is written to it, so
                    a missing or cut newest segment is detected instead of the log
                    silently ending early)

Two segment formats:

* Format 2 (written now): the file is PREALLOCATED to its capacity (ftruncate, then fsync
  of file and directory) before any record is written; records are written in place and
  the log ends at the first all-zero record header (the rest of the file is zero). A crash
  never changes the file's size, so a size that differs from the header's capacity means
  the file was cut or extended: `CorruptStorage`, never a torn tail. That is what lets a
  node tell "the tail was never synced" from "the tail that was synced is gone".
* Format 1 (written before): the file ends where its data ends; still read, never written
  to again except for the NEXT_SEGMENT record that seals it (the storage rotates to a
  format-2 segment at open).

Damage rules (`scan_segment`), for the LAST segment (anywhere else any damage is
corruption: the writer had moved on, so every byte of it was synced):

* Format 1: a record cut short (its header or payload extends past the end of the file),
  a zero-filled tail, or a last record whose payload checksum fails and whose bytes are
  zero from a 4096-byte block boundary to the end of the file (a block the file system
  never wrote before a power cut), is a TORN last record: the writer was killed while
  appending it, so it was never synced nor acknowledged, and the caller truncates it.
* Format 2: a record whose header or payload checksum fails is torn only if the file is
  zero from a 4096-byte block boundary INSIDE that record to its end (a killed write
  leaves a page-aligned prefix; a power cut loses whole blocks); the caller zeroes its
  bytes in place (the size must not change). Non-zero bytes after the log's end, a record
  extending past the capacity, or a complete record whose checksum fails are corruption.

Anything else (a bad header checksum followed by non-zero bytes, a COMPLETE record whose
payload checksum fails, even the last one: its bytes are all there and wrong, and it may
have been synced and acknowledged; a bad payload checksum with data after it, an unknown
record type, a malformed payload, or any damage in a segment that is not the last) is
corruption: `CorruptStorage` naming the file and offset.

What a torn tail can be is thus at most what was never synced; a tail cut from a
preallocated segment is seen by its size. What the rules cannot see: a format-1 segment
cut at a record boundary or mid-record (indistinguishable from a crash), and synced bytes
that were replaced by zeros from a block boundary to the end of the file.

This module must never silently skip a damaged record.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

import crc32c

from system.kv.storage_errors import CorruptStorage
from system.raft.types import Entry, EntryKind, HardState

SEGMENT_MAGIC = b"KVWAL"
SEGMENT_FORMAT_VERSION = 2  # preallocated segments (format 1: size = end of data)
SEGMENT_SUFFIX = ".wal"

_HEADER_BODY = struct.Struct("<IBI")  # payload length, type, payload crc
_HEADER_CRC = struct.Struct("<I")
RECORD_HEADER_BYTES = _HEADER_BODY.size + _HEADER_CRC.size  # 13
_ENTRY_PREFIX = struct.Struct("<QQB")  # term, index, kind
_HARD_STATE_PREFIX = struct.Struct("<QQBH")  # term, commit, has_vote, vote length
_TRUNCATE = struct.Struct("<Q")
_CATCH_UP = struct.Struct("<Q")
_SEGMENT_HEADER_V1 = struct.Struct("<5sHQ")
_SEGMENT_HEADER = struct.Struct("<5sHQQ")  # magic, version, sequence, capacity
_NEXT_SEGMENT = struct.Struct("<QQ")  # sequence, capacity
MAX_PAYLOAD_BYTES = 2**32 - 1
# Room every preallocated segment keeps free for the NEXT_SEGMENT record that seals it.
NEXT_SEGMENT_RECORD_BYTES = RECORD_HEADER_BYTES + _NEXT_SEGMENT.size
SEGMENT_HEADER_RECORD_BYTES = RECORD_HEADER_BYTES + _SEGMENT_HEADER.size
_V1_HEADER_RECORD_BYTES = RECORD_HEADER_BYTES + _SEGMENT_HEADER_V1.size
BLOCK_BYTES = 4096

_KIND_CODES = {EntryKind.NORMAL: 0, EntryKind.NOOP: 1, EntryKind.CONFIG: 2}
_KINDS_BY_CODE = {code: kind for kind, code in _KIND_CODES.items()}


class RecordType(Enum):
    SEGMENT_HEADER = 1
    HARD_STATE = 2
    ENTRY = 3
    TRUNCATE = 4
    NEXT_SEGMENT = 5


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    format_version: int
    sequence: int
    capacity: int = 0  # format 2: the file's preallocated size; 0 in format 1

    @property
    def preallocated(self) -> bool:
        return self.format_version >= 2


@dataclass(frozen=True, slots=True)
class Truncate:
    index: int  # entries with index >= this are dropped


@dataclass(frozen=True, slots=True)
class NextSegment:
    sequence: int  # the segment that continues this one
    capacity: int = 0  # its preallocated size (0: written by format 1)


Record = SegmentHeader | HardState | Entry | Truncate | NextSegment


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where a segment's torn last record starts, and why it was judged torn.

    `zero_until`: in a preallocated segment the repair zeroes [offset, zero_until) in
    place (the file's size must not change); None: truncate the file at `offset`."""

    offset: int
    reason: str
    zero_until: int | None = None


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """What a scan learned besides the records: its header (None: the segment has none,
    e.g. created but never written), where the log ends (the next record goes there),
    the file's size, and the torn tail if there was one."""

    header: SegmentHeader | None
    end: int
    size: int
    torn: TornTail | None = None


def segment_name(sequence: int) -> str:
    return f"{sequence:016d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The sequence number of a segment file name, or None if it is not one."""
    stem = name[: -len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == 16 and stem.isdigit():
        return int(stem)
    return None


def segment_capacity(segment_bytes: int, first_record_bytes: int = 0) -> int:
    """Preallocated size of a new segment: `segment_bytes`, or enough (whole blocks) for
    its header, a hard state, a record of `first_record_bytes` and the sealing record."""
    needed = (SEGMENT_HEADER_RECORD_BYTES + 512 + first_record_bytes
              + NEXT_SEGMENT_RECORD_BYTES)
    return max(segment_bytes, -(-needed // BLOCK_BYTES) * BLOCK_BYTES)


# --- encoding ---------------------------------------------------------------------------


def _record(record_type: RecordType, payload_parts: tuple[bytes, ...]) -> list[bytes]:
    length = sum(len(part) for part in payload_parts)
    if length > MAX_PAYLOAD_BYTES:
        raise ValueError(f"a WAL record payload of {length} bytes exceeds {MAX_PAYLOAD_BYTES}")
    payload_crc = 0
    for part in payload_parts:
        payload_crc = crc32c.crc32c(part, payload_crc)
    header = _HEADER_BODY.pack(length, record_type.value, payload_crc)
    return [header + _HEADER_CRC.pack(crc32c.crc32c(header)), *payload_parts]


def encode_entry(entry: Entry) -> list[bytes]:
    """Buffers to write, in order; the entry's data is referenced, not copied."""
    prefix = _ENTRY_PREFIX.pack(entry.term, entry.index, _KIND_CODES[entry.kind])
    return _record(RecordType.ENTRY, (prefix, entry.data))


def encode_hard_state(hard_state: HardState) -> list[bytes]:
    vote = (hard_state.vote or "").encode("utf-8")
    prefix = _HARD_STATE_PREFIX.pack(
        hard_state.term, hard_state.commit, hard_state.vote is not None, len(vote)
    )
    suffix = _CATCH_UP.pack(hard_state.catch_up_to) if hard_state.catch_up_to else b""
    return _record(RecordType.HARD_STATE, (prefix + vote + suffix,))


def encode_truncate(index: int) -> list[bytes]:
    return _record(RecordType.TRUNCATE, (_TRUNCATE.pack(index),))


def encode_next_segment(sequence: int, capacity: int) -> list[bytes]:
    return _record(RecordType.NEXT_SEGMENT, (_NEXT_SEGMENT.pack(sequence, capacity),))


def encode_segment_header(sequence: int, capacity: int) -> list[bytes]:
    payload = _SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, sequence, capacity)
    return _record(RecordType.SEGMENT_HEADER, (payload,))


def encode_segment_header_v1(sequence: int) -> list[bytes]:
    """Format 1 (for tests of reading segments written by the old code)."""
    payload = _SEGMENT_HEADER_V1.pack(SEGMENT_MAGIC, 1, sequence)
    return _record(RecordType.SEGMENT_HEADER, (payload,))


def records_bytes(buffers: list[bytes]) -> int:
    return sum(len(buffer) for buffer in buffers)


def entry_record_bytes(entry: Entry) -> int:
    """On-disk size of an entry's record."""
    return RECORD_HEADER_BYTES + _ENTRY_PREFIX.size + len(entry.data)


# --- scanning ---------------------------------------------------------------------------


def scan_segment(path: Path, *, is_last: bool) -> Generator[tuple[int, Record], None, SegmentEnd]:
    """Yield (offset, record) for every valid record of the segment at `path`.

    Raises CorruptStorage for damage. Returns (as StopIteration.value; use `SegmentScan`
    for a friendlier interface) a SegmentEnd: the header, where the log ends, and a torn
    last record of the last segment, which is not an error.
    """
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        first = _read_segment_header(file, path, size, is_last)
        if not isinstance(first, tuple):
            return first
        header, offset = first
        yield 0, header
        if header.preallocated and size != header.capacity:
            raise CorruptStorage(
                path, min(size, header.capacity),
                f"the segment is {size} bytes but was preallocated to {header.capacity}: "
                f"its end was cut off (or it was extended). A crash never changes a "
                f"preallocated segment's size, so records that were synced and acknowledged "
                f"may be gone",
            )
        while offset < size:
            if header.preallocated:
                result = _read_one_preallocated(file, path, offset, size, is_last)
            else:
                result = _read_one(file, path, offset, size, is_last)
            if result is None:
                return SegmentEnd(header, offset, size)
            if isinstance(result, TornTail):
                return SegmentEnd(header, result.offset, size, result)
            record, record_bytes = result
            yield offset, record
            offset += record_bytes
    return SegmentEnd(header, offset, size)


class SegmentScan:
    """Iterate a segment's records; afterwards `torn`, `header` and `end` say how it ended."""

    def __init__(self, path: Path, *, is_last: bool) -> None:
        self.path = path
        self.is_last = is_last
        self.result: SegmentEnd | None = None

    def __iter__(self) -> Iterator[tuple[int, Record]]:
        self.result = yield from scan_segment(self.path, is_last=self.is_last)

    @property
    def torn(self) -> TornTail | None:
        return self.result.torn if self.result else None

    @property
    def header(self) -> SegmentHeader | None:
        return self.result.header if self.result else None

    @property
    def end(self) -> int:
        assert self.result is not None
        return self.result.end


def _read_segment_header(
    file: BinaryIO, path: Path, size: int, is_last: bool
) -> SegmentEnd | tuple[SegmentHeader, int]:
    """The segment's header record and where the next record starts; or, for a segment
    without a (whole) header, a SegmentEnd with header None (the caller decides whether
    such a segment may exist: only as the newest, created but never synced)."""
    if size < _V1_HEADER_RECORD_BYTES:
        # Neither format leaves such a file after a crash except a format-1 segment
        # killed while writing its first record; the header is a record like any other.
        result = _read_one(file, path, 0, size, is_last) if size else None
    else:
        result = _read_one_preallocated(file, path, 0, size, is_last)
    if result is None:
        return SegmentEnd(None, 0, size)
    if isinstance(result, TornTail):
        return SegmentEnd(None, 0, size, result)
    record, record_bytes = result
    if not isinstance(record, SegmentHeader):
        raise CorruptStorage(path, 0, "segment does not start with its header")
    return record, record_bytes


def _damaged(path: Path, offset: int, problem: str, *, torn_if_last: bool,
             is_last: bool) -> TornTail:
    if torn_if_last and is_last:
        return TornTail(offset, problem)
    if torn_if_last:
        problem += " (in a segment that is not the last, so it cannot be a torn write)"
    raise CorruptStorage(path, offset, problem)


def _rest_is_zero(file: BinaryIO, offset: int, size: int) -> bool:
    return _last_nonzero(file, offset, size) < 0


def _last_nonzero(file: BinaryIO, offset: int, size: int) -> int:
    """Offset of the last non-zero byte in [offset, size), or -1. Reads only the regions
    that hold data (a preallocated segment is sparse after its log), 1 MiB at a time."""
    last = -1
    for start, end in _data_regions(file.fileno(), offset, size):
        file.seek(start)
        while start < end:
            chunk = file.read(min(end - start, 1 << 20))
            if not chunk:
                break
            kept = len(chunk.rstrip(b"\0"))
            if kept:
                last = start + kept - 1
            start += len(chunk)
    return last


def _data_regions(fd: int, offset: int, size: int) -> Iterator[tuple[int, int]]:
    position = offset
    while position < size:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as error:
            if error.errno != errno.ENXIO:  # the file system cannot tell: read it all
                yield position, size
            return  # ENXIO: no data after position
        if start >= size:
            return
        yield start, end
        position = end


def _ends_in_unwritten_block(file: BinaryIO, offset: int, size: int) -> bool:
    """Whether the record at `offset`, the last of the file, ends in zero bytes from a
    file-system block boundary on: after a power cut the file's size may cover blocks
    whose data never reached the disk. A complete record whose checksum fails otherwise
    (its bytes are all there, and wrong) is corruption, even at the tail: it may have been
    synced and acknowledged, and dropping it would lose an acknowledged entry."""
    boundary = -(-(offset + 1) // BLOCK_BYTES) * BLOCK_BYTES  # first boundary inside it
    return boundary < size and _rest_is_zero(file, boundary, size)


def _torn_in_place(file: BinaryIO, offset: int, record_end: int, size: int) -> int | None:
    """For a damaged record at `offset` of a preallocated segment: if the file is zero from
    a block boundary inside the record (offset, record_end) to its end, as a killed write
    (a page-aligned prefix) or a power cut (whole blocks lost) leaves it, where its
    non-zero bytes end (to be zeroed); else None."""
    last = _last_nonzero(file, offset, size)
    zero_from = -(-(last + 1) // BLOCK_BYTES) * BLOCK_BYTES
    if last >= offset and zero_from < record_end:
        return last + 1
    return None


def _torn_or_corrupt(file: BinaryIO, path: Path, offset: int, record_end: int, size: int,
                     is_last: bool, problem: str) -> TornTail:
    zero_until = _torn_in_place(file, offset, record_end, size)
    if zero_until is None:
        raise CorruptStorage(path, offset, problem + " in a record that is all there")
    if is_last:
        return TornTail(offset, f"{problem}; the record is zero-filled from a block boundary "
                        f"inside it to the end of the file", zero_until)
    raise CorruptStorage(path, offset, problem + ", zero-filled from a block boundary on (in "
                         "a segment that is not the last, so it cannot be a torn write)")


def _read_one_preallocated(
    file: BinaryIO, path: Path, offset: int, size: int, is_last: bool
) -> TornTail | tuple[Record, int] | None:
    """One record of a preallocated (format 2) segment; None at the log's end."""
    file.seek(offset)
    header = file.read(RECORD_HEADER_BYTES)
    if header.count(0) == len(header):
        last = _last_nonzero(file, offset, size)
        if last < 0:
            return None  # the log ends here; the rest of the file was never written
        raise CorruptStorage(
            path, offset,
            f"the log ends here (a zero record header) but byte {last} after it is not zero",
        )
    (header_crc,) = _HEADER_CRC.unpack_from(header.ljust(RECORD_HEADER_BYTES, b"\0"),
                                            _HEADER_BODY.size)
    if len(header) < RECORD_HEADER_BYTES or (
        crc32c.crc32c(header[: _HEADER_BODY.size]) != header_crc
    ):
        return _torn_or_corrupt(
            file, path, offset, offset + RECORD_HEADER_BYTES, size, is_last,
            "record header checksum mismatch")
    length, type_code, payload_crc = _HEADER_BODY.unpack_from(header)
    end = offset + RECORD_HEADER_BYTES + length
    if end > size:
        raise CorruptStorage(
            path, offset,
            f"record of {length} payload bytes extends past the end of the preallocated "
            f"segment ({size - offset - RECORD_HEADER_BYTES} bytes left)",
        )
    result = _read_body(file, path, offset, end, type_code, length, payload_crc)
    if isinstance(result, int):
        return _torn_or_corrupt(
            file, path, offset, end, size, is_last,
            f"payload checksum mismatch (stored 0x{payload_crc:08x}, computed "
            f"0x{result:08x})")
    return result, end - offset


def _read_body(file: BinaryIO, path: Path, offset: int, end: int, type_code: int,
               length: int, payload_crc: int) -> Record | int:
    """The record whose header was just read; the computed checksum if it does not match."""
    try:
        record_type = RecordType(type_code)
    except ValueError:
        raise CorruptStorage(path, offset, f"unknown record type {type_code}") from None
    if record_type is RecordType.ENTRY and length >= _ENTRY_PREFIX.size:
        # Read the data on its own so that a large value is read once, not sliced again.
        prefix = file.read(_ENTRY_PREFIX.size)
        data = file.read(length - _ENTRY_PREFIX.size)
        actual_crc = crc32c.crc32c(data, crc32c.crc32c(prefix))
        payload: bytes = prefix
    else:
        payload = file.read(length)
        data = b""
        actual_crc = crc32c.crc32c(payload)
    if actual_crc != payload_crc:
        return actual_crc
    return _parse(path, offset, record_type, payload, data)


def _read_one(
    file: BinaryIO, path: Path, offset: int, size: int, is_last: bool
) -> TornTail | tuple[Record, int]:
    """One record of a format-1 segment (its size is where its data ends)."""
    file.seek(offset)
    if size - offset < RECORD_HEADER_BYTES:
        return _damaged(
            path, offset,
            f"incomplete record header ({size - offset} of {RECORD_HEADER_BYTES} bytes)",
            torn_if_last=True, is_last=is_last,
        )
    header = file.read(RECORD_HEADER_BYTES)
    (header_crc,) = _HEADER_CRC.unpack_from(header, _HEADER_BODY.size)
    if crc32c.crc32c(header[: _HEADER_BODY.size]) != header_crc:
        # A killed writer leaves a prefix of what it wrote, never a wrong header; but a
        # file system may leave zero-filled blocks after a power cut.
        if is_last and _rest_is_zero(file, offset, size):
            return TornTail(offset, "zero-filled tail")
        raise CorruptStorage(path, offset, "record header checksum mismatch")
    length, type_code, payload_crc = _HEADER_BODY.unpack_from(header)
    end = offset + RECORD_HEADER_BYTES + length
    if end > size:
        return _damaged(
            path, offset,
            f"record of {length} payload bytes extends past the end of the file "
            f"({size - offset - RECORD_HEADER_BYTES} bytes left)",
            torn_if_last=True, is_last=is_last,
        )
    result = _read_body(file, path, offset, end, type_code, length, payload_crc)
    if isinstance(result, int):
        if end == size and is_last and _ends_in_unwritten_block(file, offset, size):
            return TornTail(offset, "last record ends in a zero-filled (never written) block")
        raise CorruptStorage(
            path, offset,
            f"payload checksum mismatch (stored 0x{payload_crc:08x}, computed "
            f"0x{result:08x}) in a complete record followed by {size - end} more bytes",
        )
    return result, end - offset


def _parse(path: Path, offset: int, record_type: RecordType, payload: bytes,
           data: bytes) -> Record:
    try:
        if record_type is RecordType.ENTRY:
            term, index, kind_code = _ENTRY_PREFIX.unpack(payload)
            kind = _KINDS_BY_CODE.get(kind_code)
            if kind is None:
                raise ValueError(f"unknown entry kind {kind_code}")
            if term < 1 or index < 1:
                raise ValueError(f"entry has term {term} and index {index}; both must be >= 1")
            return Entry(term=term, index=index, data=data, kind=kind)
        if record_type is RecordType.HARD_STATE:
            term, commit, has_vote, vote_length = _HARD_STATE_PREFIX.unpack_from(payload)
            vote_end = _HARD_STATE_PREFIX.size + vote_length
            if len(payload) not in (vote_end, vote_end + _CATCH_UP.size):
                raise ValueError("hard state length does not match its vote length")
            vote = payload[_HARD_STATE_PREFIX.size : vote_end].decode("utf-8") if has_vote else None
            catch_up_to = 0
            if len(payload) > vote_end:
                (catch_up_to,) = _CATCH_UP.unpack_from(payload, vote_end)
            return HardState(term=term, vote=vote, commit=commit, catch_up_to=catch_up_to)
        if record_type is RecordType.TRUNCATE:
            (index,) = _TRUNCATE.unpack(payload)
            if index < 1:
                raise ValueError(f"truncation at index {index}; indexes start at 1")
            return Truncate(index)
        if record_type is RecordType.NEXT_SEGMENT:
            if len(payload) == _TRUNCATE.size:  # format 1
                return NextSegment(_TRUNCATE.unpack(payload)[0])
            return NextSegment(*_NEXT_SEGMENT.unpack(payload))
        magic, version = struct.unpack_from("<5sH", payload)
        if magic != SEGMENT_MAGIC:
            raise ValueError(f"segment header magic {magic!r} is not {SEGMENT_MAGIC!r}")
        if version == 1:
            _, _, sequence = _SEGMENT_HEADER_V1.unpack(payload)
            return SegmentHeader(version, sequence)
        if version != SEGMENT_FORMAT_VERSION:
            raise ValueError(
                f"segment format version {version} is not supported "
                f"(expected 1 or {SEGMENT_FORMAT_VERSION})"
            )
        _, _, sequence, capacity = _SEGMENT_HEADER.unpack(payload)
        if capacity < BLOCK_BYTES:
            raise ValueError(f"a preallocated segment of {capacity} bytes is too small")
        return SegmentHeader(version, sequence, capacity)
    except (struct.error, ValueError) as error:
        raise CorruptStorage(
            path, offset, f"malformed {record_type.name} record with a valid checksum: {error}"
        ) from None
