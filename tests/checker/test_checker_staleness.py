"""checker/staleness.py on keys with deletes: versions restart after a delete, so a stale
read is compared only with writes that came after every delete that may have preceded it
(the kv workload's mix deletes on every key; the checker used to skip such keys)."""

from __future__ import annotations

from typing import Any

from checker.staleness import check_stale_read_states, stale_reads
from histories.ops import Op, OpType
from histories.pairing import pair_operations


def _history(*steps: tuple[str, dict[str, Any]]) -> list[Op]:
    """Sequential operations, one process each (invoke then ok); ("open-delete", {}) is a
    delete invoked and never completed."""
    records: list[Op] = []

    def add(**fields: Any) -> None:
        records.append(Op(index=len(records), key="k", **fields))

    for p, (f, fields) in enumerate(steps):
        if f == "open-delete":
            add(process=p, type=OpType.INVOKE, f="delete")
            continue
        consistency = fields.pop("consistency", None)
        add(process=p, type=OpType.INVOKE, f=f, consistency=consistency,
            value=fields.get("value") if f == "put" else None)
        add(process=p, type=OpType.OK, f=f, **fields)
    return records


def _stats(*steps: tuple[str, dict[str, Any]]) -> dict[str, int]:
    return stale_reads(pair_operations(_history(*steps)))


def _put(value: str, version: int) -> tuple[str, dict[str, Any]]:
    return "put", {"value": value, "version": version, "applied": True}


def _stale_get(value: str | None, version: int) -> tuple[str, dict[str, Any]]:
    return "get", {"value": value, "version": version, "consistency": "stale"}


def test_a_stale_read_behind_an_acknowledged_write_lags() -> None:
    assert _stats(_put("a", 1), _put("b", 2), _stale_get("a", 1)) == {
        "stale_reads": 1, "lagging": 1, "max_versions_behind": 1}


def test_after_a_delete_only_the_writes_since_count() -> None:
    recreated = (_put("a", 1), _put("b", 2), ("delete", {"version": 2, "applied": True}),
                 _put("c", 1))
    assert _stats(*recreated, _stale_get("c", 1)) == {
        "stale_reads": 1, "lagging": 0, "max_versions_behind": 0}
    assert _stats(*recreated, _stale_get(None, 0)) == {
        "stale_reads": 1, "lagging": 1, "max_versions_behind": 1}


def test_a_refused_delete_changes_nothing() -> None:
    assert _stats(_put("a", 1), _put("b", 2), ("delete", {"version": 2, "applied": False}),
                  _stale_get("a", 1))["lagging"] == 1


def test_a_read_after_a_delete_that_never_completed_is_not_counted() -> None:
    assert _stats(_put("a", 1), _put("b", 2), ("open-delete", {}), _stale_get(None, 0)) == {
        "stale_reads": 0, "lagging": 0, "max_versions_behind": 0}


def _states(*steps: tuple[str, dict[str, Any]]) -> Any:
    return check_stale_read_states(pair_operations(_history(*steps)))


def test_a_stale_read_of_a_state_some_put_produced_is_valid_however_old() -> None:
    result = _states(_put("a", 1), _put("b", 2), _stale_get("a", 1), ("delete", {"version": 2}),
                     _stale_get(None, 0))
    assert result.valid is True and result.counts["stale_reads_checked"] == 1


def test_a_stale_read_of_a_version_its_value_never_had_is_invalid() -> None:
    """A replica that applied a write twice (or diverged) holds 'a' at v2: no put made that."""
    result = _states(_put("a", 1), _stale_get("a", 2))
    assert result.valid is False
    (anomaly,) = result.anomalies
    assert anomaly.kind == "read-of-unwritten-version" and "answered at v1" in anomaly.text


def test_a_stale_read_of_a_value_nobody_wrote_is_invalid() -> None:
    result = _states(_put("a", 1), _stale_get("z", 1))
    assert [a.kind for a in result.anomalies] == ["read-of-unwritten-value"]


def test_a_put_with_an_unknown_outcome_may_have_produced_any_version() -> None:
    records = _history(_stale_get("a", 7))
    # a put of "a" invoked first, never answered (info): the read may have seen it applied
    records = [Op(index=0, process=9, type=OpType.INVOKE, f="put", key="k", value="a"),
               *[Op(**{**r.__dict__, "index": r.index + 1}) for r in records]]
    assert check_stale_read_states(pair_operations(records)).valid is True
