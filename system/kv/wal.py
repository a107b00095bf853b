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
    SEGMENT_HEADER  b"KVWAL", u16 format version, u64 segment sequence number
                    (always the first record of a segment)
    HARD_STATE      u64 term, u64 commit, u8 has_vote, u16 vote length, vote (UTF-8),
                    then (optional, absent in files written before it existed) u64
                    catch_up_to (HardState.catch_up_to)
                    (re-recorded as the second record of every new segment and at every
                    open, so deleting older segments never loses it)
    ENTRY           u64 term, u64 index, u8 kind (0 normal, 1 noop, 2 config), data
    TRUNCATE        u64 index: entries with index >= this are dropped
    NEXT_SEGMENT    u64 sequence of the segment that follows (the last record of a full
                    segment, synced before the next one is created, so a missing newest
                    segment is detected instead of the log silently ending early)

Damage rules (`scan_segment`): a record that is cut short (its header or payload extends
past the end of the file), a zero-filled tail, or a last record whose payload checksum
fails and whose bytes are zero from a 4096-byte block boundary to the end of the file (a
block the file system never wrote before a power cut), is a TORN last record when it is
in the LAST segment: the writer was killed while appending it, so it was never
synced nor acknowledged, and the caller truncates it. Anything else (a bad header checksum
followed by non-zero bytes, a COMPLETE record whose payload checksum fails, even the last
one: its bytes are all there and wrong, and it may have been synced and acknowledged; a
bad payload checksum with data after it, an unknown record
type, a malformed payload, or any damage in a segment that is not the last) is corruption:
`CorruptStorage` naming the file and offset.

This module must never silently skip a damaged record.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

import crc32c

from system.kv.storage_errors import CorruptStorage
from system.raft.types import Entry, EntryKind, HardState

SEGMENT_MAGIC = b"KVWAL"
SEGMENT_FORMAT_VERSION = 1
SEGMENT_SUFFIX = ".wal"

_HEADER_BODY = struct.Struct("<IBI")  # payload length, type, payload crc
_HEADER_CRC = struct.Struct("<I")
RECORD_HEADER_BYTES = _HEADER_BODY.size + _HEADER_CRC.size  # 13
_ENTRY_PREFIX = struct.Struct("<QQB")  # term, index, kind
_HARD_STATE_PREFIX = struct.Struct("<QQBH")  # term, commit, has_vote, vote length
_TRUNCATE = struct.Struct("<Q")
_CATCH_UP = struct.Struct("<Q")
_SEGMENT_HEADER = struct.Struct("<5sHQ")
MAX_PAYLOAD_BYTES = 2**32 - 1

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


@dataclass(frozen=True, slots=True)
class Truncate:
    index: int  # entries with index >= this are dropped


@dataclass(frozen=True, slots=True)
class NextSegment:
    sequence: int  # the segment that continues this one


Record = SegmentHeader | HardState | Entry | Truncate | NextSegment


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where a segment's torn last record starts, and why it was judged torn."""

    offset: int
    reason: str


def segment_name(sequence: int) -> str:
    return f"{sequence:016d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The sequence number of a segment file name, or None if it is not one."""
    stem = name[: -len(SEGMENT_SUFFIX)]
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == 16 and stem.isdigit():
        return int(stem)
    return None


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


def encode_next_segment(sequence: int) -> list[bytes]:
    return _record(RecordType.NEXT_SEGMENT, (_TRUNCATE.pack(sequence),))


def encode_segment_header(sequence: int) -> list[bytes]:
    payload = _SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, sequence)
    return _record(RecordType.SEGMENT_HEADER, (payload,))


def entry_record_bytes(entry: Entry) -> int:
    """On-disk size of an entry's record."""
    return RECORD_HEADER_BYTES + _ENTRY_PREFIX.size + len(entry.data)


# --- scanning ---------------------------------------------------------------------------


def scan_segment(path: Path, *, is_last: bool) -> Iterator[tuple[int, Record]]:
    """Yield (offset, record) for every valid record of the segment at `path`.

    Raises CorruptStorage for damage. A torn last record of the last segment is not an
    error: the generator returns a TornTail (available as StopIteration.value; use
    `SegmentScan` for a friendlier interface).
    """
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        offset = 0
        while offset < size:
            torn = _read_one(file, path, offset, size, is_last)
            if isinstance(torn, TornTail):
                return torn
            record, record_bytes = torn
            yield offset, record
            offset += record_bytes
    return None


class SegmentScan:
    """Iterate a segment's records; afterwards `torn` says whether its tail was torn."""

    def __init__(self, path: Path, *, is_last: bool) -> None:
        self.path = path
        self.is_last = is_last
        self.torn: TornTail | None = None

    def __iter__(self) -> Iterator[tuple[int, Record]]:
        self.torn = yield from scan_segment(self.path, is_last=self.is_last)


def _damaged(path: Path, offset: int, problem: str, *, torn_if_last: bool,
             is_last: bool) -> TornTail:
    if torn_if_last and is_last:
        return TornTail(offset, problem)
    if torn_if_last:
        problem += " (in a segment that is not the last, so it cannot be a torn write)"
    raise CorruptStorage(path, offset, problem)


def _rest_is_zero(file: BinaryIO, offset: int, size: int) -> bool:
    file.seek(offset)
    remaining = size - offset
    while remaining:
        chunk = file.read(min(remaining, 1 << 20))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        remaining -= len(chunk)
    return True


_BLOCK_BYTES = 4096


def _ends_in_unwritten_block(file: BinaryIO, offset: int, size: int) -> bool:
    """Whether the record at `offset`, the last of the file, ends in zero bytes from a
    file-system block boundary on: after a power cut the file's size may cover blocks
    whose data never reached the disk. A complete record whose checksum fails otherwise
    (its bytes are all there, and wrong) is corruption, even at the tail: it may have been
    synced and acknowledged, and dropping it would lose an acknowledged entry."""
    boundary = -(-(offset + 1) // _BLOCK_BYTES) * _BLOCK_BYTES  # first boundary inside it
    return boundary < size and _rest_is_zero(file, boundary, size)


def _read_one(
    file: BinaryIO, path: Path, offset: int, size: int, is_last: bool
) -> TornTail | tuple[Record, int]:
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
        if end == size and is_last and _ends_in_unwritten_block(file, offset, size):
            return TornTail(offset, "last record ends in a zero-filled (never written) block")
        raise CorruptStorage(
            path, offset,
            f"payload checksum mismatch (stored 0x{payload_crc:08x}, computed "
            f"0x{actual_crc:08x}) in a complete record followed by {size - end} more bytes",
        )
    return _parse(path, offset, record_type, payload, data), end - offset


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
            (sequence,) = _TRUNCATE.unpack(payload)
            return NextSegment(sequence)
        magic, version, sequence = _SEGMENT_HEADER.unpack(payload)
        if magic != SEGMENT_MAGIC:
            raise ValueError(f"segment header magic {magic!r} is not {SEGMENT_MAGIC!r}")
        if version != SEGMENT_FORMAT_VERSION:
            raise ValueError(
                f"segment format version {version} is not supported "
                f"(expected {SEGMENT_FORMAT_VERSION})"
            )
        return SegmentHeader(version, sequence)
    except (struct.error, ValueError) as error:
        raise CorruptStorage(
            path, offset, f"malformed {record_type.name} record with a valid checksum: {error}"
        ) from None
