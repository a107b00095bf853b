"""A follower stopped during 5,000 writes, with small snapshot thresholds, rejoins through a
chunked InstallSnapshot (Raft §7) and then serves the latest data.

Real processes; waits on conditions with deadlines; the write load is bounded.
"""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.client import KVClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRITES = 5_000
THREADS = 16
CHUNK_BYTES = 4096


def _write_all(cluster: LocalCluster, count: int, threads: int) -> None:
    local = threading.local()

    def write(i: int) -> None:
        if not hasattr(local, "kv"):
            local.kv = cluster.client(timeout_s=20)
        local.kv.put(f"key-{i:05d}", f"value-{i}".encode() * 4)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, range(count)))


def test_follower_stopped_during_5000_writes_rejoins_by_chunked_snapshot(tmp_path) -> None:
    node_args = ["--snapshot-entries", "500", "--snapshot-chunk-bytes", str(CHUNK_BYTES)]
    with LocalCluster(3, tmp_path, node_args=node_args) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=20)
        lagging = next(i for i in cluster.ids if i != leader)
        before = cluster.status(lagging)
        assert before is not None and before.snapshots_installed == 0
        cluster.stop(lagging)

        _write_all(cluster, WRITES, THREADS)

        leader = cluster.wait_for_leader(timeout_s=20)
        leader_status = cluster.status(leader)
        # The leader compacted its log past everything the stopped follower has.
        assert leader_status.snapshot_index > before.last_index + 500

        cluster.start_node(lagging)
        try:
            caught_up = cluster.wait_for_applied(lagging, leader_status.commit_index, timeout_s=60)
        except AssertionError:
            for node_id in cluster.ids:  # ask each node to log its view, for the post-mortem
                cluster.send_signal(node_id, signal.SIGUSR1)
            cluster.wait_until(lambda: "debug state" in cluster.specs[leader].log_file.read_text(),
                               5, "the leader to log its state")
            raise
        assert caught_up.snapshots_installed >= 1
        assert caught_up.last_snapshot_index > before.last_index
        installs = [json.loads(line) for line in cluster.specs[lagging].log_file.read_text().splitlines()
                    if "installed snapshot from leader" in line]
        assert installs, "the follower's log shows no installed snapshot"
        assert max(i["snapshot_bytes"] for i in installs) > 10 * CHUNK_BYTES  # many chunks

        with KVClient([cluster.specs[lagging].address]) as follower, cluster.client() as kv:
            for i in range(0, WRITES, 25):
                key = f"key-{i:05d}"
                assert follower.get(key, consistency="stale").value == kv.get(key).value
            last_key = f"key-{WRITES - 1:05d}"
            assert follower.get(last_key, consistency="stale").value == f"value-{WRITES - 1}".encode() * 4

            # And it takes part in commits again: a new write reaches it.
            fresh = kv.put("after-rejoin", b"yes")
            cluster.wait_for_applied(lagging, fresh.applied_index)
            assert follower.get("after-rejoin", consistency="stale").value == b"yes"

        # After kill -9 it restarts from the installed snapshot plus its log.
        cluster.kill(lagging)
        cluster.start_node(lagging)
        cluster.wait_for_applied(lagging, fresh.applied_index)
        with KVClient([cluster.specs[lagging].address]) as follower:
            assert follower.get("key-00000", consistency="stale").value == b"value-0" * 4
            assert follower.get("after-rejoin", consistency="stale").value == b"yes"
