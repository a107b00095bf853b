"""Snapshot files: one state-machine snapshot plus its Raft metadata, written atomically.

File name: `snapshot-<index:020d>-<term:020d>.snap` in the snapshots directory. Layout
(little-endian)::

    b"KVSNAP"            magic
    u16                  format version (2; 1 is read too: no learners, no member info)
    u64 index, u64 term  SnapshotMeta
    u16 voter count, then per voter: u16 length, UTF-8 id
    (version 2) u16 learner count, then per learner: u16 length, UTF-8 id
    (version 2) u16 member-info count, then per member: u16 length, UTF-8 id, u16 length,
                UTF-8 info (the KV node: its address)
    u64 data length, data
    u32 CRC32C of everything before it

Writing: temp file `<name>.tmp`, write, fsync, rename to `<name>`, fsync the directory —
so after a crash the file either exists whole or not at all. A snapshot file is never
torn; any damage is corruption (`CorruptStorage`, with file and offset).

This module must never return data whose checksum it has not verified.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import crc32c

from system.kv.storage_errors import CorruptStorage
from system.raft.types import SnapshotMeta

SNAPSHOT_MAGIC = b"KVSNAP"
SNAPSHOT_FORMAT_VERSION = 2
TEMP_SUFFIX = ".tmp"
_NAME = re.compile(r"^snapshot-(\d{20})-(\d{20})\.snap$")
_FIXED = struct.Struct("<6sHQQH")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def snapshot_name(meta: SnapshotMeta) -> str:
    return f"snapshot-{meta.index:020d}-{meta.term:020d}.snap"


def parse_snapshot_name(name: str) -> tuple[int, int] | None:
    """(index, term) from a snapshot file name, or None if it is not one."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def fsync_directory(directory: Path) -> None:
    """Make renames, creations and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, buffers: list[bytes] | list[memoryview]) -> int:
    """Write every buffer, in order, with as few system calls as possible (no copies)."""
    total = 0
    batch_size = 512  # below IOV_MAX (1024 on Linux)
    for start in range(0, len(buffers), batch_size):
        pending = [memoryview(buffer).cast("B") for buffer in buffers[start : start + batch_size]]
        pending = [view for view in pending if view.nbytes]
        while pending:
            written = os.writev(fd, pending)
            total += written
            while pending and written >= pending[0].nbytes:
                written -= pending[0].nbytes
                pending.pop(0)
            if written:
                pending[0] = pending[0][written:]
    return total


def write_snapshot_file(directory: Path, meta: SnapshotMeta, data: bytes) -> Path:
    """Durably write the snapshot; returns its path. Atomic: whole or absent after a crash."""
    voters = [voter.encode("utf-8") for voter in meta.voters]
    parts: list[bytes] = [
        _FIXED.pack(SNAPSHOT_MAGIC, SNAPSHOT_FORMAT_VERSION, meta.index, meta.term, len(voters))
    ]
    for voter in voters:
        parts += [_U16.pack(len(voter)), voter]
    parts.append(_U16.pack(len(meta.learners)))
    for learner in meta.learners:
        encoded = learner.encode("utf-8")
        parts += [_U16.pack(len(encoded)), encoded]
    parts.append(_U16.pack(len(meta.member_info)))
    for member, info in meta.member_info:
        for text in (member.encode("utf-8"), info.encode("utf-8")):
            parts += [_U16.pack(len(text)), text]
    parts += [_U64.pack(len(data)), data]
    checksum = 0
    for part in parts:
        checksum = crc32c.crc32c(part, checksum)
    parts.append(_U32.pack(checksum))

    final = directory / snapshot_name(meta)
    temp = directory / (final.name + TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, parts)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, final)
    fsync_directory(directory)
    return final


def read_snapshot_file(path: Path) -> tuple[SnapshotMeta, bytes]:
    """Read and verify a snapshot file; raises CorruptStorage naming what is wrong."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        checksum = 0
        offset = 0

        def take(length: int, what: str) -> bytes:
            nonlocal checksum, offset
            if offset + length > size - _U32.size:
                raise CorruptStorage(
                    path, offset,
                    f"file ends inside the {what} ({length} bytes needed, "
                    f"{max(0, size - _U32.size - offset)} left before the checksum)",
                )
            chunk = file.read(length)
            checksum = crc32c.crc32c(chunk, checksum)
            offset += length
            return chunk

        magic, version, index, term, voter_count = _FIXED.unpack(take(_FIXED.size, "header"))
        if magic != SNAPSHOT_MAGIC:
            raise CorruptStorage(path, 0, f"magic {magic!r} is not {SNAPSHOT_MAGIC!r}")
        if version not in (1, SNAPSHOT_FORMAT_VERSION):
            raise CorruptStorage(path, 6, f"snapshot format version {version} is not supported")

        def take_text(what: str) -> str:
            (length,) = _U16.unpack(take(_U16.size, f"{what} length"))
            text_offset = offset
            try:
                return take(length, what).decode("utf-8")
            except UnicodeDecodeError:
                raise CorruptStorage(path, text_offset, f"{what} is not UTF-8") from None

        voters = [take_text("voter id") for _ in range(voter_count)]
        learners: list[str] = []
        member_info: list[tuple[str, str]] = []
        if version >= 2:
            (learner_count,) = _U16.unpack(take(_U16.size, "learner count"))
            learners = [take_text("learner id") for _ in range(learner_count)]
            (info_count,) = _U16.unpack(take(_U16.size, "member info count"))
            for _ in range(info_count):
                member = take_text("member id")
                member_info.append((member, take_text("member info")))
        (data_length,) = _U64.unpack(take(_U64.size, "data length"))
        data = take(data_length, "data")
        if offset != size - _U32.size:
            raise CorruptStorage(
                path, offset,
                f"{size - _U32.size - offset} unexpected bytes between the data and the checksum",
            )
        (stored,) = _U32.unpack(file.read(_U32.size))
    if stored != checksum:
        raise CorruptStorage(
            path, offset,
            f"snapshot checksum mismatch (stored 0x{stored:08x}, computed 0x{checksum:08x})",
        )
    meta = SnapshotMeta(index=index, term=term, voters=tuple(voters), learners=tuple(learners),
                        member_info=tuple(member_info))
    if parse_snapshot_name(path.name) != (index, term):
        raise CorruptStorage(
            path, 0, f"file name does not match its contents (index {index}, term {term})"
        )
    return meta, data
