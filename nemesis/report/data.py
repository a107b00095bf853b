"""What a report shows, extracted from a stored run folder: one value, no drawing.

Everything here is read from the run folder alone (test.json, history.jsonl, results.json,
nodes/), so a report regenerated months later says exactly what the live one said. It never
re-runs a checker: the verdict and counterexamples are results.json's. Fault windows come
from the history's nemesis events (`value.phase` start/end paired by `value.fault` and
`value.id`); an operation's node is its completion's `node`.

Times are seconds since the history's first record (the monotonic clock of the records);
an imported history without times falls back to record indexes and has no latencies.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker.models import MODELS, by_name
from histories.ops import Op, Operation, OpType
from histories.pairing import pair_operations
from histories.read import read_history
from nemesis.store import read_json

# The run's verdict as one word. "crashed": the harness itself failed or the run never got
# to its check (results.json has no verdict); not a statement about the system under test.
VALID, INVALID, UNKNOWN_WORD, CRASHED = "valid", "invalid", "unknown", "crashed"
QUANTILES = (0.5, 0.9, 0.99, 0.999)


@dataclass(frozen=True)
class OpPoint:
    """One client operation placed in time: invoke at `start_s`, completion at `end_s`."""

    call: int  # record index of the invoke
    line: int  # line of the invoke in history.jsonl (1-based)
    process: int
    f: str  # "cas" for a put/delete with expected_version
    key: Any
    outcome: str  # ok | fail | info
    start_s: float
    end_s: float | None  # None: no completion record at all
    node: str | None  # the node that answered (completion's `node`)

    @property
    def latency_ms(self) -> float | None:
        return None if self.end_s is None else (self.end_s - self.start_s) * 1000.0


@dataclass(frozen=True)
class FaultWindow:
    """A fault from its start event to its end event (or the end of the history)."""

    fault: str
    id: Any
    start_s: float
    end_s: float
    nodes: tuple[str, ...]
    description: str
    start_line: int
    end_line: int | None  # None: never healed by its own event (heal-all or the end did)
    ops: int = 0  # operations invoked inside the window
    ok: int = 0

    @property
    def label(self) -> str:
        """Short text for a plot: which fault, which nodes."""
        shown = self.description.split(": ", 1)[-1] if self.description else " ".join(self.nodes)
        number = f"#{self.id} " if self.id is not None else ""
        return f"{number}{self.fault} {shown}"


@dataclass(frozen=True)
class Marker:
    """A one-off nemesis event (node-crashed, heal-all, nemesis-error)."""

    f: str
    time_s: float
    line: int
    description: str


@dataclass(frozen=True)
class Violation:
    """One invalid key's counterexample from results.json, with the operations to draw."""

    key: Any
    counterexample: dict[str, Any]
    operations: list[Operation]  # every operation of the key
    blocking_call: int
    blocking_ret: int | None
    time_s: float | None  # when the blocking operation completed
    node: str | None
    during: list[FaultWindow]  # faults active when it completed


@dataclass
class RunData:
    run_dir: Path
    test: dict[str, Any]
    results: dict[str, Any]
    verdict: str  # valid | invalid | unknown | crashed
    records: list[Op]
    operations: list[Operation]
    points: list[OpPoint]
    windows: list[FaultWindow]
    markers: list[Marker]
    duration_s: float
    timed: bool  # records carry times (else x is the record index)
    violations: list[Violation] = field(default_factory=list)
    history_error: str | None = None
    model_name: str = "versioned-kv"
    lines: list[str] = field(default_factory=list)  # history.jsonl's text, line by line

    def raw_value(self, record: Op) -> dict[str, Any]:
        """An event's `value` as written (the reader freezes dicts into tuples)."""
        try:
            value = json.loads(self.lines[record.index]).get("value")
        except (IndexError, ValueError, AttributeError):
            return {}
        return value if isinstance(value, dict) else {"description": str(value)}

    @property
    def system(self) -> tuple[str, str]:
        """(name, version) of the system under test, from test.json (results.json for a
        run without one); a run from before --system ran the default system at the
        harness's commit."""
        from nemesis.systems import DEFAULT

        info = self.test.get("system") or self.results.get("system") or {}
        return (str(info.get("name") or DEFAULT),
                str(info.get("version") or self.test.get("source_version") or "?"))

    @property
    def lost_write_anomalies(self) -> list[dict[str, Any]]:
        return list((self.results.get("lost_writes") or {}).get("anomalies") or [])

    @property
    def replica_anomalies(self) -> list[dict[str, Any]]:
        """checker/replicas.py's findings: a node whose state diverged at the end."""
        return list((self.results.get("replicas_agree") or {}).get("anomalies") or [])

    @property
    def replay_anomalies(self) -> list[dict[str, Any]]:
        """checker/replays.py's findings: a write sent again with its request id that was
        not answered as the first time."""
        return list((self.results.get("replays") or {}).get("anomalies") or [])

    @property
    def stale_state_anomalies(self) -> list[dict[str, Any]]:
        """checker/staleness.py's findings: a stale read of a state the key never had."""
        return list((self.results.get("stale_read_states") or {}).get("anomalies") or [])

    @property
    def crash_anomalies(self) -> list[dict[str, Any]]:
        """checker/crashes.py's findings: a node that exited though nothing stopped it."""
        return list((self.results.get("nodes_stay_up") or {}).get("anomalies") or [])

    @property
    def safety_report_anomalies(self) -> list[dict[str, Any]]:
        """checker/safety_reports.py's findings: a node's report of a broken property."""
        return list((self.results.get("safety_reports") or {}).get("anomalies") or [])

    def counts_by(self, attribute: str) -> dict[str, dict[str, int]]:
        """attribute value -> {ok, fail, info}, e.g. per function or per node."""
        table: dict[str, dict[str, int]] = {}
        for point in self.points:
            name = getattr(point, attribute)
            row = table.setdefault("(none)" if name is None else str(name),
                                   {"ok": 0, "fail": 0, "info": 0})
            row[point.outcome] += 1
        return dict(sorted(table.items()))

    def availability(self) -> dict[str, tuple[int, int]]:
        """"inside faults" / "outside faults" -> (ok, total) by invoke time."""
        inside = outside = inside_ok = outside_ok = 0
        for point in self.points:
            if any(w.start_s <= point.start_s < w.end_s for w in self.windows):
                inside += 1
                inside_ok += point.outcome == "ok"
            else:
                outside += 1
                outside_ok += point.outcome == "ok"
        return {"inside faults": (inside_ok, inside), "outside faults": (outside_ok, outside)}

    def latency_quantiles(self) -> list[dict[str, Any]]:
        """Per function over `ok` operations: count, p50, p90, p99, p99.9, max (ms)."""
        by_f: dict[str, list[float]] = {}
        for point in self.points:
            if point.outcome == "ok" and point.latency_ms is not None:
                by_f.setdefault(point.f, []).append(point.latency_ms)
        rows = []
        for f, values in sorted(by_f.items()) + [("all", sorted(
                v for vs in by_f.values() for v in vs))]:
            values = sorted(values)
            if not values:
                continue
            row: dict[str, Any] = {"f": f, "count": len(values)}
            for q in QUANTILES:
                row[f"p{q * 100:g}"] = _quantile(values, q)
            row["max"] = values[-1]
            rows.append(row)
        return rows

    def first_violation_s(self) -> float | None:
        times = [v.time_s for v in self.violations if v.time_s is not None]
        times += [t for t in (self._anomaly_time(a) for a in
                              [*self.lost_write_anomalies, *self.replica_anomalies,
                               *self.replay_anomalies, *self.stale_state_anomalies])
                  if t is not None]
        return min(times) if times else None

    def _anomaly_time(self, anomaly: dict[str, Any]) -> float | None:
        stamps = [self.time_of(op.get("complete_index") or op.get("invoke_index"))
                  for op in anomaly.get("operations", [])]
        stamps = [s for s in stamps if s is not None]
        return max(stamps) if stamps else None

    def time_of(self, index: int | None) -> float | None:
        if index is None or not 0 <= index < len(self.records):
            return None
        return self._seconds(self.records[index])

    def windows_at(self, time_s: float | None) -> list[FaultWindow]:
        if time_s is None:
            return []
        return [w for w in self.windows if w.start_s <= time_s <= w.end_s]

    def _seconds(self, record: Op) -> float:
        if not self.timed:
            return float(record.index)
        return (record.time - self.records[0].time) / 1e9  # type: ignore[operator]

    @property
    def node_logs(self) -> list[Path]:
        nodes = self.run_dir / "nodes"
        return sorted(nodes.iterdir()) if nodes.is_dir() else []


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation: every figure is a latency that happened)."""
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def verdict_of(results: dict[str, Any] | None) -> str:
    if not results or "valid" not in results:
        return CRASHED
    valid = results["valid"]
    if valid is True:
        return VALID
    return INVALID if valid is False else UNKNOWN_WORD


def load_run(run_dir: Path) -> RunData:
    """Everything a report needs from `run_dir`. A missing or unreadable history still gives
    a report (a crashed run deserves one too), with `history_error` saying why it is empty."""
    run_dir = Path(run_dir)
    test = read_json(run_dir / "test.json") if (run_dir / "test.json").exists() else {}
    results = read_json(run_dir / "results.json") if (run_dir / "results.json").exists() else {}
    records: list[Op] = []
    lines: list[str] = []
    history_error = None
    try:
        records = read_history(run_dir / "history.jsonl", allow_truncated_tail=True)
        lines = (run_dir / "history.jsonl").read_text(encoding="utf-8").splitlines()
    except (ValueError, OSError) as exc:  # HistoryError is a ValueError
        history_error = str(exc)
    operations = pair_operations(records) if records else []
    timed = bool(records) and all(r.time is not None for r in records)
    data = RunData(run_dir=run_dir, test=test, results=results, verdict=verdict_of(results),
                   records=records, operations=operations, points=[], windows=[], markers=[],
                   duration_s=0.0, timed=timed, history_error=history_error,
                   model_name=(test.get("workload") or {}).get("model") or "versioned-kv",
                   lines=lines)
    if records:
        data.duration_s = data._seconds(records[-1])
    data.points = [_point(data, op) for op in operations]
    data.windows, data.markers = _fault_windows(data)
    data.violations = _violations(data)
    return data


def _point(data: RunData, op: Operation) -> OpPoint:
    f = "cas" if op.f in ("put", "delete") and op.expected_version is not None else op.f
    completion = op.completion
    return OpPoint(call=op.call, line=op.call + 1, process=op.process, f=f, key=op.key,
                   outcome=op.type.value if op.type is not OpType.INVOKE else "info",
                   start_s=data._seconds(op.invoke),
                   end_s=data._seconds(completion) if completion is not None else None,
                   node=completion.node if completion is not None else None)


def _fields(value: dict[str, Any]) -> str:
    """A structured event's value (a trainer event) as `key=value` text."""
    return ", ".join(f"{k}={v}" for k, v in value.items()
                     if k != "wall_time" and v not in (None, "", [], {}))


def _fault_windows(data: RunData) -> tuple[list[FaultWindow], list[Marker]]:
    open_windows: dict[tuple[str, Any], tuple[Op, dict[str, Any]]] = {}
    windows: list[FaultWindow] = []
    markers: list[Marker] = []

    def close(start: Op, value: dict[str, Any], end: Op | None) -> None:
        end_s = data._seconds(end) if end is not None else data.duration_s
        windows.append(FaultWindow(
            fault=str(value.get("fault")), id=value.get("id"), start_s=data._seconds(start),
            end_s=end_s, nodes=tuple(str(n) for n in value.get("nodes") or ()),
            description=str(value.get("description") or start.f),
            start_line=start.index + 1, end_line=end.index + 1 if end is not None else None))

    for record in data.records:
        if record.is_client:
            continue
        value = data.raw_value(record)
        phase, fault, ident = value.get("phase"), value.get("fault"), value.get("id")
        if phase == "start" and ident is not None:
            open_windows[(str(fault), ident)] = (record, value)
        elif phase == "end" and ident is not None and (str(fault), ident) in open_windows:
            start, start_value = open_windows.pop((str(fault), ident))
            close(start, start_value, record)
        else:
            markers.append(Marker(f=record.f, time_s=data._seconds(record), line=record.index + 1,
                                  description=str(value.get("description") or _fields(value)
                                                  or record.value)))
    for start, start_value in open_windows.values():
        close(start, start_value, None)
    windows.sort(key=lambda w: w.start_s)
    # Operations invoked inside each window, and how many of them succeeded.
    counted = []
    for window in windows:
        inside = [p for p in data.points if window.start_s <= p.start_s < window.end_s]
        counted.append(FaultWindow(**{**window.__dict__, "ops": len(inside),
                                      "ok": sum(p.outcome == "ok" for p in inside)}))
    return counted, markers


def _violations(data: RunData) -> list[Violation]:
    keys = (data.results.get("linearizable") or {}).get("keys") or []
    by_call = {op.call: op for op in data.operations}
    by_key: dict[Any, list[Operation]] = {}
    for op in data.operations:
        by_key.setdefault(_json_key(op.key), []).append(op)
    violations = []
    for entry in keys:
        cx = entry.get("counterexample")
        if not cx:
            continue
        blocking = cx["blocking"]["op"]
        call, ret = blocking.get("invoke_index"), blocking.get("complete_index")
        op = by_call.get(call)
        node = op.completion.node if op is not None and op.completion is not None else None
        time_s = data.time_of(ret if ret is not None else call)
        violations.append(Violation(
            key=entry.get("key"), counterexample=cx, operations=by_key.get(
                _json_key(entry.get("key")), []),
            blocking_call=call, blocking_ret=ret, time_s=time_s, node=node,
            during=data.windows_at(time_s)))
    violations.sort(key=lambda v: (v.blocking_ret if v.blocking_ret is not None
                                   else v.blocking_call))
    return violations


def _json_key(key: Any) -> Any:
    """Keys as results.json spells them (tuples become lists, so compare their text)."""
    return repr(list(key)) if isinstance(key, tuple | list) else repr(key)


def model_for(data: RunData):  # noqa: ANN201 - checker.models.Model
    """The run's linearizability model (to describe a counterexample's operations); None for
    a workload checked by other properties (`trainer`: checker/trainer.py), which has no
    linearizability counterexample to draw."""
    return by_name(data.model_name, None) if data.model_name in MODELS else None


def fault_counts(data: RunData) -> Counter:
    return Counter(w.fault for w in data.windows)


def _seconds_text(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def describe_windows(windows: list[FaultWindow]) -> str:
    return ", ".join(f"{w.fault} #{w.id} ({w.description})" for w in windows)


def verdict_sentence(data: RunData) -> str:
    """The report's first line: what the run shows, in one sentence a newcomer can act on."""
    ops = len(data.points)
    faults = fault_counts(data)
    total = sum(faults.values())
    fault_text = (f"{total} fault{'s' if total != 1 else ''} ("
                  + ", ".join(f"{f} ×{n}" for f, n in sorted(faults.items())) + ")"
                  if total else "no faults")
    span = f"{data.duration_s:.0f}" if data.duration_s >= 10 else f"{data.duration_s:.1f}"
    where = f"{ops:,} operations over {span} s with {fault_text}"
    trainer = "trainer_summary" in data.results
    if data.verdict == VALID and trainer:
        return (f"VALID: {where}; no acknowledged checkpoint was lost, every resume started "
                f"from the latest, no deposed coordinator wrote, no request id applied twice, "
                f"one coordinator held each lease term and every head write was a CAS on what "
                f"its writer read under its lease.")
    if data.verdict == VALID:
        return (f"VALID: {where}; the history is linearizable and no acknowledged write "
                f"was lost.")
    if data.verdict == CRASHED:
        reason = data.results.get("harness_error") or (
            "results.json has no verdict: the harness died or the run is still going")
        return (f"CRASHED: the harness did not finish the run ({reason}); nothing was decided "
                f"about the store. {where.capitalize()} were recorded.")
    if data.verdict == UNKNOWN_WORD:
        note = (data.results.get("linearizable") or {}).get("note") or (
            "nothing was recorded" if not ops else "a checker budget ran out")
        return f"UNKNOWN: the check could not decide ({note}); {where}."
    if trainer:
        broken = [(name, data.results.get(f"trainer-{name}") or {})
                  for name, v in (data.results.get("properties") or {}).items() if v is False]
        first = next(((n, r["anomalies"][0]) for n, r in broken if r.get("anomalies")), None)
        if first is None and data.crash_anomalies:
            return f"INVALID: a store node crashed: {data.crash_anomalies[0]['text']} ({where})."
        if first is None and data.safety_report_anomalies:
            return (f"INVALID: a store node reported a broken rule: "
                    f"{data.safety_report_anomalies[0]['text']} ({where}).")
        text = (f"trainer property {first[0]!r} broken: {first[1]['kind']}: {first[1]['text']}"
                if first else "a trainer property is broken (see results.json)")
        return f"INVALID: {text} ({where})."
    return f"INVALID: {violation_summary(data)} ({where})."


def violation_summary(data: RunData) -> str:
    """The earliest violation in one clause, with the faults active when it happened."""
    first_cx = data.violations[0] if data.violations else None
    anomalies = sorted(data.lost_write_anomalies,
                       key=lambda a: data._anomaly_time(a) or math.inf)
    first_lost = anomalies[0] if anomalies else None
    lost_time = data._anomaly_time(first_lost) if first_lost else None
    total_keys = len((data.results.get("linearizable") or {}).get("keys") or [])
    counts = []
    if data.violations:
        counts.append(f"{len(data.violations)} of {total_keys} keys not linearizable")
    lost = sum(a.get("kind", "lost-write") != "stale-read" for a in anomalies)
    stale = len(anomalies) - lost
    if lost:
        counts.append(f"{lost} lost-write finding{'s' if lost != 1 else ''}")
    if stale:
        counts.append(f"{stale} stale read{'s' if stale != 1 else ''} missing an acknowledged "
                      f"write seen later")
    # Findings of the checks beside linearizability and lost writes: counted in the tail,
    # or the sentence itself when nothing else was found.
    for found, counted, lead in (
            (data.stale_state_anomalies, "stale read(s) of a state the key never had",
             "a stale read returned a state the key never had"),
            (data.replay_anomalies, "replayed write(s) answered otherwise than the first time",
             "a replayed request was not deduplicated"),
            (data.crash_anomalies, "node crash(es) nobody asked for",
             "a node exited on its own"),
            (data.safety_report_anomalies, "node report(s) of a broken rule",
             "a node reported a broken safety property")):
        if found and first_cx is None and first_lost is None:
            return f"{lead}: {found[0]['text']}"
        if found:
            counts.append(f"{len(found)} {counted}")
    tail = "; ".join(counts)
    if first_cx is not None and (lost_time is None or (first_cx.time_s or 0) <= lost_time):
        cx = first_cx.counterexample
        during = data.windows_at(first_cx.time_s)
        return (f"on key {first_cx.key!r}, {cx['blocking']['description']} "
                f"(process {cx['blocking']['op']['process']}"
                + (f", answered by {first_cx.node}" if first_cx.node else "")
                + f", history line {first_cx.blocking_call + 1}, at "
                f"{_seconds_text(first_cx.time_s)}"
                + (f", during {describe_windows(during)}" if during else ", outside any fault")
                + f") fits no order of the operations; the state then was {cx['state']}"
                + (f" — {tail}" if tail else ""))
    replicas = data.replica_anomalies
    if replicas and first_cx is None and first_lost is None:
        nodes = (data.results.get("replicas_agree") or {}).get("counts", {}).get("nodes_diverged")
        return (f"a replica diverged: {replicas[0]['text']} ({len(replicas)} replica read(s) "
                f"on {nodes} node(s) differ from the final linearizable reads)")
    if replicas:
        tail = "; ".join(filter(None, [tail, f"{len(replicas)} replica read(s) diverged"]))
    if first_lost is not None:
        during = data.windows_at(lost_time)
        return (f"{first_lost['text']} (at {_seconds_text(lost_time)}"
                + (f", during {describe_windows(during)}" if during else ", outside any fault")
                + ")" + (f" — {tail}" if tail else ""))
    return "a checker reported a violation (see results.json)"
