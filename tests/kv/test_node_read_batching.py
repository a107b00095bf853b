"""Linearizable reads share ReadIndex rounds (system/kv/node.py, docs/kv-node.md).

An in-process single-member node (its own majority, so no peers and no sockets to
peers): many concurrent reads must be served by far fewer `read_index` calls than reads,
each read still seeing every write acknowledged before it began. Waits are bounded by
deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from system.kv.node import Node, NodeConfig
from system.kv.storage import DurableStorage

READS = 40


async def _wait_until(condition, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.005)


async def _concurrent_reads_after_a_write(data_dir: Path) -> tuple[int, list[int], int]:
    config = NodeConfig(node_id="n1", listen_address="127.0.0.1:1", peers={},
                        data_dir=data_dir, tick_ms=5, election_timeout_ticks=2)
    node = Node(config, DurableStorage.open(data_dir))
    calls = []
    read_index = node.core.read_index

    def counting_read_index(context: bytes) -> None:
        calls.append(context)
        read_index(context)

    node.core.read_index = counting_read_index  # type: ignore[method-assign]
    await node.start()
    try:
        await _wait_until(lambda: node.is_leader, 10.0, "the single member to lead")
        written = await asyncio.wait_for(node.put("k", b"v", None, "req-1"), 10.0)
        indexes = await asyncio.wait_for(
            asyncio.gather(*(node.read_barrier() for _ in range(READS))), 10.0)
        return written.version, list(indexes), len(calls)
    finally:
        await node.stop()


def test_concurrent_linearizable_reads_share_read_index_rounds(tmp_path: Path) -> None:
    version, indexes, read_index_calls = asyncio.run(_concurrent_reads_after_a_write(tmp_path))
    assert version == 1
    # Every read is served at or after the acknowledged write's entry (index 2: the
    # leader's NOOP is 1) ...
    assert len(indexes) == READS and min(indexes) >= 2
    # ... and the reads, all issued before the drive task ran, shared one round.
    assert read_index_calls < READS, read_index_calls
    assert read_index_calls == 1
