"""A node persists small Readies on its event loop and large ones (and its snapshots) on
the storage thread (system/kv/node.py, `_persist_on_loop`). DurableStorage has no lock,
so the rule is: the loop never calls the storage while the thread holds a call.

An in-process single-member node (its own majority: no sockets to peers) takes a snapshot
every few entries while one client writes one put at a time (one-entry Readies, persisted
on the loop); the storage's snapshot save is slowed down so that puts arrive while the
thread holds it. A proxy around the storage records any two calls that overlap. The same
scenario with the busy check removed must find an overlap. Waits have deadlines.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from system.kv import node as node_module
from system.kv.node import Node, NodeConfig
from system.kv.storage import DurableStorage

PUTS = 60


@pytest.fixture(autouse=True)
def _any_disk_counts_as_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-entry Readies go to the loop whatever this machine's fsyncs take."""
    monkeypatch.setattr(node_module, "INLINE_PERSIST_MAX_FSYNC_MS", float("inf"))


class OverlapDetector:
    """Forwards every call to the storage; records calls that start while another runs."""

    def __init__(self, storage: DurableStorage, slow_save_s: float) -> None:
        self._storage = storage
        self._slow_save_s = slow_save_s
        self._lock = threading.Lock()
        self._running: list[str] = []
        self.overlaps: list[tuple[str, str]] = []
        self.calls_on_loop = 0
        self.saves = 0

    def __getattr__(self, name: str):  # noqa: ANN204
        value = getattr(self._storage, name)
        if not callable(value) or name == "close":
            return value

        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            with self._lock:
                if self._running:
                    self.overlaps.append((self._running[0], name))
                self._running.append(name)
            if threading.current_thread() is threading.main_thread():
                self.calls_on_loop += 1
            try:
                if name == "save_snapshot":
                    self.saves += 1
                    time.sleep(self._slow_save_s)  # hold the thread while puts arrive
                return value(*args, **kwargs)
            finally:
                with self._lock:
                    self._running.remove(name)
        return call


class IgnoresStorageThread(Node):
    """Persists on the loop even while the storage thread holds a call."""

    def _persist_on_loop(self, ready) -> bool:  # noqa: ANN001
        jobs, self._storage_jobs = self._storage_jobs, 0
        try:
            return super()._persist_on_loop(ready)
        finally:
            self._storage_jobs = jobs


async def _puts_during_snapshots(node_class: type[Node], data_dir: Path) -> OverlapDetector:
    config = NodeConfig(node_id="n1", listen_address="127.0.0.1:1", peers={},
                        data_dir=data_dir, tick_ms=5, election_timeout_ticks=2,
                        snapshot_entries=5)
    detector = OverlapDetector(DurableStorage.open(data_dir), slow_save_s=0.05)
    node = node_class(config, detector)  # type: ignore[arg-type]
    await node.start()
    try:
        deadline = asyncio.get_running_loop().time() + 10.0
        while not node.is_leader:
            assert asyncio.get_running_loop().time() < deadline, "no leader in 10 s"
            await asyncio.sleep(0.005)
        for n in range(PUTS):
            result = await asyncio.wait_for(node.put(f"k{n}", b"v", None, f"r{n}"), 10.0)
            assert result.applied
    finally:
        await node.stop()
    return detector


def test_the_loop_never_uses_the_storage_while_the_thread_holds_it(tmp_path: Path) -> None:
    detector = asyncio.run(_puts_during_snapshots(Node, tmp_path))
    assert detector.saves >= 3, "the scenario must take snapshots to mean anything"
    assert detector.calls_on_loop > PUTS, "one-entry Readies must be persisted on the loop"
    assert detector.overlaps == []


def test_the_overlap_check_fails_when_the_busy_rule_is_broken(tmp_path: Path) -> None:
    detector = asyncio.run(_puts_during_snapshots(IgnoresStorageThread, tmp_path))
    assert detector.overlaps, "the broken variant must call the storage during a save"


# ----- drive_now: Readies carried out on an input's stack (Node.drive_now) ----------------
#
# The rule: Readies are carried out one at a time, in order, whoever carries them out; an
# input may carry them out on its own stack only while the drive task is parked, and
# leaves the task any Ready that must wait for the storage thread. Concurrent puts (Readies
# of several entries, persisted on the thread, each fsync slowed) run while another task
# calls drive_now every half millisecond, as peer messages would; the detector records any
# two storage calls that overlap, and the entries must reach the storage in index order.


class DrivesOverTheTask(Node):
    """drive_now that ignores the drive task being busy. Its failures are recorded instead
    of stopping the process."""

    failures: list[str]

    def drive_now(self) -> None:
        self._drive_busy = False
        super().drive_now()

    def _drive_failed(self) -> None:
        import sys
        self.failures = [*getattr(self, "failures", []), repr(sys.exc_info()[1])]


class RecordsOrder(OverlapDetector):
    def __init__(self, storage: DurableStorage, slow_sync_s: float) -> None:
        super().__init__(storage, slow_save_s=0.0)
        self._slow_sync_s = slow_sync_s
        self.appended: list[int] = []

    def __getattr__(self, name: str):  # noqa: ANN204
        call = super().__getattr__(name)
        if name == "append":
            def append(entries):  # noqa: ANN001, ANN202
                self.appended += [e.index for e in entries]
                return call(entries)
            return append
        if name == "sync":
            def sync():  # noqa: ANN202
                time.sleep(self._slow_sync_s)  # a slow disk: the task waits on the thread
                return call()
            return sync
        return call


async def _puts_while_inputs_drive(node_class: type[Node], data_dir: Path) -> tuple[RecordsOrder, Node]:
    config = NodeConfig(node_id="n1", listen_address="127.0.0.1:1", peers={},
                        data_dir=data_dir, tick_ms=5, election_timeout_ticks=2)
    detector = RecordsOrder(DurableStorage.open(data_dir), slow_sync_s=0.003)
    node = node_class(config, detector)  # type: ignore[arg-type]
    await node.start()
    stop = asyncio.Event()

    async def inputs() -> None:
        while not stop.is_set():
            node.drive_now()
            await asyncio.sleep(0.0005)

    driver = asyncio.get_running_loop().create_task(inputs())
    try:
        deadline = asyncio.get_running_loop().time() + 10.0
        while not node.is_leader:
            assert asyncio.get_running_loop().time() < deadline, "no leader in 10 s"
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        puts = []
        for n in range(96):  # Readies of 1-3 entries, proposed while the task waits
            puts.append(loop.create_task(node.put(f"k{n}", b"v", None, f"r{n}")))
            if n % 3 == 2:
                await asyncio.sleep(0.0005)
        await asyncio.wait(puts, timeout=10.0)
        node.unanswered = sum(not (p.done() and not p.cancelled() and p.exception() is None
                                   and p.result().applied) for p in puts)
        for put in puts:
            put.cancel()
    finally:
        stop.set()
        await driver
        await node.stop()
    return detector, node


def test_inputs_drive_readies_in_order_and_never_beside_the_task(tmp_path: Path) -> None:
    detector, node = asyncio.run(_puts_while_inputs_drive(Node, tmp_path))
    assert detector.overlaps == []
    assert detector.appended == list(range(1, len(detector.appended) + 1)), \
        "entries persisted out of order or skipped"
    assert node.unanswered == 0
    assert len(detector.appended) > 96


def test_the_order_check_fails_when_drive_now_ignores_the_task(tmp_path: Path) -> None:
    detector, node = asyncio.run(_puts_while_inputs_drive(DrivesOverTheTask, tmp_path))
    broken = (detector.overlaps or getattr(node, "failures", None) or node.unanswered
              or detector.appended != list(range(1, len(detector.appended) + 1)))
    assert broken, "drive_now beside a busy task must show in the storage calls"
