"""history.jsonl: the writer leaves a readable prefix, the reader names every malformed line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from histories.ops import HistoryError, OpType
from histories.pairing import pair_operations
from histories.read import read_history, read_history_report, read_operations
from histories.write import HistoryWriter
from tests.checker.histgen import concurrent_history


def _clock():
    t = iter(range(1000, 10**9, 1000))
    return lambda: next(t)


def test_writer_round_trip_pairs_operations(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock_ns=_clock()) as writer:
        a = writer.invoke(0, "put", "k", "v1", expected_version=0)
        b = writer.invoke(1, "get", "k", consistency="linearizable")
        writer.event("nemesis", "partition", ["n1", "n2"])
        writer.complete(a, "ok", "v1", version=1, applied=True, node="n1", term=3)
        writer.complete(b, "info", error="deadline exceeded")
    records = read_history(path)
    assert [r.type for r in records] == [OpType.INVOKE, OpType.INVOKE, OpType.INFO, OpType.OK, OpType.INFO]
    assert records[3].version == 1 and records[3].node == "n1" and records[3].term == 3
    assert records[2].process == "nemesis" and not records[2].is_client
    put, get = read_operations(path)
    assert (put.type, put.expected_version, put.version, put.call, put.ret) == (OpType.OK, 0, 1, 0, 3)
    assert (get.type, get.ret, get.consistency) == (OpType.INFO, None, "linearizable")


def test_every_record_is_on_disk_when_the_call_returns(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path, clock_ns=_clock())
    writer.invoke(0, "put", "k", "v")
    # No close(): a harness killed now still leaves the invoke readable.
    assert len(read_history(path)) == 1
    writer.close()


def test_writer_refuses_a_second_operation_in_flight(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        writer.invoke(0, "get", "k")
        with pytest.raises(ValueError, match="already has operation"):
            writer.invoke(0, "get", "k")


def _write_lines(tmp_path: Path, lines: list[str], *, final_newline: bool = True) -> Path:
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def _rec(index: int, process: int | str, type: str, f: str = "get", **extra) -> str:
    return json.dumps({"index": index, "process": process, "type": type, "f": f, "key": "k", **extra})


def test_truncated_last_line_is_reported_with_its_line(tmp_path: Path) -> None:
    path = _write_lines(tmp_path, [_rec(0, 0, "invoke"), _rec(1, 0, "ok")[:17]], final_newline=False)
    with pytest.raises(HistoryError, match="truncated last line") as caught:
        read_history(path)
    assert caught.value.line == 2 and caught.value.path == str(path)
    report = read_history_report(path, allow_truncated_tail=True)
    assert report.dropped_truncated_tail and len(report.records) == 1


@pytest.mark.parametrize(
    ("lines", "line", "reason"),
    [
        ([_rec(0, 0, "ok")], 1, "without an invoke"),
        ([_rec(0, 0, "invoke"), _rec(1, 0, "invoke")], 2, "still in flight"),
        ([_rec(0, 0, "invoke"), _rec(1, 0, "done")], 2, "unknown type 'done'"),
        ([_rec(0, 0, "invoke"), _rec(2, 0, "ok")], 2, "'index' is 2, expected 1"),
        (['{"index": 0, "process": 0, "type": "invoke"}'], 1, "missing field 'f'"),
        (["[1, 2]"], 1, "expected a JSON object"),
        ([_rec(0, 0, "invoke"), "{nope", _rec(2, 0, "ok")], 2, "not valid JSON"),
        ([_rec(0, 0, "invoke"), _rec(1, 0, "info"), _rec(2, 0, "invoke")], 3, "must be retired"),
        ([_rec(0, 0, "invoke"), _rec(1, 0, "ok", f="put")], 2, "does not match the invoke"),
        ([_rec(0, 0, "invoke", version="3")], 1, "'version' must be int"),
        ([_rec(0, 0, "invoke", time=5), _rec(1, 0, "ok", time=4)], 2, "monotonic"),
        ([_rec(0, True, "invoke")], 1, "'process' must be"),
    ],
)
def test_malformed_input_names_the_line_and_the_problem(tmp_path: Path, lines, line, reason) -> None:
    path = _write_lines(tmp_path, lines)
    with pytest.raises(HistoryError, match=reason) as caught:
        read_history(path)
    assert caught.value.line == line
    assert str(path) in str(caught.value)


def test_missing_file_is_a_history_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="cannot read"):
        read_history(tmp_path / "absent.jsonl")


def test_unknown_fields_are_kept(tmp_path: Path) -> None:
    path = _write_lines(tmp_path, [_rec(0, 0, "invoke", request_id="r-1")])
    (record,) = read_history(path)
    assert dict(record.extra) == {"request_id": "r-1"}
    assert record.to_json()["request_id"] == "r-1"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(concurrent_history(kind="versioned", max_keys=3))
def test_writer_then_reader_round_trip_random_histories(tmp_path_factory, sim) -> None:
    """Any history the op model allows survives HistoryWriter -> read_operations unchanged."""
    path = tmp_path_factory.mktemp("roundtrip") / "history.jsonl"
    invoke_index: dict[int, int] = {}
    with HistoryWriter(path, clock_ns=_clock()) as writer:
        for record in sim.records:
            fields = {
                name: getattr(record, name)
                for name in ("version", "expected_version", "applied")
                if getattr(record, name) is not None
            }
            if record.type is OpType.INVOKE:
                invoke_index[record.process] = writer.invoke(record.process, record.f, record.key, record.value, **fields)
            else:
                writer.complete(invoke_index.pop(record.process), record.type.value, record.value, **fields)
    expected = pair_operations(sim.records)
    actual = read_operations(path)
    assert [(o.process, o.f, o.key, o.value, o.type, o.result, o.version, o.call, o.ret) for o in actual] == [
        (o.process, o.f, o.key, o.value, o.type, o.result, o.version, o.call, o.ret) for o in expected
    ]
