"""Counterexamples say what a person needs: the prefix that works, the state, the operation that
cannot be placed and why; the HTML timeline shows the same, escaped, one lane per process."""

from __future__ import annotations

from dataclasses import replace

from checker import check_linearizable, models
from checker.timeline import FAILING_OP_ANCHOR, failing_op_anchor, failure_window, render_html
from histories.ops import Op, OpType
from histories.pairing import pair_operations


def _stale_read_history(value_b: object = 2) -> list[Op]:
    spec = [
        (0, OpType.INVOKE, "write", 1),
        (0, OpType.OK, "write", 1),
        (1, OpType.INVOKE, "write", value_b),
        (1, OpType.OK, "write", value_b),
        (2, OpType.INVOKE, "read", None),
        (3, OpType.INVOKE, "write", 9),  # never completes: may or may not have happened
        (2, OpType.OK, "read", 1),  # stale: the write of value_b had completed
    ]
    return [Op(index=i, process=p, type=t, f=f, value=v) for i, (p, t, f, v) in enumerate(spec)]


def test_counterexample_names_prefix_state_blocking_operation_and_candidates() -> None:
    result = check_linearizable(_stale_read_history(), models.cas_register(0))
    assert result.valid is False
    (cx,) = result.counterexamples
    assert [p.description for p in cx.prefix] == ["write(1)", "write(2)"]
    assert cx.state == "2"
    assert cx.blocking_description == "read() -> 1"
    outcomes = {c.description: c.outcome for c in cx.candidates}
    assert outcomes["read() -> 1"] == "illegal in state 2"
    assert outcomes["write(9) (unknown outcome)"].startswith("-> 9")
    text = cx.text()
    assert "longest linearizable prefix: 2 of 4 operations" in text
    assert "cannot place: [4..6] p2 read() -> 1" in text
    assert cx.to_json()["blocking"]["op"]["invoke_index"] == 4


def test_timeline_has_a_lane_per_process_marks_the_failure_and_escapes_values() -> None:
    history = _stale_read_history(value_b="<script>alert(1)</script>")
    model = models.cas_register(0)
    operations = pair_operations(history)
    result = check_linearizable(operations, model)
    page = render_html(result, operations, model, title="t<1>")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)" in page
    assert page.count("class='lane'") == 4
    assert page.count("class='bar blocking'") == 1
    assert "class='bar unknown candidate'" in page  # the pending write could go next
    assert "1. write(1)" in page and "2. write(" in page


def test_valid_history_timeline_shows_every_operation() -> None:
    history = _stale_read_history()[:4]
    model = models.cas_register(0)
    operations = pair_operations(history)
    page = render_html(check_linearizable(operations, model), operations, model)
    assert "linearizable" in page and page.count("class='bar") == 2


def _long_history_with_a_stale_read_at_the_end(writes: int) -> list[Op]:
    """`writes` sequential writes by two processes, then a read of the first value: the
    failure is at the very end, past any count of operations drawn from the start."""
    spec = []
    for n in range(writes):
        spec += [(n % 2, OpType.INVOKE, "write", n), (n % 2, OpType.OK, "write", n)]
    spec += [(7, OpType.INVOKE, "write", -1)]  # never completes
    spec += [(5, OpType.INVOKE, "read", None), (5, OpType.OK, "read", 0)]
    return [Op(index=i, process=p, type=t, f=f, value=v) for i, (p, t, f, v) in enumerate(spec)]


def test_the_text_names_the_write_the_failing_read_contradicts_and_where_its_value_was_written() -> None:
    operations = pair_operations(_long_history_with_a_stale_read_at_the_end(5))
    result = check_linearizable(operations, models.cas_register(None))
    (cx,) = result.counterexamples
    assert cx.last_write is not None and cx.last_write.value == 4
    assert [op.value for op in cx.sources] == [0]
    text = cx.text()
    assert "it contradicts [8..9] p0 write 4" in text and "written by [0..1] p0 write 0" in text


def test_a_long_key_draws_the_window_around_the_failure_and_says_how_many_were_left_out() -> None:
    model = models.cas_register(None)
    operations = pair_operations(_long_history_with_a_stale_read_at_the_end(4000))
    result = check_linearizable(operations, model)
    (cx,) = result.counterexamples
    shown, left_out = failure_window(cx, limit=100)
    assert cx.blocking in shown and len(shown) == 100 and left_out == len(operations) - 100
    assert cx.last_write in shown and cx.sources[0] in shown
    page = render_html(result, operations, model)
    assert page.count("class='bar blocking'") == 1  # the read that cannot be placed is drawn
    assert f"{len(operations) - 3000} left out" in page
    # The key is refuted from its last write on (checker/windows.py): the write it contradicts
    # is placed, the first write (of the value the read returned) outlined, before the window.
    assert "class='bar contradicted prefix'" in page and "class='bar source'" in page
    assert "class='bar unknown candidate'" in page and ">? write(-1)" in page  # unknown stays distinct


def test_the_timeline_page_opens_on_the_failing_operation_however_long_the_key() -> None:
    # 4,000 writes then a stale read: past the 3,000 drawn, and tens of thousands of pixels wide.
    operations = pair_operations(_long_history_with_a_stale_read_at_the_end(4000))
    model = models.cas_register(None)
    result = check_linearizable(operations, model)
    page = render_html(result, operations, model)
    # Exactly one anchor, on the red bar of the operation that cannot be placed.
    assert page.count(f"id='{FAILING_OP_ANCHOR}'") == 1
    assert f"<div id='{FAILING_OP_ANCHOR}' class='bar blocking'" in page
    assert f"href='#{FAILING_OP_ANCHOR}'" in page
    assert "scrollIntoView" in page  # the page scrolls there on load, fragment or not
    valid = render_html(check_linearizable(operations[:-1], model), operations[:-1], model)
    assert "<script>" not in valid and FAILING_OP_ANCHOR not in valid  # nothing to go to


def test_each_invalid_key_has_its_own_failing_op_anchor() -> None:
    records = []
    for k, key in enumerate(("a", "b")):
        for op in _stale_read_history():
            records.append(replace(op, index=len(records), key=key, process=op.process + 10 * k))
    operations = pair_operations(records)
    model = models.cas_register(0)
    result = check_linearizable(operations, model, all_keys=True)
    assert len(result.counterexamples) == 2
    page = render_html(result, operations, model)
    assert page.count(f"id='{failing_op_anchor(0)}'") == 1 and page.count(f"id='{failing_op_anchor(1)}'") == 1
