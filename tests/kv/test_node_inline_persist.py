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
