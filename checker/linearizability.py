"""Linearizability checking: Wing & Gong / Lowe search, memoized, split per key.

Theory of operation (Lowe, "Testing for linearizability", 2017; Porcupine's checker):
the operations of one key become entries of a doubly linked list in real-time order, a
*call* entry at the invoke and a *return* entry at the completion. The calls before the
first return form the *window*: exactly the operations that may be linearized next. The
search linearizes a window operation (steps the model, removes its entries from the list:
"lift"), and when the first entry of the list is a return of an operation it could not place,
it backtracks ("unlift"). A configuration is (set of linearized operations, model state);
one already explored is never explored again (the memo), which is what makes the search
practical. P-compositionality (Herlihy & Wing): a history is linearizable iff each key's
sub-history is, so keys are checked separately.

Operations whose outcome is unknown (`info`, or never completed) have no return entry: they
may be linearized at any point after their invoke or never. The search succeeds as soon as
no return entry is left, leaving any unlinearized `info` operation out ("never").

Cheap, sound pruning (each keeps the verdict exact):
- order (only which candidate is tried first; every one is tried before giving up): a legal
  read-only operation first; then, just in time (Lowe), the window's operations legal only in
  the current state (`Step.requires`: a cas from it, which may never be legal again), the
  operation of the window's first return, the operations (pending `info` ones included) that
  leave the state it requires, a few levels back; then the other completed operations; then
  the `info` operations, which can always wait;
- read-only operations (Step.read_only) legal in the current state are linearized greedily,
  before anything else: moving such an operation earlier within its window never breaks a
  linearization, so if the configuration after it fails the current one fails too, and no
  other candidate needs trying;
- interchangeable `info` operations (same process-independent input, both pending) are only
  linearized in invoke order (symmetry);
- an `info` operation whose step leaves the state unchanged is not placed (never taking effect
  is the same), and a blind write (Step.blind) is not placed right after an `info` operation:
  the configuration without that `info` operation reaches the same state with more options
  left, and it is explored from the parent configuration anyway; an `info` blind write is
  placed only where a pending operation could observe the state it leaves;
- when the model says which state every state-changing operation leaves (`requires` and
  `blind` hints), a configuration is dropped as soon as some completed operation requires a
  state that no operation left unlinearized and invoked before that one returns can leave
  (leaving a state for good that a read still needs; a window operation that can never
  become legal).

Windows (checker/windows.py): a key is first cut at its isolated blind writes and each window
searched alone, the last first; a window with no linearization refutes the key, disjoint
window linearizations prove it, and otherwise the whole key is searched as above.

Budget, per key: CPU seconds (a loaded machine does not change the verdict), a cap on memo
entries and the search's memory, measured (the memo's table and keys, the stack, the
transition tables, the distinct states); when one is reached the key's verdict is "unknown"
with a note saying which, never a guess. A memo entry is (state, completed frontier, completed
operations linearized above it, info operations linearized): exact, and its size depends on
the concurrency, not on the history's length.

Must never mutate the operations it is given or keep memo tables after a key is decided.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from checker.models import ANY_STATE, ILLEGAL, Model, Unpartitioned, versioned_kv
from checker.result import (
    UNKNOWN,
    Candidate,
    Counterexample,
    KeyResult,
    Placed,
    Result,
    Verdict,
    combine,
)
from checker.windows import windows
from histories.ops import Op, Operation, OpType
from histories.pairing import pair_operations

DEFAULT_BUDGET_S = 60.0
DEFAULT_MAX_MEMO_ENTRIES = 2_000_000  # per key; about 200 MB of memo with its transitions
DEFAULT_MAX_MEMORY_MB = 512  # per key: memo, transition table and distinct model states
_INT_BYTES = sys.getsizeof(2**40)  # a transition's target id, when not a cached small int


def _measure_transition_bytes() -> int:
    """What one entry of a transition table costs here, measured on a table of 1,000."""
    table = {sid: sid + 2**40 for sid in range(1000)}
    return sys.getsizeof(table) // 1000 + _INT_BYTES


_TRANSITION_BYTES = _measure_transition_bytes()
_FRAME_BYTES = sys.getsizeof((0,) * 11) + 4 * _INT_BYTES + sys.getsizeof([])  # a frame, its ints, its list
_CHECK_EVERY = 1024
_CX_MEMO_ENTRIES = 5_000  # the whole key's search for a refuted window's counterexample
_SOURCES_SHOWN = 5  # counterexample: ops that write the value the blocking op needs
_PRODUCER_DEPTH = 3
_NOTHING_TRIED: frozenset[int] = frozenset()  # how far back _candidates follows "leaves the state that op requires"  # search iterations between budget checks


def check_versioned_kv(history: Sequence[Op], *, budget_s: float = DEFAULT_BUDGET_S) -> Result:
    """Every key of `history` against the versioned-kv model: the simulator's end-of-run
    check. The simulator (system/sim) never imports the checker; whoever runs it to a
    verdict hands it this function (`Simulation.check_linearizable(check_versioned_kv)`)."""
    return check_linearizable(history, versioned_kv(), budget_s=budget_s, all_keys=True)


def check_linearizable(
    history: Sequence[Op] | Sequence[Operation],
    model: Model,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    all_keys: bool = False,
    partition: bool = True,
    max_memo_entries: int = DEFAULT_MAX_MEMO_ENTRIES,
    max_memory_mb: float = DEFAULT_MAX_MEMORY_MB,
    wall_budget_s: float | None = None,
) -> Result:
    """Is the history linearizable with respect to `model`?

    `history` is a list of records (paired here) or of paired Operations. Each key gets its
    own `budget_s` CPU seconds, `max_memo_entries` memo entries and about `max_memory_mb` of
    search memory (memo, transitions, distinct states); past any of them it is "unknown". By default the check stops
    at the first invalid key, as Porcupine does; `all_keys=True` checks every key.
    `partition=False` checks the whole history as one object (slow; for stress tests).
    `wall_budget_s` bounds the whole check in wall-clock seconds (all keys together; None:
    no bound): for a harness that must finish by a time, whatever the machine's load. When
    it runs out the key being searched and every key not reached are "unknown".
    """
    # A budget at or below zero is spent at the first check (callers use it to force
    # "unknown"); the command line refuses negative ones. NaN would never compare as spent.
    for name, value in (
        ("budget_s", budget_s),
        ("max_memo_entries", max_memo_entries),
        ("max_memory_mb", max_memory_mb),
        ("wall_budget_s", 0.0 if wall_budget_s is None else wall_budget_s),
    ):
        if value != value:
            raise ValueError(f"{name} must be a number, got {value!r}")
    started = time.perf_counter()
    wall_deadline = None if wall_budget_s is None else time.monotonic() + wall_budget_s
    operations = _operations(history)
    if not partition:
        keys_seen: dict[Hashable, None] = {}
        for op in operations:
            keys_seen.setdefault(model.partition_key(op), None)
        model = Unpartitioned(model, list(keys_seen))
    groups: dict[Hashable, list[Operation]] = {}
    for op in operations:
        groups.setdefault(model.partition_key(op), []).append(op)
    # Small keys first: the cheap ones decide quickly and an invalid one stops the check.
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), repr(item[0])))
    results: list[KeyResult] = []
    skipped = 0
    wall_skipped = 0
    for position, (key, ops) in enumerate(ordered):
        if wall_deadline is not None and position and time.monotonic() > wall_deadline:
            wall_skipped = len(ordered) - position
            break
        key_result = check_key(
            key,
            ops,
            model,
            budget_s=budget_s,
            max_memo_entries=max_memo_entries,
            max_memory_mb=max_memory_mb,
            wall_deadline=wall_deadline,
        )
        results.append(key_result)
        if key_result.valid is False and not all_keys:
            skipped = len(ordered) - position - 1
            break
    verdict: Verdict = combine([r.valid for r in results] + ([UNKNOWN] if wall_skipped else []))
    notes = [f"{r.key!r}: {r.note}" for r in results if r.valid == UNKNOWN]
    if wall_skipped:
        notes.append(f"{_wall_note(wall_budget_s)}; {wall_skipped} keys not checked")
    if skipped:
        notes.append(f"stopped at the first invalid key; {skipped} keys not checked (use all_keys)")
    counts = {
        "operations": len(operations),
        "ok": sum(op.type is OpType.OK for op in operations),
        "fail": sum(op.type is OpType.FAIL for op in operations),
        "info": sum(op.type is OpType.INFO for op in operations),
        "keys": len(groups),
        "keys_checked": len(results),
        "keys_valid": sum(r.valid is True for r in results),
        "keys_invalid": sum(r.valid is False for r in results),
        "keys_unknown": sum(r.valid == UNKNOWN for r in results) + wall_skipped,
    }
    return Result(
        checker="linearizable",
        valid=verdict,
        model=model.name,
        seconds=time.perf_counter() - started,
        keys=tuple(results),
        counts=counts,
        note="; ".join(notes),
    )


def _wall_note(wall_budget_s: float | None) -> str:
    return f"wall-clock budget of {wall_budget_s:g} s ran out (--wall-budget-s)"


def _operations(history: Sequence[Op] | Sequence[Operation]) -> list[Operation]:
    if history and isinstance(history[0], Op):
        return pair_operations(history)  # type: ignore[arg-type]
    return list(history)  # type: ignore[arg-type]


@dataclass
class _Outcome:
    valid: Verdict
    explored: int
    note: str
    # the deepest configuration reached, for the counterexample; when valid, the linearization
    best_path: list[int]


def check_key(
    key: Hashable,
    operations: Sequence[Operation],
    model: Model,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    max_memo_entries: int = DEFAULT_MAX_MEMO_ENTRIES,
    max_memory_mb: float = DEFAULT_MAX_MEMORY_MB,
    wall_deadline: float | None = None,
) -> KeyResult:
    """Check one key's operations (already partitioned). `wall_deadline` is a
    time.monotonic() value past which the key is "unknown" (the wall-clock budget)."""
    started = time.perf_counter()
    kept: list[Operation] = []
    steps = []
    for op in model.forget_unread_values(operations):
        step = model.prepare(op)
        if step is not None:
            kept.append(op)
            steps.append(step)
    # The time budget is CPU time of this process: on a loaded machine (CI, shared hosts)
    # the verdict must not depend on how much CPU the others took.
    limits = _Limits(time.process_time() + budget_s, max_memo_entries, max_memory_mb * 2**20, wall_deadline)
    cut = windows(kept, steps)
    decided = _check_windows(key, kept, steps, cut, model, limits, operations) if len(cut) > 1 else None
    explored = 0
    if decided is not None:
        valid, explored, note, counterexample = decided
    if decided is None or valid is None:
        searcher = _Search(kept, steps, model.initial_state())
        outcome = searcher.run(*limits)
        valid, note, counterexample = outcome.valid, outcome.note, None
        explored += outcome.explored
        if outcome.valid is False:
            counterexample = searcher.counterexample(key, model, outcome, operations)
    return KeyResult(
        key=key,
        valid=valid,
        operations=len(operations),
        seconds=time.perf_counter() - started,
        explored=explored,
        note=note,
        counterexample=counterexample,
    )


@dataclass(frozen=True)
class _Limits:
    deadline: float  # time.process_time()
    max_memo_entries: int
    max_memory_bytes: float
    wall_deadline: float | None  # time.monotonic()

    def __iter__(self):  # noqa: ANN204 - unpacks into _Search.run's arguments
        return iter((self.deadline, self.max_memo_entries, self.max_memory_bytes, self.wall_deadline))


def _check_windows(
    key: Hashable,
    ops: list[Operation],
    steps: list[Any],
    cut: list[list[int]],
    model: Model,
    limits: _Limits,
    operations: Sequence[Operation],
) -> tuple[Verdict | None, int, str, Counterexample | None]:
    """Search each window alone (checker/windows.py says why that is exact), the last first:
    a violation near the end is found without exhausting the key before it. Returns (verdict
    or None when the windows cannot decide, configurations explored, note, counterexample)."""
    info_ops = [i for i, op in enumerate(ops) if op.ret is None]
    used: set[int] = set()  # info ops the windows searched so far linearized
    explored = 0
    undecided = ""  # why the windows cannot show validity, if they cannot
    for members in reversed(cut):
        end = max(ops[i].ret for i in members)  # type: ignore[type-var]
        available = [i for i in info_ops if ops[i].call < end]
        free = [i for i in available if i not in used] if not undecided else available
        outcome, searcher, chosen = _search_window(ops, steps, members, free, model, limits)
        explored += outcome.explored
        if outcome.valid is False and len(free) < len(available):
            # Failed without the info ops other windows took: with all of them?
            outcome, searcher, chosen = _search_window(ops, steps, members, available, model, limits)
            explored += outcome.explored
            if outcome.valid is True:
                undecided = undecided or "windows share info ops"
                continue
        if outcome.valid is False:  # no linearization even with every info op: refuted
            # The whole key's deepest prefix explains best (from the initial state), when a
            # short search finds it; else the window's, from its blind write on.
            # (It needs a configuration per operation before the window: only a short key can.)
            if len(ops) <= _CX_MEMO_ENTRIES // 2:
                whole = _Search(ops, steps, model.initial_state())
                full = whole.run(limits.deadline, _CX_MEMO_ENTRIES, limits.max_memory_bytes, limits.wall_deadline)
                explored += full.explored
                if full.valid is False:
                    return False, explored, "", whole.counterexample(key, model, full, operations)
            counterexample = searcher.counterexample(key, model, outcome, operations)
            start = ops[members[0]] if members is not cut[0] else None
            sources = _sources(ops, steps, searcher, counterexample.blocking, model.initial_state())
            return False, explored, "", replace(counterexample, start=start, sources=sources)
        if outcome.valid == UNKNOWN:
            undecided = outcome.note
        elif not undecided:
            used.update(chosen[j] for j in outcome.best_path if ops[chosen[j]].ret is None)
    if not undecided:
        return True, explored, "", None
    if undecided == "windows share info ops":
        return None, explored, "", None  # the whole key's search decides
    return UNKNOWN, explored, undecided, None


def _sources(
    ops: list[Operation], steps: list[Any], window: _Search, blocking: Operation, init: Any
) -> tuple[Operation, ...]:
    """The latest operations of the whole key (not only the window) that leave the state the
    blocking operation requires and were invoked before it returned (model hints)."""
    needed = window.requires[window.ops.index(blocking)]
    if needed < 0:
        return ()
    state = window.states[needed]
    found = []
    for op, step in zip(ops, steps, strict=True):
        if op.call > blocking.ret or step.read_only:  # type: ignore[operator]
            continue
        if step.blind:
            new = step.apply(init)
        elif step.requires is not ANY_STATE:
            new = step.apply(step.requires)
        else:
            continue
        if new == state and new is not ILLEGAL:
            found.append(op)
    return tuple(found[-_SOURCES_SHOWN:])


def _search_window(
    ops: list[Operation],
    steps: list[Any],
    members: list[int],
    info: list[int],
    model: Model,
    limits: _Limits,
) -> tuple[_Outcome, _Search, list[int]]:
    """One window's search: its completed ops and the given info ops, in call order, from the
    model's initial state (window 0's real one; any other window starts with a blind write,
    which makes the start state irrelevant). Returns the outcome (on success its best_path
    is the linearization found), the search and the window's ops as indexes into `ops`."""
    chosen = sorted(members + info, key=lambda i: ops[i].call)
    searcher = _Search([ops[i] for i in chosen], [steps[i] for i in chosen], model.initial_state())
    return searcher.run(*limits), searcher, chosen


class _Search:
    """The memoized just-in-time linearization search over one key's operations."""

    def __init__(self, ops: list[Operation], steps: list[Any], init: Any) -> None:
        self.ops = ops
        self.steps = steps
        n = len(ops)
        self.n = n
        self.info = [1 if op.ret is None else 0 for op in ops]
        self.read_only = [s.read_only for s in steps]
        self.blind = [s.blind for s in steps]
        self.apply = [s.apply for s in steps]
        # Twins: an info op may be linearized only after the previous pending info op with
        # the same input, which was invoked earlier (symmetry; see the module docstring).
        self.twin = [-1] * n
        last_with_input: dict[Any, int] = {}
        for i, op in enumerate(ops):
            if self.info[i]:
                signature = (op.f, _hashable(op.key), _hashable(op.value), op.expected_version)
                self.twin[i] = last_with_input.get(signature, -1)
                last_with_input[signature] = i
        # Entries: 2i is the call of op i, 2i+1 its return. Two lists share the link arrays:
        # the completed operations' calls and returns (head..tail), and the info operations'
        # calls (info_head..info_tail), so that neither phase of the search walks over the
        # other's entries. `position` is the record index of each call and return.
        events = []
        info_calls = []
        self.position = [0] * (2 * n)
        for i, op in enumerate(ops):
            self.position[2 * i] = op.call
            if op.ret is None:
                info_calls.append((op.call, 2 * i))
            else:
                self.position[2 * i + 1] = op.ret
                events.append((op.call, 2 * i))
                events.append((op.ret, 2 * i + 1))
        events.sort()
        info_calls.sort()
        self.head, self.tail = 2 * n, 2 * n + 1
        self.info_head, self.info_tail = 2 * n + 2, 2 * n + 3
        self.nxt = [0] * (2 * n + 4)
        self.prv = [0] * (2 * n + 4)
        for first, entries, last in (
            (self.head, events, self.tail),
            (self.info_head, info_calls, self.info_tail),
        ):
            chain = [first] + [e for _, e in entries] + [last]
            for a, b in zip(chain, chain[1:], strict=False):
                self.nxt[a] = b
                self.prv[b] = a
        self.states: list[Any] = [init]
        self.state_ids: dict[Any, int] = {init: 0}
        self.transitions: list[dict[int, int]] = [{} for _ in range(n)]
        self.transition_count = 0
        self.transition_bytes = 0
        self.state_bytes = sys.getsizeof(init)
        # The memo key's parts: completed operations are numbered in call order (`completed`)
        # and info operations get one bit each (`info_bit`); see run().
        self.completed = [0] * n
        self.info_bit = [0] * n
        count_completed = count_info = 0
        for i in range(n):
            if self.info[i]:
                self.info_bit[i] = 1 << count_info
                count_info += 1
            else:
                self.completed[i] = count_completed
                count_completed += 1
        # Model hints (Step.requires, Step.blind): the one state an operation needs, and the
        # state a blind operation leaves. An unknown-outcome blind write is placed only where
        # something could observe the state it leaves (see run()).
        self.requires = [-1 if st.requires is ANY_STATE else self._intern(st.requires) for st in steps]
        # The state an op leaves whenever it is legal: a blind op's, or the one it leaves from
        # the one state it requires (a cas from x to y leaves y).
        self.produces = [-1] * n
        for i, st in enumerate(steps):
            if st.blind:
                self.produces[i] = self._intern(st.apply(init))
            elif self.requires[i] >= 0 and not st.read_only:  # a read leaves nothing new
                new = st.apply(self.states[self.requires[i]])
                if new is not ILLEGAL:
                    self.produces[i] = self._intern(new)
        self.info_requires = {self.requires[i] for i in range(n) if self.info[i] and self.requires[i] >= 0}
        self.info_producers: dict[int, list[int]] = {}  # state -> info ops leaving it, in call order
        # Every state-changing op leaves a known state: then an op that requires a state no
        # remaining op can leave is doomed, and so is the configuration (see _doomed).
        self.producers_known = all(self.read_only[i] or self.produces[i] >= 0 for i in range(n))
        self.producers_of: dict[int, list[int]] = {}  # state -> ops leaving it, in call order
        for i in range(n):
            if self.produces[i] >= 0:
                self.producers_of.setdefault(self.produces[i], []).append(i)
        self.completed_consumers: dict[int, list[int]] = {}  # state -> completed ops legal only there
        for i in range(n):
            if not self.info[i] and self.requires[i] >= 0:
                self.completed_consumers.setdefault(self.requires[i], []).append(i)
        self.info_consumers: dict[int, list[int]] = {}  # state -> info ops legal only there
        for i in range(n):
            if self.info[i] and self.produces[i] >= 0:
                self.info_producers.setdefault(self.produces[i], []).append(i)
            if self.info[i] and self.requires[i] >= 0 and not self.read_only[i]:
                self.info_consumers.setdefault(self.requires[i], []).append(i)
        # Without a hint on every unknown-outcome non-blind operation, the filter is off.
        self.filter_info_writes = not any(
            self.info[i] and not self.blind[i] and self.requires[i] < 0 for i in range(n)
        )

    def _intern(self, state: Any) -> int:
        sid = self.state_ids.get(state)
        if sid is None:
            sid = len(self.states)
            self.states.append(state)
            self.state_ids[state] = sid
            self.state_bytes += _size(state)
        return sid

    def _transition(self, i: int, sid: int) -> int:
        new = self.apply[i](self.states[sid])
        result = -1 if new is ILLEGAL else self._intern(new)
        self.transitions[i][sid] = result
        self.transition_bytes += _TRANSITION_BYTES
        self.transition_count += 1
        return result

    def memory_bytes(self, memo: set, memo_bytes: int, stack: list) -> int:
        """What the search holds, measured: the memo's table and keys, the stack, the
        transition tables, and the distinct states with their interning table."""
        return (
            sys.getsizeof(memo)
            + memo_bytes
            + sys.getsizeof(stack)
            + self.transition_bytes
            + self.state_bytes
            + sys.getsizeof(self.states)
            + sys.getsizeof(self.state_ids)
        )

    def run(
        self, deadline: float, max_memo_entries: int, max_memory_bytes: float, wall_deadline: float | None = None
    ) -> _Outcome:
        nxt, prv, position = self.nxt, self.prv, self.position
        head, tail, info_head, info_tail = self.head, self.tail, self.info_head, self.info_tail
        info, read_only, twin, blind = self.info, self.read_only, self.twin, self.blind
        completed, info_bit = self.completed, self.info_bit
        produces, info_requires = self.produces, self.info_requires
        filter_info_writes = self.filter_info_writes
        transitions = self.transitions
        transition = self._transition
        candidates_of = self._candidates
        doomed = self._doomed
        loses = self._loses
        producers_known = self.producers_known
        # The memo holds configurations already explored, as (state id, frontier, above,
        # info): every completed operation numbered below `frontier` is linearized, `above`
        # has bit k set when completed operation frontier + k is, and `info` has the bits of
        # the linearized info operations. Exact (no hashing of the set, so no collisions) and
        # small: `above` spans only the operations concurrent with the frontier's, so an
        # entry does not grow with the history's length (only `info`, by one bit per info
        # operation).
        memo: set[tuple[int, int, int, int]] = set()
        memo_bytes = 0
        memo_counted = 0
        stack_bytes = 0  # the frames and the candidate lists they hold
        # (op, state id, forced, window limit, frontier, above, info, phase, candidates, next
        # candidate, info ops tried in phase 0): the configuration before the op
        stack: list[tuple] = []
        sid = 0
        frontier = 0
        above = 0
        linearized_info = 0
        # Phases of trying the candidates of one configuration: 2, a legal read-only op of the
        # window (placed greedily, no alternatives); 0, the window's other operations in the
        # order _candidates gives (just in time: the first returning one, then what makes it
        # legal, then the rest); 1, the info ops invoked before the window's first return.
        phase = 2
        limit = 0  # record index of the window's first return
        entry = nxt[head]
        candidates: list[int] = []
        next_candidate = 0
        info_tried: set[int] | frozenset[int] = _NOTHING_TRIED  # info ops phase 0 tried already
        window_requires: set[int] | None = None
        window_unhinted: list[int] = []
        best_depth = -1
        placed_completed = 0
        record_best = False
        best_length = 0
        best_path: list[int] = []
        low_water = 0  # best_path == the ops of stack[:low_water]
        countdown = _CHECK_EVERY

        while True:
            countdown -= 1
            if countdown == 0:
                countdown = _CHECK_EVERY
                if time.process_time() > deadline:
                    return _Outcome(UNKNOWN, len(memo), "time budget ran out", best_path)
                if wall_deadline is not None and time.monotonic() > wall_deadline:
                    return _Outcome(UNKNOWN, len(memo), "wall-clock budget ran out (--wall-budget-s)", best_path)
                if len(memo) > max_memo_entries:
                    return _Outcome(
                        UNKNOWN,
                        len(memo),
                        f"memo table reached {max_memo_entries:,} entries (memory budget)",
                        best_path,
                    )
                if memo:
                    # The newest key stands for those added since the last check.
                    memo_bytes += (len(memo) - memo_counted) * _key_bytes((sid, frontier, above, linearized_info))
                    memo_counted = len(memo)
                if self.memory_bytes(memo, memo_bytes, stack) + stack_bytes > max_memory_bytes:
                    return _Outcome(
                        UNKNOWN,
                        len(memo),
                        f"search memory reached {max_memory_bytes / 2**20:,.0f} MB (memory budget)",
                        best_path,
                    )
            backtrack = False
            if phase == 2:
                if entry == tail:  # no completed operation left: the rest may never happen
                    return _Outcome(True, len(memo), "", [item[0] for item in stack])
                if entry & 1:  # the window's first return: now the operations that change state
                    if producers_known and doomed(sid, frontier, above, linearized_info):
                        phase = 1
                        entry = info_tail
                        continue  # backtracks: no candidate can help
                    phase = 0
                    candidates, limit, info_tried = candidates_of(entry, sid, linearized_info, stack)
                    next_candidate = 0
                    continue
                i = entry >> 1
                if not read_only[i]:
                    entry = nxt[entry]
                    continue
            elif phase == 0:
                if next_candidate == len(candidates):
                    phase = 1
                    entry = nxt[info_head]
                    window_requires = None  # computed when a blind info op first needs it
                    continue
                i = candidates[next_candidate]
                next_candidate += 1
                entry = 2 * i
            else:
                if entry == info_tail or position[entry] > limit:
                    backtrack = True  # every candidate of this configuration was tried
                else:
                    i = entry >> 1
                    if (
                        (twin[i] >= 0 and not linearized_info & info_bit[twin[i]])
                        or (blind[i] and stack and info[stack[-1][0]])
                        or i in info_tried
                    ):
                        entry = nxt[entry]
                        continue
                    if filter_info_writes and blind[i]:
                        # The next operation after it must observe its state (a blind one
                        # would erase it): skip it when nothing pending could.
                        v = produces[i]
                        if window_requires is None:
                            window_requires, window_unhinted = self._window_needs()
                        if v not in window_requires and v not in info_requires and not any(
                            transition(q, v) >= 0 if (t := transitions[q].get(v)) is None else t >= 0
                            for q in window_unhinted
                        ):
                            entry = nxt[entry]
                            continue
            if not backtrack:
                new_sid = transitions[i].get(sid)
                if new_sid is None:
                    new_sid = transition(i, sid)
                if new_sid < 0 or (info[i] and new_sid == sid):
                    if phase != 0:
                        entry = nxt[entry]
                    continue
                if info[i]:
                    new_frontier, new_above, new_info = frontier, above, linearized_info | info_bit[i]
                else:
                    new_info = linearized_info
                    new_above = above | (1 << (completed[i] - frontier))
                    new_frontier = frontier
                    while new_above & 1:  # the frontier moves past the linearized prefix
                        new_above >>= 1
                        new_frontier += 1
                memo_key = (new_sid, new_frontier, new_above, new_info)
                forced = read_only[i]
                if memo_key in memo:
                    if not forced:
                        if phase == 1:
                            entry = nxt[entry]
                        continue
                    backtrack = True  # dominated by a configuration that already failed
                elif producers_known and new_sid != sid and loses(sid, new_frontier, new_above, new_info):
                    memo.add(memo_key)  # leaves a state some op still needs, for good: failed
                    if not info[i] and placed_completed + 1 > best_depth:
                        # Still a linearizable prefix, and the counterexample wants the longest.
                        best_depth = placed_completed + 1
                        del best_path[low_water:]
                        best_path.extend(item[0] for item in stack[low_water:])
                        best_path.append(i)
                        low_water = len(stack)
                        record_best = False
                    if phase == 1:
                        entry = nxt[entry]
                    continue
                else:
                    memo.add(memo_key)
                    # The frame keeps this configuration's candidates, so that resuming it
                    # after a failure costs nothing (recomputing them made wide windows slow).
                    stack.append(
                        (i, sid, forced, limit, frontier, above, linearized_info, phase, candidates, next_candidate, info_tried)
                    )
                    stack_bytes += _FRAME_BYTES + 8 * len(candidates)
                    sid, frontier, above, linearized_info = new_sid, new_frontier, new_above, new_info
                    # lift: remove the op's call (and return) from its list
                    a = prv[entry]
                    b = nxt[entry]
                    nxt[a] = b
                    prv[b] = a
                    if not info[i]:
                        r = entry + 1
                        a = prv[r]
                        b = nxt[r]
                        nxt[a] = b
                        prv[b] = a
                        placed_completed += 1
                        # Deepest configuration by completed operations placed: the info
                        # operations on its path are exactly those it needed.
                        if placed_completed > best_depth:
                            best_depth = placed_completed
                            best_length = len(stack)
                            record_best = True  # copied when the search turns back
                    phase = 2
                    entry = nxt[head]
                    continue
            if record_best:
                # The stack only grew since the new best: its first best_length entries
                # are that configuration (later info placements are left out). Only the part
                # below the stack's low-water mark since the last copy changed: copying the
                # whole path each time made long keys quadratic.
                del best_path[low_water:]
                best_path.extend(item[0] for item in stack[low_water:best_length])
                low_water = best_length
                record_best = False
            while True:
                if not stack:
                    return _Outcome(False, len(memo), "", best_path)
                (
                    i, sid, forced, limit, frontier, above, linearized_info, phase,
                    candidates, next_candidate, info_tried,
                ) = stack.pop()
                stack_bytes -= _FRAME_BYTES + 8 * len(candidates)
                if len(stack) < low_water:
                    low_water = len(stack)
                # unlift, in the reverse order of lift
                if not info[i]:
                    placed_completed -= 1
                    r = 2 * i + 1
                    nxt[prv[r]] = r
                    prv[nxt[r]] = r
                c = 2 * i
                nxt[prv[c]] = c
                prv[nxt[c]] = c
                if not forced:
                    break
            # Resume the configuration after op i: its candidates and their position are
            # in the frame (phase 0); phase 1 goes on along the info list.
            if phase == 1:
                entry = nxt[2 * i]
                window_requires = None

    def _doomed(self, sid: int, frontier: int, above: int, linearized_info: int) -> bool:
        """Whether a window op requires a state that nothing can leave before it returns:
        no op left unlinearized that leaves that state was invoked before its return (and
        the state is not the current one). Sound only when every state-changing op's state
        is known (producers_known): then no linearization extends this configuration."""
        nxt, requires, position, completed, info, info_bit = (
            self.nxt, self.requires, self.position, self.completed, self.info, self.info_bit,
        )
        producers_of = self.producers_of
        entry = nxt[self.head]
        while not entry & 1:
            q = entry >> 1
            entry = nxt[entry]
            r = requires[q]
            if r < 0 or r == sid:
                continue
            returned = position[2 * q + 1]
            available = False
            for p in producers_of.get(r, ()):
                if position[2 * p] > returned:
                    break  # invoked after q returned: cannot come before q
                if info[p]:
                    available = not linearized_info & info_bit[p]
                else:
                    c = completed[p] - frontier
                    available = c >= 0 and not (above >> c) & 1
                if available:
                    break
            if not available:
                return True
        return False

    def _loses(self, state: int, frontier: int, above: int, linearized_info: int) -> bool:
        """Whether leaving `state` dooms the configuration: some completed op not yet
        linearized requires it, and no op left unlinearized that leaves it was invoked
        before that op returns. Sound only when producers_known (see _doomed)."""
        completed, position, info, info_bit = self.completed, self.position, self.info, self.info_bit
        producers = self.producers_of.get(state, ())
        for q in self.completed_consumers.get(state, ()):
            c = completed[q] - frontier
            if c < 0 or (above >> c) & 1:
                continue  # linearized already
            returned = position[2 * q + 1]
            available = False
            for p in producers:
                if position[2 * p] > returned:
                    break
                if info[p]:
                    available = not linearized_info & info_bit[p]
                else:
                    d = completed[p] - frontier
                    available = d >= 0 and not (above >> d) & 1
                if available:
                    break
            if not available:
                return True
        return False

    def _window_needs(self) -> tuple[set[int], list[int]]:
        """The states the window's pending state-observing operations require, and those of
        them without a `requires` hint (tested one by one)."""
        nxt, blind, requires = self.nxt, self.blind, self.requires
        needs: set[int] = set()
        unhinted: list[int] = []
        entry = nxt[self.head]
        while not entry & 1:
            i = entry >> 1
            if not blind[i]:
                if requires[i] >= 0:
                    needs.add(requires[i])
                else:
                    unhinted.append(i)
            entry = nxt[entry]
        return needs, unhinted

    def _candidates(
        self, first_return: int, sid: int, linearized_info: int, stack: list
    ) -> tuple[list[int], int, set[int] | frozenset[int]]:
        """Phase 0's candidates, just in time (Lowe), ordered by the model's hints: the
        window's ops legal only in the current state (it may not come back), the op of the
        window's first return, the ops that leave the state it requires (and those that leave
        the states they require, a few levels deep, pending info ops included), then the
        window's other completed ops in call order. Read-only ops are phase 2's; a blind op
        right after an info op is skipped (see the module docstring). The order only decides
        which candidate is tried first: every candidate is tried before giving up. Returns
        them, the window limit and the info ops among them (phase 1 skips those)."""
        nxt, read_only, blind, produces, requires = self.nxt, self.read_only, self.blind, self.produces, self.requires
        after_info = bool(stack) and self.info[stack[-1][0]]
        first = first_return >> 1
        limit = self.position[first_return]
        if not self.producers_known:
            # Without a hint on every state-changing op the order below guesses from half the
            # picture, and measured worse than call order (Porcupine's kv c50-ok: 3x the
            # configurations on one key): the window in call order then, as before.
            plain = []
            entry = nxt[self.head]
            while entry != first_return:
                i = entry >> 1
                entry = nxt[entry]
                if not (read_only[i] or (after_info and blind[i])):
                    plain.append(i)
            return plain, limit, _NOTHING_TRIED
        enabled: list[int] = []
        head: list[int] = []
        window: list[int] = []
        by_product: dict[int, list[int]] = {}
        entry = nxt[self.head]
        while entry != first_return:
            i = entry >> 1
            entry = nxt[entry]
            if read_only[i] or (after_info and blind[i]):
                continue
            if requires[i] == sid:
                enabled.append(i)
            elif i == first:
                head.append(i)
            else:
                window.append(i)
                if produces[i] >= 0:
                    by_product.setdefault(produces[i], []).append(i)
        producers: list[int] = []
        info_tried: set[int] = set()
        position, info_bit, twin, info_producers = self.position, self.info_bit, self.twin, self.info_producers
        for i in self.info_consumers.get(sid, ()):  # pending info ops legal only now
            if position[2 * i] > limit:
                break
            if not linearized_info & info_bit[i] and (twin[i] < 0 or linearized_info & info_bit[twin[i]]):
                enabled.append(i)
                info_tried.add(i)
        wanted = [requires[first]] if requires[first] >= 0 else []
        seen = set(wanted)
        for _ in range(_PRODUCER_DEPTH):
            deeper = []
            for state in wanted:
                found = list(by_product.get(state, ()))
                for i in info_producers.get(state, ()):
                    if position[2 * i] > limit:
                        break
                    if (
                        i not in info_tried
                        and not linearized_info & info_bit[i]
                        and (twin[i] < 0 or linearized_info & info_bit[twin[i]])
                        and not (after_info and blind[i])
                    ):
                        found.append(i)
                        info_tried.add(i)
                for i in found:
                    producers.append(i)
                    r = requires[i]
                    if r >= 0 and r != sid and r not in seen:
                        seen.add(r)
                        deeper.append(r)
            wanted = deeper
            if not wanted:
                break
        if producers:
            chosen = set(producers)
            window = [i for i in window if i not in chosen]
        return enabled + head + producers + window, limit, info_tried

    def _extend_greedily(self, path: list[int]) -> list[int]:
        """The search's cuts stop a doomed configuration early (a read's value overwritten for
        good), so its deepest path may end well before the op that cannot be placed. For the
        explanation, extend it with legal steps only (a legal read-only window op; else the
        first returning op; else a window op that leaves the state that one requires) until
        none applies: still a linearizable prefix, now ending where the history fails."""
        nxt, prv, info = self.nxt, self.prv, self.info
        lifted: list[int] = []

        def step(i: int, sid: int) -> int:
            new_sid = self.transitions[i].get(sid)
            return self._transition(i, sid) if new_sid is None else new_sid

        def lift(i: int) -> None:
            for entry in (2 * i,) if info[i] else (2 * i, 2 * i + 1):
                a, b = prv[entry], nxt[entry]
                nxt[a] = b
                prv[b] = a
            lifted.append(i)

        sid = 0
        for i in path:
            sid = step(i, sid)
            lift(i)
        extended = list(path)
        while True:
            window = []
            entry = nxt[self.head]
            while not entry & 1:
                window.append(entry >> 1)
                entry = nxt[entry]
            if entry == self.tail:
                break
            first = entry >> 1
            needed = self.requires[first]
            chosen = next((i for i in window if self.read_only[i] and step(i, sid) >= 0), None)
            if chosen is None and step(first, sid) >= 0:
                chosen = first
            if chosen is None and needed >= 0:
                chosen = next((i for i in window if self.produces[i] == needed and step(i, sid) >= 0), None)
            if chosen is None:
                break
            sid = step(chosen, sid)
            lift(chosen)
            extended.append(chosen)
        for i in reversed(lifted):  # unlift, in the reverse order of lift
            for entry in (2 * i,) if info[i] else (2 * i + 1, 2 * i):
                nxt[prv[entry]] = entry
                prv[nxt[entry]] = entry
        return extended

    def counterexample(
        self, key: Hashable, model: Model, outcome: _Outcome, all_ops: Sequence[Operation]
    ) -> Counterexample:
        """Rebuild the deepest configuration reached and say what could not be placed."""
        path = self._extend_greedily(outcome.best_path)
        placed = []
        sid = 0
        last_write = None  # the prefix's last op that changed the state
        for i in path:
            before = sid
            sid = self.transitions[i][sid]
            if sid != before:
                last_write = self.ops[i]
            placed.append(
                Placed(
                    op=self.ops[i],
                    description=model.describe_operation(self.ops[i]),
                    state_after=model.describe_state(self.states[sid]),
                )
            )
        done = set(path)
        remaining = [i for i in range(self.n) if i not in done]
        completed = [i for i in remaining if self.ops[i].ret is not None]
        blocking = min(completed, key=lambda i: self.ops[i].ret)  # type: ignore[arg-type, return-value]
        cutoff = self.ops[blocking].ret
        state = self.states[sid]
        candidates = []
        for i in remaining:
            op = self.ops[i]
            if op.call > cutoff:  # type: ignore[operator]
                continue
            new = self.apply[i](state)
            if new is ILLEGAL:
                outcome_text = f"illegal in state {model.describe_state(state)}"
            else:
                outcome_text = f"-> {model.describe_state(new)}, but no order of the rest works from there"
            candidates.append(Candidate(op=op, description=model.describe_operation(op), outcome=outcome_text))
        # Where the value the blocking op needs comes from (model hints; nothing without them).
        needed = self.requires[blocking]
        before_return = [i for i in self.producers_of.get(needed, ()) if needed >= 0 and self.ops[i].call < cutoff]  # type: ignore[operator]
        sources = tuple(self.ops[i] for i in before_return[-_SOURCES_SHOWN:])  # the latest ones
        return Counterexample(
            key=key,
            last_write=last_write,
            sources=sources,
            prefix=tuple(placed),
            state=model.describe_state(state),
            blocking=self.ops[blocking],
            blocking_description=model.describe_operation(self.ops[blocking]),
            candidates=tuple(candidates),
            operations=tuple(all_ops),
        )


def _key_bytes(key: tuple[int, int, int, int]) -> int:
    """A memo key's own bytes: the tuple and its ints (small ints are shared, counted anyway)."""
    return sys.getsizeof(key) + sum(sys.getsizeof(part) for part in key)


def _size(state: Any) -> int:
    size = sys.getsizeof(state)
    if isinstance(state, tuple):
        size += sum(sys.getsizeof(part) for part in state)
    return size


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
