"""The kv workload's client gate (workloads.base.ClientGate): the restore-majority fault
holds the clients so that nothing a client sees is written while a majority's disks are
copied and restored. Held, no client invokes anything; an operation in flight finishes
first (`hold_clients` waits for it, or says it did not end); released, they go on.

No cluster: a stand-in client whose first operations block until the test lets them go."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from histories.write import HistoryWriter
from nemesis.systems.base import KvResult
from nemesis.systems.store import StoreSystem
from workloads import kv
from workloads.base import ClientGate, RunContext


class _Client:
    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self.node_addresses = {"n1": "127.0.0.1:1"}

    def _op(self) -> KvResult:
        s = self.shared
        with s.lock:
            s.invoked += 1
            s.inside += 1
            if s.watch_held.is_set():
                s.invoked_while_held.set()
            s.changed.notify_all()
        try:
            s.go.wait(10)
            return KvResult(version=1, value=b"v", node="n1")
        finally:
            with s.lock:
                s.inside -= 1
                s.changed.notify_all()

    def get(self, key, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self._op()

    def put(self, key, value, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self._op()

    def delete(self, key, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self._op()

    def new_request_id(self) -> str:
        return "r"

    def close(self) -> None:
        pass


class _Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.invoked = self.inside = 0
        self.go = threading.Event()
        self.watch_held = threading.Event()
        self.invoked_while_held = threading.Event()

    def wait_for(self, predicate, timeout_s: float = 10.0) -> bool:  # noqa: ANN001
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)


class _System(StoreSystem):
    def __init__(self, shared: _Shared) -> None:
        super().__init__()
        self.shared = shared

    def kv_client(self, addresses, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return _Client(self.shared)


def test_held_clients_invoke_nothing_until_released(tmp_path: Path) -> None:
    shared = _Shared()
    workload = kv.KVWorkload(concurrency=2, rate=200, op_timeout_s=5, system=_System(shared))
    assert isinstance(workload, ClientGate)
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        ctx = RunContext(addresses={"n1": "127.0.0.1:1"}, history=history, seed=1,
                         deadline=time.monotonic() + 60)
        workload.start(ctx)
        try:
            assert shared.wait_for(lambda: shared.inside == 2), "both clients in an operation"
            # Operations in flight that do not end: the hold says so.
            assert workload.hold_clients(0.1) is False
            held = threading.Thread(target=lambda: results.append(workload.hold_clients(10)))
            results: list[bool] = []
            held.start()
            shared.go.set()  # the operations in flight end; none may start after them
            held.join(10)
            assert results == [True]
            assert shared.inside == 0
            before = shared.invoked
            shared.watch_held.set()
            assert not shared.invoked_while_held.wait(0.3), "a held client invoked"
            assert shared.invoked == before
            shared.watch_held.clear()
            workload.release_clients()
            assert shared.wait_for(lambda: shared.invoked >= before + 4), "released clients go on"
        finally:
            ctx.stop.set()
            shared.go.set()
            workload.release_clients()
            assert workload.join(10)


def test_held_clients_stop_at_the_run_s_end(tmp_path: Path) -> None:
    shared = _Shared()
    shared.go.set()
    workload = kv.KVWorkload(concurrency=2, rate=200, op_timeout_s=5, system=_System(shared))
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        ctx = RunContext(addresses={"n1": "127.0.0.1:1"}, history=history, seed=1,
                         deadline=time.monotonic() + 60)
        workload.start(ctx)
        assert shared.wait_for(lambda: shared.invoked >= 2)
        assert workload.hold_clients(10) is True
        ctx.stop.set()  # never released: the clients still end with the run
        assert workload.join(10)
