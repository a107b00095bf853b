"""The operation record: one line of `history.jsonl`, and an operation paired from two of them.

Jepsen's op model (see docs/histories.md): a process *invokes* an operation and later the
same process records exactly one completion: `ok` (it happened), `fail` (it certainly did
not happen) or `info` (unknown: it may take effect at any later time, or never). A record
whose process is not an integer client (Jepsen's `:nemesis`) is an event, not an operation.

This module only defines values. It must never read files, touch the clock or know about
a particular model: parsing lives in `histories.read` and the importers, meaning in
`checker.models`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

_new = object.__new__  # Op.trusted, Operation.trusted


class OpType(enum.Enum):
    """The four record types of Jepsen's op model."""

    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class HistoryError(ValueError):
    """Malformed history input; says which file, which line and what is wrong."""

    def __init__(self, reason: str, *, path: str | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        where = path or "<history>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {reason}")


# Field names that the stable format defines (docs/histories.md). Anything else a writer adds
# is kept in `Op.extra` and written back unchanged, so newer writers do not break old readers.
RECORD_FIELDS = (
    "index",
    "time",
    "process",
    "type",
    "f",
    "key",
    "value",
    "version",
    "expected_version",
    "applied",
    "node",
    "term",
    "error",
    "consistency",
)


@dataclass(frozen=True)
class Op:
    """One record of a history: an invoke or a completion.

    `index` is the record's position in the history (0, 1, 2, ...); real-time order is the
    order of records, `time` (monotonic nanoseconds, may be None for imported histories) is
    for display only. `line` is where the record was read from, for error messages; it is
    not part of the stored format.
    """

    index: int
    process: int | str
    type: OpType
    f: str
    key: Any = None
    value: Any = None
    time: int | None = None
    version: int | None = None
    expected_version: int | None = None
    applied: bool | None = None
    node: str | None = None
    term: int | None = None
    error: str | None = None
    consistency: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()
    line: int | None = field(default=None, compare=False)

    @classmethod
    def trusted(cls, **fields: Any) -> Op:
        """A record from fields a reader already checked, built without the dataclass
        __init__ (a frozen one sets its 16 fields one call each: that was a third of
        reading a 50,000-operation log). Fields not given keep their defaults."""
        op = _new(cls)
        op.__dict__.update(fields)
        return op

    @property
    def is_client(self) -> bool:
        """Client operations have integer processes; anything else (nemesis) is an event."""
        return isinstance(self.process, int) and not isinstance(self.process, bool)

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object of one `history.jsonl` line (None fields omitted)."""
        out: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type.value,
            "f": self.f,
        }
        for name in RECORD_FIELDS[5:]:
            value = getattr(self, name)
            if value is not None or name in ("key", "value"):
                out[name] = value
        for name, value in self.extra:
            out[name] = value
        if out["time"] is None:
            del out["time"]
        return out


INFINITY = math.inf


@dataclass(frozen=True)
class Operation:
    """An invoke paired with its completion (or with none: then `type` is INFO).

    `call` and `ret` are positions in the history (record indexes); `ret` is None when the
    outcome is unknown (`info` or no completion by the end of the history): such an operation
    may take effect at any time after its invoke, or never.
    """

    id: int
    process: int
    f: str
    key: Any
    value: Any  # the invoke's value (what was asked)
    type: OpType  # OK, FAIL or INFO
    result: Any  # the completion's value (what was answered); None when unknown
    call: int
    ret: int | None
    invoke: Op
    completion: Op | None

    @classmethod
    def trusted(cls, **fields: Any) -> Operation:
        """Built without the dataclass __init__, as Op.trusted; every field must be given."""
        op = _new(cls)
        op.__dict__.update(fields)
        return op

    @property
    def version(self) -> int | None:
        return self.completion.version if self.completion else None

    @property
    def line(self) -> int:
        """The history line (1-based) of its completion, else of its invoke: what an
        anomaly's text points a person at."""
        record = self.completion or self.invoke
        return record.line if record.line is not None else record.index + 1

    @property
    def expected_version(self) -> int | None:
        if self.invoke.expected_version is not None:
            return self.invoke.expected_version
        return self.completion.expected_version if self.completion else None

    @property
    def applied(self) -> bool | None:
        return self.completion.applied if self.completion else None

    @property
    def error(self) -> str | None:
        return self.completion.error if self.completion else None

    @property
    def consistency(self) -> str | None:
        return self.invoke.consistency

    def describe(self) -> str:
        """Short human text, e.g. `p3 cas [1 2] -> ok` (models give richer text)."""
        outcome = self.type.value
        if self.type is OpType.OK and self.result is not None and self.result != self.value:
            outcome = f"ok {self.result!r}"
        key = "" if self.key is None else f" k={self.key!r}"
        return f"p{self.process} {self.f}{key} {self.value!r} -> {outcome}"
