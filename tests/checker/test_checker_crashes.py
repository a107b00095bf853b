"""nodes-stay-up (checker/crashes.py): a node that exited though nothing stopped it makes the
run INVALID — the store stops itself exactly when it finds a rule broken under it, so the
crash is the evidence no client answer carries."""

from __future__ import annotations

import json
import time
from pathlib import Path

from histories.read import read_history
from histories.write import HistoryWriter
from nemesis import check
from nemesis.report import write_junit, write_report
from nemesis.report.data import load_run, verdict_sentence
from nemesis.store import write_json

CRASH = {"fault": "crash", "phase": "start", "nodes": ["n2"], "node": "n2", "exit_code": 70,
         "reason": "fatal error in the Raft drive loop; stopping the process",
         "description": "n2 exited with code 70 on its own"}
REFUSAL = {"fault": "truncate", "id": 3, "phase": "step", "nodes": ["n2"], "node": "n2",
           "exit_code": 3, "reason": "wal.log: record 7 is cut off at offset 912",
           "description": "n2 refused to start (exit 3)"}


def _run(tmp_path: Path, events: list[tuple[str, dict]]) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "nodes").mkdir(parents=True)
    write_json(run_dir / "test.json", {
        "run_id": "kv-crash-1", "started": "2026-01-01T00:00:01+0000",
        "config": {"platform": "local", "faults": ["kill"], "duration_s": 3.0, "nodes": 3,
                   "workload": "kv", "seed": 1},
        "workload": {"name": "kv", "model": "versioned-kv"}})
    write_json(run_dir / "results.json", {"harness_error": None, "crashed_nodes": [],
                                          "nemesis_errors": []})
    with HistoryWriter(run_dir / "history.jsonl") as h:
        for version in (1, 2, 3):
            i = h.invoke(0, "put", "k", f"v{version}")
            time.sleep(0.001)
            h.complete(i, "ok", f"v{version}", version=version, applied=True, node="n1")
            if version == 2:
                for f, value in events:
                    h.event("nemesis", f, value)
        i = h.invoke(1, "get", "k", None)
        h.complete(i, "ok", "v3", version=3, node="n1")
    return run_dir


def test_a_node_that_exited_on_its_own_makes_the_run_invalid(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, [("node-crashed", CRASH)])
    results = check.check_run(run_dir, budget_s=10)
    assert results["valid"] is False and results["verdict"] == "INVALID"
    # The reads and writes themselves were fine: only the crash says so.
    assert results["linearizable"]["valid"] is True and results["lost_writes"]["valid"] is True
    found = results["nodes_stay_up"]
    assert found["valid"] is False and found["counts"] == {"node_crashes": 1}
    text = found["anomalies"][0]["text"]
    assert "n2 exited on its own with code 70" in text and "drive loop" in text
    lines = check.summary_lines(results)
    assert any(line.startswith("nodes stay up: INVALID") for line in lines), lines
    assert check.exit_code(results["valid"]) == check.EXIT_INVALID
    first = check.first_violation_s(results, run_dir)
    records = read_history(run_dir / "history.jsonl")
    crash = next(r for r in records if r.f == "node-crashed")
    assert first == (crash.time - records[0].time) / 1e9


def test_the_report_and_junit_name_the_crash(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, [("node-crashed", CRASH)])
    check.check_run(run_dir, budget_s=10)
    sentence = verdict_sentence(load_run(run_dir))
    assert sentence.startswith("INVALID: a node exited on its own: n2 exited"), sentence
    write_report(run_dir)
    junit = write_junit(run_dir, tmp_path / "junit.xml").read_text()
    assert 'name="nodes stay up"' in junit and "<failure" in junit


def test_a_refusal_after_a_disk_fault_and_no_crash_are_valid(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, [("node-refused", REFUSAL)])
    results = check.check_run(run_dir, budget_s=10)
    assert results["valid"] is True and results["nodes_stay_up"]["valid"] is True
    stored = json.loads((run_dir / "results.json").read_text())
    assert stored["nodes_stay_up"]["counts"] == {"node_crashes": 0}


def test_the_exit_reason_is_the_nodes_message_and_the_cause_not_its_traceback() -> None:
    from nemesis.platforms.base import exit_line

    logged = json.dumps({
        "level": "critical", "msg": "fatal error in the Raft drive loop; stopping the process",
        "exception": "Traceback (most recent call last):\n  File \"node.py\", line 552\n"
                     "OutOfOrderApply: apply of log index 1695 but applied_index is 1500"})
    assert exit_line("earlier line\n" + logged + "\n\n") == (
        "fatal error in the Raft drive loop; stopping the process: OutOfOrderApply: apply of "
        "log index 1695 but applied_index is 1500")
    refusal = "n2 refuses to start: wal.log: record 7 is cut off at offset 912"
    assert exit_line(refusal) == refusal  # a plain line as it is
    assert len(exit_line("x" * 1000)) == 300
