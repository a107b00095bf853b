"""checker/staleness.py on keys with deletes: versions restart after a delete, so a stale
read is compared only with writes that came after every delete that may have preceded it
(the kv workload's mix deletes on every key; the checker used to skip such keys)."""

from __future__ import annotations

from typing import Any

from checker.staleness import stale_reads
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
