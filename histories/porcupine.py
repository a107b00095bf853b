"""Import Porcupine's two test-data formats so its published histories can be checked.

1. Jepsen etcd logs (`test_data/jepsen/etcd_NNN.log`): lines such as
   `INFO  jepsen.util - 3<TAB>:invoke<TAB>:cas<TAB>[1 2]` (process, type, f, value; some logs use
   spaces instead of tabs); other
   lines are log noise and are skipped. As in Porcupine's own reader: `:fail :read :timed-out`
   and `:info ... :timed-out` have an unknown outcome (recorded as `info`), while `:fail :cas`
   is etcd saying the compare did not match (kept as `fail`; the `etcd` model reads it so).
2. Key-value logs (`test_data/kv/cNN-*.txt`): one EDN map per line with `:key` and `:value`.

Must never guess: a `jepsen.util` line whose fields cannot be read raises HistoryError with
the line number.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from histories.ops import HistoryError, Op, OpType

# Fields are tab-separated in most logs and space-separated in a few (etcd_100, etcd_102).
_LINE = re.compile(r"^INFO\s+jepsen\.util\s+-\s+(\S+)\s+(:\S+)\s+(\S+)\s+(.*)$")
_TYPES = {":invoke": OpType.INVOKE, ":ok": OpType.OK, ":fail": OpType.FAIL, ":info": OpType.INFO}


def read_etcd_log(path: str | Path) -> list[Op]:
    """Records of a Jepsen etcd log as Porcupine reads it."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"cannot read the file: {exc}", path=name) from exc
    records: list[Op] = []
    trusted = Op.trusted
    for number, raw in enumerate(text.splitlines(), start=1):
        if "jepsen.util" not in raw:
            continue
        # The common shape first, without the regular expression (half of reading a long
        # log was it and the generic value parser): `INFO  jepsen.util - P<TAB>:type<TAB>:f<TAB>value`
        # with a plain process number, a known type and a nil / integer / [a b] value.
        if raw.startswith(_PREFIX):
            fields = raw[len(_PREFIX):].split("\t")
            if (len(fields) == 4 and fields[0].isdecimal() and fields[1] in _TYPES
                    and fields[2][:1] == ":" and " " not in fields[2]):
                value = _FAST_VALUES.get(fields[3], _NO_FAST_VALUE)
                if value is _NO_FAST_VALUE:
                    value = _fast_value(fields[3])
                if value is not _NO_FAST_VALUE:
                    records.append(trusted(index=len(records), process=int(fields[0]), type=_TYPES[fields[1]],
                                           f=fields[2][1:], value=value, line=number))
                    continue
        match = _LINE.match(raw.rstrip("\r"))
        if match is None:
            if re.match(r"^INFO\s+jepsen\.util\s+-\s+\d+\s+:", raw):
                raise HistoryError(
                    "jepsen.util op line without the 4 fields process, type, f, value",
                    path=name,
                    line=number,
                )
            continue  # a log message, not an op
        process_text, type_text, f_text, value_text = match.groups()

        def fail(reason: str, number: int = number) -> HistoryError:
            return HistoryError(reason, path=name, line=number)

        if not process_text.isdigit():
            continue  # e.g. the nemesis logs through jepsen.util too
        if type_text not in _TYPES:
            raise fail(f"unknown type {type_text!r}")
        if not f_text.startswith(":"):
            raise fail(f"function {f_text!r} is not a keyword")
        kind = _TYPES[type_text]
        value = _value(value_text.strip(), fail)
        error = None
        if value == ":timed-out":
            value, error = None, "timed-out"
            if kind is OpType.FAIL:
                # Porcupine: a timed-out read is unknown, not a definite failure.
                kind = OpType.INFO
        records.append(
            Op(
                index=len(records),
                process=int(process_text),
                type=kind,
                f=f_text[1:],
                value=value,
                error=error,
                line=number,
            )
        )
    return records


_PREFIX = "INFO  jepsen.util - "
_NO_FAST_VALUE = object()
_FAST_VALUES = {"nil": None}


def _fast_value(text: str) -> Any:
    """nil, a plain integer or [int int], else _NO_FAST_VALUE (the full parser decides)."""
    if text.isdecimal():
        return int(text)
    if text[:1] == "[" and text[-1:] == "]":
        parts = text[1:-1].split(" ")
        if len(parts) == 2 and parts[0].isdecimal() and parts[1].isdecimal():
            return (int(parts[0]), int(parts[1]))
    return _NO_FAST_VALUE


def _value(text: str, fail: Any) -> Any:
    if text == "nil":
        return None
    if text.startswith(":"):
        return text
    if text.startswith("["):
        parts = text.strip("[]").split()
        try:
            return tuple(None if p == "nil" else int(p) for p in parts)
        except ValueError:
            raise fail(f"cannot read the vector value {text!r}") from None
    try:
        return int(text)
    except ValueError:
        raise fail(f"cannot read the value {text!r} (expected nil, an integer or [a b])") from None


def read_kv_log(path: str | Path) -> list[Op]:
    """Records of a Porcupine key-value log (EDN maps with :key)."""
    from histories.edn import read_edn_history  # only here: etcd logs must not pay for edn_format

    return read_edn_history(path, independent=False)
