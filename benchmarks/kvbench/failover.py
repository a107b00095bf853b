"""The leader-kill row: SIGKILL the leader of a healthy cluster and time how long until the
first write sent after the kill is acknowledged.

Writes are sent to both survivors every `interval_s` (a new attempt does not wait for the
previous one, so a slow failure does not hide an early success); each attempt has its own
deadline. Only writes sent after the kill count, so an acknowledgement already in flight
from the dead leader can never be mistaken for the new leader's. The probe is bounded in
time and in attempts, and runs in the controlling process because it is the only load.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc

from benchmarks.kvbench.clients import open_client
from benchmarks.kvbench.target import ClusterError, Target


@dataclass(frozen=True)
class FailoverResult:
    seconds: float  # from SIGKILL to the first acknowledged write sent after it
    killed_member: int
    attempts: int  # writes sent before one was acknowledged


async def _probe(target: Target, timeout_s: float, interval_s: float, attempt_timeout_s: float) -> FailoverResult:
    target.wait_settled(timeout_s)
    leader = target.find_leader()
    if leader is None:
        raise ClusterError(f"{target.name}: no leader before the kill")
    addresses = target.client_addresses()
    survivors = [
        open_client(target.client_kind, addresses[i], follow_leader_hints=False)
        for i in range(len(addresses))
        if i != leader
    ]
    try:
        await asyncio.gather(*(client.wait_connected(5.0) for client in survivors))
        # One write through each survivor first, so the connections are warm. A follower may
        # refuse it with a leader hint (ours does; etcd and PySyncObj forward): that is fine.
        await asyncio.gather(
            *(client.put("kvbench-failover", b"before", 5.0) for client in survivors),
            return_exceptions=True,
        )

        loop = asyncio.get_running_loop()
        first_ack: asyncio.Future[float] = loop.create_future()

        async def attempt(client, number: int) -> None:
            try:
                await client.put("kvbench-failover", f"after-{number}".encode(), attempt_timeout_s)
            except grpc.aio.AioRpcError:
                return
            if not first_ack.done():
                first_ack.set_result(time.monotonic())

        member = target.members[leader]
        assert member is not None
        killed_at = time.monotonic()
        member.kill_hard()
        tasks = []
        attempts = 0
        max_attempts = int(timeout_s / interval_s) * len(survivors) + len(survivors)
        while not first_ack.done():
            if time.monotonic() - killed_at > timeout_s or attempts >= max_attempts:
                raise ClusterError(
                    f"{target.name}: no write acknowledged within {timeout_s:.0f} s of killing "
                    f"the leader\n{target.describe_logs()}"
                )
            for client in survivors:
                attempts += 1
                tasks.append(asyncio.create_task(attempt(client, attempts)))
            await asyncio.wait([first_ack], timeout=interval_s)
        acknowledged_at = first_ack.result()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return FailoverResult(acknowledged_at - killed_at, leader, attempts)
    finally:
        await asyncio.gather(*(client.close() for client in survivors), return_exceptions=True)


def measure_leader_kill(
    target: Target, timeout_s: float = 30.0, interval_s: float = 0.02, attempt_timeout_s: float = 1.0
) -> FailoverResult:
    """Kill the leader of a started target and time the first write after it. The target
    is left with one member dead; the caller stops it."""
    return asyncio.run(_probe(target, timeout_s, interval_s, attempt_timeout_s))
