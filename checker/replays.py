"""Replayed writes: a write sent again with the request id of one already acknowledged must
be answered with the first answer and change nothing (docs/kv.md, "Request ids").

The kv workload records such a write as f `replay` with `replay_of`, the invoke index of
the write it repeats (workloads/kv.py). From the history alone: every replay answered `ok`
must carry its original's outcome — applied or refused on its version, and the same
version. A store that applied it again answers a new version (or applies a compare that
was refused, or refuses one that applied). What a replay did to the key is the
linearizability check's part: its model takes a replay as changing nothing
(checker/models.py), so a replay that did change the key contradicts the reads after it.

A replay whose original is not in the history, or was not acknowledged, cannot be judged:
it is counted (`unjudged`), never a violation. A `fail` replay changed nothing; an `info`
one is left to the linearizability check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from checker.result import Anomaly, Result
from histories.ops import Operation, OpType

REPLAY = "replay"


def _outcome(op: Operation) -> tuple[bool, int | None]:
    return (op.applied is not False, op.version)


def _describe(op: Operation) -> str:
    applied, version = _outcome(op)
    return f"applied at v{version}" if applied else f"refused (the key was at v{version})"


def check_replays(operations: Sequence[Operation]) -> Result:
    started = time.monotonic()
    by_call = {op.call: op for op in operations}
    anomalies: list[Anomaly] = []
    judged = unjudged = 0
    for op in operations:
        if op.f != REPLAY or op.type is not OpType.OK:
            continue
        extra = dict(op.invoke.extra)
        original = by_call.get(extra.get("replay_of"))  # type: ignore[arg-type]
        if original is None or original.type is not OpType.OK or original.f == REPLAY:
            unjudged += 1
            continue
        judged += 1
        if _outcome(op) == _outcome(original):
            continue
        kind = "replay-applied-again" if op.applied is not False else "replay-answered-differently"
        anomalies.append(Anomaly(
            kind, op.key,
            f"{extra.get('replayed', 'write')} of {op.key!r} with request id "
            f"{extra.get('request_id')!r} was {_describe(original)} (history line "
            f"{original.line}); sent again with the same request id it was "
            f"{_describe(op)} (line {op.line}): a retried request must get its first "
            f"answer and change nothing",
            (original, op)))
    valid = not anomalies
    return Result("replays", valid, "request ids", time.monotonic() - started,
                  anomalies=tuple(anomalies),
                  counts={"replays_judged": judged, "replays_unjudged": unjudged,
                          "replays_answered_differently": len(anomalies)})

