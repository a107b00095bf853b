"""Stale reads: how stale they were (`stale_reads`), and whether what they returned ever
existed (`check_stale_read_states`).

`stale_reads` counts reads served without the ReadIndex barrier that returned a version
older than one already acknowledged before the read began. Not a safety check — a stale
read promises no recency — but what a person choosing `consistency="stale"` wants to see:
how often it lagged and by how many versions.

`check_stale_read_states` is a safety check: a stale read promises no recency, but it does
promise a state the key really had. The kv workload writes unique values, so the value a
stale read returns names the one put that wrote it; that put must have been invoked
before the read ended and, if it was answered, at the version the read returns (a value
no put wrote, or the right value at another version, is a replica that applied something
the log does not say: a write applied twice, a diverged node, a read served from the wrong
key). Absent (version 0) is always a state the key had. Puts whose outcome is unknown
match any version.
Versioned histories only (our store). Versions restart after a delete, so a read is
compared only with writes no delete can have come after: writes invoked after every
delete that may have taken effect before the read completed (a read with such a delete
still open is not counted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from checker.models import _hashable
from checker.result import Anomaly, Result
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


def check_stale_read_states(operations: Sequence[Operation]) -> Result:
    """Every stale read returned a (value, version) some put produced (see the module doc)."""
    started = time.monotonic()
    writers: dict[tuple[Any, Any], list[Operation]] = {}
    for op in operations:
        if op.f == "put" and op.type is not OpType.FAIL and not (
                op.type is OpType.OK and op.applied is False):
            writers.setdefault((op.key, _hashable(op.value)), []).append(op)
    anomalies: list[Anomaly] = []
    checked = 0
    for op in operations:
        if op.f != "get" or op.consistency != "stale" or op.type is not OpType.OK:
            continue
        if not op.version or op.result is None:
            continue  # absent: the state every key starts in
        checked += 1
        ended = op.ret if op.ret is not None else op.call
        puts = [w for w in writers.get((op.key, _hashable(op.result)), []) if w.call < ended]
        if not puts:
            anomalies.append(Anomaly(
                "read-of-unwritten-value", op.key,
                f"a stale read of {op.key!r} (line {op.line}) returned {op.result!r} at "
                f"v{op.version}, a value no put of the key had sent by then", (op,)))
        elif all(w.type is OpType.OK for w in puts) and op.version not in {w.version for w in puts}:
            put = puts[0]
            anomalies.append(Anomaly(
                "read-of-unwritten-version", op.key,
                f"a stale read of {op.key!r} (line {op.line}) returned {op.result!r} at "
                f"v{op.version}, but the put that wrote that value was answered at "
                f"v{put.version} (line {put.line}): the node holds a state the key never "
                f"had (a write applied again, or a replica that diverged)", (put, op)))
    return Result("stale-read-states", not anomalies, "versioned-kv",
                  time.monotonic() - started, anomalies=tuple(anomalies),
                  counts={"stale_reads_checked": checked, "unwritten_states": len(anomalies)})

