"""Node reports of a broken safety property (checker/safety_reports.py,
nemesis/safety_reports.py): a committed log that diverged, repaired by the store's own
defence, leaves no wrong answer; the node's report is the evidence, and it counts unless a
fault destroyed durable state."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from checker.safety_reports import (
    LOSES_DURABLE_STATE,
    check_safety_reports,
    excused_diverged_nodes,
)
from histories.read import read_history
from histories.write import HistoryWriter
from nemesis import check, safety_reports
from nemesis.faults import FILE_FAULTS
from nemesis.store import write_json

DIVERGED = ("this node's committed log diverged from leader n3's at index 696 (term 3 here, "
            "4 at the leader), at or below its commit index 696")


def _log_line(node: str, msg: str, **extra: object) -> str:
    return json.dumps({"ts": "2026-12-06T02:11:06.296+00:00", "level": "error",
                       "logger": "kv.node", "msg": msg, "node": node, **extra})


def test_scan_reads_the_lines_a_node_marks_with_safety_once_each(tmp_path: Path) -> None:
    (tmp_path / "n1.log").write_text("\n".join([
        _log_line("n1", "started"),
        _log_line("n1", DIVERGED, safety="committed-log-diverged"),
        _log_line("n1", DIVERGED, safety="committed-log-diverged"),  # said again: once
        "not json {\"safety\"",
    ]) + "\n")
    (tmp_path / "n2.log").write_text(_log_line("n2", "storage error: EIO") + "\n")
    found = safety_reports.scan(tmp_path)
    assert [(r["node"], r["rule"], r["text"]) for r in found] == [
        ("n1", "committed-log-diverged", DIVERGED)]


def _history(tmp_path: Path, faults: list[str], rule: str = "committed-log-diverged") -> list:
    path = tmp_path / f"history-{'-'.join(faults) or 'none'}-{rule}.jsonl"
    with HistoryWriter(path) as h:
        i = h.invoke(0, "put", "k", "v1")
        h.complete(i, "ok", "v1", version=1, applied=True, node="n1")
        for fault in faults:
            h.event("nemesis", fault, {"fault": fault, "phase": "start", "nodes": ["n2"]})
        safety_reports.record_all([{"node": "n1", "rule": rule,
                                    "text": DIVERGED, "logged_at": None}],
                                  lambda f, v: h.event("nemesis", f, v))
    return read_history(path)


def test_a_report_is_a_violation_unless_a_fault_destroyed_durable_state(tmp_path: Path) -> None:
    found = check_safety_reports(_history(tmp_path, ["kill", "start-partition"]))
    assert found.valid is False and found.counts == {"safety_reports": 1}
    assert "n1 reported committed-log-diverged" in found.anomalies[0].text
    excused = check_safety_reports(_history(tmp_path, ["kill", "lose-unsynced"]))
    assert excused.valid is True and "lose-unsynced" in excused.note
    assert check_safety_reports(_history(tmp_path, [])[:1]).valid is True  # no report


def test_a_rule_watch_report_is_never_excused_by_a_lost_disk(tmp_path: Path) -> None:
    """A rule one node breaks by itself (system/raft/watch.py) is not what a lost disk
    explains: the run is INVALID whatever the faults."""
    found = check_safety_reports(_history(tmp_path, ["lose-unsynced"], "leader-committed-old-term"))
    assert found.valid is False and "whatever any disk lost" in found.anomalies[0].text


def test_the_checker_knows_every_fault_that_destroys_durable_state() -> None:
    # It cannot import the nemesis (a checker reads histories only); the lists must agree.
    assert set(FILE_FAULTS) | {"lose-unsynced", "rollback", "restore-majority"} == set(LOSES_DURABLE_STATE)


def test_a_run_with_a_report_is_invalid_with_the_report_in_its_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json(run_dir / "test.json", {"workload": {"name": "kv", "model": "versioned-kv"}})
    with HistoryWriter(run_dir / "history.jsonl") as h:
        for version in (1, 2):
            i = h.invoke(0, "put", "k", f"v{version}")
            time.sleep(0.001)
            h.complete(i, "ok", f"v{version}", version=version, applied=True, node="n1")
        i = h.invoke(1, "get", "k", None)
        h.complete(i, "ok", "v2", version=2, node="n1")
        safety_reports.record_all([{"node": "n1", "rule": "committed-log-diverged",
                                    "text": DIVERGED, "logged_at": None}],
                                  lambda f, v: h.event("nemesis", f, v))
    results = check.check_run(run_dir, budget_s=10)
    assert results["valid"] is False and results["linearizable"]["valid"] is True
    assert results["safety_reports"]["valid"] is False
    assert any(line.startswith("nodes report no broken rule: INVALID")
               for line in check.summary_lines(results))
    assert check.first_violation_s(results, run_dir) is not None


def test_the_first_violation_is_when_the_node_logged_the_report(tmp_path: Path) -> None:
    """Reports are read from the logs at the end of a real run; `age_s` puts them back."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json(run_dir / "test.json", {"workload": {"name": "kv", "model": "versioned-kv"}})
    clock = iter(range(0, 100 * 10**9, 10 * 10**9))  # 0 s, 10 s, 20 s, ...
    with HistoryWriter(run_dir / "history.jsonl", clock_ns=lambda: next(clock)) as h:
        i = h.invoke(0, "put", "k", "v1")                                    # 0 s
        h.complete(i, "ok", "v1", version=1, applied=True, node="n1")        # 10 s
        i = h.invoke(1, "get", "k", None)                                    # 20 s
        h.complete(i, "ok", "v1", version=1, node="n1")                      # 30 s
        safety_reports.record_all(                                           # 40 s
            [{"node": "n1", "rule": "committed-log-diverged", "text": DIVERGED,
              "logged_at": "2026-12-06T02:11:06.000+00:00"}],
            lambda f, v: h.event("nemesis", f, v),
            now=datetime.fromisoformat("2026-12-06T02:11:31.500+00:00").timestamp())
    results = check.check_run(run_dir, budget_s=10)
    assert results["valid"] is False
    assert check.first_violation_s(results, run_dir) == 14.5  # 40 s less its 25.5 s age


def test_the_nodes_excused_from_replicas_agree_reported_their_own_divergence_after_such_a_fault(
        tmp_path: Path) -> None:
    assert excused_diverged_nodes(_history(tmp_path, ["restore-majority"])) == {"n1"}
    assert excused_diverged_nodes(_history(tmp_path, ["kill"])) == frozenset()
    # A rule of the watch is never an excuse.
    assert excused_diverged_nodes(_history(tmp_path, ["restore-majority"],
                                           "committed-conflict-unnoticed")) == frozenset()
