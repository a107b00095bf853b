"""What a workload is to the harness: client processes that drive the system and record ops.

The harness builds a `RunContext` (the nodes' loopback addresses, the history writer, the
seed, the deadline, a stop event) and calls, in order: `start(ctx)` — start the client
processes; `stop()`/`join()` at the deadline; after the nemesis has healed everything,
`final_reads(ctx)` — read back what the run touched, recorded in the same history; then the
harness checks the history with the checkers the workload names (`model`).

Jepsen's process rule holds for every workload: one operation in flight per process; an
operation whose outcome is unknown is recorded `info` and its process retires — a new
process id takes over (the old id plus the concurrency).
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from histories.write import HistoryWriter
from system.kv.tls import TlsFiles


class WorkloadError(Exception):
    """The workload could not do its part (its processes never came up, say): the run has
    no verdict, and the message says what to look at."""


@dataclass
class RunContext:
    addresses: dict[str, str]  # node id -> 127.0.0.1:PORT
    history: HistoryWriter
    seed: int
    deadline: float  # time.monotonic() at which clients stop invoking
    stop: threading.Event = field(default_factory=threading.Event)
    platform: Any = None  # the Platform (a workload with processes of its own runs them there)
    tls: TlsFiles | None = None  # --tls: the clients' certificate (role client), key and CA
    system: Any = None  # the System under test (nemesis/systems/base.py): its client factory


@dataclass
class Counts:
    """Live counters for the progress line and the summary (thread-safe through `add`):
    operation outcomes per function (`add`), and events that are no operation, so neither
    succeed nor fail (`note`: the trainer's depositions), shown beside them by name."""

    by_f: dict[str, dict[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: dict[str, int] = field(default_factory=dict)

    def add(self, f: str, outcome: str) -> None:
        with self.lock:
            row = self.by_f.setdefault(f, {"ok": 0, "fail": 0, "info": 0})
            row[outcome] += 1

    def note(self, name: str, n: int = 1) -> None:
        """Count an event `name` (n=0 only makes it show, as 0)."""
        with self.lock:
            self.events[name] = self.events.get(name, 0) + n

    def notes(self) -> dict[str, int]:
        with self.lock:
            return dict(self.events)

    def totals(self) -> dict[str, int]:
        with self.lock:
            out = {"ok": 0, "fail": 0, "info": 0}
            for row in self.by_f.values():
                for k, v in row.items():
                    out[k] += v
            return out

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {f: dict(row) for f, row in self.by_f.items()}


class Workload(abc.ABC):
    name = ""
    model = ""  # the checker model its history is checked against

    def __init__(self) -> None:
        self.counts = Counts()

    @abc.abstractmethod
    def start(self, ctx: RunContext) -> None:
        """Start the client processes and return once they are running (the run's duration,
        and so its fault schedule, counts from then); they stop invoking at ctx.deadline or
        ctx.stop. Raises WorkloadError when they cannot be started."""

    @abc.abstractmethod
    def join(self, timeout_s: float) -> bool:
        """Wait for every client process to finish its last operation; False on timeout."""

    @abc.abstractmethod
    def final_reads(self, ctx: RunContext, timeout_s: float) -> dict[str, Any]:
        """After the heal: read back everything the run touched; returns a summary."""

    def replica_reads(self, ctx: RunContext, skipped: dict[str, str], timeout_s: float,
                      say=print) -> dict[str, Any] | None:  # noqa: ANN001 - print-like
        """After `final_reads`: read it back from each node on its own, but those in
        `skipped` (node -> why: not a member, down); the kv workload does
        (workloads/replicas.py). None when the workload has no such reads."""
        return None

    def describe(self) -> dict[str, Any]:
        """The workload's configuration, for test.json."""
        return {"name": self.name, "model": self.model}


@runtime_checkable
class ClientGate(Protocol):
    """A workload whose clients the nemesis can hold between operations: the
    restore-majority fault (nemesis/restore_majority.py) needs a window in which nothing a
    client will see is written. Held clients invoke nothing; an operation in flight ends
    as it would (its outcome recorded), then its process waits too."""

    def hold_clients(self, timeout_s: float) -> bool:
        """Stop new operations and wait until none is in flight; False if some still was
        after `timeout_s` (the clients stay held: call `release_clients`)."""

    def release_clients(self) -> None: ...


@runtime_checkable
class ProcessTargets(Protocol):
    """Processes a workload owns (the trainer's coordinators and workers) that the nemesis
    may hurt beside the store's nodes (nemesis/faults.py). A role names a kind of process
    ("coordinator", "standby", "worker"); `resolve` says which process it is right now."""

    def target_roles(self) -> tuple[str, ...]: ...

    def resolve(self, role: str) -> str | None: ...

    def kill_target(self, name: str) -> None: ...

    def restart_target(self, name: str) -> str: ...

    def pause_target(self, name: str) -> None: ...

    def resume_target(self, name: str) -> str | None: ...  # what happened, if noteworthy

    def cut_from_store(self, name: str) -> None: ...

    def heal_from_store(self, name: str) -> None: ...

    def lose_reply(self, name: str) -> dict[str, Any]: ...

    def heal_targets(self) -> list[str]: ...

    # Optional: windows of the workload's own protocol a fault can be timed into (the
    # trainer: "checkpoint-write", "lease-renewal", "takeover"); `window_fault` starts a
    # fault of a kind (kill, pause, partition) inside one, or returns None (nothing to hurt).
    # def target_windows(self) -> tuple[str, ...]: ...
    # def window_fault(self, window: str, kind: str) -> dict[str, Any] | None: ...
