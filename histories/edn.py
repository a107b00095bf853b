"""Import Jepsen's `history.edn` (and Porcupine's key-value logs, which are EDN maps per line).

Jepsen writes a history either as one vector of op maps or as one map per line, with `;`
comments: `{:process 3, :type :invoke, :f :cas, :value [1 2]}`. Multi-key tests built with
`jepsen.independent` wrap each value in a `[key value]` tuple (printed as a vector, or as the
tagged record `#jepsen.independent.Tuple{:key k, :value v}`); those become the record's `key`
and `value`. Nemesis entries (`:process :nemesis`) become events (string process).

Parsing: histories.edn_reader reads the part of EDN Jepsen writes, about 10x faster; anything
else goes to the maintained `edn-format` reader (never ad-hoc patterns on op lines). Must never guess
a value: an op map without `:process`, `:type` or `:f`, an unknown type or unreadable EDN
raises HistoryError with the file and (where it can be located) the line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import edn_format
from edn_format import EDNDecodeError, ImmutableDict, ImmutableList, Keyword, Symbol

from histories import edn_reader
from histories.ops import HistoryError, Op, OpType

_TYPES = {t.value: t for t in OpType}
_KNOWN_KEYS = {"process", "type", "f", "value", "time", "index", "error", "key"}


class IndependentTuple(tuple):
    """A `jepsen.independent` [key value] pair read from a tagged record."""


def _tuple_tag(body: Any) -> IndependentTuple:
    if isinstance(body, ImmutableDict | dict):
        return IndependentTuple((body.get(Keyword("key")), body.get(Keyword("value"))))
    return IndependentTuple(tuple(body))


def _record_tag(body: Any) -> Any:
    return body  # e.g. #jepsen.history.Op{...}: the map inside is the op


edn_format.add_tag("jepsen.independent.Tuple", _tuple_tag)
edn_format.add_tag("jepsen.history.Op", _record_tag)


_PLAIN = frozenset({int, str, bool})


def to_python(value: Any) -> Any:
    """EDN data -> hashable Python values: vectors/lists -> tuples, keywords -> ':name' text,
    maps -> sorted tuples of pairs, sets -> frozensets. Strings, numbers, nil unchanged."""
    if value is None or type(value) in _PLAIN:  # most values: answered with one test
        return value
    if isinstance(value, IndependentTuple):
        return IndependentTuple(to_python(v) for v in value)
    if isinstance(value, Keyword):
        return ":" + value.name
    if isinstance(value, Symbol):
        return str(value)
    if isinstance(value, ImmutableList | list | tuple):
        return tuple(to_python(v) for v in value)
    if isinstance(value, ImmutableDict | dict):
        return tuple(sorted(((to_python(k), to_python(v)) for k, v in value.items()), key=repr))
    if isinstance(value, frozenset | set):
        return frozenset(to_python(v) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"number {value} is not finite (NaN and infinities are refused)")
    return value


def parse_edn_value(text: str) -> Any:
    """One EDN value (e.g. the CLI's `--init 0` or `nil`) in the form the importer produces."""
    try:
        return to_python(edn_format.loads(text))
    except (EDNDecodeError, NotImplementedError) as exc:
        raise ValueError(f"not an EDN value: {text!r} ({exc})") from exc


def read_edn_history(path: str | Path, *, independent: bool | None = None) -> list[Op]:
    """Records of a Jepsen EDN history. `independent=None` detects `jepsen.independent`
    tuples (tagged tuples, or reads invoked with a `[key nil]` vector)."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"cannot read the file: {exc}", path=name) from exc
    maps = _parse_maps(text, name)
    lines = _record_lines(text, len(maps))
    return records_from_maps(maps, path=name, lines=lines, independent=independent)


def records_from_maps(
    maps: list[Any],
    *,
    path: str | None = None,
    lines: list[int | None] | None = None,
    independent: bool | None = None,
) -> list[Op]:
    raw = [_op_fields(m, path, lines[i] if lines else None) for i, m in enumerate(maps)]
    if independent is None:
        independent = _looks_independent(raw)
    records = []
    for index, (fields, line) in enumerate(raw):
        key = fields.pop("key", None)
        value = fields["value"]
        if independent and fields["process_is_client"]:
            if not (isinstance(value, tuple) and len(value) == 2):
                raise HistoryError(
                    f"jepsen.independent history, but this op's value {value!r} is not a "
                    f"[key value] tuple",
                    path=path,
                    line=line,
                )
            key, value = value
        records.append(
            Op(
                index=index,
                process=fields["process"],
                type=fields["type"],
                f=fields["f"],
                key=key,
                value=tuple(value) if isinstance(value, IndependentTuple) else value,
                time=fields["time"],
                error=fields["error"],
                extra=fields["extra"],
                line=line,
            )
        )
    return records


_TAGS = {"jepsen.independent.Tuple": _tuple_tag, "jepsen.history.Op": _record_tag}


def _parse_maps(text: str, path: str) -> list[Any]:
    try:
        values = edn_reader.read_all(text, _TAGS)
    except edn_reader.EdnValueError as exc:
        raise HistoryError(exc.reason, path=path, line=exc.line) from None
    except (edn_reader.Unsupported, ValueError):
        # Outside the part of EDN the fast reader knows, or malformed: edn-format decides
        # (and _locate_error says where).
        try:
            values = edn_format.loads_all(text)
        except (EDNDecodeError, NotImplementedError, ValueError) as exc:
            line, reason = _locate_error(text, exc)
            raise HistoryError(f"unreadable EDN: {reason}", path=path, line=line) from exc
        except RecursionError:
            raise HistoryError("unreadable EDN: values nested too deeply", path=path) from None
    if len(values) == 1 and isinstance(values[0], ImmutableList | list | tuple):
        values = list(values[0])
    return values


def _locate_error(text: str, exc: Exception) -> tuple[int | None, str]:
    """edn-format gives no positions: re-parse line by line to find the first bad line."""
    lines = text.split("\n")
    last_content = max((i for i, s in enumerate(lines) if s.strip()), default=None)
    for number, raw in enumerate(lines, start=1):
        body = raw.split(";", 1)[0].strip() if raw.lstrip().startswith(";") else raw.strip()
        if number == 1:
            body = body.removeprefix("[")
        if number - 1 == last_content:
            body = body.removesuffix("]")
        if not body or body.startswith(";"):
            continue
        try:
            edn_format.loads(body)
        except (EDNDecodeError, NotImplementedError, ValueError) as line_exc:
            truncated = number - 1 == last_content and not text.endswith("\n")
            what = "truncated last line" if truncated else str(line_exc) or type(line_exc).__name__
            return number, what
    return None, str(exc) or type(exc).__name__


def _record_lines(text: str, count: int) -> list[int | None]:
    """Line numbers of op maps when the file has one per line (the usual Jepsen layout)."""
    starts = [
        n
        for n, raw in enumerate(text.split("\n"), start=1)
        if raw.lstrip().lstrip("[").lstrip().startswith("{")
    ]
    if len(starts) == count:
        return list(starts)
    return [None] * count


def _op_fields(m: Any, path: str | None, line: int | None) -> tuple[dict[str, Any], int | None]:
    def fail(reason: str) -> HistoryError:
        return HistoryError(reason, path=path, line=line)

    if not isinstance(m, ImmutableDict | dict):
        raise fail(f"expected an op map {{:process .. :type .. :f ..}}, got {m!r}")
    get = {(k.name if isinstance(k, Keyword) else str(k)): v for k, v in m.items()}
    for required in ("process", "type", "f"):
        if required not in get:
            raise fail(f"op map without :{required}")
    process = get["process"]
    if isinstance(process, Keyword):
        process = process.name
    elif isinstance(process, bool) or not isinstance(process, int):
        raise fail(f":process must be an integer or a keyword, got {process!r}")
    kind = get["type"]
    kind_name = kind.name if isinstance(kind, Keyword) else kind
    if kind_name not in _TYPES:
        raise fail(f"unknown :type {kind!r} (expected :invoke, :ok, :fail or :info)")
    f = get["f"]
    f_name = f.name if isinstance(f, Keyword) else str(f)
    time = get.get("time")
    error = get.get("error")
    try:
        value = to_python(get.get("value"))
        others = get.keys() - _KNOWN_KEYS
        extra = tuple((k, to_python(get[k])) for k in sorted(others)) if others else ()
    except ValueError as exc:
        raise fail(str(exc)) from None
    except RecursionError:
        raise fail("values nested too deeply") from None
    fields = {
        "process": process,
        "process_is_client": isinstance(process, int),
        "type": _TYPES[kind_name],
        "f": f_name,
        "value": value,
        "time": time if isinstance(time, int) and not isinstance(time, bool) else None,
        "error": None if error is None else str(to_python(error)),
        "extra": extra,
    }
    if "key" in get:
        fields["key"] = to_python(get["key"])
    return fields, line


def _looks_independent(raw: Iterable[tuple[dict[str, Any], int | None]]) -> bool:
    tagged = False
    vector_reads = False
    plain_reads = False
    for fields, _ in raw:
        value = fields["value"]
        if isinstance(value, IndependentTuple):
            tagged = True
        if fields["process_is_client"] and fields["f"] == "read" and fields["type"] is OpType.INVOKE:
            if isinstance(value, tuple) and len(value) == 2:
                vector_reads = True
            else:
                plain_reads = True
    return tagged or (vector_reads and not plain_reads)
