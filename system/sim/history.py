"""The simulator's client history, and its conversion to the project's operation records.

What it is for: the simulator records every client operation as Jepsen does (an `invoke`,
later one completion: `ok` it happened, `fail` it certainly did not, `info` unknown) as
`HistoryEvent`s. At the end of a run the history must be linearizable for the versioned
register the store's state machine keeps (`system.sim.state_machine`); the project's checker (`checker/`, model
`versioned-kv`, docs/checker.md) decides that, so `to_records` turns the events into its
`histories.Op` records (docs/histories.md), one record per event, same index, same order.

How the store's keys map onto `versioned-kv` (both: a key is (value, version), version 0 =
never written, +1 per applied write):
- `put` -> `put` without `expected_version`; `cas` -> `put` with `expected_version`;
  `delete` -> `delete`, with `expected_version` when conditional (the reported version is
  the one the key had: 0 when absent).
- a CAS whose expected version did not match completes `fail` here with the key's current
  version (`applied=False`); it becomes `fail` with `error: "cas-mismatch"` and that version,
  which the model reads as "at some instant in the interval the version was this one, and
  not the expected one" (information, not a no-op). Any other `fail` certainly did not apply.
- `get` -> `get` with `consistency` "stale" or "linearizable" on the invoke; stale reads
  promise no recency and the model does not check them.
- other errors keep the sim's text in `error`; a mismatch's text goes to an extra field
  `detail`, as do the request id (`request_id`) and the simulator step (`step`); the
  checker ignores extra fields.

What it must never do: I/O, clocks or anything but turning values into values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from histories.ops import Op, OpType

CAS_MISMATCH = "cas-mismatch"  # the error text versioned-kv reads as a CAS that did not match


class EventType(Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class Function(Enum):
    PUT = "put"
    CAS = "cas"
    GET = "get"
    DELETE = "delete"  # with expected_version: a conditional delete


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One line of a client history (Jepsen's op model)."""

    index: int  # position in the history; doubles as the logical time of the event
    type: EventType
    process: int  # a client process; it has at most one operation in flight
    f: Function
    key: str
    value: str | None = None  # put/cas: the value written; get ok: the value read
    version: int | None = None  # completion: the key's version after the write / as read
    expected_version: int | None = None  # cas only
    request_id: str = ""  # writes: the id every retry of this operation carries
    node: str = ""  # completion: the node that answered
    stale: bool = False  # a get served from local state without a ReadIndex barrier
    step: int = 0  # the simulator step at which the event happened
    error: str = ""  # fail/info: why
    # Write completions answered by a state machine: False for a CAS whose expected version
    # did not match (nothing changed; `version` is the key's version then). None otherwise.
    applied: bool | None = None

    def line(self) -> str:
        parts = [f"{self.index}", self.type.value, f"p{self.process}", self.f.value, self.key]
        if self.expected_version is not None:
            parts.append(f"expect=v{self.expected_version}")
        if self.value is not None:
            parts.append(f"value={self.value!r}")
        if self.version is not None:
            parts.append(f"v{self.version}")
        if self.stale:
            parts.append("stale")
        if self.applied is False:
            parts.append("not-applied")
        if self.node:
            parts.append(f"@{self.node}")
        if self.error:
            parts.append(f"({self.error})")
        return " ".join(parts)


def to_records(history: list[HistoryEvent]) -> list[Op]:
    """The history as `histories.Op` records for `checker` (see the module docstring)."""
    records = []
    for event in history:
        f = {Function.GET: "get", Function.DELETE: "delete"}.get(event.f, "put")
        invoke = event.type is EventType.INVOKE
        extra: list[tuple[str, object]] = [("step", event.step)]
        if event.request_id:
            extra.append(("request_id", event.request_id))
        error: str | None = event.error or None
        if event.applied is False:
            extra.append(("detail", event.error))
            error = CAS_MISMATCH
        consistency = None
        if f == "get" and invoke:
            consistency = "stale" if event.stale else "linearizable"
        records.append(
            Op(
                index=event.index,
                time=None,
                process=event.process,
                type=OpType(event.type.value),
                f=f,
                key=event.key,
                value=None if f == "get" and invoke else event.value,
                version=event.version,
                expected_version=event.expected_version if invoke else None,
                applied=event.applied,
                node=event.node or None,
                error=error,
                consistency=consistency,
                extra=tuple(sorted(extra)),
            )
        )
    return records
