"""How stale were the stale reads? Counts reads served without the ReadIndex barrier that
returned a version older than one already acknowledged before the read began.

Not a safety check — a stale read promises no recency — but what a person choosing
`consistency="stale"` wants to see: how often it lagged and by how many versions.
Versioned histories only (our store); keys with deletes are skipped (versions restart).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from histories.ops import Operation, OpType


def stale_reads(operations: Sequence[Operation]) -> dict[str, Any]:
    by_key: dict[Any, list[Operation]] = {}
    for op in operations:
        by_key.setdefault(op.key, []).append(op)
    total = lagging = worst = 0
    for ops in by_key.values():
        if any(op.f == "delete" for op in ops):
            continue
        # Acknowledged writes by completion position, with the running maximum version.
        writes = sorted((op.ret, op.version) for op in ops
                        if op.f == "put" and op.type is OpType.OK and op.applied is not False
                        and op.ret is not None and op.version is not None)
        rets = [r for r, _ in writes]
        best, running = [], 0
        for _, version in writes:
            running = max(running, version)
            best.append(running)
        for op in ops:
            if op.f != "get" or op.consistency != "stale" or op.type is not OpType.OK:
                continue
            total += 1
            i = bisect.bisect_left(rets, op.call)
            newest = best[i - 1] if i else 0
            behind = newest - (op.version or 0)
            if behind > 0:
                lagging += 1
                worst = max(worst, behind)
    return {"stale_reads": total, "lagging": lagging, "max_versions_behind": worst}
