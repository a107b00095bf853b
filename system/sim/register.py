"""A versioned register per key that remembers request ids: the simulator's replicated
state machine.

What it is for: the deterministic simulator (`system.sim`) needs something real to
replicate so that client operations can be proposed, retried and read back, and so that
"applied exactly once" and "no acknowledged write lost" can be checked. Each key holds a
value and a version (0 = never written); `put` bumps the version, `cas` bumps it only when
the caller's expected version matches. Every write carries a request id; applying a
command whose request id was already applied changes nothing and returns the FIRST result
(the essay's idempotent write: a retry returns the first result, never applies twice).

What it must never do: I/O of any kind, or depend on anything but the sequence of
commands applied to it. Bad command bytes never raise out of `apply`: they produce an
error result and leave the state unchanged (a bad entry must not crash a node). A
snapshot that does not verify is refused with `CorruptSnapshot`, never served.

The production KV state machine lives in `system/kv/state_machine.py`; this one is the
minimum the Raft tests need and stays independent of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum

from system.raft.types import Entry, EntryKind


class Operation(Enum):
    """The writes a command can carry. Reads never go through the log."""

    PUT = "put"
    CAS = "cas"


@dataclass(frozen=True, slots=True)
class Command:
    """A client write, as proposed to Raft (encoded with `encode_command`)."""

    request_id: str  # unique per logical client operation; retries reuse it
    operation: Operation
    key: str
    value: str
    expected_version: int | None = None  # CAS only: apply only if the key's version equals it


# The start of a CAS mismatch's error text (kept in snapshots, so a duplicate request id
# restored from one still reads as a mismatch).
MISMATCH_ERROR = "version mismatch"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What applying a write returned. A duplicate request id returns the first result."""

    ok: bool  # False: CAS version mismatch or a malformed command; the state did not change
    version: int  # the key's version after the write (or the current one when not ok)
    value: str | None  # the key's value after the write (or the current one when not ok)
    error: str = ""  # why not ok, for the person reading the history

    @property
    def cas_mismatch(self) -> bool:
        """A CAS whose expected version differed from `version`, the key's version then
        (as opposed to a malformed command, whose `version` means nothing)."""
        return not self.ok and self.error.startswith(MISMATCH_ERROR)


@dataclass(frozen=True, slots=True)
class ReadResult:
    value: str | None  # None: never written
    version: int  # 0: never written


class CorruptSnapshot(ValueError):
    """Snapshot bytes that fail their checksum or do not decode. Never restore from them."""


def encode_command(command: Command) -> bytes:
    """The bytes to propose for `command` (canonical JSON)."""
    record = {
        "request_id": command.request_id,
        "op": command.operation.value,
        "key": command.key,
        "value": command.value,
    }
    if command.expected_version is not None:
        record["expected_version"] = command.expected_version
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def decode_command(data: bytes) -> Command:
    """Parse proposed bytes; raises ValueError saying what is wrong."""
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"command is not JSON: {error}") from None
    if not isinstance(record, dict):
        raise ValueError("command must be a JSON object")
    try:
        operation = Operation(record.get("op"))
    except ValueError:
        raise ValueError(f"unknown operation {record.get('op')!r}; expected put or cas") from None
    request_id, key, value = record.get("request_id"), record.get("key"), record.get("value")
    for name, field in (("request_id", request_id), ("key", key), ("value", value)):
        if not isinstance(field, str):
            raise ValueError(f"command field {name!r} must be a string, got {field!r}")
    expected = record.get("expected_version")
    if operation is Operation.CAS and (not isinstance(expected, int) or expected < 0):
        raise ValueError(f"cas needs a non-negative integer expected_version, got {expected!r}")
    if operation is Operation.PUT and expected is not None:
        raise ValueError("put takes no expected_version")
    return Command(request_id, operation, key, value, expected)


class Register:
    """The state machine: key -> (value, version) plus the request-id table.

    Invariants: a key's version is the number of writes applied to it; a request id is
    applied at most once (its first result is kept and returned for every duplicate).
    """

    def __init__(self) -> None:
        self._cells: dict[str, tuple[str, int]] = {}  # key -> (value, version >= 1)
        self._results: dict[str, WriteResult] = {}  # request id -> first result

    # -- applying ------------------------------------------------------------------------

    def apply(self, entry: Entry) -> WriteResult | None:
        """Apply one committed entry. NOOP entries return None and change nothing."""
        if entry.kind is not EntryKind.NORMAL:  # NOOP, CONFIG
            return None
        try:
            command = decode_command(entry.data)
        except ValueError as error:
            return WriteResult(ok=False, version=0, value=None, error=f"rejected: {error}")
        return self.apply_command(command)

    def apply_command(self, command: Command) -> WriteResult:
        first = self._results.get(command.request_id)
        if first is not None:
            return first  # a retry: exactly-once, the first result wins
        result = self._execute(command)
        self._results[command.request_id] = result
        return result

    def _execute(self, command: Command) -> WriteResult:
        value, version = self._cells.get(command.key, (None, 0))
        if command.operation is Operation.CAS and command.expected_version != version:
            return WriteResult(
                ok=False,
                version=version,
                value=value,
                error=f"{MISMATCH_ERROR}: expected {command.expected_version}, found {version}",
            )
        self._cells[command.key] = (command.value, version + 1)
        return WriteResult(ok=True, version=version + 1, value=command.value)

    # -- reading -------------------------------------------------------------------------

    def read(self, key: str) -> ReadResult:
        value, version = self._cells.get(key, (None, 0))
        return ReadResult(value=value, version=version)

    def result_of(self, request_id: str) -> WriteResult | None:
        """The first result recorded for `request_id`, None if never applied."""
        return self._results.get(request_id)

    def keys(self) -> list[str]:
        return sorted(self._cells)

    # -- snapshots -----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state, with a checksum so corruption is detected."""
        body = json.dumps(
            {
                "cells": {key: list(cell) for key, cell in sorted(self._cells.items())},
                "results": {
                    rid: [r.ok, r.version, r.value, r.error]
                    for rid, r in sorted(self._results.items())
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    @classmethod
    def restore(cls, data: bytes) -> Register:
        """Rebuild from `snapshot()` bytes; raises CorruptSnapshot when they do not verify."""
        digest, separator, body = data.partition(b"\n")
        if not separator or hashlib.sha256(body).hexdigest().encode() != digest:
            raise CorruptSnapshot(
                f"register snapshot of {len(data)} bytes fails its sha256 check "
                "(truncated, reordered or corrupted chunks?)"
            )
        try:
            record = json.loads(body)
            register = cls()
            for key, (value, version) in record["cells"].items():
                register._cells[key] = (value, int(version))
            for rid, (ok, version, value, error) in record["results"].items():
                register._results[rid] = WriteResult(bool(ok), int(version), value, error)
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptSnapshot(f"register snapshot does not decode: {error}") from None
        return register

    def digest(self) -> str:
        """A short fingerprint of the state, equal on two registers iff states are equal."""
        return self.snapshot()[:16].decode()
