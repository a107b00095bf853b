"""Nodes that stopped on their own: a run is INVALID when a node of the system under test
exited without the nemesis stopping it (docs/checker.md, "Nodes stay up").

Why it is a safety verdict and not a warning: the store stops itself (exit 70) exactly when
it finds a rule broken underneath it — a state machine asked to apply a non-consecutive
index, a storage call that failed, an invariant of its core. A bug that its own defences
turn into a crash never reaches a client's answer, so the history of reads and writes
shows nothing; the crash is the evidence. Jepsen's `log-file-pattern` checker (a panic in
a node's log fails the test) and etcd's robustness tests (a member that exits fails the
run) judge it the same way.

From the history alone: the harness records `node-crashed` (process `nemesis`) when a node
it did not stop is found exited — during the run, at a restart the nemesis made, or in the
end-of-run sweep — with `exit_code` and `reason` (the last line the node printed). A node
that refused its data after a disk fault is `node-refused`: an expected outcome the nemesis
repairs (docs/nemesis.md), never counted here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from checker.result import Anomaly, Result
from histories.ops import Op
from histories.read import thaw_object

CRASHED = "node-crashed"


def crash_records(records: Sequence[Op]) -> list[Op]:
    return [r for r in records if r.process == "nemesis" and r.f == CRASHED]


def check_crashes(records: Sequence[Op]) -> Result:
    started = time.monotonic()
    anomalies = []
    for record in crash_records(records):
        value = thaw_object(record.value)
        node = value.get("node") or ", ".join(value.get("nodes") or ["a node"])
        code = value.get("exit_code")
        reason = value.get("reason") or "no last line"
        anomalies.append(Anomaly(
            CRASHED, None,
            f"{node} exited on its own with code {code} (history line {record.line}): "
            f"{reason}. A node stops itself when it finds a rule broken under it (its "
            f"state machine, its storage, its core); its log says which",
            ()))
    return Result("nodes-stay-up", not anomalies, "crashes", time.monotonic() - started,
                  anomalies=tuple(anomalies), counts={"node_crashes": len(anomalies)})
