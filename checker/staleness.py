"""How stale were the stale reads? Counts reads served without the ReadIndex barrier that
returned a version older than one already acknowledged before the read began.

Not a safety check — a stale read promises no recency — but what a person choosing
`consistency="stale"` wants to see: how often it lagged and by how many versions.
Versioned histories only (our store). Versions restart after a delete, so a read is
compared only with writes no delete can have come after: writes invoked after every
delete that may have taken effect before the read completed (a read with such a delete
still open is not counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from histories.ops import Operation, OpType


def _may_have_deleted(op: Operation) -> bool:
    return (op.f == "delete" and op.type is not OpType.FAIL
            and not (op.type is OpType.OK and op.applied is False))


def stale_reads(operations: Sequence[Operation]) -> dict[str, Any]:
    by_key: dict[Any, list[Operation]] = {}
    for op in operations:
        by_key.setdefault(op.key, []).append(op)
    total = lagging = worst = 0
    for ops in by_key.values():
        writes = [op for op in ops
                  if op.f == "put" and op.type is OpType.OK and op.applied is not False
                  and op.ret is not None and op.version is not None]
        deletes = [op for op in ops if _may_have_deleted(op)]
        for op in ops:
            if op.f != "get" or op.consistency != "stale" or op.type is not OpType.OK:
                continue
            if dict(op.invoke.extra).get("phase") == "replica":
                continue  # the end-of-run replica reads (checker/replicas.py), not the mix's
            # Deletes that may have taken effect before this read ended: a write counts
            # only if it was invoked after all of them had completed.
            before = [d for d in deletes if op.ret is None or d.call < op.ret]
            if any(d.ret is None for d in before):
                continue
            after = max((d.ret for d in before), default=-1)  # type: ignore[type-var]
            total += 1
            newest = max((w.version for w in writes  # type: ignore[misc]
                          if w.call > after and w.ret < op.call), default=0)  # type: ignore[operator]
            behind = newest - (op.version or 0)
            if behind > 0:
                lagging += 1
                worst = max(worst, behind)
    return {"stale_reads": total, "lagging": lagging, "max_versions_behind": worst}
