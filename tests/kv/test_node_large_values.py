"""A 64 MiB value (a model checkpoint) is written, replicated and read back whole.

Python copies a 64 MiB value several times per hop (about a second of event-loop time on
a busy 2-core machine), so this cluster runs with election timeouts of 1-2 s
(--election-timeout-ticks 50) and raises the value limit (default 16 MiB) to 64 MiB:
with the default 0.5-1 s a busy leader may lose its leadership mid-write; the client's
retry (same request id) still gets it through.

With the DEFAULT limits, the largest value the node accepts goes through and one byte more
is refused unread; whether it costs an election under load is a timing figure, measured
by benchmarks/large_value_elections.py.
"""

from __future__ import annotations

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.client import KVClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VALUE_BYTES = 64 * 1024 * 1024


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_value_over_the_limit_is_refused_unread_with_the_limit_and_flag_named(tmp_path) -> None:
    """A 64 MiB put to nodes with the default 16 MiB limit: gRPC refuses it from its
    length, so the node never reads, copies or parses it (before: each refused put took
    3-11 s of the node's loop, moved the term 1 -> 3 over three puts on a loaded machine,
    and left the leader 665 MiB larger), and the client says what the store says."""
    from system.kv.client import InvalidArgument

    value = b"x" * VALUE_BYTES
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=20)
        with cluster.client(timeout_s=60) as kv:
            kv.put("warm", b"up")
            rss_before = {n: _rss_bytes(cluster.processes[n].pid) for n in cluster.ids}
            for _ in range(3):
                with pytest.raises(InvalidArgument, match=(
                        r"^value is 67108864 bytes; the limit is 16777216 bytes "
                        r"\(node flag --max-value-bytes\)")):
                    kv.put("too-big", value)
            grown = {n: _rss_bytes(cluster.processes[n].pid) - rss_before[n]
                     for n in cluster.ids}
            assert max(grown.values()) < 32 * 1024 * 1024, (
                f"nodes grew by {grown} bytes after refusing three 64 MiB puts")
            assert kv.put("after", b"ok").node_id == leader


def test_peers_on_grpc_carry_batches_larger_than_the_client_limit(tmp_path) -> None:
    """Peers reached over gRPC share the client port and its limit (1 MiB values: about
    2 MiB a message here); a follower that comes back behind gets APPENDs of several such
    entries (up to 4 MiB each), and they still reach it, in pieces."""
    value = bytes(range(256)) * (1024 * 1024 // 256)
    node_args = ["--max-value-bytes", str(len(value))]
    with LocalCluster(3, tmp_path, node_args=node_args, tcp_peers=False) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=20)
        behind = next(n for n in cluster.ids if n != leader)
        with cluster.client(timeout_s=60) as kv:
            kv.put("warm", b"up")
            cluster.kill(behind)
            written = [kv.put(f"k{i}", value) for i in range(6)]
        cluster.start_node(behind)
        cluster.wait_for_applied(behind, written[-1].applied_index, timeout_s=30)
        with KVClient([cluster.specs[behind].address], timeout_s=30) as direct:
            assert direct.get("k5", consistency="stale").value == value


def test_64_mib_value_round_trips_and_reaches_every_replica(tmp_path) -> None:
    value = bytes(range(256)) * (VALUE_BYTES // 256)
    node_args = ["--election-timeout-ticks", "50", "--max-value-bytes", str(VALUE_BYTES)]
    with LocalCluster(3, tmp_path, node_args=node_args) as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=20)
        with cluster.client(timeout_s=120) as kv:
            written = kv.put("model/checkpoint", value)
            got = kv.get("model/checkpoint", timeout_s=60)
            assert got.version == written.version
            assert got.value == value
        for node_id in cluster.ids:
            cluster.wait_for_applied(node_id, written.applied_index, timeout_s=60)
            with KVClient([cluster.specs[node_id].address], timeout_s=60) as direct:
                assert direct.get("model/checkpoint", consistency="stale").value == value


def test_ten_puts_of_the_largest_default_value_succeed_and_one_byte_more_is_refused(
        tmp_path) -> None:
    """Default limits and timing: ten puts of the largest accepted value (16 MiB) are
    acknowledged, each read back whole, and one byte more is refused before anything is
    proposed. Whether they cost an election depends on the CPU the machine has to spare
    (each node's loop copies the value several times, the loop that sends heartbeats: at
    load 10-70 terms went 1 -> 4 here), so that is measured, with its load, by
    `python benchmarks/large_value_elections.py`, not asserted (docs/kv-node.md)."""
    from system.kv.client import InvalidArgument

    default_limit = 16 * 1024 * 1024
    value = bytes(range(256)) * (default_limit // 256)
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=20)
        with cluster.client(timeout_s=120) as kv:
            kv.put("warm", b"up")
            written = [kv.put(f"big/{i % 2}", value[:-1] + bytes([i])) for i in range(10)]
            for i, w in enumerate(written[-2:], start=8):
                got = kv.get(f"big/{i % 2}", timeout_s=60)
                assert got.version == w.version == 5 and got.value == value[:-1] + bytes([i])
            with pytest.raises(InvalidArgument, match="limit is 16777216 bytes"):
                kv.put("too-big", value + b"x")
