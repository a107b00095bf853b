"""The kv workload's final reads (workloads/kv.py `final_reads`): after the heal, every key
the run touched is read back. The timeout is a stall timeout — how long the reads may go
without one succeeding — so a slow cluster on a loaded machine still gets every key read,
while a cluster that serves nothing is given up on in bounded time.

No cluster: a stand-in client on a fake clock, advanced by each read."""

from __future__ import annotations

from pathlib import Path

import pytest

from histories.write import HistoryWriter
from nemesis.systems.base import Fail, KvResult
from nemesis.systems.store import StoreSystem
from workloads import kv
from workloads.base import RunContext


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _SlowClient:
    """Each read takes `seconds_per_read` of the fake clock; a key is served on its
    `attempts_to_serve`-th read (0: never)."""

    def __init__(self, clock: _Clock, seconds_per_read: float, attempts_to_serve: int) -> None:
        self.clock, self.seconds, self.serve_on = clock, seconds_per_read, attempts_to_serve
        self.tries: dict[str, int] = {}
        self.node_addresses = {"n1": "127.0.0.1:1"}

    def get(self, key: str, *, consistency: str = "linearizable", via: str | None = None
            ) -> KvResult:
        self.clock.now += self.seconds
        self.tries[key] = self.tries.get(key, 0) + 1
        if self.serve_on and self.tries[key] >= self.serve_on:
            return KvResult(version=0, node="n1")
        raise Fail("DEADLINE_EXCEEDED")

    def close(self) -> None:
        pass


class _System(StoreSystem):
    def __init__(self, client: _SlowClient) -> None:
        super().__init__()
        self.client = client

    def kv_client(self, addresses, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self.client


def _final_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: int,
                 seconds_per_read: float, attempts_to_serve: int
                 ) -> tuple[dict, _SlowClient, _Clock]:
    clock = _Clock()
    monkeypatch.setattr(kv.time, "monotonic", clock.monotonic)
    client = _SlowClient(clock, seconds_per_read, attempts_to_serve)
    workload = kv.KVWorkload(concurrency=2, rate=10, op_timeout_s=5, system=_System(client))
    workload.pool.touched.extend(f"k{i}" for i in range(keys))
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        ctx = RunContext(addresses=dict(client.node_addresses), history=history, seed=1,
                         deadline=0.0)
        summary = workload.final_reads(ctx, timeout_s=30.0)
    return summary, client, clock


def test_a_slow_cluster_still_gets_every_key_read(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each key served on its third read of 5 s (the op timeout): 60 s of reads in all, but
    never 30 s without a success. (With a shared 30 s the last two keys went unread.)"""
    summary, client, clock = _final_reads(tmp_path, monkeypatch, keys=4, seconds_per_read=5,
                                          attempts_to_serve=3)
    assert summary == {"keys": 4, "read": 4, "unread": []}
    assert all(tries == 3 for tries in client.tries.values())


def test_a_cluster_that_serves_nothing_is_given_up_on_in_bounded_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary, client, clock = _final_reads(tmp_path, monkeypatch, keys=50, seconds_per_read=5,
                                          attempts_to_serve=0)
    assert summary["read"] == 0 and len(summary["unread"]) == 50
    # The first key for 30 s, then one try each: nothing served resets the deadline.
    assert clock.now - 1000.0 <= 30 + 5 + 49 * 5


def test_the_whole_is_capped_even_while_reads_keep_succeeding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads that each take 15 s (three 5 s op timeouts within the client) yet succeed:
    30 s plus two op timeouts per key, then the rest are not tried."""
    summary, client, clock = _final_reads(tmp_path, monkeypatch, keys=1000, seconds_per_read=15,
                                          attempts_to_serve=1)
    assert clock.now - 1000.0 <= 30 + 2 * 5 * 1000 + 15
    assert 0 < summary["read"] < 1000 and len(summary["unread"]) == 1000 - summary["read"]
