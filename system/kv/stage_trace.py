"""Where a put's time goes inside a node: timestamps at each stage of the request path.

Off unless the environment variable KV_STAGE_TRACE names a directory; the node then
records, for every write it proposes as leader, when it reached each stage, and on
SIGUSR2 writes a summary to `<dir>/<node id>.json` and starts afresh. `benchmarks/kv_stages.py`
drives it and prints the breakdown (docs/benchmarks.md, "Where a put's time goes").

Stages of one put on the leader (each a timestamp; a stage's time is the gap to the
previous one):
  received   the handler got the request's bytes (before decoding them)
  proposed   decoded, checked, encoded and handed to the core (`propose` returned)
  taken      the drive loop took the Ready carrying the entry (waiting for the loop)
  persisted  the storage thread wrote and fsynced it here (overlaps replication)
  committed  it came out committed, i.e. a majority has it (replication round trip)
  applied    the state machine applied it and its waiter was answered
  replied    the handler coroutine resumed with the answer (scheduling the reply)
Per Ready the node also counts entries and fsync time, so the batching is visible.

Hops, on every member (leader and followers alike), so that one put can be followed
across processes: `hop(name, index)` records (name, log index, time) when an APPEND
carrying entries up to `index` is handed to gRPC (`append-write`) or arrives
(`append-received`), when a Ready with entries up to `index` is taken (`taken`) and
fsynced (`persisted`), and when the answer acknowledging `index` is handed to gRPC
(`answer-write`) or arrives (`answer-received`), and when a Ready commits entries up to
`index` (`committed`). The times are CLOCK_MONOTONIC, one clock for every process on a
machine (time.perf_counter_ns on Linux), so the members' lists merge into one timeline
(`benchmarks/kv_stages.py` prints it).

What it must never do: change what the node does or when; with tracing off it costs one
`is None` test per stage.
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from system.raft.messages import Message, MessageType

ENV_VAR = "KV_STAGE_TRACE"
STAGES = ("received", "proposed", "taken", "persisted", "committed", "applied", "replied")
_INDEX = {name: i for i, name in enumerate(STAGES)}

# The receive time of the request the current task serves (set by the client handler).
received_ns: contextvars.ContextVar[int] = contextvars.ContextVar("received_ns", default=0)

_MAX_OPEN = 200_000  # records of writes never finished (leader change) are dropped past this
_MAX_HOPS = 400_000  # hop records kept between two dumps; the oldest half goes past this


def now_ns() -> int:
    return time.perf_counter_ns()


class StageTrace:
    """Records stage timestamps by log index; summarises finished writes."""

    def __init__(self, directory: Path, node_id: str) -> None:
        self.path = directory / f"{node_id}.json"
        self._open: dict[int, list[int]] = {}
        self._finished: list[list[int]] = []
        self._readies = 0
        self._ready_entries = 0
        self._fsyncs = 0
        self._fsync_ns = 0
        self._started_ns = now_ns()
        self._hops: list[tuple[str, int, int]] = []

    @classmethod
    def from_environment(cls, node_id: str) -> StageTrace | None:
        directory = os.environ.get(ENV_VAR)
        if not directory:
            return None
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(Path(directory), node_id)

    def proposed(self, index: int) -> None:
        if len(self._open) >= _MAX_OPEN:
            self._open.clear()
        record = [0] * len(STAGES)
        now = now_ns()
        record[0] = received_ns.get() or now
        record[1] = now
        self._open[index] = record

    def mark(self, indexes: list[int], stage: str) -> None:
        position = _INDEX[stage]
        now = now_ns()
        for index in indexes:
            record = self._open.get(index)
            if record is not None and record[position] == 0:
                record[position] = now

    def ready_persisted(self, entries: int, fsync_ns: int) -> None:
        self._readies += 1
        self._ready_entries += entries
        self._fsyncs += 1
        self._fsync_ns += fsync_ns

    def hop(self, name: str, index: int) -> None:
        if len(self._hops) >= _MAX_HOPS:
            del self._hops[: _MAX_HOPS // 2]
        self._hops.append((name, index, now_ns()))

    def hops_sent(self, messages: Iterable[Message]) -> None:
        """Record the appends and answers of a batch about to be handed to gRPC."""
        for message in messages:
            hop = _hop_of(message, "write")
            if hop is not None:
                self.hop(*hop)

    def hops_received(self, messages: Iterable[Message]) -> None:
        for message in messages:
            hop = _hop_of(message, "received")
            if hop is not None:
                self.hop(*hop)

    def replied(self, index: int) -> None:
        record = self._open.pop(index, None)
        if record is None:
            return
        record[-1] = now_ns()
        if all(record):
            self._finished.append(record)

    def summary(self) -> dict:
        """Per stage: mean and p50/p99 of its gap in microseconds, over finished writes."""
        stages = {}
        for position in range(1, len(STAGES)):
            # A stage reached before the previous one (the entry committed while this node
            # was still fsyncing it) costs nothing on its own: count it as 0.
            gaps = sorted(max(0, r[position] - max(r[:position])) for r in self._finished)
            stages[STAGES[position]] = _stats_us(gaps)
        totals = sorted(r[-1] - r[0] for r in self._finished)
        elapsed_s = (now_ns() - self._started_ns) / 1e9
        return {
            "writes": len(self._finished),
            "elapsed_s": elapsed_s,
            "stages_us": stages,
            "total_us": _stats_us(totals),
            "readies_with_entries": self._readies,
            "entries_per_ready": self._ready_entries / self._readies if self._readies else 0.0,
            "fsync_mean_us": self._fsync_ns / self._fsyncs / 1000 if self._fsyncs else 0.0,
            "hops": self._hops,
        }

    def dump_and_reset(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.summary()))
        partial.replace(self.path)  # whole or absent for whoever waits for it
        self._open.clear()
        self._finished.clear()
        self._hops = []
        self._readies = self._ready_entries = self._fsyncs = self._fsync_ns = 0
        self._started_ns = now_ns()


def _hop_of(message: Message, suffix: str) -> tuple[str, int] | None:
    if message.type is MessageType.APPEND and message.entries:
        return f"append-{suffix}", message.entries[-1].index
    if message.type is MessageType.APPEND_RESPONSE and not message.reject:
        return f"answer-{suffix}", message.index
    return None


def _stats_us(sorted_ns: list[int]) -> dict[str, float]:
    if not sorted_ns:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    n = len(sorted_ns)
    return {"mean": sum(sorted_ns) / n / 1000, "p50": sorted_ns[n // 2] / 1000,
            "p99": sorted_ns[min(n - 1, int(n * 0.99))] / 1000}
