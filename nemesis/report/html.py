"""report.html: one self-contained page per run (no scripts, no network; images inline).

Order of the page is the order of a reader's questions: what is the verdict and how do I
reproduce it; where is the violation (for an invalid run: the counterexample timeline);
what did the faults do to latency and throughput; the tables; the configuration; the files.

Every history text goes through html.escape. Links to history lines point at the
"records cited" section of the same page (`#L<line>`), which quotes those lines of
history.jsonl verbatim, so they resolve when the page is opened from disk.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from checker.timeline import FAILING_OP_ANCHOR
from nemesis.report.data import (
    INVALID,
    RunData,
    Violation,
    describe_windows,
    model_for,
    verdict_sentence,
)
from nemesis.report.plots import OUTCOME_COLOURS, fault_colour

PREFIX_SHOWN = 10  # placed operations drawn before the point of failure
MAX_DRAWN_OPS = 80  # per counterexample timeline
MAX_ANOMALIES_SHOWN = 20
MAX_MARKERS_SHOWN = 60  # a trainer run records every lease change, resume and skip
RUN_FILES = ("history.jsonl", "nemesis.jsonl", "results.json", "test.json", "harness.log",
             "timeline.html", "latency.png", "rate.png", "junit.xml")

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, sans-serif; margin: 0; color: #1d1d1d; }
main { max-width: 1180px; margin: 0 auto; padding: 8px 20px 40px; }
h1 { font-size: 17px; margin: 0; padding: 14px 20px; color: white; line-height: 1.4; }
h1.valid { background: #17702a; } h1.invalid { background: #b00020; }
h1.unknown { background: #a15c00; } h1.crashed { background: #555; }
h2 { font-size: 16px; margin-top: 30px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 14px; margin: 18px 0 6px; }
nav { font-size: 13px; margin: 8px 0; } nav a { margin-right: 12px; }
code, pre, .rec { font: 12px/1.4 ui-monospace, Menlo, Consolas, monospace; }
pre.cmd { background: #f3f3f3; padding: 8px 10px; white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; margin: 4px 0 10px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
img.plot { width: 100%; max-width: 1100px; border: 1px solid #eee; display: block; }
.swatch { display: inline-block; width: 11px; height: 11px; vertical-align: middle;
          border: 1px solid #999; margin-right: 4px; }
.meta { color: #555; font-size: 13px; }
.rec { white-space: pre-wrap; word-break: break-all; padding: 1px 4px; }
.rec:target, tr:target { background: #fff3b0; outline: 2px solid #e0b000; }
.rec a.ln { display: inline-block; min-width: 5em; color: #666; }
.why { background: #fff4f4; border-left: 4px solid #b00020; padding: 6px 10px; }
svg.cx text { font: 11px ui-monospace, Menlo, Consolas, monospace; }
svg.cx a:hover rect { stroke-width: 2.5; }
div.tl { display: flex; align-items: flex-start; }
div.scroll { overflow-x: auto; min-width: 0; flex: 1; display: flex; flex-direction: row-reverse; }
div.scroll svg { flex: none; }  /* row-reverse: starts scrolled to the failure, at the right */
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
"""


def render(data: RunData, plots: dict[str, bytes]) -> str:
    title = f"{data.verdict.upper()} — {data.test.get('run_id') or data.run_dir.name}"
    cited: set[int] = set()
    body = [
        f"<h1 class='{data.verdict}' id='verdict'>{html.escape(verdict_sentence(data))}</h1>",
        "<main>",
        _nav(data),
        _reproduce(data),
    ]
    if data.verdict == INVALID:  # the violation is what a reader of a failed run came for
        body.append(_violations(data, cited))
    body.append(_overview(data))
    body.append(_plots(data, plots))
    body.append(_faults(data, cited))
    body.append(_operations(data))
    body.append(_configuration(data))
    body.append(_files(data))
    body.append(_records(data, cited))
    body.append("</main>")
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            "<link rel='icon' href='data:,'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _operation_links(anomaly: dict[str, Any], cited: set[int]) -> list[str]:
    """Links to the history lines of each operation an anomaly names (invoke, completion)."""
    lines = []
    for op in anomaly.get("operations", []):
        lines.append(_line_link(op["invoke_index"] + 1, cited))
        if op.get("complete_index") is not None:
            lines.append(_line_link(op["complete_index"] + 1, cited))
    return lines


def _line_link(line: int | None, cited: set[int], text: str | None = None) -> str:
    if line is None:
        return "—"
    cited.add(line)
    return f"<a href='#L{line}'>{_e(text or line)}</a>"


def _nav(data: RunData) -> str:
    links = [("#violation", "violation")] if data.verdict == INVALID else []
    links.append(("#overview", "the run"))
    links += [("#plots", "latency & throughput"), ("#faults", "faults"),
              ("#operations", "operations"), ("#configuration", "configuration"),
              ("#files", "files & node logs")]
    return "<nav>" + "".join(f"<a href='{href}'>{text}</a>" for href, text in links) + "</nav>"


def _reproduce(data: RunData) -> str:
    reproduce = data.test.get("reproduce")
    if not reproduce:
        return ""
    return (f"<p class='meta'>Reproduce (same fault schedule and operation mix; which node "
            f"leads depends on the cluster):</p><pre class='cmd' id='reproduce'>{_e(reproduce)}"
            f"</pre>")


def _overview(data: RunData) -> str:
    test, results = data.test, data.results
    config = test.get("config") or {}
    rows = [
        ("run", test.get("run_id") or data.run_dir.name),
        ("started", test.get("started", "?")),
        ("workload", f"{(test.get('workload') or {}).get('name', config.get('workload', '?'))} "
                     f"(model {data.model_name})"),
        ("system", "{} {}".format(*data.system)),
        ("faults asked for", ", ".join(config.get("faults") or []) or "?"),
        ("nodes / platform", f"{config.get('nodes', '?')} on {config.get('platform', '?')}"),
        ("duration", f"{config.get('duration_s', '?')} s asked, {data.duration_s:.1f} s recorded"),
        ("seed", config.get("seed", "?")),
        ("transport", "mutual TLS on every node port, certificates of a CA made for this run "
                      "(its certificate: ca.crt)" if config.get("tls") else "plaintext"),
        ("harness commit", test.get("source_version", "?")),
    ]
    if config.get("unsafe"):
        who = "coordinator" if "trainer_summary" in results else "node"
        rows.insert(3, ("canary", f"every {who} ran the deliberately broken --unsafe "
                                  f"{config['unsafe']}: this run is meant to be caught"))
    out = ["<section id='overview'><h2>The run</h2>"]
    out.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
               + "</table>")
    problems = []
    if results.get("harness_error"):
        problems.append(f"harness error: {results['harness_error']} (see harness.log)")
    for crash in results.get("crashed_nodes") or []:
        problems.append(f"{crash.get('node')} exited with code {crash.get('exit_code')} on its "
                        f"own — nodes-stay-up makes the run invalid: "
                        f"{crash.get('reason') or 'no last line'} (see its log below)")
    for finding in ((results.get("safety_reports") or {}).get("anomalies") or [])[:5]:
        problems.append(f"safety report: {finding.get('text')}")
    for error in (results.get("nemesis_errors") or [])[:5]:
        problems.append(f"nemesis error: {error}")
    if data.history_error:
        problems.append(f"history unreadable: {data.history_error}")
    for note in [(results.get("linearizable") or {}).get("note")]:
        if note:
            problems.append(f"checker note: {note}")
    if problems:
        out.append("<ul class='why'>" + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


# --- the counterexample -------------------------------------------------------------------

def _violations(data: RunData, cited: set[int]) -> str:
    out = ["<section id='violation'><h2>The violation</h2>"]
    if data.violations:
        out.append(f"<p>{len(data.violations)} key(s) are not linearizable; the earliest "
                   f"first. Each timeline has one lane per client process; a bar runs from "
                   f"an operation's invoke to its completion (the x axis is the order of "
                   f"those records, which is all linearizability looks at). Click a bar for "
                   f"its lines in history.jsonl.</p>" + _legend())
        for n, violation in enumerate(data.violations):
            block = _counterexample(data, violation, cited)
            if n == 0:
                out.append(block)
            else:
                out.append(f"<details><summary>key {_e(repr(violation.key))} — "
                           f"{_e(violation.counterexample['blocking']['description'])}"
                           f"</summary>{block}</details>")
    anomalies = data.lost_write_anomalies
    if anomalies:
        lost = sum(a.get("kind") != "stale-read" for a in anomalies)
        stale = len(anomalies) - lost
        title = ", ".join(filter(None, [f"lost or reused: {lost}" if lost else "",
                                        f"stale reads missing a write seen later: {stale}"
                                        if stale else ""]))
        out.append(f"<h3 id='lost-writes'>Acknowledged writes a read missed ({title})</h3><table>"
                   "<tr><th>key</th><th>kind</th><th>what</th><th>history lines</th><th>at</th></tr>")
        for anomaly in anomalies[:MAX_ANOMALIES_SHOWN]:
            lines = _operation_links(anomaly, cited)
            when = data._anomaly_time(anomaly)
            out.append(f"<tr><td>{_e(repr(anomaly.get('key')))}</td>"
                       f"<td>{_e(anomaly.get('kind', 'lost-write'))}</td><td>{_e(anomaly['text'])}"
                       f"</td><td>{' '.join(lines)}</td><td class='n'>"
                       f"{'' if when is None else f'{when:.2f} s'}</td></tr>")
        out.append("</table>")
        if len(anomalies) > MAX_ANOMALIES_SHOWN:
            out.append(f"<p class='meta'>{len(anomalies) - MAX_ANOMALIES_SHOWN} more in "
                       f"<a href='results.json'>results.json</a>.</p>")
    out.append(_replica_anomalies(data, cited))
    out.append(_replay_anomalies(data, cited))
    out.append(_trainer_anomalies(data, cited))
    if (data.run_dir / "timeline.html").exists():
        # The fragment opens that page on the failing operation, however long the key.
        out.append("<p class='meta'>Every operation of each invalid key: "
                   f"<a href='timeline.html#{FAILING_OP_ANCHOR}'>timeline.html</a> (opens on "
                   "the operation that cannot be placed).</p>")
    out.append("</section>")
    return "\n".join(out)


def _replay_anomalies(data: RunData, cited: set[int]) -> str:
    """checker/replays.py's and checker/staleness.py's findings: a replayed write answered
    otherwise than the first time; a stale read of a state the key never had."""
    return "\n".join(filter(None, [
        _anomaly_table(data.replay_anomalies, cited, "replays", "Replayed writes answered otherwise",
                       "An acknowledged write sent again with its request id must be answered "
                       "as the first time and change nothing."),
        _anomaly_table(data.stale_state_anomalies, cited, "stale-states",
                       "Stale reads of a state the key never had",
                       "A stale read promises no recency, but a value and version some put "
                       "produced.")]))


def _anomaly_table(anomalies: list[dict], cited: set[int], anchor: str, title: str,
                   intro: str) -> str:
    if not anomalies:
        return ""
    out = [f"<h3 id='{anchor}'>{_e(title)} ({len(anomalies)})</h3><p>{_e(intro)}</p>"
           "<table><tr><th>key</th><th>kind</th><th>what</th><th>history lines</th></tr>"]
    for anomaly in anomalies[:MAX_ANOMALIES_SHOWN]:
        lines = _operation_links(anomaly, cited)
        out.append(f"<tr><td>{_e(repr(anomaly.get('key')))}</td><td>{_e(anomaly.get('kind'))}"
                   f"</td><td>{_e(anomaly['text'])}</td><td>{' '.join(lines)}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _replica_anomalies(data: RunData, cited: set[int]) -> str:
    """checker/replicas.py's findings: the replica's read and the final read it contradicts."""
    return _anomaly_table(data.replica_anomalies, cited, "replicas",
                          "Replicas that disagree with the final reads",
                          "Each node was read on its own after the final linearizable reads; at "
                          "or past the index a final read was served at, its state machine must "
                          "hold the same value and version.")


def _trainer_anomalies(data: RunData, cited: set[int]) -> str:
    """The broken trainer properties (checker/trainer.py), each anomaly with its lines."""
    rows = []
    for name, result in sorted(data.results.items()):
        if not name.startswith("trainer-") or result.get("valid") is not False:
            continue
        for anomaly in (result.get("anomalies") or [])[:MAX_ANOMALIES_SHOWN]:
            indexes = [i for i in anomaly.get("indexes") or [] if i is not None]
            when = [t for t in (data.time_of(i) for i in indexes) if t is not None]
            rows.append(f"<tr><td>{_e(name.removeprefix('trainer-'))}</td>"
                        f"<td>{_e(anomaly.get('kind'))}</td><td>{_e(anomaly.get('text'))}</td>"
                        f"<td>{' '.join(_line_link(i + 1, cited) for i in indexes)}</td>"
                        f"<td class='n'>{f'{max(when):.2f} s' if when else ''}</td></tr>")
    if not rows:
        return ""
    return ("<h3 id='trainer-properties'>Broken trainer properties</h3><table><tr><th>property"
            "</th><th>anomaly</th><th>what</th><th>history lines</th><th>at</th></tr>"
            + "".join(rows) + "</table>")


def _legend() -> str:
    items = [("#c8e6c9", "#4c9a52", "placed (the longest linearizable prefix, in its order)"),
             ("#ffe0b2", "#e08a00", "could go next (tried, none works)"),
             ("#ffcdd2", "#b00020", "cannot be placed"),
             ("#eeeeee", "#999999", "other operations; hatched = outcome unknown")]
    return "<p class='meta'>" + "".join(
        f"<span class='swatch' style='background:{fill};border-color:{edge}'></span>"
        f"{_e(text)} &nbsp; " for fill, edge, text in items) + "</p>"


def _counterexample(data: RunData, violation: Violation, cited: set[int]) -> str:
    cx = violation.counterexample
    prefix = cx["prefix"]
    blocking = cx["blocking"]
    model = model_for(data)
    order = {p["op"]["invoke_index"]: n for n, p in enumerate(prefix, start=1)}
    candidates = {c["op"]["invoke_index"]: c for c in cx["candidates"]}
    focus = [p["op"] for p in prefix[-PREFIX_SHOWN:]] + [c["op"] for c in cx["candidates"]]
    focus.append(blocking["op"])
    lo = min(op["invoke_index"] for op in focus)
    hi = max(op["complete_index"] if op.get("complete_index") is not None else op["invoke_index"]
             for op in focus)
    shown = [op for op in violation.operations
             if op.call <= hi and (op.ret is None or op.ret >= lo)]
    if len(shown) > MAX_DRAWN_OPS:  # keep the ones nearest the failure
        keep = {op["invoke_index"] for op in focus}
        rest = sorted((op for op in shown if op.call not in keep),
                      key=lambda op: abs(op.call - blocking["op"]["invoke_index"]))
        chosen = {op.call for op in rest[:max(0, MAX_DRAWN_OPS - len(keep))]} | keep
        shown = [op for op in shown if op.call in chosen]
    for op in shown:  # every bar links to its lines
        cited.update({op.call + 1} | ({op.ret + 1} if op.ret is not None else set()))
    during = violation.during
    out = [f"<h3 id='key-{_e(_anchor(violation.key))}'>key {_e(repr(violation.key))}</h3>",
           "<p class='why'>",
           f"<b>Cannot place</b> {_e(blocking['description'])} — process "
           f"{_e(blocking['op']['process'])}"
           + (f", answered by <b>{_e(violation.node)}</b>" if violation.node else "")
           + f", history lines {_line_link(blocking['op']['invoke_index'] + 1, cited)}"
           + (f"..{_line_link(violation.blocking_ret + 1, cited)}"
              if violation.blocking_ret is not None else "")
           + (f", at {violation.time_s:.2f} s" if violation.time_s is not None else "")
           + (f", during {_e(describe_windows(during))}" if during else ", outside any fault")
           + f".<br>After the longest linearizable prefix ({len(prefix)} of "
           f"{len(violation.operations)} operations of this key) the state is "
           f"<b>{_e(cx['state'])}</b>, and no operation that could go next leads to an order "
           f"in which this one's result is possible. Click a bar for its completion (or, if "
           f"it has none, its invoke) in history.jsonl.</p>",
           _timeline_svg(shown, model, order, candidates, blocking["op"]["invoke_index"], data),
           f"<p class='meta'>Drawn: {len(shown)} operations of this key around the failure "
           f"(history lines {lo + 1} to {hi + 1}).</p>"]
    out.append("<h3>What could go next, and why each fails</h3><table><tr><th>operation</th>"
               "<th>process</th><th>lines</th><th>the model says</th></tr>")
    for cand in cx["candidates"]:
        op = cand["op"]
        out.append(f"<tr><td><code>{_e(cand['description'])}</code></td><td>{_e(op['process'])}"
                   f"</td><td>{_op_lines(op, cited)}</td><td>{_e(cand['outcome'])}</td></tr>")
    out.append("</table>")
    tail = prefix[-PREFIX_SHOWN:]
    out.append(f"<h3>The longest linearizable prefix (last {len(tail)} of {len(prefix)}), "
               f"with the model state after each</h3><table><tr><th>#</th><th>operation</th>"
               f"<th>process</th><th>lines</th><th>state after</th></tr>")
    for n, placed in enumerate(tail, start=len(prefix) - len(tail) + 1):
        op = placed["op"]
        out.append(f"<tr><td class='n'>{n}</td><td><code>{_e(placed['description'])}</code></td>"
                   f"<td>{_e(op['process'])}</td><td>{_op_lines(op, cited)}</td>"
                   f"<td><code>{_e(placed['state_after'])}</code></td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _anchor(key: Any) -> str:
    return "".join(c if c.isalnum() else "-" for c in str(key))


def _op_lines(op: dict[str, Any], cited: set[int]) -> str:
    text = _line_link(op["invoke_index"] + 1, cited)
    if op.get("complete_index") is not None:
        text += ".." + _line_link(op["complete_index"] + 1, cited)
    return text


def _timeline_svg(operations, model, order: dict[int, int], candidates: dict[int, Any],  # noqa: ANN001
                  blocking_call: int, data: RunData) -> str:
    if not operations:
        return "<p>no operations to draw</p>"
    points = sorted({op.call for op in operations} | {op.ret for op in operations
                                                      if op.ret is not None})
    rank = {p: n for n, p in enumerate(points)}
    lanes = sorted({op.process for op in operations})
    # At least ~4 characters of label per record step; wider timelines scroll sideways
    # (starting at the right, where the failure is); the lane names stay put on the left.
    label_px, lane_px, min_step, tail_px = 6, 30, 30.0, 260
    step = max(min_step, (1120 - tail_px) / (len(points) + 1))
    width = int(label_px + step * (len(points) + 1) + tail_px)
    height = lane_px * len(lanes) + 24
    hatch = f"hatch{blocking_call}"
    names = [f"<svg class='cx' xmlns='http://www.w3.org/2000/svg' width='44' height='{height}'>"]
    for n, process in enumerate(lanes):
        names.append(f"<text x='4' y='{n * lane_px + 19}' fill='#666'>p{_e(process)}</text>")
    names.append("</svg>")
    out = ["<div class='tl'>", *names, "<div class='scroll'>",
           f"<svg class='cx' xmlns='http://www.w3.org/2000/svg' width='{width}' "
           f"height='{height}' viewBox='0 0 {width} {height}' role='img' "
           f"aria-label='counterexample timeline'>",
           f"<defs><pattern id='{hatch}' width='6' height='6' patternUnits='userSpaceOnUse' "
           "patternTransform='rotate(45)'><rect width='6' height='6' fill='#f1f1f1'/>"
           "<line x1='0' y1='0' x2='0' y2='6' stroke='#cfcfcf' stroke-width='3'/></pattern>"
           "</defs>"]
    for n in range(len(lanes)):
        y = n * lane_px
        out.append(f"<line x1='0' y1='{y + lane_px}' x2='{width}' y2='{y + lane_px}' "
                   f"stroke='#eee'/>")
    for op in operations:
        y = lanes.index(op.process) * lane_px + 4
        x0 = label_px + rank[op.call] * step
        x1 = label_px + ((rank[op.ret] if op.ret is not None else len(points)) + 0.85) * step
        label = model.describe_operation(op)
        if op.call == blocking_call:
            fill, stroke, stroke_width = "#ffcdd2", "#b00020", 2.5
            label = "✗ " + label
        elif op.call in candidates:
            fill, stroke, stroke_width = "#ffe0b2", "#e08a00", 1.5
        elif op.call in order:
            fill, stroke, stroke_width = "#c8e6c9", "#4c9a52", 1
            label = f"{order[op.call]}. {label}"
        else:
            fill, stroke, stroke_width = "#eeeeee", "#999999", 1
        if op.ret is None:
            fill = f"url(#{hatch})"
        node = op.completion.node if op.completion is not None else None
        tip = (f"{label} | process {op.process}" + (f" | node {node}" if node else "")
               + f" | lines {op.call + 1}.." + ("?" if op.ret is None else str(op.ret + 1))
               + f" | {op.type.value}"
               + (f" | {data.time_of(op.call):.3f} s" if data.time_of(op.call) is not None else ""))
        bar_width = max(4.0, x1 - x0)
        clip = f"c{op.call}"
        out.append(
            f"<clipPath id='{clip}'><rect x='{x0:.1f}' y='{y}' width='{bar_width:.1f}' "
            f"height='22'/></clipPath>"
            f"<a href='#L{(op.ret if op.ret is not None else op.call) + 1}'>"
            f"<title>{_e(tip)}</title>"
            f"<rect x='{x0:.1f}' y='{y}' width='{bar_width:.1f}' height='22' rx='3' "
            f"fill='{fill}' stroke='{stroke}' stroke-width='{stroke_width}'"
            + (" stroke-dasharray='4 2'" if op.ret is None else "")
            + (" opacity='0.5'" if op.type.value == "fail" else "") + "/>"
            f"<text x='{x0 + 3:.1f}' y='{y + 15}' clip-path='url(#{clip})'>{_e(label)}</text>"
            + (f"<text class='blocking' x='{x0 + bar_width + 6:.1f}' y='{y + 15}' "
               f"fill='#b00020' font-weight='bold'>{_e(label)}</text>"
               if op.call == blocking_call else "")  # its whole label: the reader came for it
            + "</a>")
    out.append(f"<text x='{label_px}' y='{height - 6}' fill='#888'>record order → "
               f"(lines {points[0] + 1} .. {points[-1] + 1})</text></svg></div></div>")
    return "\n".join(out)


# --- plots, faults, tables ------------------------------------------------------------------

def _plots(data: RunData, plots: dict[str, bytes]) -> str:
    out = ["<section id='plots'><h2>Latency and throughput</h2>",
           "<p class='meta'>Shaded bands are fault windows (labelled with the fault and its "
           "nodes; numbers match the fault table below)"
           + ("; the red line is the first violation" if data.first_violation_s() is not None
              else "") + ". Points: "
           + ", ".join(f"<span class='swatch' style='background:{c}'></span>{o}"
                       for o, c in OUTCOME_COLOURS.items()) + ".</p>"]
    for name, alt in (("latency.png", "latency of every operation over time"),
                      ("rate.png", "completions per second over time")):
        if name in plots:
            encoded = base64.b64encode(plots[name]).decode("ascii")
            out.append(f"<img class='plot' id='plot-{name.split('.')[0]}' alt='{alt}' "
                       f"src='data:image/png;base64,{encoded}'>")
    out.append("</section>")
    return "\n".join(out)


def _faults(data: RunData, cited: set[int]) -> str:
    out = ["<section id='faults'><h2>Faults</h2>"]
    if not data.windows:
        out.append("<p>No fault window in this history.</p>")
    else:
        out.append("<table><tr><th>#</th><th>fault</th><th>nodes</th><th>what</th>"
                   "<th>from</th><th>to</th><th>lines</th><th>ops invoked</th>"
                   "<th>ok</th></tr>")
        for w in data.windows:
            share = f"{100.0 * w.ok / w.ops:.0f} %" if w.ops else "—"
            end = _line_link(w.end_line, cited) if w.end_line else "(healed at the end)"
            out.append(
                f"<tr><td class='n'>{_e(w.id)}</td><td><span class='swatch' style='background:"
                f"{fault_colour(w.fault)}'></span>{_e(w.fault)}</td><td>{_e(' '.join(w.nodes))}"
                f"</td><td>{_e(w.description)}</td><td class='n'>{w.start_s:.2f} s</td>"
                f"<td class='n'>{w.end_s:.2f} s</td><td>{_line_link(w.start_line, cited)} "
                f"{end}</td><td class='n'>{w.ops}</td><td class='n'>{share}</td></tr>")
        out.append("</table>")
    if data.markers:
        shown = data.markers[:MAX_MARKERS_SHOWN]
        more = len(data.markers) - len(shown)
        out.append("<p class='meta'>Other events: " + "; ".join(
            f"{_e(m.f)} at {m.time_s:.2f} s ({_e(m.description)}, line "
            f"{_line_link(m.line, cited)})" for m in shown)
            + (f"; and {more} more in history.jsonl" if more else "") + "</p>")
    out.append("</section>")
    return "\n".join(out)


def _count_table(title: str, table: dict[str, dict[str, int]]) -> str:
    rows = "".join(
        f"<tr><td>{_e(name)}</td><td class='n'>{r['ok']}</td><td class='n'>{r['fail']}</td>"
        f"<td class='n'>{r['info']}</td><td class='n'>{sum(r.values())}</td></tr>"
        for name, r in table.items())
    return (f"<table><tr><th>{_e(title)}</th><th>ok</th><th>fail</th><th>info</th>"
            f"<th>total</th></tr>{rows}</table>")


def _operations(data: RunData) -> str:
    out = ["<section id='operations'><h2>Operations</h2>",
           "<p class='meta'>ok = happened; fail = certainly did not happen; info = outcome "
           "unknown (a timeout). cas = a write with an expected version. Node (none): the "
           "completion names no node (no node answered, or the workload did not record "
           "which one did).</p>",
           "<div style='display:flex;gap:28px;flex-wrap:wrap'>",
           _count_table("function", data.counts_by("f")),
           _count_table("node that answered", data.counts_by("node"))]
    availability = data.availability()
    out.append("<table><tr><th>availability</th><th>ok</th><th>of</th><th>share</th></tr>"
               + "".join(f"<tr><td>{_e(name)}</td><td class='n'>{ok}</td><td class='n'>{total}"
                         f"</td><td class='n'>{(100.0 * ok / total) if total else 0:.1f} %</td>"
                         f"</tr>" for name, (ok, total) in availability.items())
               + "</table></div>")
    quantiles = data.latency_quantiles()
    if quantiles:
        names = [k for k in quantiles[0] if k not in ("f", "count")]
        out.append("<h3>Latency of ok operations (ms)</h3><table><tr><th>function</th>"
                   "<th>count</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>")
        for row in quantiles:
            out.append(f"<tr><td>{_e(row['f'])}</td><td class='n'>{row['count']}</td>" + "".join(
                f"<td class='n'>{row[n]:.1f}</td>" for n in names) + "</tr>")
        out.append("</table>")
    stale = data.results.get("stale_reads") or {}
    if stale.get("stale_reads"):
        out.append(f"<p>Stale reads: {stale.get('lagging')} of {stale.get('stale_reads')} "
                   f"returned an older version than one already acknowledged (up to "
                   f"{stale.get('max_versions_behind')} versions behind).</p>")
    out.append("</section>")
    return "\n".join(out)


def _configuration(data: RunData) -> str:
    config = dict(data.test.get("config") or {})
    config.pop("argv", None)
    workload = data.test.get("workload") or {}
    argv = data.test.get("argv")
    out = ["<section id='configuration'><h2>Configuration</h2>"]
    if argv:
        out.append(f"<p>Command line as given: <code>{_e(' '.join(argv))}</code></p>")
    out.append("<div style='display:flex;gap:28px;flex-wrap:wrap'>")
    for title, mapping in (("run", config), ("workload", workload)):
        out.append(f"<table><tr><th colspan='2'>{title}</th></tr>" + "".join(
            f"<tr><td>{_e(k)}</td><td><code>{_e(json.dumps(v, default=str))}</code></td></tr>"
            for k, v in mapping.items()) + "</table>")
    out.append("</div></section>")
    return "\n".join(out)


def _files(data: RunData) -> str:
    out = ["<section id='files'><h2>Files and node logs</h2><ul>"]
    for name in RUN_FILES:
        path = data.run_dir / name
        if path.exists():
            out.append(f"<li><a href='{name}'>{name}</a> <span class='meta'>"
                       f"({_size(path.stat().st_size)})</span></li>")
    out.append("</ul><h3>Node logs</h3>")
    logs = data.node_logs
    if logs:
        out.append("<ul>" + "".join(
            f"<li><a href='nodes/{_e(p.name)}'>nodes/{_e(p.name)}</a> <span class='meta'>"
            f"({_size(p.stat().st_size)})</span></li>" for p in logs) + "</ul>")
    else:
        out.append("<p>No node logs were collected.</p>")
    out.append("</section>")
    return "\n".join(out)


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def _records(data: RunData, cited: set[int]) -> str:
    if not cited or not data.lines:
        return ""
    out = ["<section id='records'><h2>Records cited (lines of "
           "<a href='history.jsonl'>history.jsonl</a>, verbatim)</h2>"]
    for line in sorted(cited):
        text = data.lines[line - 1] if 0 < line <= len(data.lines) else "(no such line)"
        out.append(f"<div class='rec' id='L{line}'><a class='ln' href='#L{line}'>{line}</a>"
                   f"{_e(text)}</div>")
    out.append("</section>")
    return "\n".join(out)

