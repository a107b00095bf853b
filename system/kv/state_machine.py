"""The replicated key-value state machine: what a committed log entry does to the data.

Theory of operation
-------------------
Every replica applies the same committed commands in the same log order, so every
replica must compute exactly the same state and the same result from them. This module
is therefore PURE and deterministic: no clocks, no I/O, no threads, no randomness, no
iteration over unordered sets. It must never raise on a bad command (a command that does
not decode is a result, `CommandRejected`, and changes nothing but the applied index),
because a command that crashed one replica would crash all of them.

Commands
    `encode_put` / `encode_delete` produce the bytes a node proposes; `decode_command`
    reads them back. Layout (big-endian, fixed 25-byte header, then three byte strings)::

        u8  format version (1)
        u8  operation (1 = put, 2 = delete)
        u8  flags (bit 0: expected_version is set)
        u64 expected_version (0 when the flag is clear)
        u16 request_id length   (UTF-8 bytes)
        u32 key length          (UTF-8 bytes)
        u64 value length        (0 for delete)
        request_id, key, value

    The total length must match exactly; anything else is `InvalidCommand`.

Versions and compare-and-swap (see kv.proto)
    A key is created at version 1 and every write adds 1. Delete removes the key and its
    version: a later create starts again at 1 (no tombstones, so memory is bounded by the
    live keys). Consequence for callers: a compare-and-swap cannot tell "v1 of the old key"
    from "v1 of a re-created key" (the ABA case); use a value that identifies its writer
    when that matters. `expected_version=N` applies only if the current version is N;
    `expected_version=0` means "must not exist". A mismatch is a result, not an error:
    `applied=False` with the key's current version (0 = absent).

Request ids (idempotent retries)
    A command with a non-empty request id that was applied within the retention window
    returns exactly the result of its first application (also a failed compare-and-swap)
    and changes nothing — also after snapshot/restore, because the table is in the
    snapshot. A request id reused for a different operation or key, or for the same key
    and operation with a different value or expected version (a payload fingerprint,
    CRC32C of both, is remembered with the id), is rejected (`CommandRejected`), not
    silently answered with the other command's result.

    Retention is by applied log position, never by wall clock: an id applied at log
    index i is remembered for the commands at indexes i+1 .. i+dedup_window_entries
    (default 100,000 entries), and at most `dedup_max_ids` ids (default 100,000; the
    oldest is forgotten first) are kept. A retry that arrives after that is applied
    again: clients must stop retrying a request well within the window (in entries, which
    at 5,000 writes/s is 20 s). All replicas must use the same two numbers; they are
    stored in the snapshot and a restored machine takes them from it.

What this module must never do: import os/time/threading/socket/uuid or use global
randomness (tests/test_purity.py checks), raise on a command's content, or let two
replicas that applied the same commands differ.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

import crc32c

COMMAND_FORMAT_VERSION = 1
SNAPSHOT_MAGIC = b"KVSM"
SNAPSHOT_FORMAT_VERSION = 2  # 2 adds each remembered request's payload fingerprint
DEFAULT_DEDUP_WINDOW_ENTRIES = 100_000
DEFAULT_DEDUP_MAX_IDS = 100_000

_FLAG_EXPECTED_VERSION = 0x01
_COMMAND_HEADER = struct.Struct(">BBBQHIQ")  # version, op, flags, expected, rid, key, value
_U64_MAX = 2**64 - 1


class InvalidCommand(ValueError):
    """The bytes are not a command this version understands (the message says why)."""


class InvalidSnapshot(ValueError):
    """A snapshot blob is truncated, corrupt or of an unknown format (the message says why)."""


class OutOfOrderApply(RuntimeError):
    """The caller applied a log index that is not applied_index + 1: a bug in the shell."""


class Operation(Enum):
    PUT = 1
    DELETE = 2


@dataclass(frozen=True, slots=True)
class PutCommand:
    key: str
    value: bytes
    expected_version: int | None = None  # None = unconditional; 0 = must not exist
    request_id: str = ""  # "" = no idempotency


@dataclass(frozen=True, slots=True)
class DeleteCommand:
    key: str
    expected_version: int | None = None
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class PutResult:
    applied: bool  # False only when expected_version did not match
    version: int  # new version if applied; current version (0 = absent) if not


@dataclass(frozen=True, slots=True)
class DeleteResult:
    applied: bool  # False only when expected_version did not match
    existed: bool  # whether the key existed before this command
    version: int  # version the key had (deleted, or current on mismatch); 0 = absent


@dataclass(frozen=True, slots=True)
class CommandRejected:
    """The command could not be applied at all; nothing but the applied index changed."""

    reason: str


ApplyResult = PutResult | DeleteResult | CommandRejected


# --- command encoding -------------------------------------------------------------------


def _encode(
    operation: Operation,
    key: str,
    value: bytes,
    expected_version: int | None,
    request_id: str,
) -> bytes:
    if not isinstance(key, str):
        raise InvalidCommand(f"key must be a str, got {type(key).__name__}")
    if not isinstance(request_id, str):
        raise InvalidCommand(f"request_id must be a str, got {type(request_id).__name__}")
    try:
        key_bytes = key.encode("utf-8")
        request_id_bytes = request_id.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidCommand(f"key and request_id must be encodable as UTF-8: {error}") from None
    if len(request_id_bytes) > 0xFFFF:
        raise InvalidCommand(
            f"request_id is {len(request_id_bytes)} bytes; the limit is 65535"
        )
    if len(key_bytes) > 0xFFFFFFFF:
        raise InvalidCommand(f"key is {len(key_bytes)} bytes; the limit is 4294967295")
    flags = 0
    expected = 0
    if expected_version is not None:
        if isinstance(expected_version, bool) or not isinstance(expected_version, int):
            raise InvalidCommand("expected_version must be an int or None")
        if not 0 <= expected_version <= _U64_MAX:
            raise InvalidCommand(
                f"expected_version {expected_version} is outside 0 .. 2**64-1"
            )
        flags |= _FLAG_EXPECTED_VERSION
        expected = expected_version
    header = _COMMAND_HEADER.pack(
        COMMAND_FORMAT_VERSION,
        operation.value,
        flags,
        expected,
        len(request_id_bytes),
        len(key_bytes),
        len(value),
    )
    # One join = one copy of the value, whatever its size.
    return b"".join((header, request_id_bytes, key_bytes, value))


def encode_put(
    key: str,
    value: bytes,
    *,
    expected_version: int | None = None,
    request_id: str = "",
) -> bytes:
    """The command bytes for a put; raises InvalidCommand if it cannot be encoded."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidCommand(f"value must be bytes, got {type(value).__name__}")
    return _encode(Operation.PUT, key, value, expected_version, request_id)


def encode_delete(
    key: str,
    *,
    expected_version: int | None = None,
    request_id: str = "",
) -> bytes:
    """The command bytes for a delete; raises InvalidCommand if it cannot be encoded."""
    return _encode(Operation.DELETE, key, b"", expected_version, request_id)


def decode_command(data: bytes | bytearray | memoryview) -> PutCommand | DeleteCommand:
    """Parse command bytes; raises InvalidCommand saying what is wrong."""
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise InvalidCommand(f"a command is bytes, got {type(data).__name__}") from None
    if view.nbytes < _COMMAND_HEADER.size:
        raise InvalidCommand(
            f"command is {view.nbytes} bytes, shorter than its {_COMMAND_HEADER.size}-byte header"
        )
    version, op_code, flags, expected, rid_len, key_len, value_len = (
        _COMMAND_HEADER.unpack_from(view, 0)
    )
    if version != COMMAND_FORMAT_VERSION:
        raise InvalidCommand(
            f"command format version {version} is not supported (expected "
            f"{COMMAND_FORMAT_VERSION})"
        )
    try:
        operation = Operation(op_code)
    except ValueError:
        raise InvalidCommand(f"unknown operation code {op_code}") from None
    if flags & ~_FLAG_EXPECTED_VERSION:
        raise InvalidCommand(f"unknown flag bits 0x{flags:02x}")
    if operation is Operation.DELETE and value_len != 0:
        raise InvalidCommand(f"a delete carries no value, but value length is {value_len}")
    expected_length = _COMMAND_HEADER.size + rid_len + key_len + value_len
    if view.nbytes != expected_length:
        raise InvalidCommand(
            f"command is {view.nbytes} bytes but its header describes {expected_length}"
        )
    if not flags & _FLAG_EXPECTED_VERSION and expected != 0:
        raise InvalidCommand("expected_version is set without its flag")
    offset = _COMMAND_HEADER.size
    try:
        request_id = str(view[offset : offset + rid_len], "utf-8")
        offset += rid_len
        key = str(view[offset : offset + key_len], "utf-8")
        offset += key_len
    except UnicodeDecodeError as error:
        raise InvalidCommand(f"key or request_id is not valid UTF-8: {error}") from None
    expected_version = expected if flags & _FLAG_EXPECTED_VERSION else None
    if operation is Operation.DELETE:
        return DeleteCommand(key, expected_version, request_id)
    # The single copy of the value: the state machine keeps this bytes object.
    value = view[offset:].tobytes() if value_len else b""
    return PutCommand(key, value, expected_version, request_id)


# --- the state machine ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Remembered:
    """A request id's first outcome, kept for deterministic retries (decoded from its
    stored record only when the id is seen again)."""

    applied_index: int  # log index at which the request was first applied
    operation: Operation
    key: str
    result: PutResult | DeleteResult
    # CRC32C of the value and expected version; None when restored from a format-1
    # snapshot that did not keep it (then only operation and key are compared).
    fingerprint: int | None = None


# The table keeps each id's record as the snapshot stores it, one bytes object per id:
# encoded once when the id is remembered, a snapshot joins them (packing 100,000 records
# per snapshot took ~250 ms of CPU holding the GIL and stalled the leader's commits), and
# bytes are invisible to Python's cyclic GC (100,000 records as two dataclass objects each
# made every full collection walk 200,000 more objects: 54-62 ms pauses on a leader, its
# 64-client p99).
_RID_LENGTH = struct.Struct(">H")
_RECORD_TAIL = struct.Struct(">QBI")  # applied index, operation, key length
_RECORD_RESULT = struct.Struct(">BBQI")  # applied, existed, version, fingerprint (0: none)
_RECORD_RESULT_V1 = struct.Struct(">BBQ")  # format 1: no fingerprint


def _encode_record(request_id: str, applied_index: int, operation: Operation, key: str,
                   result: PutResult | DeleteResult, fingerprint: int | None) -> bytes:
    rid_bytes = request_id.encode("utf-8")
    key_bytes = key.encode("utf-8")
    existed = result.existed if isinstance(result, DeleteResult) else False
    return b"".join((
        _RID_LENGTH.pack(len(rid_bytes)), rid_bytes,
        _RECORD_TAIL.pack(applied_index, operation.value, len(key_bytes)), key_bytes,
        _RECORD_RESULT.pack(result.applied, existed, result.version, fingerprint or 0),
    ))


def _record_applied_index(record: bytes) -> int:
    (rid_length,) = _RID_LENGTH.unpack_from(record, 0)
    return _RECORD_TAIL.unpack_from(record, 2 + rid_length)[0]


def _decode_record(record: bytes | memoryview, offset: int = 0, format_version: int = 2,
                   ) -> tuple[str, _Remembered, int]:
    """(request id, its record, offset after it) of the record at `offset`; raises
    struct.error, UnicodeDecodeError or ValueError when the bytes are not one."""
    (rid_length,) = _RID_LENGTH.unpack_from(record, offset)
    offset += 2
    request_id = str(record[offset:offset + rid_length], "utf-8")
    if len(request_id.encode("utf-8")) != rid_length:
        raise ValueError(f"request id {request_id!r} is cut short")
    offset += rid_length
    applied_at, op_code, key_length = _RECORD_TAIL.unpack_from(record, offset)
    offset += _RECORD_TAIL.size
    key = str(record[offset:offset + key_length], "utf-8")
    if len(key.encode("utf-8")) != key_length:
        raise ValueError(f"key {key!r} of request id {request_id!r} is cut short")
    offset += key_length
    if format_version >= 2:
        applied, existed, version, fingerprint = _RECORD_RESULT.unpack_from(record, offset)
        offset += _RECORD_RESULT.size
    else:
        applied, existed, version = _RECORD_RESULT_V1.unpack_from(record, offset)
        fingerprint = 0
        offset += _RECORD_RESULT_V1.size
    operation = Operation(op_code)
    result: PutResult | DeleteResult
    if operation is Operation.PUT:
        result = PutResult(applied=bool(applied), version=version)
    else:
        result = DeleteResult(applied=bool(applied), existed=bool(existed), version=version)
    return request_id, _Remembered(applied_at, operation, key, result, fingerprint or None), offset


def payload_fingerprint(command: PutCommand | DeleteCommand) -> int:
    """What must be equal for two commands under one request id to be the same request,
    beyond operation and key: the value and the expected version."""
    expected = b"-" if command.expected_version is None else str(command.expected_version).encode()
    value = command.value if isinstance(command, PutCommand) else b""
    return crc32c.crc32c(value, crc32c.crc32c(expected + b"|"))


class KVStateMachine:
    """Keys -> (value, version), applied in log order. Not thread-safe; one owner."""

    def __init__(
        self,
        *,
        dedup_window_entries: int = DEFAULT_DEDUP_WINDOW_ENTRIES,
        dedup_max_ids: int = DEFAULT_DEDUP_MAX_IDS,
        applied_index: int = 0,
    ) -> None:
        if dedup_window_entries < 1:
            raise ValueError(f"dedup_window_entries must be >= 1, got {dedup_window_entries}")
        if dedup_max_ids < 1:
            raise ValueError(f"dedup_max_ids must be >= 1, got {dedup_max_ids}")
        if applied_index < 0:
            raise ValueError(f"applied_index must be >= 0, got {applied_index}")
        self.dedup_window_entries = dedup_window_entries
        self.dedup_max_ids = dedup_max_ids
        self._applied_index = applied_index
        self._data: dict[str, tuple[bytes, int]] = {}
        # Insertion order == application order == increasing log index (the snapshot
        # keeps that order).
        self._remembered: dict[str, bytes] = {}  # id -> its encoded record
        # (applied index, id) in application order: expiry walks it from the front. A
        # plain dict plus this queue instead of an OrderedDict, because copying an
        # OrderedDict's 100,000 values for a snapshot took 9 ms on the event loop and a
        # dict's takes one. An entry whose id was remembered again later is stale and
        # skipped (its applied index no longer matches).
        self._expiry: deque[tuple[int, str]] = deque()

    # -- reading

    @property
    def applied_index(self) -> int:
        """Highest log index applied (commands, rejected commands and NOOPs alike)."""
        return self._applied_index

    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, version) of `key`, or None if absent."""
        return self._data.get(key)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Iterator[str]:
        """Keys in sorted order (deterministic)."""
        return iter(sorted(self._data))

    def remembered_request_ids(self) -> int:
        """How many request ids are currently remembered (for status and tests)."""
        return len(self._remembered)

    def first_result(self, request_id: str) -> PutResult | DeleteResult | None:
        """The result `request_id` got when first applied, or None if it never was (or has
        been forgotten). The simulator checks with it that acknowledged writes survive."""
        record = self._remembered.get(request_id)
        return _decode_record(record)[1].result if record is not None else None

    # -- applying

    def _advance(self, index: int) -> None:
        if index != self._applied_index + 1:
            raise OutOfOrderApply(
                f"apply of log index {index} but applied_index is {self._applied_index}; "
                f"entries must be applied exactly once, in order"
            )
        self._applied_index = index
        self._expire(index)

    def _expire(self, index: int) -> None:
        """Forget ids applied more than dedup_window_entries positions before `index`."""
        expiry = self._expiry
        while expiry and expiry[0][0] + self.dedup_window_entries < index:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        applied_index, request_id = self._expiry.popleft()
        record = self._remembered.get(request_id)
        if record is not None and _record_applied_index(record) == applied_index:
            del self._remembered[request_id]

    def apply_noop(self, index: int) -> None:
        """Count a NOOP (or any non-command) entry as applied."""
        self._advance(index)

    def apply(self, index: int, command: bytes) -> ApplyResult:
        """Apply the committed entry at `index`. Never raises for the command's content."""
        self._advance(index)
        try:
            decoded = decode_command(command)
        except InvalidCommand as error:
            return CommandRejected(f"entry {index}: {error}")
        operation = Operation.PUT if isinstance(decoded, PutCommand) else Operation.DELETE
        if decoded.request_id:
            earlier = self._lookup(decoded.request_id, index)
            if earlier is not None:
                if earlier.operation is not operation or earlier.key != decoded.key:
                    return CommandRejected(
                        f"request id {decoded.request_id!r} was already used at entry "
                        f"{earlier.applied_index} for a {earlier.operation.name.lower()} "
                        f"of key {earlier.key!r}; a request id names one request"
                    )
                if (earlier.fingerprint is not None
                        and earlier.fingerprint != payload_fingerprint(decoded)):
                    return CommandRejected(
                        f"request id {decoded.request_id!r} was already used at entry "
                        f"{earlier.applied_index} for a {operation.name.lower()} of key "
                        f"{decoded.key!r} with a different value or expected version; a retry "
                        f"must resend the same request, a new request needs a new id"
                    )
                return earlier.result
        if isinstance(decoded, PutCommand):
            result: PutResult | DeleteResult = self._put(decoded)
        else:
            result = self._delete(decoded)
        if decoded.request_id:
            self._remember(decoded.request_id, index, _encode_record(
                decoded.request_id, index, operation, decoded.key, result,
                payload_fingerprint(decoded)))
        return result

    def _lookup(self, request_id: str, index: int) -> _Remembered | None:
        record = self._remembered.get(request_id)
        if record is None:
            return None
        earlier = _decode_record(record)[1]
        if earlier.applied_index + self.dedup_window_entries < index:
            return None
        return earlier

    def _remember(self, request_id: str, applied_index: int, record: bytes) -> None:
        # An expired entry of the same id: popped so that the new one goes to the end.
        self._remembered.pop(request_id, None)
        while len(self._remembered) >= self.dedup_max_ids:
            self._forget_oldest()
        self._remembered[request_id] = record
        self._expiry.append((applied_index, request_id))

    def _put(self, command: PutCommand) -> PutResult:
        current = self._data.get(command.key)
        current_version = current[1] if current is not None else 0
        if command.expected_version is not None and command.expected_version != current_version:
            return PutResult(applied=False, version=current_version)
        new_version = current_version + 1
        self._data[command.key] = (command.value, new_version)
        return PutResult(applied=True, version=new_version)

    def _delete(self, command: DeleteCommand) -> DeleteResult:
        current = self._data.get(command.key)
        current_version = current[1] if current is not None else 0
        existed = current is not None
        if command.expected_version is not None and command.expected_version != current_version:
            return DeleteResult(applied=False, existed=existed, version=current_version)
        if existed:
            del self._data[command.key]
        return DeleteResult(applied=True, existed=existed, version=current_version)

    # -- snapshots

    def frozen_copy(self) -> FrozenState:
        """This machine's state, copied in O(keys + remembered ids) of pointer copies and
        sharing the immutable values and records: its `snapshot()` may run on another
        thread while this machine goes on applying (the node does that so a snapshot does
        not stall its event loop)."""
        return FrozenState(self._applied_index, self.dedup_window_entries,
                           self.dedup_max_ids, dict(self._data),
                           list(self._remembered.values()))

    def snapshot(self) -> bytes:
        """The whole state as bytes; see `FrozenState.snapshot` for the layout."""
        return self.frozen_copy().snapshot()

    @classmethod
    def restore(cls, data: bytes | bytearray | memoryview) -> KVStateMachine:
        """Rebuild a machine from `snapshot()` bytes; raises InvalidSnapshot if they are bad."""
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise InvalidSnapshot(f"a snapshot is bytes, got {type(data).__name__}") from None
        if view.nbytes < len(SNAPSHOT_MAGIC) + 2 + 4:
            raise InvalidSnapshot(f"snapshot is {view.nbytes} bytes, too short to be one")
        if view[:4] != SNAPSHOT_MAGIC:
            raise InvalidSnapshot(
                f"snapshot does not start with {SNAPSHOT_MAGIC!r}: not a KV state machine snapshot"
            )
        (stored_checksum,) = struct.unpack_from(">I", view, view.nbytes - 4)
        body = view[: view.nbytes - 4]
        actual_checksum = crc32c.crc32c(body)
        if actual_checksum != stored_checksum:
            raise InvalidSnapshot(
                f"snapshot checksum mismatch (stored 0x{stored_checksum:08x}, computed "
                f"0x{actual_checksum:08x}): the snapshot is corrupt"
            )
        try:
            return cls._parse(body)
        except InvalidSnapshot:
            raise
        except (struct.error, UnicodeDecodeError, ValueError) as error:
            raise InvalidSnapshot(f"snapshot body is malformed: {error}") from None

    @classmethod
    def _parse(cls, body: memoryview) -> KVStateMachine:
        reader = _Reader(body, len(SNAPSHOT_MAGIC))
        (format_version,) = reader.unpack(">H")
        if format_version not in (1, SNAPSHOT_FORMAT_VERSION):
            raise InvalidSnapshot(
                f"snapshot format version {format_version} is not supported "
                f"(expected {SNAPSHOT_FORMAT_VERSION})"
            )
        applied_index, window, max_ids, key_count = reader.unpack(">QQQQ")
        machine = cls(
            dedup_window_entries=window, dedup_max_ids=max_ids, applied_index=applied_index
        )
        for _ in range(key_count):
            (key_length,) = reader.unpack(">I")
            key = reader.text(key_length)
            version, value_length = reader.unpack(">QQ")
            if version < 1:
                raise InvalidSnapshot(f"key {key!r} has version {version}; versions start at 1")
            machine._data[key] = (reader.raw(value_length), version)
        (id_count,) = reader.unpack(">Q")
        reader.offset = _parse_records(body, reader.offset, id_count, format_version, machine)
        if reader.offset != body.nbytes:
            raise InvalidSnapshot(
                f"snapshot has {body.nbytes - reader.offset} unexpected trailing bytes"
            )
        return machine


def _parse_records(body: memoryview, offset: int, count: int, format_version: int,
                   machine: KVStateMachine) -> int:
    """Read `count` remembered-id records starting at `offset` into `machine`; returns the
    offset after them. Format-2 records are kept as the bytes they are (validated by
    decoding each); format-1 records are re-encoded in format 2."""
    data = bytes(body)
    remembered = machine._remembered
    expiry = machine._expiry
    for _ in range(count):
        start = offset
        request_id, record, offset = _decode_record(data, offset, format_version)
        if offset > len(data):
            raise InvalidSnapshot(f"snapshot is truncated inside the request id {request_id!r}")
        if request_id in remembered:
            raise InvalidSnapshot(f"request id {request_id!r} is remembered twice")
        if format_version >= 2:
            remembered[request_id] = data[start:offset]
        else:
            remembered[request_id] = _encode_record(
                request_id, record.applied_index, record.operation, record.key, record.result,
                record.fingerprint)
        expiry.append((record.applied_index, request_id))
    return offset


@dataclass(frozen=True, slots=True)
class FrozenState:
    """A state machine's state at one applied index, detached from the machine."""

    applied_index: int
    dedup_window_entries: int
    dedup_max_ids: int
    data: dict[str, tuple[bytes, int]]
    records: list[bytes]  # the remembered ids' encoded records, in application order

    def snapshot(self) -> bytes:
        """The whole state as bytes: data, versions, request ids, applied index, settings.

        Layout (big-endian): b"KVSM", u16 format version, u64 applied_index,
        u64 dedup_window_entries, u64 dedup_max_ids, u64 key count, then per key in sorted
        order (u32 key length, key, u64 version, u64 value length, value), u64 remembered
        id count, then per id in application order (u16 id length, id, u64 applied index,
        u8 operation, u32 key length, key, u8 applied, u8 existed, u64 version, u32 payload
        fingerprint), and last a u32 CRC32C of everything before it. Format 1 (still read)
        had no fingerprint.
        """
        parts: list[bytes] = [
            SNAPSHOT_MAGIC,
            struct.pack(">HQQQQ", SNAPSHOT_FORMAT_VERSION, self.applied_index,
                        self.dedup_window_entries, self.dedup_max_ids, len(self.data)),
        ]
        data = self.data
        for key in sorted(data):
            value, version = data[key]
            key_bytes = key.encode("utf-8")
            parts.append(struct.pack(">I", len(key_bytes)))
            parts.append(key_bytes)
            parts.append(struct.pack(">QQ", version, len(value)))
            parts.append(value)
        parts.append(struct.pack(">Q", len(self.records)))
        parts.extend(self.records)
        body = b"".join(parts)
        return body + struct.pack(">I", crc32c.crc32c(body))


class _Reader:
    """Sequential reads from a memoryview that fail loudly when the data runs out."""

    def __init__(self, view: memoryview, offset: int) -> None:
        self.view = view
        self.offset = offset

    def unpack(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        self._need(size)
        values = struct.unpack_from(fmt, self.view, self.offset)
        self.offset += size
        return values

    def raw(self, length: int) -> bytes:
        self._need(length)
        chunk = self.view[self.offset : self.offset + length].tobytes()
        self.offset += length
        return chunk

    def text(self, length: int) -> str:
        self._need(length)
        chunk = str(self.view[self.offset : self.offset + length], "utf-8")
        self.offset += length
        return chunk

    def _need(self, length: int) -> None:
        if self.offset + length > self.view.nbytes:
            raise InvalidSnapshot(
                f"snapshot is truncated: need {length} bytes at offset {self.offset}, "
                f"{self.view.nbytes - self.offset} left"
            )
