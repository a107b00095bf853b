"""`python -m nemesis show RUN_DIR [--key K]`: the report for a terminal.

The verdict sentence, the reproduce command, the faults, the operation table and, for an
invalid run, the counterexample as a text timeline: one row per operation of the key
around the failure, in invoke order, with a bar on the record-order axis:

    line  proc  node  operation                                |     timeline     |
    2029  p1    n3    18. put('r3', '1-161') -> ok v18         |   [====]         |
    2041  p0    n1    ✗ get('r3') -> '1-160' @v17              |       [####]     |

`=` placed in the longest linearizable prefix (numbered in its order), `~` could go next,
`#` cannot be placed, `-` other operations, `?` outcome unknown (runs to the end).
"""

from __future__ import annotations

from tabulate import tabulate

from nemesis.report.data import (
    INVALID,
    RunData,
    Violation,
    describe_windows,
    model_for,
    verdict_sentence,
)

PREFIX_SHOWN = 10
# One-off events worth a line: nodes that died or refused their data, the steps that
# rejoined them, the member fault's changes and what became of each, the nemesis's own
# failures.
EVENTS_SHOWN = ("node-crashed", "safety-report", "node-refused", "rejoin-step", "member-change",
               "nemesis-error")
EVENTS_LIMIT = 30
BAR_WIDTH = 40
LABEL_WIDTH = 52


def render(data: RunData, key: str | None = None) -> str:
    lines = [verdict_sentence(data)]
    if data.test.get("reproduce"):
        lines.append(f"reproduce: {data.test['reproduce']}")
    lines.append(f"run folder: {data.run_dir}")
    lines.append("")
    if data.windows:
        lines.append(tabulate(
            [[w.id, w.fault, w.description, f"{w.start_s:.1f}", f"{w.end_s:.1f}", w.ops,
              f"{100.0 * w.ok / w.ops:.0f}%" if w.ops else "-"] for w in data.windows],
            headers=["#", "fault", "what", "from s", "to s", "ops", "ok"]))
    else:
        lines.append("faults: none recorded")
    events = [m for m in data.markers if m.f in EVENTS_SHOWN]
    if events:
        lines.append("")
        lines.append("events:")
        lines.extend(f"  {m.time_s:7.1f} s  line {m.line:<6} {m.f}: {m.description}"
                     for m in events[:EVENTS_LIMIT])
        if len(events) > EVENTS_LIMIT:
            lines.append(f"  ... and {len(events) - EVENTS_LIMIT} more in history.jsonl")
    lines.append("")
    table = data.counts_by("f")
    lines.append(tabulate([[f, r["ok"], r["fail"], r["info"]] for f, r in table.items()],
                          headers=["op", "ok", "fail", "info"]))
    for name, (ok, total) in data.availability().items():
        share = f"{100.0 * ok / total:.1f}%" if total else "-"
        lines.append(f"availability {name}: {ok} ok of {total} ({share})")
    if data.verdict == INVALID:
        violations = data.violations
        if key is not None:
            violations = [v for v in violations if str(v.key) == key or repr(v.key) == key]
            if not violations:
                invalid = ", ".join(str(v.key) for v in data.violations) or "none"
                lines.append(f"\nkey {key!r} has no counterexample (invalid keys: {invalid})")
        for violation in violations[:1]:
            lines.append("")
            lines.append(counterexample_text(data, violation))
        if key is None and len(data.violations) > 1:
            lines.append(f"\n{len(data.violations) - 1} more invalid keys: "
                         + ", ".join(str(v.key) for v in data.violations[1:])
                         + " (show one with --key K)")
        anomalies = data.lost_write_anomalies
        if anomalies:
            lines.append(f"\nlost writes ({len(anomalies)}):")
            lines.extend(f"  {a.get('text')}" for a in anomalies[:5])
        if data.stale_state_anomalies:
            lines.append(f"\nstale reads of a state the key never had "
                         f"({len(data.stale_state_anomalies)}):")
            lines.extend(f"  {a.get('text')}" for a in data.stale_state_anomalies[:5])
        if data.replay_anomalies:
            lines.append(f"\nreplayed writes answered otherwise ({len(data.replay_anomalies)}):")
            lines.extend(f"  {a.get('text')}" for a in data.replay_anomalies[:5])
        if data.replica_anomalies:
            lines.append(f"\nreplicas that diverged ({len(data.replica_anomalies)} reads):")
            lines.extend(f"  {a.get('text')}" for a in data.replica_anomalies[:5])
    page = data.run_dir / "report.html"
    lines.append(f"\nreport: {page}" if page.exists() else
                 f"\nno report.html yet: python -m nemesis report {data.run_dir}")
    return "\n".join(lines)


def counterexample_text(data: RunData, violation: Violation) -> str:
    cx = violation.counterexample
    prefix = cx["prefix"]
    blocking = cx["blocking"]
    blocking_call = blocking["op"]["invoke_index"]
    order = {p["op"]["invoke_index"]: n for n, p in enumerate(prefix, start=1)}
    candidates = {c["op"]["invoke_index"] for c in cx["candidates"]}
    focus = [p["op"] for p in prefix[-PREFIX_SHOWN:]] + [c["op"] for c in cx["candidates"]]
    focus.append(blocking["op"])
    lo = min(op["invoke_index"] for op in focus)
    hi = max(op["complete_index"] if op.get("complete_index") is not None else op["invoke_index"]
             for op in focus)
    shown = [op for op in violation.operations
             if op.call <= hi and (op.ret is None or op.ret >= lo)][:60]
    model = model_for(data)
    points = sorted({op.call for op in shown} | {op.ret for op in shown if op.ret is not None})
    rank = {p: n for n, p in enumerate(points)}
    scale = BAR_WIDTH / max(1, len(points))
    during = violation.during
    out = [f"key {violation.key!r}: not linearizable",
           f"  cannot place: {blocking['description']} (process {blocking['op']['process']}"
           + (f", node {violation.node}" if violation.node else "")
           + f", lines {blocking_call + 1}.."
           + ("?" if violation.blocking_ret is None else str(violation.blocking_ret + 1))
           + (f", at {violation.time_s:.2f} s" if violation.time_s is not None else "")
           + (f", during {describe_windows(during)}" if during else ", outside any fault") + ")",
           f"  state after the longest linearizable prefix ({len(prefix)} of "
           f"{len(violation.operations)} operations): {cx['state']}",
           "",
           f"  {'line':>6}  {'proc':<5} {'node':<5} {'operation':<{LABEL_WIDTH}} |"
           f"{'record order':^{BAR_WIDTH}}|"]
    for op in shown:
        label = model.describe_operation(op)
        if op.call == blocking_call:
            char, label = "#", "✗ " + label
        elif op.call in candidates:
            char = "~"
        elif op.call in order:
            char, label = "=", f"{order[op.call]}. {label}"
        else:
            char = "-"
        if op.ret is None:
            char = "?"
        start = int(rank[op.call] * scale)
        end = BAR_WIDTH if op.ret is None else max(start + 1, int((rank[op.ret] + 1) * scale))
        bar = " " * start + "[" + char * max(0, end - start - 2) + "]"
        bar = bar[:BAR_WIDTH].ljust(BAR_WIDTH)
        node = (op.completion.node if op.completion is not None else None) or ""
        if len(label) > LABEL_WIDTH:
            label = label[:LABEL_WIDTH - 1] + "…"
        out.append(f"  {op.call + 1:>6}  p{op.process:<4} {node:<5} {label:<{LABEL_WIDTH}} |{bar}|")
    out.append("  = placed in the prefix (its order)  ~ could go next  # cannot be placed  "
               "? outcome unknown")
    if cx["candidates"]:
        out.append("  what could go next, and why each fails:")
        for cand in cx["candidates"][:12]:
            out.append(f"    line {cand['op']['invoke_index'] + 1}: {cand['description']}: "
                       f"{cand['outcome']}")
    return "\n".join(out)

