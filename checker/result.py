"""What a checker returns: a three-valued verdict, per-key details, a counterexample, JSON.

`valid` is True, False or "unknown" (a budget ran out), never a guess. Must never hold
references to model internals: descriptions are rendered to text when the result is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from histories.ops import Operation

Verdict = bool | Literal["unknown"]
UNKNOWN: Literal["unknown"] = "unknown"


def combine(verdicts: list[Verdict]) -> Verdict:
    """False if any is False, else unknown if any is unknown, else True."""
    if any(v is False for v in verdicts):
        return False
    if any(v == UNKNOWN for v in verdicts):
        return UNKNOWN
    return True


@dataclass(frozen=True)
class Placed:
    """An operation in the longest linearizable prefix, with the state after it."""

    op: Operation
    description: str
    state_after: str


@dataclass(frozen=True)
class Candidate:
    """An operation that could have come next, and what the model said about it."""

    op: Operation
    description: str
    outcome: str  # e.g. "illegal in state 3" or "leads to 4, which was already explored"


@dataclass(frozen=True)
class Counterexample:
    """Why one key is not linearizable: the longest prefix that works and what then fails."""

    key: Any
    prefix: tuple[Placed, ...]
    state: str  # model state after the prefix
    blocking: Operation  # completed operation that cannot be placed before its return
    blocking_description: str
    candidates: tuple[Candidate, ...]
    operations: tuple[Operation, ...]  # every operation of the key (for the timeline)
    last_write: Operation | None = None  # the prefix's last state change: what the blocking op contradicts
    sources: tuple[Operation, ...] = ()  # ops that write the state the blocking op needs (model hints)
    # When the key was refuted from one window (checker/windows.py): the blind write that
    # starts it; the prefix then starts there, and what came before cannot matter.
    start: Operation | None = None

    def involved_ids(self) -> set[int]:
        return {c.op.id for c in self.candidates} | {self.blocking.id}

    def contradiction(self) -> list[str]:
        """One line each: the write whose value the blocking op contradicts, and where the
        value it needs was written."""
        lines = []
        if self.last_write is not None:
            lines.append(
                f"it contradicts {_where(self.last_write)} {self.last_write.describe()} "
                f"(the prefix's last write: state {self.state})"
            )
        if self.sources:
            shown = ", ".join(f"{_where(op)} {op.describe()}" for op in self.sources)
            lines.append(f"the value it needs is written by {shown}")
        return lines

    def text(self, *, prefix_shown: int = 8, candidates_shown: int = 12) -> str:
        lines = [f"key {self.key!r}: not linearizable"]
        if self.start is None:
            lines.append(
                f"  longest linearizable prefix: {len(self.prefix)} of {len(self.operations)} operations"
            )
        else:
            lines.append(
                f"  from {_where(self.start)} {self.start.describe()} on: every "
                f"operation before it returned before it began and it leaves the same state whatever "
                f"came before, so no order of the earlier ones can help"
            )
            lines.append(f"  longest linearizable sequence from there: {len(self.prefix)} operations")
        if len(self.prefix) > prefix_shown:
            lines.append(f"    ... {len(self.prefix) - prefix_shown} earlier operations")
        for placed in self.prefix[-prefix_shown:]:
            lines.append(
                f"    {_where(placed.op)} p{placed.op.process} {placed.description}  => {placed.state_after}"
            )
        lines.append(f"  state then: {self.state}")
        lines.append(
            f"  cannot place: {_where(self.blocking)} p{self.blocking.process} {self.blocking_description}"
            f" (it returned before any order could include it)"
        )
        lines += [f"  {line}" for line in self.contradiction()]
        if self.candidates:
            lines.append("  operations that could go next, none of which leads to a linearization:")
            for cand in self.candidates[:candidates_shown]:
                lines.append(f"    {_where(cand.op)} p{cand.op.process} {cand.description}: {cand.outcome}")
            if len(self.candidates) > candidates_shown:
                lines.append(f"    ... {len(self.candidates) - candidates_shown} more")
        lines.append("  ([invoke..completion] are record indexes; ? = outcome unknown)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": _jsonable(self.key),
            "prefix": [
                {"op": _op_json(p.op), "description": p.description, "state_after": p.state_after}
                for p in self.prefix
            ],
            "state": self.state,
            "start": None if self.start is None else _op_json(self.start),
            "blocking": {"op": _op_json(self.blocking), "description": self.blocking_description},
            "last_write": None if self.last_write is None else _op_json(self.last_write),
            "sources": [_op_json(op) for op in self.sources],
            "candidates": [
                {"op": _op_json(c.op), "description": c.description, "outcome": c.outcome}
                for c in self.candidates
            ],
        }


def _where(op: Operation) -> str:
    ret = "?" if op.ret is None else str(op.ret)
    return f"[{op.call}..{ret}]"


def _op_json(op: Operation) -> dict[str, Any]:
    return {
        "id": op.id,
        "process": op.process,
        "f": op.f,
        "key": _jsonable(op.key),
        "value": _jsonable(op.value),
        "type": op.type.value,
        "result": _jsonable(op.result),
        "invoke_index": op.call,
        "complete_index": op.ret,
        "invoke_line": op.invoke.line,
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list | frozenset | set):
        return [_jsonable(v) for v in value]
    return repr(value)


@dataclass(frozen=True)
class KeyResult:
    key: Any
    valid: Verdict
    operations: int
    seconds: float
    explored: int = 0  # configurations (linearized set, state) memoized
    note: str = ""
    counterexample: Counterexample | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "key": _jsonable(self.key),
            "valid": self.valid,
            "operations": self.operations,
            "seconds": round(self.seconds, 6),
            "explored": self.explored,
            "note": self.note,
        }
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample.to_json()
        return out


@dataclass(frozen=True)
class Anomaly:
    """A lost-write checker finding: what kind, on which key, and the operations involved."""

    kind: str  # "lost-write" | "stale-read" | "version-reuse"
    key: Any
    text: str
    operations: tuple[Operation, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": _jsonable(self.key),
            "text": self.text,
            "operations": [_op_json(op) for op in self.operations],
        }


@dataclass(frozen=True)
class Result:
    checker: str  # "linearizable" | "lost-writes"
    valid: Verdict
    model: str
    seconds: float
    keys: tuple[KeyResult, ...] = ()
    anomalies: tuple[Anomaly, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    note: str = ""

    @property
    def counterexamples(self) -> list[Counterexample]:
        return [k.counterexample for k in self.keys if k.counterexample is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "checker": self.checker,
            "valid": self.valid,
            "model": self.model,
            "seconds": round(self.seconds, 6),
            "counts": dict(self.counts),
            "note": self.note,
            "keys": [k.to_json() for k in self.keys],
            "anomalies": [a.to_json() for a in self.anomalies],
        }
