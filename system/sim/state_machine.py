"""The simulator's replicated state machine: the store's own, `system/kv/state_machine.py`.

What it is for: what the simulator proves about applying, deduplicating, snapshotting and
restoring must be about the code production runs, so there is one register with request-id
dedup in the project, `KVStateMachine`, and this module only adapts it to the simulator's
vocabulary: client values are text (UTF-8 in the store), a compare-and-swap is a put with
an expected version, a delete is a write without a value, and a write's outcome is a `WriteResult` the shell hands to the
client. `Replica` wraps one node's machine; a broken variant of the store
(tests/raft/broken.py) is a `KVStateMachine` subclass passed in through `SimVariant`.

What it must never do: I/O, clocks, randomness, or decide anything the store's state
machine does not: every rule (versions, CAS, request ids, snapshot checksums) is its.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from system.kv.state_machine import (
    CommandRejected,
    DeleteResult,
    InvalidSnapshot,
    KVStateMachine,
    PutResult,
    encode_delete,
    encode_put,
)
from system.raft.types import Entry, EntryKind

# A snapshot that fails its checksum or does not decode (the store's own error).
CorruptSnapshot = InvalidSnapshot

MISMATCH_ERROR = "version mismatch"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """A write's outcome. A duplicate request id gets the first result again."""

    ok: bool  # False: CAS version mismatch or a rejected command; nothing changed
    version: int  # the key's version after the write (the current one when not ok);
    # a delete: the version the key had (0: absent)
    error: str = ""  # why not ok, for the person reading the history

    @property
    def cas_mismatch(self) -> bool:
        """A CAS whose expected version differed from `version`, the key's version then
        (as opposed to a rejected command, whose `version` means nothing)."""
        return not self.ok and self.error.startswith(MISMATCH_ERROR)


@dataclass(frozen=True, slots=True)
class ReadResult:
    value: str | None  # None: never written
    version: int  # 0: never written


def encode_write(request_id: str, key: str, value: str | None,
                 expected_version: int | None) -> bytes:
    """The bytes a node proposes for a client's put (or CAS, with `expected_version`);
    `value` None: a delete (conditional with `expected_version`)."""
    if value is None:
        return encode_delete(key, expected_version=expected_version, request_id=request_id)
    return encode_put(key, value.encode(), expected_version=expected_version,
                      request_id=request_id)


def _write_result(result: PutResult | DeleteResult) -> WriteResult:
    if result.applied:
        return WriteResult(True, result.version)
    return WriteResult(False, result.version,
                       f"{MISMATCH_ERROR}: the key is at version {result.version}")


class Replica:
    """One node's copy of the store's state machine, seen with the simulator's text values."""

    def __init__(self, machine: KVStateMachine) -> None:
        self.machine = machine

    @classmethod
    def restore(cls, machine_class: type[KVStateMachine], data: bytes) -> Replica:
        """Rebuild from snapshot bytes; raises CorruptSnapshot when they do not verify."""
        return cls(machine_class.restore(data))

    def apply(self, entry: Entry) -> WriteResult | None:
        """Apply one committed entry in log order. No-op and membership entries return None."""
        if entry.kind is not EntryKind.NORMAL:
            self.machine.apply_noop(entry.index)
            return None
        result = self.machine.apply(entry.index, entry.data)
        if isinstance(result, CommandRejected):
            return WriteResult(False, 0, f"rejected: {result.reason}")
        return _write_result(result)

    def read(self, key: str) -> ReadResult:
        cell = self.machine.get(key)
        if cell is None:
            return ReadResult(None, 0)
        return ReadResult(cell[0].decode(), cell[1])

    def result_of(self, request_id: str) -> WriteResult | None:
        """The first result recorded for `request_id`, None if never applied."""
        first = self.machine.first_result(request_id)
        return _write_result(first) if first is not None else None

    def keys(self) -> list[str]:
        return list(self.machine.keys())

    @property
    def applied_index(self) -> int:
        return self.machine.applied_index

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def digest(self) -> str:
        """A short fingerprint of the whole state: equal on two replicas iff states are."""
        return hashlib.sha256(self.machine.snapshot()).hexdigest()[:16]
