"""Read and validate a `history.jsonl` file (format: docs/histories.md).

Every problem is reported as HistoryError with the file, the line number and what is wrong:
a line that is not JSON, a missing or mistyped field, an unknown type, indexes out of order,
a completion without an invoke, a process with two operations in flight, a process that
invokes again after `info`, and a truncated last line (the harness died mid-write).

Must never repair input silently: the only tolerance is `allow_truncated_tail=True`, which
drops a last line that has no newline and does not parse, and says so in the result.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from histories.ops import RECORD_FIELDS, HistoryError, Op, Operation, OpType
from histories.pairing import pair_operations

_TYPES = {t.value: t for t in OpType}
_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "time": (int,),
    "version": (int,),
    "expected_version": (int,),
    "applied": (bool,),
    "node": (str,),
    "term": (int,),
    "error": (str,),
    "consistency": (str,),
}
_CONSISTENCIES = ("linearizable", "stale")


@dataclass(frozen=True)
class ReadReport:
    """What `read_history_report` found besides the records."""

    records: list[Op]
    dropped_truncated_tail: bool


def read_history(path: str | Path, *, allow_truncated_tail: bool = False) -> list[Op]:
    """All records of a history.jsonl file, validated (pairing rules included)."""
    return read_history_report(path, allow_truncated_tail=allow_truncated_tail).records


def read_operations(path: str | Path, *, allow_truncated_tail: bool = False) -> list[Operation]:
    """The client operations of a history.jsonl file, each invoke paired with its completion."""
    records = read_history(path, allow_truncated_tail=allow_truncated_tail)
    return pair_operations(records, path=str(path), strict=True)


def read_history_report(path: str | Path, *, allow_truncated_tail: bool = False) -> ReadReport:
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise HistoryError(f"cannot read the file: {exc.strerror or exc}", path=name) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise HistoryError(f"not UTF-8 text (byte {exc.start})", path=name, line=line) from exc
    lines = text.split("\n") if text else []  # an empty file is an empty history
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines.pop()  # the empty string after the final newline
    records: list[Op] = []
    dropped = False
    last_time: int | None = None
    for number, raw in enumerate(lines, start=1):
        is_last = number == len(lines)
        if not raw.strip():
            raise HistoryError("empty line (one JSON object per line expected)", path=name, line=number)
        try:
            obj = _loads(raw)
        except _NotFinite as exc:
            raise HistoryError(str(exc), path=name, line=number) from None
        except RecursionError:
            raise HistoryError("value nested too deeply", path=name, line=number) from None
        except json.JSONDecodeError as exc:
            if is_last and not ends_with_newline:
                if allow_truncated_tail:
                    dropped = True
                    break
                raise HistoryError(
                    f"truncated last line ({len(raw)} bytes, no newline, not valid JSON: "
                    f"{exc.msg}); the harness probably died while writing it. The "
                    f"{len(records)} records before it are intact",
                    path=name,
                    line=number,
                ) from exc
            raise HistoryError(f"not valid JSON: {exc.msg} at column {exc.colno}", path=name, line=number) from exc
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise HistoryError(f"unreadable value: {exc}", path=name, line=number) from None
        try:
            record = parse_record(obj, expected_index=len(records), path=name, line=number)
        except RecursionError:
            raise HistoryError("value nested too deeply", path=name, line=number) from None
        if record.time is not None:
            if last_time is not None and record.time < last_time:
                raise HistoryError(
                    f"time {record.time} ns is earlier than the previous record's {last_time} ns "
                    f"(times are monotonic)",
                    path=name,
                    line=number,
                )
            last_time = record.time
        records.append(record)
    pair_operations(records, path=name, strict=True)  # raises on pairing errors
    return ReadReport(records=records, dropped_truncated_tail=dropped)


class _NotFinite(ValueError):
    """NaN or an infinite number: no model can compare it, and JSON does not allow it."""


def _reject_constant(name: str) -> Any:
    raise _NotFinite(f"{name} is not a number JSON allows (NaN and infinities are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"number {text[:40]} is out of range (not finite)")
    return value


def _loads(raw: str) -> Any:
    return json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)


def parse_record(obj: Any, *, expected_index: int | None, path: str | None, line: int | None) -> Op:
    """One JSON object -> Op, checking every field of the stable format."""

    def fail(reason: str) -> HistoryError:
        return HistoryError(reason, path=path, line=line)

    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")
    for required in ("index", "process", "type", "f"):
        if required not in obj:
            raise fail(f"missing field {required!r}")
    index = obj["index"]
    if not isinstance(index, int) or isinstance(index, bool):
        raise fail(f"'index' must be an integer, got {index!r}")
    if expected_index is not None and index != expected_index:
        raise fail(f"'index' is {index}, expected {expected_index} (records are numbered 0, 1, 2... in order)")
    process = obj["process"]
    if isinstance(process, bool) or not isinstance(process, int | str):
        raise fail(f"'process' must be an integer (client) or a string (e.g. 'nemesis'), got {process!r}")
    type_name = obj["type"]
    if type_name not in _TYPES:
        raise fail(f"unknown type {type_name!r} (expected one of invoke, ok, fail, info)")
    f = obj["f"]
    if not isinstance(f, str) or not f:
        raise fail(f"'f' must be a non-empty string, got {f!r}")
    fields: dict[str, Any] = {}
    for name, types in _OPTIONAL_TYPES.items():
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types:
            raise fail(f"{name!r} must be {types[0].__name__} or null, got {value!r}")
        if not isinstance(value, types):
            raise fail(f"{name!r} must be {types[0].__name__} or null, got {value!r}")
        fields[name] = value
    if fields.get("consistency") not in (None, *_CONSISTENCIES):
        raise fail(f"'consistency' must be one of {_CONSISTENCIES}, got {fields['consistency']!r}")
    extra = tuple((k, v) for k, v in obj.items() if k not in RECORD_FIELDS)
    return Op(
        index=index,
        process=process,
        type=_TYPES[type_name],
        f=f,
        key=_freeze(obj.get("key")),
        value=_freeze(obj.get("value")),
        extra=extra,
        line=line,
        **fields,
    )


def thaw_object(value: Any) -> dict[str, Any]:
    """A JSON object as `_freeze` left it (sorted (key, value) pairs) back to a dict; {}
    for anything else. Event records' values (a nemesis event's fields) are read so."""
    if isinstance(value, dict):
        return value
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2
                                        and isinstance(p[0], str) for p in value):
        return dict(value)
    return {}


def _freeze(value: Any) -> Any:
    """JSON lists become tuples so that values are hashable model inputs."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value
