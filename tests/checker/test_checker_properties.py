"""Property tests: histories valid by construction pass, planted anomalies are caught, and the
pruned search agrees with a brute-force search on small random histories.

The generator (histgen.py) simulates concurrent clients over a true register per key,
including `info` operations that take effect before, after or never, and many keys.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checker.linearizability as linearizability
from checker import check_linearizable, models
from checker.models import ILLEGAL
from histories.ops import Op, Operation, OpType
from histories.pairing import pair_operations
from tests.checker.histgen import Simulation, concurrent_history

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _model(sim: Simulation):
    return models.cas_register(0) if sim.kind == "register" else models.versioned_kv()


@SETTINGS
@given(concurrent_history(kind="register", max_keys=12, max_steps=120))
def test_register_histories_valid_by_construction_are_linearizable(sim: Simulation) -> None:
    if sim.in_flight and len(sim.records) % 2:
        sim.quiesce()  # half of them end with operations still in flight (never completed)
    result = check_linearizable(sim.records, _model(sim), budget_s=30, all_keys=True)
    assert result.valid is True, [k.counterexample.text() for k in result.keys if k.counterexample]


@SETTINGS
@given(concurrent_history(kind="versioned", max_keys=4))
def test_versioned_histories_valid_by_construction_are_linearizable(sim: Simulation) -> None:
    result = check_linearizable(sim.records, _model(sim), budget_s=30, all_keys=True)
    assert result.valid is True, [k.counterexample.text() for k in result.keys if k.counterexample]


def _plant_register(sim: Simulation, anomaly: str) -> object:
    sim.quiesce()
    key = sim.keys[0] if len(sim.keys) > 1 else None
    sim_key = sim.keys[0]
    p, q = sim.new_process(), sim.new_process()
    a, b, c = sim.fresh_value(), sim.fresh_value(), sim.fresh_value()
    sim.sequential(p, "write", sim_key, a)
    if anomaly == "stale-read":
        sim.sequential(q, "write", sim_key, b)
        sim.sequential(p, "read", sim_key, None, answer=a)  # b was acknowledged: a is stale
    elif anomaly == "lost-write":
        sim.sequential(q, "write", sim_key, b)
        sim.sequential(p, "cas", sim_key, (a, c))  # succeeds from a: the write of b was lost
    else:  # double-applied cas
        sim.sequential(p, "cas", sim_key, (a, b))
        sim.sequential(q, "write", sim_key, a)
        sim.sequential(p, "read", sim_key, None, answer=b)  # the cas took effect a second time
    return key


@SETTINGS
@given(
    concurrent_history(kind="register", max_keys=4),
    st.sampled_from(["stale-read", "lost-write", "double-cas"]),
)
def test_register_planted_anomalies_are_invalid(sim: Simulation, anomaly: str) -> None:
    key = _plant_register(sim, anomaly)
    result = check_linearizable(sim.records, _model(sim), budget_s=30)
    assert result.valid is False
    (counterexample,) = result.counterexamples
    assert counterexample.key == key


@SETTINGS
@given(
    concurrent_history(kind="versioned", max_keys=4),
    st.sampled_from(["stale-read", "lost-write", "double-put", "double-cas"]),
)
def test_versioned_planted_anomalies_are_invalid(sim: Simulation, anomaly: str) -> None:
    sim.quiesce()
    key = "planted"  # a fresh key: no pending operation of the random part can touch it
    p, q = sim.new_process(), sim.new_process()
    sim.sequential(p, "put", key, "a", version=1, applied=True)
    if anomaly == "stale-read":
        sim.sequential(q, "put", key, "b", version=2, applied=True)
        sim.sequential(p, "get", key, None, answer="a", version=1)
    elif anomaly == "lost-write":
        sim.sequential(q, "put", key, "b", version=2, applied=True)
        # a compare-and-swap from version 1 succeeds: the acknowledged put of b was lost
        _cas_put(sim, p, key, "c", expected_version=1, version=2)
    elif anomaly == "double-put":
        sim.sequential(q, "get", key, None, answer="a", version=2)  # the put applied twice
    else:
        _cas_put(sim, q, key, "b", expected_version=1, version=2)
        sim.sequential(p, "get", key, None, answer="b", version=3)  # the cas applied twice
    result = check_linearizable(sim.records, _model(sim), budget_s=30, all_keys=True)
    assert result.valid is False
    assert [c.key for c in result.counterexamples] == [key]


def _cas_put(sim: Simulation, process: int, key: str, value: str, *, expected_version: int, version: int) -> None:
    n = len(sim.records)
    sim.records.append(Op(index=n, process=process, type=OpType.INVOKE, f="put", key=key, value=value, expected_version=expected_version))
    sim.records.append(Op(index=n + 1, process=process, type=OpType.OK, f="put", key=key, value=value, version=version, applied=True))


# --- the pruned search against a brute-force one --------------------------------------------


def _brute_force(operations: list[Operation], model) -> bool:
    """Plain recursion over every minimal operation, no memo, no pruning (small inputs only)."""
    steps = {op.id: model.prepare(op) for op in operations}
    ops = [op for op in operations if steps[op.id] is not None]

    def search(remaining: list[Operation], state) -> bool:
        if all(op.ret is None for op in remaining):
            return True
        first_return = min(op.ret for op in remaining if op.ret is not None)
        for op in remaining:
            if op.call < first_return:
                new = steps[op.id].apply(state)
                if new is not ILLEGAL and search([o for o in remaining if o is not op], new):
                    return True
        return False

    return search(ops, model.initial_state())


@st.composite
def small_random_history(draw: st.DrawFn) -> list[Op]:
    """Arbitrary (usually not linearizable) single-key cas-register histories of <= 7 ops."""
    n = draw(st.integers(1, 7))
    records: list[Op] = []
    events = []
    for process in range(n):
        f = draw(st.sampled_from(["read", "write", "cas"]))
        value = None if f == "read" else draw(st.integers(0, 2)) if f == "write" else (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
        outcome = draw(st.sampled_from(["ok", "ok", "info", "info", "fail", "pending"]))
        result = draw(st.integers(0, 2)) if f == "read" else value
        start, length = draw(st.integers(0, 20)), draw(st.integers(0, 8))
        events.append((start * 2, 0, process, OpType.INVOKE, f, value))
        if outcome != "pending":
            events.append((start * 2 + 1 + 2 * length, 1, process, OpType(outcome), f, result if outcome == "ok" else value))
    events.sort()
    for _, _, process, kind, f, value in events:
        records.append(Op(index=len(records), process=process, type=kind, f=f, value=value))
    return records


@settings(max_examples=1500, deadline=None)
@given(small_random_history())
def test_search_agrees_with_brute_force(records: list[Op]) -> None:
    operations = pair_operations(records)
    model = models.cas_register(0)
    assert check_linearizable(operations, model).valid is _brute_force(operations, model)


@settings(max_examples=600, deadline=None)
@given(small_random_history())
def test_search_agrees_with_brute_force_on_the_etcd_model(records: list[Op]) -> None:
    # etcd reads a failed cas as "the compare did not match": a read-only step.
    operations = pair_operations(records)
    model = models.etcd()
    assert check_linearizable(operations, model).valid is _brute_force(operations, model)


def test_brute_force_comparison_catches_an_unsound_pruning(monkeypatch) -> None:
    """The comparison above can fail: a search that treats every step as read-only (greedy
    for writes too) disagrees with brute force on some small history."""
    original = linearizability._Search.__init__

    def greedy_everywhere(self, ops, steps, init):
        original(self, ops, steps, init)
        self.read_only = [True] * len(ops)

    monkeypatch.setattr(linearizability._Search, "__init__", greedy_everywhere)
    model = models.cas_register(0)
    found = False
    for values in itertools.permutations([1, 2]):
        # two concurrent writes, then a read of the first: valid only if the second goes first.
        records = [
            Op(index=0, process=0, type=OpType.INVOKE, f="write", value=values[0]),
            Op(index=1, process=1, type=OpType.INVOKE, f="write", value=values[1]),
            Op(index=2, process=0, type=OpType.OK, f="write", value=values[0]),
            Op(index=3, process=1, type=OpType.OK, f="write", value=values[1]),
            Op(index=4, process=2, type=OpType.INVOKE, f="read"),
            Op(index=5, process=2, type=OpType.OK, f="read", value=values[0]),
        ]
        operations = pair_operations(records)
        if check_linearizable(operations, model).valid is not _brute_force(operations, model):
            found = True
    assert found
