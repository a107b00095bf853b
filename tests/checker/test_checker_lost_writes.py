"""Lost-write checker: silent on histories valid by construction, names planted lost writes
and reused versions."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from checker.lost_writes import check_lost_writes
from histories.ops import Op, OpType
from tests.checker.histgen import Simulation, concurrent_history

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(concurrent_history(kind="register", max_keys=3))
def test_no_false_alarm_on_valid_register_histories(sim: Simulation) -> None:
    result = check_lost_writes(sim.records)
    assert result.valid is True, [a.text for a in result.anomalies]


@SETTINGS
@given(concurrent_history(kind="versioned", max_keys=3))
def test_no_false_alarm_on_valid_versioned_histories(sim: Simulation) -> None:
    sim.quiesce()
    result = check_lost_writes(sim.records)
    assert result.valid is True, [a.text for a in result.anomalies]


@SETTINGS
@given(concurrent_history(kind="register", max_keys=3))
def test_register_read_of_an_overwritten_value_is_a_lost_write(sim: Simulation) -> None:
    sim.quiesce()
    key = sim.keys[0]
    p = sim.new_process()
    a, b = sim.fresh_value(), sim.fresh_value()
    sim.sequential(p, "write", key, a)
    sim.sequential(p, "write", key, b)
    sim.sequential(p, "read", key, None, answer=a)
    result = check_lost_writes(sim.records)
    assert result.valid is False
    (anomaly,) = result.anomalies
    assert anomaly.kind == "lost-write" and str(b) in anomaly.text


def _op(records: list[Op], process: int, kind: OpType, f: str, value=None, **fields) -> None:
    records.append(Op(index=len(records), process=process, type=kind, f=f, key="k", value=value, **fields))


def test_versioned_read_below_an_acknowledged_version_is_reported_with_both_versions() -> None:
    records: list[Op] = []
    _op(records, 0, OpType.INVOKE, "put", "a")
    _op(records, 0, OpType.OK, "put", "a", version=1, applied=True)
    _op(records, 0, OpType.INVOKE, "put", "b")
    _op(records, 0, OpType.OK, "put", "b", version=2, applied=True)
    _op(records, 1, OpType.INVOKE, "get")
    _op(records, 1, OpType.OK, "get", "a", version=1)
    result = check_lost_writes(records)
    (anomaly,) = result.anomalies
    assert anomaly.kind == "lost-write"
    assert "version 2" in anomaly.text and "saw version 1" in anomaly.text


def test_stale_reads_and_possible_deletes_are_not_lost_writes() -> None:
    records: list[Op] = []
    _op(records, 0, OpType.INVOKE, "put", "a")
    _op(records, 0, OpType.OK, "put", "a", version=1, applied=True)
    _op(records, 1, OpType.INVOKE, "get", consistency="stale")
    _op(records, 1, OpType.OK, "get", None, version=0)  # stale: allowed to miss the put
    _op(records, 2, OpType.INVOKE, "delete")  # never completed: may have happened
    _op(records, 3, OpType.INVOKE, "get")
    _op(records, 3, OpType.OK, "get", None, version=0)
    assert check_lost_writes(records).valid is True


def test_one_version_with_two_values_is_a_version_reuse() -> None:
    records: list[Op] = []
    _op(records, 0, OpType.INVOKE, "put", "a")
    _op(records, 1, OpType.INVOKE, "put", "b")
    _op(records, 0, OpType.OK, "put", "a", version=1, applied=True)
    _op(records, 1, OpType.OK, "put", "b", version=1, applied=True)
    result = check_lost_writes(records)
    assert [a.kind for a in result.anomalies] == ["version-reuse"]


def test_a_read_that_misses_a_write_seen_later_is_a_stale_read_not_a_lost_write() -> None:
    records: list[Op] = []
    _op(records, 0, OpType.INVOKE, "put", "a")
    _op(records, 0, OpType.OK, "put", "a", version=1, applied=True)
    _op(records, 1, OpType.INVOKE, "get")
    _op(records, 1, OpType.OK, "get", None, version=0)  # misses version 1 ...
    _op(records, 2, OpType.INVOKE, "get")
    _op(records, 2, OpType.OK, "get", "a", version=1)  # ... which a later read sees
    result = check_lost_writes(records)
    assert result.valid is False
    assert [a.kind for a in result.anomalies] == ["stale-read"]
    assert result.counts["stale_reads"] == 1 and result.counts["lost_writes"] == 0
    records = records[:4]  # nothing after the read sees it: lost
    assert [a.kind for a in check_lost_writes(records).anomalies] == ["lost-write"]


def test_unverified_keys_are_those_never_read_after_their_last_acknowledged_write() -> None:
    from checker.lost_writes import unverified_keys

    records: list[Op] = []
    _op(records, 0, OpType.INVOKE, "put", "a")
    _op(records, 0, OpType.OK, "put", "a", version=1, applied=True)
    assert unverified_keys(records) == ["k"]
    _op(records, 1, OpType.INVOKE, "get", consistency="stale")
    _op(records, 1, OpType.OK, "get", "a", version=1)
    assert unverified_keys(records) == ["k"], "a stale read proves nothing"
    _op(records, 2, OpType.INVOKE, "get")
    _op(records, 2, OpType.OK, "get", "a", version=1)
    assert unverified_keys(records) == []
    _op(records, 0, OpType.INVOKE, "delete")
    _op(records, 0, OpType.OK, "delete", None, applied=True, version=0)
    assert unverified_keys(records) == ["k"]
