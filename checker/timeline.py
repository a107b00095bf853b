"""An HTML timeline of a history: one lane per process, each operation a bar from its invoke
to its completion, in the spirit of Porcupine's visualization and Knossos' linear.svg.

For an invalid key the bars are coloured: the longest linearizable prefix (numbered in its
linearization order), the operations that could have come next (orange) and the operation
that cannot be placed (red). Operations with an unknown outcome extend to the end, hatched.
The page is self-contained (no network). It opens on the operation that cannot be placed,
however wide the timeline: that bar has the id `failing-op` (FAILING_OP_ANCHOR; the next
keys' `failing-op-2`, ...), links to the page carry `#failing-op`, and one small inline
script centres the bar on load when the link had no fragment (the only script; it reads
nothing from the history). Must never embed unescaped history text: every value goes
through html.escape.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from checker.models import Model
from checker.result import Counterexample, Result
from histories.ops import Operation, OpType

_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 28px; }
.verdict-true { color: #17702a; } .verdict-false { color: #b00020; } .verdict-unknown { color: #a15c00; }
.timeline { position: relative; border-top: 1px solid #ccc; overflow-x: auto; }
.lane { position: relative; height: 26px; border-bottom: 1px solid #eee; }
.lane-label { position: absolute; left: 0; width: 56px; top: 5px; color: #666; font-size: 11px; }
.bar { position: absolute; top: 3px; height: 18px; border-radius: 3px; background: #c9d7ea;
       border: 1px solid #7d96b8; font-size: 11px; white-space: nowrap; overflow: hidden;
       text-overflow: ellipsis; padding: 0 3px; box-sizing: border-box; }
.bar:hover { overflow: visible; z-index: 2; background-clip: padding-box; }
.bar.unknown { background: repeating-linear-gradient(45deg, #e4e4e4, #e4e4e4 4px, #f4f4f4 4px, #f4f4f4 8px);
               border-style: dashed; }
.bar.failed-op { opacity: 0.45; }
.bar.prefix { background: #c8e6c9; border-color: #4c9a52; }
.bar.candidate { background: #ffe0b2; border-color: #e08a00; }
.bar.blocking { background: #ffcdd2; border: 2px solid #b00020; font-weight: bold; }
.bar.contradicted { border: 2px solid #6a1b9a; }
.bar.source { border: 2px dotted #6a1b9a; }
/* an unknown outcome stays hatched and dashed whatever else it is */
.bar.unknown.prefix { background: repeating-linear-gradient(45deg, #c8e6c9, #c8e6c9 4px, #f4f4f4 4px, #f4f4f4 8px); border-style: dashed; }
.bar.unknown.candidate { background: repeating-linear-gradient(45deg, #ffe0b2, #ffe0b2 4px, #f4f4f4 4px, #f4f4f4 8px); border-style: dashed; }
.legend span { display: inline-block; padding: 1px 6px; margin-right: 8px; border-radius: 3px; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
"""

FAILING_OP_ANCHOR = "failing-op"
# Without a fragment in the link (or with one naming nothing here) the browser would open the
# page at its top left, thousands of pixels from the failure: centre the failing bar instead.
_SCROLL_TO_FAILURE = f"""<script>
(function () {{
  var wanted = location.hash.slice(1);
  var target = (wanted && document.getElementById(wanted)) || document.getElementById('{FAILING_OP_ANCHOR}');
  if (target) target.scrollIntoView({{block: 'center', inline: 'center'}});
}})();
</script>"""

_LANE_LABEL_PX = 60
_MAX_OPS = 3000  # beyond this a page is unreadable and heavy; the text report says the rest


def render_html(
    result: Result, operations: Sequence[Operation], model: Model, *, title: str = "history"
) -> str:
    """The whole report page: verdict, per-key summary, and a timeline per shown key."""
    verdict = {True: "linearizable", False: "NOT linearizable", "unknown": "unknown"}[result.valid]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}: {verdict}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}: <span class='verdict-{str(result.valid).lower()}'>{verdict}</span></h1>",
        f"<p>model {html.escape(result.model)}, {result.counts.get('operations', 0)} operations, "
        f"{result.counts.get('keys', 0)} keys, {result.seconds:.3f} s"
        + (f"; {html.escape(result.note)}" if result.note else "")
        + "</p>",
        "<p class='legend'><span class='key bar prefix' style='position:static'>linearized prefix</span>"
        "<span class='key bar candidate' style='position:static'>could go next</span>"
        "<span class='key bar blocking' style='position:static'>cannot be placed</span>"
        "<span class='key bar unknown' style='position:static'>? outcome unknown</span>"
        "<span class='key bar contradicted' style='position:static'>the write it contradicts</span>"
        "<span class='key bar source' style='position:static'>writes the value it needs</span></p>",
    ]
    counterexamples = result.counterexamples
    if counterexamples:
        parts.append(
            f"<p><a href='#{FAILING_OP_ANCHOR}'>Go to the operation that cannot be placed</a> "
            "(the page opens there; it is the red bar).</p>"
        )
        for n, cx in enumerate(counterexamples):
            parts.append(f"<h2>key {html.escape(repr(cx.key))}</h2>")
            parts.append(f"<pre>{html.escape(cx.text())}</pre>")
            shown, left_out = failure_window(cx)
            if left_out:
                parts.append(
                    f"<p>{len(cx.operations)} operations on this key: drawn are the {len(shown)} around the "
                    f"failure (the operation that cannot be placed, every operation concurrent with it, "
                    f"the candidates, the write it contradicts and the last operations of the linearizable "
                    f"prefix); {left_out} left out.</p>"
                )
            parts.append(_timeline(shown, model, cx, anchor=failing_op_anchor(n)))
    else:
        shown = list(operations)[:_MAX_OPS]
        if len(operations) > _MAX_OPS:
            parts.append(f"<p>showing the first {_MAX_OPS} of {len(operations)} operations</p>")
        parts.append(_timeline(shown, model, None))
    if counterexamples:
        parts.append(_SCROLL_TO_FAILURE)
    parts.append("</body></html>")
    return "\n".join(parts)


def failing_op_anchor(n: int = 0) -> str:
    """The id of the bar of the n-th invalid key's operation that cannot be placed."""
    return FAILING_OP_ANCHOR if n == 0 else f"{FAILING_OP_ANCHOR}-{n + 1}"


def failure_window(cx: Counterexample, limit: int = _MAX_OPS) -> tuple[list[Operation], int]:
    """The operations to draw for an invalid key, at most `limit`, and how many are left out.

    Never drops the operation that cannot be placed: first it, the write it contradicts and
    where its value comes from, then every operation concurrent with it, then the candidates
    that could have gone next, then the linearizable prefix from its end backwards."""
    if len(cx.operations) <= limit:
        return list(cx.operations), 0
    blocking = cx.blocking
    chosen: dict[int, Operation] = {blocking.id: blocking}

    def take(ops: Sequence[Operation]) -> None:
        for op in ops:
            if len(chosen) >= limit:
                return
            chosen.setdefault(op.id, op)

    take([op for op in (cx.last_write, *cx.sources) if op is not None])
    assert blocking.ret is not None
    take([op for op in cx.operations if op.call < blocking.ret and (op.ret is None or op.ret > blocking.call)])
    take([c.op for c in cx.candidates])
    take([p.op for p in reversed(cx.prefix)])
    # A prefix that starts at a cut (checker/windows.py) is short: the operations just before
    # the failure fill the rest.
    take([op for op in reversed(cx.operations) if op.call < blocking.call])
    shown = sorted(chosen.values(), key=lambda op: op.call)
    return shown, len(cx.operations) - len(shown)


def _timeline(
    operations: Sequence[Operation], model: Model, cx: Counterexample | None, *, anchor: str = ""
) -> str:
    operations = list(operations)[:_MAX_OPS] if cx is None else list(operations)
    if not operations:
        return "<p>no operations</p>"
    # The x axis is the order of this key's own invokes and completions (real-time order is
    # all that linearizability looks at), so a key spread thinly over a long history stays
    # readable; unknown outcomes run to one step past the last completion.
    points = sorted({op.call for op in operations} | {op.ret for op in operations if op.ret is not None})
    rank = {position: n for n, position in enumerate(points)}
    end = len(points)
    start = 0
    px = max(14.0, min(60.0, 1600.0 / max(1, end)))
    width = int((end + 1) * px) + _LANE_LABEL_PX + 20
    order = {}
    candidates: set[int] = set()
    blocking = None
    if cx is not None:
        order = {placed.op.id: n for n, placed in enumerate(cx.prefix, start=1)}
        candidates = {c.op.id for c in cx.candidates}
        blocking = cx.blocking.id
    lanes: dict[object, list[Operation]] = {}
    for op in sorted(operations, key=lambda o: o.call):
        lanes.setdefault(op.process, []).append(op)
    rows = [f"<div class='timeline' style='width:{width}px'>"]
    for process in sorted(lanes, key=lambda p: (str(type(p)), p)):
        rows.append(f"<div class='lane'><span class='lane-label'>p{html.escape(str(process))}</span>")
        for op in lanes[process]:
            left = _LANE_LABEL_PX + (rank[op.call] - start) * px
            right = _LANE_LABEL_PX + ((rank[op.ret] if op.ret is not None else end) - start + 0.85) * px
            classes = ["bar"]
            if op.ret is None:
                classes.append("unknown")
            if op.type is OpType.FAIL:
                classes.append("failed-op")
            label = model.describe_operation(op)
            if cx is not None and cx.last_write is not None and op.id == cx.last_write.id:
                classes.append("contradicted")
            if cx is not None and any(op.id == source.id for source in cx.sources):
                classes.append("source")
            if op.ret is None:
                label = f"? {label}"
            if op.id == blocking:
                classes.append("blocking")
            elif op.id in candidates:
                classes.append("candidate")
            elif op.id in order:
                classes.append("prefix")
                label = f"{order[op.id]}. {label}"
            tip = f"{label} | invoke #{op.call}" + (f", completion #{op.ret}" if op.ret is not None else ", outcome unknown")
            if op.invoke.line is not None:
                tip += f" | line {op.invoke.line}"
            ident = f" id='{anchor}'" if anchor and op.id == blocking else ""
            rows.append(
                f"<div{ident} class='{' '.join(classes)}' style='left:{left:.0f}px;width:{max(4.0, right - left):.0f}px' "
                f"title='{html.escape(tip, quote=True)}'>{html.escape(label)}</div>"
            )
        rows.append("</div>")
    rows.append("</div>")
    return "\n".join(rows)
