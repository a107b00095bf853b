"""A failed tick stops the node like a failed drive loop (system/kv/node.py).

`Node._tick_forever` is the node's only clock: if `core.tick()` raised and the task just
ended, the node would go on serving clients but never campaign nor send heartbeats, and
nothing would say so. An in-process single-member node whose core raises on its third
tick must log the failure at CRITICAL and exit 70. `os._exit` is replaced by a recorder
(the test process must survive); waits are bounded by deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from system.kv import node as node_module
from system.kv.node import Node, NodeConfig
from system.kv.storage import DurableStorage


class _Exited(BaseException):
    """Stands for the process ending at os._exit: nothing after it runs."""


async def _run_until_exit(data_dir: Path, exits: list[int]) -> None:
    config = NodeConfig(node_id="n1", listen_address="127.0.0.1:1", peers={},
                        data_dir=data_dir, tick_ms=5, election_timeout_ticks=2)
    node = Node(config, DurableStorage.open(data_dir))
    tick = node.core.tick
    ticks = 0

    def failing_tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 3:
            raise RuntimeError("tick broke an invariant")
        tick()

    node.core.tick = failing_tick  # type: ignore[method-assign]
    await node.start()
    try:
        deadline = asyncio.get_running_loop().time() + 20.0
        while not exits:
            assert asyncio.get_running_loop().time() < deadline, "the node never exited"
            await asyncio.sleep(0.005)
    finally:
        task = node._tick_task
        if task is not None and task.done():
            assert isinstance(task.exception(), _Exited)  # (retrieved: no "never retrieved")
            node._tick_task = None  # ended where the process would have; nothing to cancel
        await node.stop()


def test_a_tick_that_raises_stops_the_process_with_exit_70(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(node_module.os, "_exit", fake_exit)
    monkeypatch.setattr(node_module.logging, "shutdown", lambda: None)
    with caplog.at_level(logging.CRITICAL, logger="kv.node"):
        asyncio.run(_run_until_exit(tmp_path, exits))
    assert exits == [70]
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and "fatal error in the Raft tick" in critical[0].getMessage()
    assert critical[0].exc_info is not None and "tick broke an invariant" in str(critical[0].exc_info[1])
