"""A node's own report of a broken safety property makes the run INVALID (docs/checker.md,
"Nodes report no broken rule"); a diverged committed log is excused when the nemesis took
durable state away from a node.

Two sources. Every input to a node's Raft core passes its shell's RuleWatch
(system/raft/watch.py), which reports a transition Figure 2 of the Raft paper forbids: a
higher term ignored, an entry of an older term committed by counting, a commit past what
an append verified, a leader elected without a majority of its term's votes... Each holds
for one node's transitions whatever any disk lost, so such a report is never excused.

And the store's Raft core notices a follower whose committed log conflicts with its leader's
and repairs it with a snapshot (docs/raft.md). Raft's safety argument rests on stable
storage: with every acknowledged entry kept, committed logs never diverge, so a report is
a broken rule in some node (a leader that overwrote a committed entry, a follower that took
entries from a deposed leader) — and once repaired, no read or write in the history shows
it. When a fault destroyed durable state (a file truncated, bit-flipped or its WAL wiped,
unsynced writes lost in a power cut, a data directory rolled back, a majority restored
from backups) a divergence is the expected outcome the defence exists for: the reports
are then counted, not a violation.

From the history alone: `safety-report` records (nemesis/safety_reports.py: `node`,
`rule`, `text`), and the fault records that say whether durable state was lost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from checker.result import Anomaly, Result
from histories.ops import Op
from histories.read import thaw_object

REPORT = "safety-report"
# Faults that take durable state away from a node (nemesis/faults.py FILE_FAULTS, the power
# cut that loses unsynced writes, the restart on an older copy of the data directory, a
# majority's restart on backups: nemesis/restore_majority.py).
LOSES_DURABLE_STATE = ("truncate", "bitflip", "wipe-wal", "lose-unsynced", "rollback",
                       "restore-majority")
# Reports such a fault excuses: a diverged committed log. The rules the node shell's
# RuleWatch checks (system/raft/watch.py) hold for one node's transitions whatever any disk
# lost, so a report of one of them is never excused.
EXCUSABLE = ("committed-log-diverged",)
# How the Raft core words a node's report about itself (system/raft/core.py
# `committed_log_diverged`); a leader's report names the follower instead.
SELF_DIVERGED = "this node's committed log diverged"


def excused_diverged_nodes(records: Sequence[Op]) -> frozenset[str]:
    """Nodes that reported their own committed log diverged in a run where a fault destroyed
    durable state: until repaired such a node answers from the state it diverged with (it
    cannot know before the leader tells it), and the report is that evidence, excused
    (checker/replicas.py does not count their disagreeing answers again)."""
    events = [r for r in records if r.process == "nemesis"]
    if not any(thaw_object(r.value).get("fault") in LOSES_DURABLE_STATE for r in events):
        return frozenset()
    return frozenset(
        str(value.get("node")) for value in (thaw_object(r.value) for r in events if r.f == REPORT)
        if value.get("rule") in EXCUSABLE
        and str(value.get("text", "")).startswith(SELF_DIVERGED))


def check_safety_reports(records: Sequence[Op]) -> Result:
    started = time.monotonic()
    events = [r for r in records if r.process == "nemesis"]
    reports = [r for r in events if r.f == REPORT]
    lost = sorted({str(thaw_object(r.value).get("fault")) for r in events
                   if thaw_object(r.value).get("fault") in LOSES_DURABLE_STATE})
    counts = {"safety_reports": len(reports)}
    excused = [r for r in reports if lost and thaw_object(r.value).get("rule") in EXCUSABLE]
    anomalies = []
    for record in reports:
        if record in excused:
            continue
        value = thaw_object(record.value)
        why = ("no fault of this run destroyed durable state, so a rule of the protocol "
               "broke in some node") if value.get("rule") in EXCUSABLE else (
               "a rule one node breaks by itself, whatever any disk lost")
        anomalies.append(Anomaly(
            str(value.get("rule") or REPORT), None,
            f"{value.get('node')} reported {value.get('rule')} (history line {record.line}): "
            f"{value.get('text')} — {why}",
            ()))
    note = ""
    if excused:
        note = (f"{len(excused)} report(s) of a diverged log after faults that destroy "
                f"durable state ({', '.join(lost)}): the store's defence at work, not counted")
    return Result("safety-reports", not anomalies, "node reports", time.monotonic() - started,
                  anomalies=tuple(anomalies), counts=counts, note=note)
