"""Append a history to `history.jsonl` as it happens, one flushed line per record.

The file is created, never overwritten. Each record is written and flushed before the call
returns, so if the harness dies the file holds a readable prefix (at worst a truncated last
line, which the reader reports). The writer numbers records, stamps monotonic time and enforces the op model as it goes (one
operation in flight per process; a completion answers an invoke in flight), so a harness bug
shows up where it happens, not in the checker hours later.

Must never: reorder records, write a completion for an operation that is not in flight, or
buffer records in memory past the call that produced them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from histories.ops import Op, OpType

_SERVER_FIELDS = ("version", "expected_version", "applied", "node", "term", "error", "consistency")


class HistoryWriter:
    """Thread-safe appender. Use as a context manager or call close().

    >>> w = HistoryWriter("history.jsonl")
    >>> i = w.invoke(3, "put", "k", "v1", expected_version=2)
    >>> w.complete(i, "ok", "v1", version=3, node="n1", term=7)
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        fsync: bool = False,
    ) -> None:
        self.path = Path(path)
        self._clock_ns = clock_ns
        self._fsync = fsync
        self._lock = threading.Lock()
        self._file = open(self.path, "x", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._next_index = 0
        self._in_flight: dict[int, Op] = {}  # invoke index -> invoke record
        self._process_busy: dict[int, int] = {}  # process -> invoke index in flight

    def invoke(
        self, process: int, f: str, key: Any = None, value: Any = None, **fields: Any
    ) -> int:
        """Record that `process` starts operation `f`; returns the invoke's index."""
        if isinstance(process, bool) or not isinstance(process, int):
            raise TypeError(f"client process must be an int, got {process!r}")
        with self._lock:
            if process in self._process_busy:
                raise ValueError(
                    f"process {process} already has operation #{self._process_busy[process]} "
                    f"in flight; complete it first (one operation per process)"
                )
            record = self._append(process, OpType.INVOKE, f, key, value, fields)
            self._in_flight[record.index] = record
            self._process_busy[process] = record.index
            return record.index

    def complete(self, invoke_index: int, type: str | OpType, value: Any = None, **fields: Any) -> int:
        """Record the outcome of the invoke at `invoke_index`: 'ok', 'fail' or 'info'."""
        kind = OpType(type)
        if kind is OpType.INVOKE:
            raise ValueError("complete() takes 'ok', 'fail' or 'info', not 'invoke'")
        with self._lock:
            invoke = self._in_flight.pop(invoke_index, None)
            if invoke is None:
                raise ValueError(f"no operation #{invoke_index} in flight to complete")
            del self._process_busy[invoke.process]  # type: ignore[arg-type]
            record = self._append(invoke.process, kind, invoke.f, invoke.key, value, fields)
            return record.index

    def event(self, process: str, f: str, value: Any = None, **fields: Any) -> int:
        """A non-client record (e.g. process 'nemesis', type info): faults in the same timeline."""
        if not isinstance(process, str):
            raise TypeError("event processes are strings such as 'nemesis'")
        with self._lock:
            return self._append(process, OpType.INFO, f, None, value, fields).index

    def in_flight(self) -> list[int]:
        """Invoke indexes not yet completed (the harness records them as info at shutdown)."""
        with self._lock:
            return sorted(self._in_flight)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(
        self, process: int | str, kind: OpType, f: str, key: Any, value: Any, fields: dict[str, Any]
    ) -> Op:
        unknown = set(fields) - set(_SERVER_FIELDS)
        extra = tuple(sorted((k, fields.pop(k)) for k in unknown))
        record = Op(
            index=self._next_index,
            time=self._clock_ns(),
            process=process,
            type=kind,
            f=f,
            key=key,
            value=value,
            extra=extra,
            **fields,
        )
        line = json.dumps(
            record.to_json(), separators=(",", ":"), ensure_ascii=False, default=_json_value
        )
        self._file.write(line + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._next_index += 1
        return record


def _json_value(value: Any) -> Any:
    """bytes values (the store's values are bytes) are written as UTF-8 text."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError(
                "history values must be JSON text; decode binary values (e.g. base64) first"
            ) from None
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to a JSON history")
