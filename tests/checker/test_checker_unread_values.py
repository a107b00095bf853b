"""The versioned-kv model's rule that unknown-outcome puts whose value no read returned
share one placeholder value (checker/models.py, `forget_unread_values`): the verdict never
changes, and the search gets smaller. It used to live in the simulator only; every user of
the checker gets it now."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checker import check_linearizable, models
from histories.ops import Op, OpType
from tests.checker.histgen import Simulation, concurrent_history


class RemembersEveryValue(models.VersionedKv):
    """The model without the rule: every value kept as written."""

    def forget_unread_values(self, operations):  # noqa: ANN001, ANN201
        return list(operations)


def _verdicts(records: list[Op]) -> tuple[object, object]:
    forgetting = check_linearizable(records, models.versioned_kv(), budget_s=30, all_keys=True)
    remembering = check_linearizable(records, RemembersEveryValue(), budget_s=30, all_keys=True)
    return forgetting.valid, remembering.valid


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(concurrent_history(kind="versioned", max_keys=2, max_steps=40), st.randoms())
def test_the_verdict_never_changes(sim: Simulation, rnd) -> None:  # noqa: ANN001
    """On random histories, valid ones and ones made wrong by moving one read's answer to
    another written value or version (so both verdicts occur)."""
    records = list(sim.records)
    gets = [i for i, r in enumerate(records) if r.f == "get" and r.type is OpType.OK]
    written = [r.value for r in records if r.f == "put" and r.type is OpType.INVOKE]
    if gets and rnd.random() < 0.7:
        i = rnd.choice(gets)
        answer = records[i]
        if written and rnd.random() < 0.5:
            records[i] = replace(answer, value=rnd.choice(written))
        else:
            records[i] = replace(answer, version=max(0, (answer.version or 0) + rnd.choice((-1, 1))))
    forgetting, remembering = _verdicts(records)
    assert forgetting == remembering


def _partitioned_writes(unknown: int) -> list[Op]:
    """`unknown` puts of distinct values whose outcome nobody learned (a partition), then a
    read that finds the key at the version all of them together make."""
    records: list[Op] = []

    def add(**fields) -> None:  # noqa: ANN003
        records.append(Op(index=len(records), **fields))

    for p in range(unknown):
        add(process=p, type=OpType.INVOKE, f="put", key="k", value=f"v{p}")
    for p in range(unknown):
        add(process=p, type=OpType.INFO, f="put", key="k", value=f"v{p}")
    add(process=99, type=OpType.INVOKE, f="get", key="k")
    add(process=99, type=OpType.OK, f="get", key="k", value="v0", version=unknown)
    return records


def test_the_search_gets_smaller_with_the_same_verdict() -> None:
    records = _partitioned_writes(9)
    forgetting = check_linearizable(records, models.versioned_kv(), budget_s=60)
    remembering = check_linearizable(records, RemembersEveryValue(), budget_s=60)
    assert forgetting.valid is remembering.valid is True
    small, large = forgetting.keys[0].explored, remembering.keys[0].explored
    assert small * 10 < large, (small, large)


def test_a_value_someone_read_is_kept() -> None:
    """v0 was read: its put keeps its value; the eight others share the placeholder."""
    records = _partitioned_writes(9)
    forgotten = models.versioned_kv().forget_unread_values(_pairs(records))
    values = sorted({op.value for op in forgotten if op.f == "put"})
    assert values == ["<a value no read returned>", "v0"]


def _pairs(records: list[Op]):  # noqa: ANN202
    from histories.pairing import pair_operations

    return pair_operations(records)
