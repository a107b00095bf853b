"""Check a run folder's history: linearizability and lost writes, results.json, timeline.html.

Used at the end of every run and by `python -m nemesis check RUN_DIR`, so a stored run is
checked exactly as a live one. The verdict comes from the history alone.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tabulate import tabulate

from checker.crashes import check_crashes, crash_records
from checker.linearizability import check_linearizable
from checker.lost_writes import check_lost_writes, unverified_keys
from checker.models import by_name
from checker.replays import check_replays
from checker.replicas import check_replicas
from checker.result import UNKNOWN, Result, Verdict, combine
from checker.safety_reports import REPORT, check_safety_reports, excused_diverged_nodes
from checker.staleness import check_stale_read_states, stale_reads
from checker.timeline import render_html
from histories.ops import Operation
from histories.pairing import pair_operations
from histories.read import read_history_report, thaw_object
from nemesis.store import read_json, write_json

EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN, EXIT_HARNESS = 0, 1, 2, 3
WORDS = {True: "VALID", False: "INVALID", UNKNOWN: "UNKNOWN"}


def exit_code(verdict: Verdict) -> int:
    if verdict is True:
        return EXIT_VALID
    return EXIT_INVALID if verdict is False else EXIT_UNKNOWN


def op_table(operations: list[Operation]) -> dict[str, dict[str, int]]:
    """f -> {ok, fail, info} over client operations (cas = put with expected_version)."""
    table: dict[str, dict[str, int]] = {}
    for op in operations:
        f = "cas" if op.f == "put" and op.expected_version is not None else op.f
        row = table.setdefault(f, {"ok": 0, "fail": 0, "info": 0})
        row[op.type.value] += 1
    return table


def check_run(run_dir: Path, *, budget_s: float = 60.0, model_name: str | None = None,
              wall_budget_s: float | None = None) -> dict[str, Any]:
    """Check `run_dir/history.jsonl`; write results.json (keeping the run's own fields) and,
    when invalid, timeline.html. Returns the results. `budget_s` is CPU seconds per key,
    `wall_budget_s` wall-clock seconds for the linearizability check as a whole."""
    started = time.monotonic()
    history_path = run_dir / "history.jsonl"
    read = read_history_report(history_path, allow_truncated_tail=True)
    operations = pair_operations(read.records)
    test = read_json(run_dir / "test.json") if (run_dir / "test.json").exists() else {}
    model_name = model_name or test.get("workload", {}).get("model") or "versioned-kv"
    if model_name == "trainer":
        return _check_trainer_run(run_dir, test, started, read.records, operations)
    model = by_name(model_name, None)
    lin: Result = check_linearizable(operations, model, budget_s=budget_s, all_keys=True,
                                     wall_budget_s=wall_budget_s)
    lost: Result = check_lost_writes(operations)
    unread = unverified_keys(operations)
    if unread and lost.valid is True:
        # Nothing after the last acknowledged write of these keys read them back (the final
        # reads failed, or the run was cut off before them): a write lost at the end would
        # not show, so "no acknowledged write was lost" is not established.
        shown = ", ".join(repr(k) for k in unread[:5]) + (" ..." if len(unread) > 5 else "")
        lost = replace(lost, valid=UNKNOWN, note="; ".join(filter(None, [lost.note, (
            f"{len(unread)} key(s) with an acknowledged write were never read after it "
            f"({shown}): whether those writes survived is unknown")])))
    agree: Result = check_replicas(operations, excused=excused_diverged_nodes(read.records))
    replays: Result = check_replays(operations)
    states: Result = check_stale_read_states(operations)
    crashes: Result = check_crashes(read.records)
    reports: Result = check_safety_reports(read.records)
    verdict = combine([lin.valid, lost.valid, agree.valid, replays.valid, states.valid,
                       crashes.valid, reports.valid])
    if not operations:
        # A run that recorded nothing proves nothing: never "valid".
        verdict = UNKNOWN
    results_path = run_dir / "results.json"
    results: dict[str, Any] = read_json(results_path) if results_path.exists() else {}
    results.update({
        "valid": verdict,
        "verdict": WORDS[verdict],
        "operations": op_table(operations),
        "linearizable": lin.to_json(),
        "lost_writes": lost.to_json(),
        "replicas_agree": agree.to_json(),
        "replays": replays.to_json(),
        "stale_read_states": states.to_json(),
        "nodes_stay_up": crashes.to_json(),
        "safety_reports": reports.to_json(),
        "stale_reads": stale_reads(operations),
        "unverified_keys": len(unread),
        "history_truncated": read.dropped_truncated_tail,
        "check_seconds": round(time.monotonic() - started, 3),
    })
    if lin.valid is False:
        (run_dir / "timeline.html").write_text(
            render_html(lin, operations, model, title=str(run_dir)), encoding="utf-8")
        results["timeline"] = "timeline.html"
    write_json(results_path, results)
    results["_lin"] = lin
    results["_lost"] = lost
    results["_agree"] = agree
    results["_replays"] = replays
    results["_states"] = states
    results["_crashes"] = crashes
    results["_reports"] = reports
    return results


def _check_trainer_run(run_dir: Path, test: dict[str, Any], started: float,
                       records: list, operations: list[Operation]) -> dict[str, Any]:
    """The trainer workload's history: checker/trainer.py's properties (no linearizability:
    the head key is written only through CAS by the trainer; its checker is the trainer's)."""
    from checker.trainer import PROPERTIES, check_trainer, reference_digest

    config = (test.get("workload") or {}).get("config")
    found = check_trainer(records, reference_digest(config) if config else None)
    crashes = check_crashes(records)  # the store's nodes under the trainer
    reports = check_safety_reports(records)
    verdict = combine([found["trainer_summary"]["valid"], crashes.valid, reports.valid])
    if not operations:
        verdict = UNKNOWN
    results_path = run_dir / "results.json"
    results: dict[str, Any] = read_json(results_path) if results_path.exists() else {}
    results.update(found)
    results.update({"valid": verdict, "verdict": WORDS[verdict], "operations": op_table(operations),
                    "check_seconds": round(time.monotonic() - started, 3),
                    "properties": {p: found[f"trainer-{p}"]["valid"] for p in PROPERTIES},
                    "nodes_stay_up": crashes.to_json(),
                    "safety_reports": reports.to_json()})
    write_json(results_path, results)
    results["_crashes"] = crashes
    results["_reports"] = reports
    return results


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The table and the evidence a person reads after a run."""
    lines = []
    if results.get("harness_error"):
        lines.append(f"the run did not finish ({results['harness_error']}): the history ends "
                     f"where it stopped, so the end-of-run reads may be missing")
    if results.get("history_truncated"):
        lines.append("the history's last line was cut off mid-write and was left out "
                     "(the harness died while writing it)")
    rows = [[f, r["ok"], r["fail"], r["info"]] for f, r in sorted(results["operations"].items())]
    if rows:
        lines.append(tabulate(rows, headers=["op", "ok", "fail", "info"], tablefmt="simple"))
    if "trainer_summary" in results:
        counts = results["trainer_summary"]["counts"]
        lines.append(f"trainer: {counts['resumes']} resumes, {counts['lease_acquisitions']} lease "
                     f"acquisitions, {counts['skipped_worker_steps']} skipped worker steps, final "
                     f"step {counts['final_step']}")
        for name, valid in results["properties"].items():
            entry = results[f"trainer-{name}"]
            lines.append(f"{name}: {WORDS[valid].lower()}"
                         + (f" ({entry['note']})" if entry.get("note") else ""))
            for anomaly in entry["anomalies"][:3]:
                lines.append(f"  {anomaly['kind']}: {anomaly['text']}")
        return lines + crash_lines(results.get("_crashes"), results.get("_reports"))
    lin: Result = results["_lin"]
    lost: Result = results["_lost"]
    keys = lin.keys
    bad = [k for k in keys if k.valid is False]
    unknown = [k for k in keys if k.valid == UNKNOWN]
    lines.append(f"linearizable: {WORDS[lin.valid].lower()} ({len(keys)} keys, {len(bad)} invalid, "
                 f"{len(unknown)} unknown, {lin.seconds:.1f} s)")
    lost_count = lost.counts.get("lost_writes", 0)
    missed = lost.counts.get("stale_reads", 0)
    reuses = lost.counts.get("version_reuses", 0)
    if lost.valid is True:
        lost_text = "none"
    elif lost.valid is False:
        lost_text = ", ".join(filter(None, [
            f"{lost_count} lost (never seen again)" if lost_count else "",
            f"{missed} stale reads that missed an acknowledged write seen later" if missed else "",
            f"{reuses} versions reused" if reuses else ""]))
    else:
        lost_text = f"unknown: {lost.note}"
    lines.append(f"lost writes: {lost_text} ({lost.counts.get('reads_checked', 0)} reads checked)")
    stale = results.get("stale_reads") or {}
    if stale.get("stale_reads"):
        lines.append(f"stale reads: {stale['lagging']} of {stale['stale_reads']} returned an "
                     f"older version than one already acknowledged (up to "
                     f"{stale['max_versions_behind']} versions behind)")
    for anomaly in lost.anomalies[:5]:
        lines.append(f"  {anomaly.kind}: {anomaly.text}")
    lines += replica_lines(results.get("_agree"))
    lines += replay_lines(results.get("_replays"))
    states = results.get("_states")
    if states is not None and states.valid is False:
        lines.append(f"stale reads: {len(states.anomalies)} returned a state the key never had")
        lines += [f"  {a.kind}: {a.text}" for a in states.anomalies[:5]]
    lines += crash_lines(results.get("_crashes"), results.get("_reports"))
    for counterexample in lin.counterexamples[:1]:
        lines.append("")
        lines.append(counterexample.text())
    return lines


def crash_lines(crashes: Result | None, reports: Result | None = None) -> list[str]:
    """Nodes that exited on their own (checker/crashes.py) or reported a broken safety
    property (checker/safety_reports.py); nothing when none did."""
    lines = []
    if crashes is not None and crashes.valid is False:
        lines.append(f"nodes stay up: INVALID ({len(crashes.anomalies)} exit(s) nobody asked for)")
        lines += [f"  {a.kind}: {a.text}" for a in crashes.anomalies[:5]]
    if reports is not None and reports.valid is False:
        lines.append(f"nodes report no broken rule: INVALID ({len(reports.anomalies)} report(s))")
        lines += [f"  {a.kind}: {a.text}" for a in reports.anomalies[:5]]
    elif reports is not None and reports.note:
        lines.append(f"nodes report no broken rule: {reports.note}")
    return lines


def replay_lines(replays: Result | None) -> list[str]:
    """What the writes sent again with their request ids were answered (checker/replays.py)."""
    if replays is None or not (replays.counts.get("replays_judged") or replays.anomalies):
        return []
    judged = replays.counts.get("replays_judged", 0)
    if replays.valid is True:
        return [f"replays: {judged} acknowledged writes sent again with their request ids, "
                f"each answered as the first time"]
    lines = [f"replays: {len(replays.anomalies)} of {judged} writes sent again with their "
             f"request ids were NOT answered as the first time"]
    lines += [f"  {a.kind}: {a.text}" for a in replays.anomalies[:5]]
    return lines


def replica_lines(agree: Result | None) -> list[str]:
    """What the replica reads found (checker/replicas.py); nothing for a history without."""
    if agree is None or not (agree.counts.get("replica_reads") or agree.counts.get("silent_nodes")):
        return []
    c = agree.counts
    if agree.valid is False:
        head = (f"replicas agree: INVALID ({c['diverged']} read(s) on {c['nodes_diverged']} "
                f"node(s) differ from the final linearizable read at or past its index)")
    else:
        head = f"replicas agree: valid ({c['agree']} of {c['replica_reads']} replica reads agree"
        head += f", {c['behind']} from behind the final reads' index)" if c["behind"] else ")"
        if c.get("lagging_nodes"):
            head += f"; {c['lagging_nodes']} node(s) NEVER CAUGHT UP (see below)"
        if c.get("silent_nodes"):
            head += f"; {c['silent_nodes']} node(s) NEVER ANSWERED (see below)"
    lines = [head]
    for note in filter(None, agree.note.split("; ")):
        lines.append(f"  {note}")
    for anomaly in agree.anomalies[:5]:
        lines.append(f"  {anomaly.kind}: {anomaly.text}")
    return lines


def first_violation_s(results: dict[str, Any], run_dir: Path) -> float | None:
    """Seconds from the history's first record to the completion of the earliest operation
    a checker names (the blocking operation, or a lost write's read); None if valid."""
    from histories.read import read_history

    records = read_history(run_dir / "history.jsonl", allow_truncated_tail=True)
    if not records or records[0].time is None:
        return None
    times = {r.index: r.time for r in records}
    positions = []
    if "trainer_summary" in results:  # checker/trainer.py names history indexes
        for name in results.get("properties") or {}:
            for anomaly in results[f"trainer-{name}"]["anomalies"]:
                positions.extend(anomaly.get("indexes") or [])
        stamps = [times[p] for p in positions if p in times and times[p] is not None]
        stamps += _node_finding_times(results, records)
        return (max(0, min(stamps) - records[0].time)) / 1e9 if stamps else None
    for counterexample in results["_lin"].counterexamples:
        op = counterexample.blocking
        positions.append(op.ret if op.ret is not None else op.call)
    extra = [results[k].anomalies for k in ("_replays", "_states") if results.get(k) is not None]
    for anomaly in [*results["_lost"].anomalies, *results["_agree"].anomalies,
                    *(a for found in extra for a in found)]:
        positions.extend(op.ret if op.ret is not None else op.call for op in anomaly.operations)
    stamps = [times[p] for p in positions if p in times and times[p] is not None]
    stamps += _node_finding_times(results, records)
    if not stamps:
        return None
    return max(0, min(stamps) - records[0].time) / 1e9


def _node_finding_times(results: dict[str, Any], records: list) -> list[int]:
    """History times of the crash records, and of the safety reports when they count
    (less their `age_s`: a report is gathered from the logs after the node made it)."""
    found = [r.time for r in crash_records(records) if r.time is not None]
    if (results.get("safety_reports") or {}).get("valid") is False:
        for r in records:
            if r.process == "nemesis" and r.f == REPORT and r.time is not None:
                age = float(thaw_object(r.value).get("age_s") or 0.0)
                found.append(r.time - int(age * 1e9))
    return found

