"""Cutting a key at isolated blind writes (checker/windows.py): where the cuts are, and that
the 30-client keys with a stale read planted at the end — which the whole-key search cannot
decide — are decided, with their valid twins, within the default budgets.

The budgets here are generous CPU seconds (no test may depend on spare CPU); how long the
keys take is benchmarks/checker_bench.py's business."""

from __future__ import annotations

import pytest

from checker import check_linearizable, models
from checker.windows import isolated_blind_writes, windows
from histories.ops import Op, OpType
from histories.pairing import pair_operations
from tests.checker.histgen import hot_key


def _ops(spec: list[tuple[int, OpType, str, object]]):  # noqa: ANN202
    records = [Op(index=i, process=p, type=t, f=f, value=v) for i, (p, t, f, v) in enumerate(spec)]
    operations = pair_operations(records)
    model = models.etcd(0)
    return operations, [model.prepare(op) for op in operations]


INV, OK = OpType.INVOKE, OpType.OK


def test_only_a_blind_write_that_nothing_completed_overlaps_cuts() -> None:
    operations, steps = _ops([
        (0, INV, "write", 1), (0, OK, "write", 1),   # 0: isolated, blind: a cut
        (1, INV, "write", 2), (2, INV, "read", None), (1, OK, "write", 2), (2, OK, "read", 2),  # overlap
        (3, INV, "cas", (2, 3)), (3, OK, "cas", (2, 3)),  # isolated but not blind: no cut
        (4, INV, "write", 9),  # never completes: overlaps everything after it, cuts nothing
        (5, INV, "write", 4), (5, OK, "write", 4),   # 5: isolated, blind
        (6, INV, "read", None), (6, OK, "read", 4),
    ])
    assert isolated_blind_writes(operations, steps) == [0, 5]
    # window 0 is empty (the key starts with a cut): two windows, each opening with its write
    assert windows(operations, steps) == [[0, 1, 2, 3], [5, 6]]


def test_a_stale_read_in_a_window_is_found_whatever_came_before() -> None:
    operations, _ = _ops([
        (0, INV, "write", 1), (0, OK, "write", 1),
        (1, INV, "write", 2), (1, OK, "write", 2),
        (2, INV, "read", None), (2, OK, "read", 1),  # stale: 2 was written after 1
    ])
    result = check_linearizable(operations, models.etcd(0))
    assert result.valid is False
    assert result.counterexamples[0].blocking.f == "read"


def test_windows_that_need_the_same_unknown_write_do_not_make_it_valid() -> None:
    # Both reads of 7 need the one write of 7 whose outcome is unknown: each window alone is
    # linearizable with it, the key is not (it cannot take effect twice).
    operations, _ = _ops([
        (9, INV, "write", 7),  # unknown outcome
        (0, INV, "write", 1), (0, OK, "write", 1),
        (1, INV, "read", None), (1, OK, "read", 7),
        (0, INV, "write", 2), (0, OK, "write", 2),
        (1, INV, "read", None), (1, OK, "read", 7),
    ])
    assert check_linearizable(operations, models.etcd(0)).valid is False
    # ... and with a second unknown write of 7 it is linearizable.
    operations, _ = _ops([
        (9, INV, "write", 7), (8, INV, "write", 7),
        (0, INV, "write", 1), (0, OK, "write", 1),
        (1, INV, "read", None), (1, OK, "read", 7),
        (0, INV, "write", 2), (0, OK, "write", 2),
        (1, INV, "read", None), (1, OK, "read", 7),
    ])
    assert check_linearizable(operations, models.etcd(0)).valid is True


@pytest.mark.parametrize("seed", [2501, 2502])
def test_a_stale_read_planted_in_a_30_client_key_is_found_and_its_twin_is_valid(seed: int) -> None:
    model = models.etcd(0)
    stale = check_linearizable(hot_key(seed, clients=30, operations=20_000, plant="stale-end"), model,
                               budget_s=600)
    assert stale.valid is False, stale.note
    (cx,) = stale.counterexamples
    assert cx.blocking.f == "read" and cx.start is not None and cx.start.f == "write"
    twin = check_linearizable(hot_key(seed, clients=30, operations=20_000, plant="valid-end"), model,
                              budget_s=600)
    assert twin.valid is True, twin.note
    middle = check_linearizable(hot_key(seed, clients=30, operations=20_000, plant="stale-mid"), model,
                                budget_s=600)
    assert middle.valid is False, middle.note
