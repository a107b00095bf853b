"""Client histories of the simulator and a small linearizability search over them.

What it is for: the simulator records every client operation as Jepsen does (an `invoke`,
later one completion: `ok` it happened, `fail` it certainly did not, `info` unknown), and
at the end of a run the history must be linearizable for the versioned register of
`system.raft.register`. The search is Wing & Gong's with Lowe's memoization of
(set of linearized operations, register state), split per key (P-compositionality):
an `ok` op takes effect at one instant between its invoke and its completion; an `info`
op may take effect at any instant after its invoke, or never; `fail` ops and stale reads
are left out (a stale read is allowed to be old by definition).

What it must never do: guess. When the search budget runs out the verdict is
"unknown", never True. The project's full checker lives in `checker/`; this one only
needs to be right for the simulator's register and small histories.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class EventType(Enum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class Function(Enum):
    PUT = "put"
    CAS = "cas"
    GET = "get"


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
        if self.node:
            parts.append(f"@{self.node}")
        if self.error:
            parts.append(f"({self.error})")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class _Operation:
    call: int
    ret: float  # completion index, or infinity for info ops
    must_happen: bool  # ok ops must be linearized; info ops may be
    f: Function
    value: str | None
    version: int | None
    expected_version: int | None
    text: str


@dataclass(frozen=True)
class Verdict:
    """valid is True, False or "unknown" (budget exhausted)."""

    valid: bool | str
    key: str | None = None  # the key whose sub-history failed (or ran out of budget)
    explanation: str = ""
    states_explored: int = 0
    keys_checked: list[str] = field(default_factory=list)


_State = tuple[str | None, int]  # (value, version) of one key


def _step(state: _State, op: _Operation) -> _State | None:
    """The register model: the state after `op`, or None when `op` cannot happen here."""
    value, version = state
    if op.f is Function.GET:
        if op.value != value or (op.version is not None and op.version != version):
            return None
        return state
    if op.f is Function.CAS and op.expected_version != version:
        # An ok CAS needs a match; an info CAS that does not match is a no-op.
        return None if op.must_happen else state
    if op.must_happen and op.version is not None and op.version != version + 1:
        return None
    return (op.value, version + 1)


def operations_by_key(history: list[HistoryEvent]) -> dict[str, list[_Operation]]:
    """Pair invokes with completions per process; drop what cannot constrain the register."""
    open_ops: dict[int, HistoryEvent] = {}
    result: dict[str, list[_Operation]] = {}
    for event in history:
        if event.type is EventType.INVOKE:
            if event.process in open_ops:
                raise ValueError(
                    f"process {event.process} invoked {event.line()!r} while "
                    f"{open_ops[event.process].line()!r} was still open"
                )
            open_ops[event.process] = event
            continue
        invoke = open_ops.pop(event.process, None)
        if invoke is None:
            raise ValueError(f"completion without invoke: {event.line()!r}")
        _add(result, invoke, event)
    for invoke in open_ops.values():  # never completed: as good as info
        _add(result, invoke, None)
    return result


def _add(result: dict[str, list[_Operation]], invoke: HistoryEvent, done: HistoryEvent | None):
    status = done.type if done is not None else EventType.INFO
    if status is EventType.FAIL:
        return  # certainly did not happen
    if invoke.f is Function.GET and (status is EventType.INFO or (done and done.stale)):
        return  # an unknown read constrains nothing; a stale read is allowed to be old
    if status is EventType.OK:
        assert done is not None
        value = done.value if invoke.f is Function.GET else invoke.value
        version = done.version
        ret: float = done.index
        text = f"{invoke.line()}  ->  {done.line()}"
    else:
        value, version, ret = invoke.value, None, float("inf")
        text = f"{invoke.line()}  ->  {done.line() if done else 'never completed'}"
    result.setdefault(invoke.key, []).append(
        _Operation(
            call=invoke.index,
            ret=ret,
            must_happen=status is EventType.OK,
            f=invoke.f,
            value=value,
            version=version,
            expected_version=invoke.expected_version,
            text=text,
        )
    )


def check_key(ops: list[_Operation], max_states: int) -> tuple[bool | str, str, int]:
    """Wing & Gong / Lowe search over one key's operations."""
    ops = sorted(ops, key=lambda o: o.call)
    count = len(ops)
    required = 0
    for i, op in enumerate(ops):
        if op.must_happen:
            required |= 1 << i
    start: _State = (None, 0)
    stack: list[tuple[int, _State]] = [(0, start)]
    seen: set[tuple[int, _State]] = set()
    deepest: tuple[int, _State] = (0, start)
    while stack:
        mask, state = stack.pop()
        if mask & required == required:
            return True, "", len(seen)
        if (mask, state) in seen:
            continue
        seen.add((mask, state))
        if len(seen) > max_states:
            return "unknown", f"gave up after {max_states} states", len(seen)
        if bin(mask & required).count("1") > bin(deepest[0] & required).count("1"):
            deepest = (mask, state)
        # Only ops invoked before the earliest pending `ok` completion may go next.
        horizon = min(ops[i].ret for i in range(count) if required >> i & 1 and not mask >> i & 1)
        for i in range(count - 1, -1, -1):
            if mask >> i & 1 or ops[i].call >= horizon:
                continue
            after = _step(state, ops[i])
            if after is not None:
                stack.append((mask | 1 << i, after))
    mask, state = deepest
    done = [ops[i].text for i in range(count) if mask >> i & 1]
    pending = [ops[i].text for i in range(count) if required >> i & 1 and not mask >> i & 1]
    explanation = (
        "no order of these operations is consistent with a versioned register.\n"
        f"  longest consistent prefix ends in state value={state[0]!r} version={state[1]}:\n"
        + "".join(f"    {t}\n" for t in done)
        + "  and none of these can come next:\n"
        + "".join(f"    {t}\n" for t in pending)
    )
    return False, explanation, len(seen)


def check_history(history: list[HistoryEvent], max_states_per_key: int = 200_000) -> Verdict:
    """Is `history` linearizable for a versioned register per key?"""
    explored = 0
    checked: list[str] = []
    unknown: Verdict | None = None
    for key, ops in sorted(operations_by_key(history).items()):
        valid, explanation, states = check_key(ops, max_states_per_key)
        explored += states
        checked.append(key)
        if valid is False:
            return Verdict(False, key, f"key {key!r}: {explanation}", explored, checked)
        if valid == "unknown" and unknown is None:
            unknown = Verdict("unknown", key, f"key {key!r}: {explanation}", explored, checked)
    if unknown is not None:
        return unknown
    return Verdict(True, None, "", explored, checked)
