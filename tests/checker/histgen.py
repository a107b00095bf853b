"""Random concurrent histories that are linearizable by construction, and planted anomalies.

A simulated store holds the true state of every key. Processes invoke operations; at some
later step each in-flight operation takes effect atomically on the true state (its
linearization point) and later completes with what the state said. Some completions are
`info` (the client never learned the outcome): such an operation may take effect before the
info, after it (a "zombie" applied later), or never. A process whose operation ended in info
is retired and replaced by a fresh process id, as in Jepsen. Every written value is fresh,
so planted anomalies at the end are invalid whatever the zombies do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from histories.ops import Op, OpType


@dataclass
class _Pending:
    process: int
    f: str
    key: Any
    value: Any
    expected_version: int | None = None
    applied: bool = False
    result: dict[str, Any] = field(default_factory=dict)


class Simulation:
    """Builds a history record by record. `kind` is "register" (read/write/cas, init 0) or
    "versioned" (get/put/delete with versions)."""

    def __init__(self, kind: str, keys: list[Any]) -> None:
        self.kind = kind
        self.keys = keys
        self.state: dict[Any, Any] = {k: (0 if kind == "register" else (None, 0)) for k in keys}
        self.records: list[Op] = []
        self.in_flight: dict[int, _Pending] = {}
        self.zombies: list[_Pending] = []
        self.idle: list[int] = []
        self.next_process = 0
        self.next_value = 1
        self.values_seen: dict[Any, list[Any]] = {k: [0] for k in keys}

    def fresh_value(self) -> int:
        self.next_value += 1
        return self.next_value * 10

    def new_process(self) -> int:
        self.next_process += 1
        return self.next_process - 1

    def record(self, process: int, kind: OpType, f: str, key: Any, value: Any, **fields: Any) -> None:
        if self.kind == "register" and len(self.keys) == 1:
            key = None
        self.records.append(
            Op(index=len(self.records), process=process, type=kind, f=f, key=key, value=value, **fields)
        )

    # --- actions ---------------------------------------------------------------------

    def invoke(self, process: int, f: str, key: Any, value: Any, expected_version: int | None = None) -> None:
        fields = {} if expected_version is None else {"expected_version": expected_version}
        self.record(process, OpType.INVOKE, f, key, value, **fields)
        self.in_flight[process] = _Pending(process, f, key, value, expected_version)

    def apply(self, op: _Pending) -> None:
        """The operation's linearization point: it acts on the true state now."""
        op.applied = True
        s = self.state[op.key]
        if self.kind == "register":
            if op.f == "read":
                op.result = {"value": s}
            elif op.f == "write":
                self.state[op.key] = op.value
            else:
                old, new = op.value
                if s == old:
                    self.state[op.key] = new
                    op.result = {"matched": True}
                else:
                    op.result = {"matched": False}
            return
        value, version = s
        if op.f == "get":
            op.result = {"value": value, "version": version}
            return
        if op.expected_version is not None and op.expected_version != version:
            op.result = {"mismatch": True, "version": version}
            return
        if op.f == "put":
            self.state[op.key] = (op.value, version + 1)
            op.result = {"version": version + 1}
        else:
            self.state[op.key] = (None, 0)
            op.result = {"version": version}

    def complete(self, process: int, outcome: str) -> None:
        """outcome: "ok" (apply first if needed), "info" (maybe applied, maybe later), or
        "fail" (only if not applied: it then never takes effect)."""
        op = self.in_flight.pop(process)
        if outcome == "info":
            self.record(process, OpType.INFO, op.f, op.key, None)
            if not op.applied:
                self.zombies.append(op)
            return  # the process is retired
        if outcome == "fail":
            assert not op.applied
            self.record(process, OpType.FAIL, op.f, op.key, op.value)
            self.idle.append(process)
            return
        if not op.applied:
            self.apply(op)
        r = op.result
        if self.kind == "register":
            if op.f == "read":
                self.record(process, OpType.OK, "read", op.key, r["value"])
            elif op.f == "cas" and not r["matched"]:
                self.record(process, OpType.FAIL, "cas", op.key, op.value)
            else:
                self.record(process, OpType.OK, op.f, op.key, op.value)
        elif op.f == "get":
            self.record(process, OpType.OK, "get", op.key, r["value"], version=r["version"])
        elif r.get("mismatch"):
            self.record(process, OpType.OK, op.f, op.key, op.value, version=r["version"], applied=False)
        else:
            self.record(process, OpType.OK, op.f, op.key, op.value, version=r["version"], applied=True)
        self.idle.append(process)

    def quiesce(self) -> None:
        for process in sorted(self.in_flight):
            self.complete(process, "ok")

    def sequential(self, process: int, f: str, key: Any, value: Any, **result: Any) -> None:
        """An invoke immediately followed by an ok completion with the given (maybe false)
        answer; used to plant anomalies."""
        self.record(process, OpType.INVOKE, f, key, value)
        answer = result.pop("answer", value)
        self.record(process, OpType.OK, f, key, answer, **result)


@st.composite
def concurrent_history(draw: st.DrawFn, kind: str = "register", max_keys: int = 3, max_steps: int = 60) -> Simulation:
    """A linearizable-by-construction concurrent history, left running (call quiesce())."""
    keys = [f"k{i}" for i in range(draw(st.integers(1, max_keys)))]
    sim = Simulation(kind, keys)
    for _ in range(draw(st.integers(1, 5))):
        sim.idle.append(sim.new_process())
    for _ in range(draw(st.integers(0, max_steps))):
        action = draw(st.sampled_from(["invoke", "invoke", "apply", "complete", "complete", "zombie"]))
        if action == "invoke" and sim.idle:
            process = sim.idle.pop(draw(st.integers(0, len(sim.idle) - 1)))
            key = draw(st.sampled_from(keys))
            if kind == "register":
                f = draw(st.sampled_from(["read", "write", "cas"]))
                if f == "read":
                    value = None
                elif f == "write":
                    value = sim.fresh_value()
                else:
                    seen = sim.values_seen[key]
                    value = (draw(st.sampled_from(seen[-4:])), sim.fresh_value())
                if f != "read":
                    sim.values_seen[key].append(value if f == "write" else value[1])
                sim.invoke(process, f, key, value)
            else:
                f = draw(st.sampled_from(["get", "get", "put", "put", "delete"]))
                expected = None
                if f != "get" and draw(st.booleans()):
                    version = sim.state[key][1]
                    expected = draw(st.sampled_from([version, version, max(0, version - 1), version + 1]))
                value = sim.fresh_value() if f == "put" else None
                sim.invoke(process, f, key, value, expected)
        elif action == "apply":
            waiting = [p for p, op in sim.in_flight.items() if not op.applied]
            if waiting:
                sim.apply(sim.in_flight[draw(st.sampled_from(sorted(waiting)))])
        elif action == "complete" and sim.in_flight:
            process = draw(st.sampled_from(sorted(sim.in_flight)))
            op = sim.in_flight[process]
            choices = ["ok", "ok", "ok", "info"] + ([] if op.applied else ["fail"])
            outcome = draw(st.sampled_from(choices))
            sim.complete(process, outcome)
            if outcome == "info":
                sim.idle.append(sim.new_process())
        elif action == "zombie" and sim.zombies:
            sim.apply(sim.zombies.pop(draw(st.integers(0, len(sim.zombies) - 1))))
    return sim


def hot_key(seed: int, clients: int = 30, operations: int = 20_000, info_rate: float = 0.01,
            plant: str | None = None) -> list[Op]:
    """One register (key None, initial value 0) hammered by `clients` concurrent processes,
    like `../shared/data/longkeys/long-p30-*`: reads, writes and compare-and-swaps of fresh
    values, about `info_rate` of the writes and cas ending `info` (applied before, later or
    never). Linearizable by construction, then (`plant`):

    - "stale-end": every process done, a write of v1, a write of v2, then a read of v1: a
      stale read after everything else (the shared `-stale` keys' shape); "valid-end" the
      same with a read of v2 (its valid twin);
    - "stale-mid": the same three operations halfway, then the traffic goes on.

    Deterministic for a seed (random.Random, not hypothesis: these are too large to shrink)."""
    import random

    rng = random.Random(seed)
    sim = Simulation("register", [None])
    sim.idle.extend(sim.new_process() for _ in range(clients))

    def plant_here(stale: bool) -> None:
        sim.quiesce()
        process = sim.idle[0]
        first, second = sim.fresh_value(), sim.fresh_value()
        sim.sequential(process, "write", None, first)
        sim.sequential(process, "write", None, second)
        sim.state[None] = second
        sim.values_seen[None] += [first, second]
        sim.sequential(process, "read", None, None, answer=first if stale else second)

    planted_mid = False
    while len(sim.records) < 2 * operations:
        if plant == "stale-mid" and not planted_mid and len(sim.records) >= operations:
            plant_here(stale=True)
            planted_mid = True
        roll = rng.random()
        if sim.idle and (roll < 0.5 or not sim.in_flight):
            process = sim.idle.pop(rng.randrange(len(sim.idle)))
            f = rng.choice(("read", "read", "write", "cas"))
            seen = sim.values_seen[None]
            value = (None if f == "read" else sim.fresh_value() if f == "write"
                     else (rng.choice(seen[-3:]), sim.fresh_value()))
            if f != "read":
                seen.append(value if f == "write" else value[1])
            sim.invoke(process, f, None, value)
        elif roll < 0.75:
            waiting = [op for op in sim.in_flight.values() if not op.applied]
            if waiting:
                sim.apply(rng.choice(waiting))
        elif sim.in_flight:
            process = rng.choice(sorted(sim.in_flight))
            op = sim.in_flight[process]
            unknown = op.f != "read" and rng.random() < info_rate
            sim.complete(process, "info" if unknown else "ok")
            if unknown:
                sim.idle.append(sim.new_process())
        if sim.zombies and rng.random() < 0.002:
            sim.apply(sim.zombies.pop(rng.randrange(len(sim.zombies))))
    if plant in ("stale-end", "valid-end"):
        plant_here(stale=plant == "stale-end")
    else:
        sim.quiesce()
    return sim.records
