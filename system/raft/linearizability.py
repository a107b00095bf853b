"""Client histories of the simulator and a small linearizability search over them.

What it is for: the simulator records every client operation as Jepsen does (an `invoke`,
later one completion: `ok` it happened, `fail` it certainly did not, `info` unknown), and
at the end of a run the history must be linearizable for the versioned register of
`system.raft.register`. The search is Wing & Gong's with Lowe's memoization of
(set of linearized operations, register state), split per key (P-compositionality):
an `ok` op takes effect at one instant between its invoke and its completion; an `info`
op may take effect at any instant after its invoke, or never; `fail` ops and stale reads
are left out (a stale read is allowed to be old by definition).

Histories with many `info` writes make that search exponential (which subset of the
unknown writes happened, in which order). When the search runs out of budget and every
`ok` op reports the version it saw or made (the simulator's always do), the key is
settled exactly by `check_key_by_versions`: versions fix the order of the writes, and
the question left is whether the versions nobody reported a writer for can be filled by
distinct `info` writes invoked early enough, a bipartite matching.

What it must never do: guess. When neither method can decide, the verdict is
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


def _version_before(op: _Operation) -> int | None:
    """The key's version an `ok` op must find when it takes effect (None if unknown)."""
    if op.version is None:
        return None
    return op.version if op.f is Function.GET else op.version - 1


def check_key(ops: list[_Operation], max_states: int) -> tuple[bool | str, str, int]:
    """Wing & Gong / Lowe search over one key's operations.

    Two prunings use the register's versions (sound only when every `ok` op reports the
    version it saw or made, which the simulator's always do): versions never decrease, so
    a state whose version passed the version some pending `ok` op needs is dead; and if
    some pending `ok` op can take effect now, no version-changing `info` op can precede
    it, so `info` ops are only tried when no `ok` op can go next.
    """
    ops = sorted(ops, key=lambda o: o.call)
    count = len(ops)
    required = 0
    for i, op in enumerate(ops):
        if op.must_happen:
            required |= 1 << i
    by_return = sorted((i for i in range(count) if ops[i].must_happen), key=lambda i: ops[i].ret)
    exact = all(_version_before(ops[i]) is not None for i in by_return)
    by_version = sorted(by_return, key=lambda i: _version_before(ops[i]) or 0)
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
        if exact:
            needed = next(_version_before(ops[i]) for i in by_version if not mask >> i & 1)
            if needed is not None and state[1] > needed:
                continue  # versions never go back: that op can never take effect
        # Only ops invoked before the earliest pending `ok` completion may go next.
        horizon = next(ops[i].ret for i in by_return if not mask >> i & 1)
        # Push `info` ops first so they are tried last: most of them either never took
        # effect or only matter where an `ok` op cannot go on without them.
        later: list[tuple[int, _State]] = []
        sooner: list[tuple[int, _State]] = []
        for i in range(count):
            op = ops[i]
            if op.call >= horizon:
                break  # sorted by call: nothing further can go next either
            if mask >> i & 1:
                continue
            after = _step(state, op)
            if after is not None:
                (sooner if op.must_happen else later).append((mask | 1 << i, after))
        if not (exact and sooner):
            stack.extend(later)
        stack.extend(reversed(sooner))
    mask, state = deepest
    done = [ops[i].text for i in range(count) if mask >> i & 1]
    if len(done) > 10:  # the end of the prefix is what a reader needs
        done = [f"... {len(done) - 10} earlier operations"] + done[-10:]
    pending = [ops[i].text for i in range(count) if required >> i & 1 and not mask >> i & 1]
    if len(pending) > 10:
        pending = pending[:10] + [f"... and {len(pending) - 10} more"]
    explanation = (
        "no order of these operations is consistent with a versioned register.\n"
        f"  longest consistent prefix ends in state value={state[0]!r} version={state[1]}:\n"
        + "".join(f"    {t}\n" for t in done)
        + "  and none of these can come next:\n"
        + "".join(f"    {t}\n" for t in pending)
    )
    return False, explanation, len(seen)


def check_key_by_versions(ops: list[_Operation]) -> tuple[bool, str]:
    """Exact decision for one key when every `ok` op carries its version.

    In any linearization of a versioned register, the write that made version v comes
    after the one that made v-1, and a read of version v sits between the writes of v and
    v+1. So the order of groups is fixed: reads of 0, write 1, reads of 1, write 2, ...
    Linearization points exist iff no op completed before an op of an EARLIER group was
    invoked (greedy: each point is the latest invoke seen so far). Versions no `ok` write
    made must each be made by a distinct `info` write (a CAS only at expected+1) that was
    invoked before every op of a later group completed: a bipartite matching.
    """
    for op in ops:
        if op.must_happen and op.version is None:
            raise ValueError("check_key_by_versions needs a version on every ok op")
    ok_ops = [op for op in ops if op.must_happen]
    for op in ok_ops:
        lowest = 0 if op.f is Function.GET else 1
        if (op.version or 0) < lowest:
            return False, f"{op.text}\n  reports version {op.version}, below {lowest}"
    info_writes = [op for op in ops if not op.must_happen and op.f is not Function.GET]
    top = max((op.version or 0 for op in ok_ops), default=0)
    writer: dict[int, _Operation] = {}
    seen_value: dict[int, tuple[str | None, _Operation]] = {0: (None, _ZERO)}
    for op in ok_ops:
        version = op.version or 0
        if op.f is Function.GET:
            continue
        if op.f is Function.CAS and op.expected_version != version - 1:
            return False, f"{op.text}\n  a CAS expecting v{op.expected_version} made v{version}"
        if version in writer:
            return False, (
                f"two writes both made version {version}:\n  {writer[version].text}\n  {op.text}"
            )
        writer[version] = op
        seen_value[version] = (op.value, op)
    for op in ok_ops:
        if op.f is not Function.GET:
            continue
        version = op.version or 0
        known = seen_value.get(version)
        if known is not None and known[0] != op.value:
            return False, (
                f"version {version} holds {known[0]!r} ({known[1].text}) but a read saw "
                f"{op.value!r}:\n  {op.text}"
            )
        seen_value.setdefault(version, (op.value, op))

    def group(op: _Operation) -> int:
        version = op.version or 0
        return 2 * version + 1 if op.f is Function.GET else 2 * version

    # Real time among ok ops: no op may complete before an earlier group's op began.
    ordered = sorted(ok_ops, key=group)
    latest_call, latest_op, index = -1, None, 0
    while index < len(ordered):
        current = group(ordered[index])
        end = index
        while end < len(ordered) and group(ordered[end]) == current:
            end += 1
        for op in ordered[index:end]:
            if latest_op is not None and op.ret < latest_call:
                return False, (
                    f"{op.text}\n  completed before this op of an earlier version began:\n"
                    f"  {latest_op.text}"
                )
        for op in ordered[index:end]:
            if op.call > latest_call:
                latest_call, latest_op = op.call, op
        index = end

    # Versions without an ok writer, each to be made by a distinct info write.
    deadline: dict[int, float] = {}
    by_group = sorted(ok_ops, key=group)
    suffix_min: list[float] = [float("inf")] * (len(by_group) + 1)
    for i in range(len(by_group) - 1, -1, -1):
        suffix_min[i] = min(suffix_min[i + 1], by_group[i].ret)
    position = 0
    for version in range(1, top + 1):
        while position < len(by_group) and group(by_group[position]) <= 2 * version:
            position += 1
        deadline[version] = suffix_min[position]  # every op after write v completes later
    empty = [v for v in range(1, top + 1) if v not in writer]
    candidates: dict[int, list[int]] = {}
    for version in empty:
        wanted = seen_value.get(version)
        candidates[version] = [
            i
            for i, op in enumerate(info_writes)
            if op.call < deadline[version]
            and (op.f is Function.PUT or op.expected_version == version - 1)
            and (wanted is None or wanted[0] == op.value)
        ]
    owner: dict[int, int] = {}  # info write index -> version it makes

    def assign(version: int, visited: set[int]) -> bool:
        for i in candidates[version]:
            if i in visited:
                continue
            visited.add(i)
            if i not in owner or assign(owner[i], visited):
                owner[i] = version
                return True
        return False

    for version in empty:
        if not assign(version, set()):
            wanted = seen_value.get(version)
            detail = f" with value {wanted[0]!r} (read by {wanted[1].text})" if wanted else ""
            return False, (
                f"version {version}{detail} was made by no acknowledged write, and no "
                "unknown (info) write invoked in time is left to have made it"
            )
    return True, ""


_ZERO = _Operation(call=-1, ret=-1, must_happen=False, f=Function.PUT, value=None,
                   version=0, expected_version=None, text="the initial state (version 0)")


def check_history(history: list[HistoryEvent], max_states_per_key: int = 20_000) -> Verdict:
    """Is `history` linearizable for a versioned register per key?"""
    explored = 0
    checked: list[str] = []
    unknown: Verdict | None = None
    for key, ops in sorted(operations_by_key(history).items()):
        valid, explanation, states = check_key(ops, max_states_per_key)
        if valid == "unknown" and all(op.version is not None for op in ops if op.must_happen):
            valid, explanation = check_key_by_versions(ops)
        explored += states
        checked.append(key)
        if valid is False:
            return Verdict(False, key, f"key {key!r}: {explanation}", explored, checked)
        if valid == "unknown" and unknown is None:
            unknown = Verdict("unknown", key, f"key {key!r}: {explanation}", explored, checked)
    if unknown is not None:
        return unknown
    return Verdict(True, None, "", explored, checked)
