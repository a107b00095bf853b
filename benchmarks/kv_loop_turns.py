"""Event-loop turns and CPU per put at one client, with three members in ONE process.

    python benchmarks/kv_loop_turns.py [--puts 400] [--without-drive-now]

Starts three `Node`s (system/kv/node.py) on one asyncio loop, Raft traffic over their peer
ports on loopback, no client port: a put is `Node.put` on the leader, one at a time. It
counts the loop's turns (`_run_once` calls) and the process's CPU per put. The turns of
the three members add up, and unlike latency they barely move with the machine's load:
the figure for a change that removes hand-offs on a shared machine. Every one-entry Ready
is persisted on the loop, as on a machine whose fsyncs take well under a millisecond.

`--without-drive-now`: peer messages wake the drive task as before the fourth pass
(docs/benchmarks.md) instead of carrying out the Readies on the receiver's stack.

A benchmark, not a test: it prints figures and asserts nothing. The nodes are stopped and
their temporary directory removed in a `finally`; the run is bounded by --puts and a
10-second deadline per put.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from system.kv import node as node_module  # noqa: E402
from system.kv.node import Node, NodeConfig  # noqa: E402
from system.kv.storage import DurableStorage  # noqa: E402

IDS = ("n1", "n2", "n3")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def _measure(root: Path, puts: int) -> dict[str, float]:
    ports = _free_ports(2 * len(IDS))
    client = {i: f"127.0.0.1:{p}" for i, p in zip(IDS, ports, strict=False)}
    peer = {i: f"127.0.0.1:{p}" for i, p in zip(IDS, ports[len(IDS):], strict=True)}
    nodes = []
    for i in IDS:
        (root / i).mkdir()
        config = NodeConfig(node_id=i, listen_address=client[i],
                            peers={j: client[j] for j in IDS if j != i}, data_dir=root / i,
                            peer_listen_address=peer[i],
                            peer_links={j: peer[j] for j in IDS if j != i})
        nodes.append(Node(config, DurableStorage.open(root / i)))
    loop = asyncio.get_running_loop()
    try:
        for node in nodes:
            await node.start()
        deadline = loop.time() + 20.0
        while not any(node.is_leader for node in nodes):
            if loop.time() > deadline:
                raise SystemExit("no leader within 20 s")
            await asyncio.sleep(0.01)
        leader = next(node for node in nodes if node.is_leader)
        for k in range(20):  # warm-up
            await asyncio.wait_for(leader.put(f"w{k}", b"v" * 256, None, f"w{k}"), 10.0)
        turns = 0
        run_once = loop._run_once  # type: ignore[attr-defined]

        def counting() -> None:
            nonlocal turns
            turns += 1
            run_once()

        loop._run_once = counting  # type: ignore[attr-defined]
        latencies = []
        cpu_before = time.process_time()
        try:
            for k in range(puts):
                started = time.perf_counter()
                await asyncio.wait_for(leader.put(f"k{k}", b"v" * 256, None, f"r{k}"), 10.0)
                latencies.append(time.perf_counter() - started)
        finally:
            loop._run_once = run_once  # type: ignore[attr-defined]
        cpu_s = time.process_time() - cpu_before
    finally:
        for node in nodes:
            if node._drive_task is not None:
                await node.stop()
    latencies.sort()
    return {"turns": turns / puts, "cpu_ms": cpu_s * 1000 / puts,
            "p50_ms": latencies[len(latencies) // 2] * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--puts", type=int, default=400)
    parser.add_argument("--without-drive-now", action="store_true",
                        help="peer messages only wake the drive task (before the fourth pass)")
    args = parser.parse_args()
    if args.without_drive_now:
        Node.drive_now = Node._kick  # type: ignore[method-assign]
    node_module.INLINE_PERSIST_MAX_FSYNC_MS = float("inf")
    node_module.INLINE_PERSIST_FOLLOWER_MAX_FSYNC_MS = float("inf")
    root = Path(tempfile.mkdtemp(prefix="kv-loop-turns-"))
    try:
        figures = asyncio.run(_measure(root, args.puts))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'without' if args.without_drive_now else 'with'} drive_now: "
          f"{figures['turns']:.2f} loop turns per put (three members), "
          f"{figures['cpu_ms']:.3f} ms of CPU per put, p50 {figures['p50_ms']:.2f} ms; "
          f"{args.puts} puts; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
