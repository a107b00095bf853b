"""The versioned-kv model (checker/models.py) on what the kv workload's mix does since it
deletes: compare-and-swaps and conditional deletes against right, stale, future and absent
versions, a delete resetting the version to 0, re-creation at version 1, and stale reads
(not checked). Each case is a sequential history, one operation after another, so its
verdict is what the store's rules (docs/kv.md, "Versions and compare-and-swap") say."""

from __future__ import annotations

from typing import Any

import pytest

from checker import check_linearizable, models
from histories.ops import Op, OpType


class _History:
    def __init__(self) -> None:
        self.records: list[Op] = []

    def _add(self, **fields: Any) -> None:
        self.records.append(Op(index=len(self.records), key="k", **fields))

    def put(self, value: str, version: int, expected: int | None = None,
            applied: bool = True) -> _History:
        self._add(process=0, type=OpType.INVOKE, f="put", value=value, expected_version=expected)
        self._add(process=0, type=OpType.OK, f="put", value=value, version=version,
                  applied=applied)
        return self

    def delete(self, version: int, expected: int | None = None,
               applied: bool = True) -> _History:
        self._add(process=0, type=OpType.INVOKE, f="delete", expected_version=expected)
        self._add(process=0, type=OpType.OK, f="delete", version=version, applied=applied)
        return self

    def get(self, value: str | None, version: int, consistency: str = "linearizable"
            ) -> _History:
        self._add(process=1, type=OpType.INVOKE, f="get", consistency=consistency)
        self._add(process=1, type=OpType.OK, f="get", value=value, version=version)
        return self

    def valid(self) -> bool | None:
        return check_linearizable(self.records, models.versioned_kv(), budget_s=10).valid


def _h() -> _History:
    return _History()


CASES = {
    # Absent keys: never written, or deleted.
    "cas expecting 0 creates an absent key at v1": (_h().put("a", 1, expected=0), True),
    "cas expecting a version of an absent key cannot apply": (
        _h().put("a", 1, expected=2), False),
    "that cas refused, the key absent, is right": (
        _h().put("a", 0, expected=2, applied=False), True),
    "a refusal reporting a version the absent key does not have is wrong": (
        _h().put("a", 3, expected=2, applied=False), False),
    "cas on a deleted key with its old version cannot apply": (
        _h().put("a", 1).put("b", 2).delete(2).put("c", 3, expected=2), False),
    "the same cas refused at version 0 is right": (
        _h().put("a", 1).put("b", 2).delete(2).put("c", 0, expected=2, applied=False), True),
    # A key that exists.
    "cas expecting 0 (absent) on an existing key cannot apply": (
        _h().put("a", 1).put("b", 2, expected=0), False),
    "refused at the key's version is right": (
        _h().put("a", 1).put("b", 1, expected=0, applied=False), True),
    "cas with the right version applies": (_h().put("a", 1).put("b", 2, expected=1), True),
    "cas with a stale version cannot apply": (
        _h().put("a", 1).put("b", 2).put("c", 3, expected=1), False),
    "cas with a future version cannot apply": (
        _h().put("a", 1).put("b", 2, expected=4), False),
    "a stale cas refused at the current version is right": (
        _h().put("a", 1).put("b", 2).put("c", 2, expected=1, applied=False), True),
    "a refusal of the right version is wrong": (
        _h().put("a", 1).put("b", 1, expected=1, applied=False), False),
    # Delete resets the version to 0; re-creation starts at 1.
    "a read after a delete finds the key absent": (_h().put("a", 1).delete(1).get(None, 0), True),
    "a read after a delete that finds the old value is wrong": (
        _h().put("a", 1).delete(1).get("a", 1), False),
    "a delete reports the version it removed": (_h().put("a", 1).put("b", 2).delete(2), True),
    "a delete reporting another version is wrong": (_h().put("a", 1).put("b", 2).delete(1), False),
    "re-created after a delete at v1": (_h().put("a", 1).put("b", 2).delete(2).put("c", 1), True),
    "re-created continuing from the deleted version is wrong": (
        _h().put("a", 1).put("b", 2).delete(2).put("c", 3), False),
    "the ABA case the store documents: v1 of the re-created key matches": (
        _h().put("a", 1).delete(1).put("b", 1).put("c", 2, expected=1), True),
    "a plain delete of an absent key reports 0": (_h().delete(0).get(None, 0), True),
    # Conditional deletes.
    "a conditional delete with the right version applies": (
        _h().put("a", 1).delete(1, expected=1).get(None, 0), True),
    "a conditional delete with a stale version cannot apply": (
        _h().put("a", 1).put("b", 2).delete(2, expected=1), False),
    "that delete refused at the current version is right": (
        _h().put("a", 1).put("b", 2).delete(2, expected=1, applied=False).get("b", 2), True),
    "a conditional delete expecting 0 on an existing key cannot apply": (
        _h().put("a", 1).delete(1, expected=0), False),
    "expecting 0 on an absent key applies and changes nothing": (
        _h().delete(0, expected=0).put("a", 1, expected=0), True),
    "a conditional delete expecting a version of an absent key cannot apply": (
        _h().delete(0, expected=3), False),
    # Stale reads promise no recency: not checked for linearizability.
    "a stale read of the deleted value is not checked": (
        _h().put("a", 1).delete(1).get("a", 1, consistency="stale"), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_versioned_kv_model_on_the_mix(name: str) -> None:
    history, expected = CASES[name]
    assert history.valid() is expected, name
