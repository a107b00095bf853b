"""A paused leader must not stall the client for its whole deadline: each attempt has its
own timeout and the retry (same request id) goes to the next node, so the first write
acknowledged after SIGSTOP of the leader comes about when the election is over.
"""

from __future__ import annotations

import threading
import time

import pytest

from nemesis.platforms.local_cluster import LocalCluster

pytestmark = pytest.mark.integration


def test_after_sigstop_of_the_leader_the_first_write_comes_within_one_and_a_half_elections(
    tmp_path,
) -> None:
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=30)
        followers = [n for n in cluster.ids if n != leader]
        kv = cluster.client(timeout_s=10)
        try:
            for i in range(5):
                kv.put("warm", b"%d" % i)
            elected_at: list[float] = []
            stop = threading.Event()

            def watch() -> None:  # when does a follower report a new leader?
                while not stop.is_set() and not elected_at:
                    for node in followers:
                        status = cluster.status(node, timeout_s=0.2)
                        if status is not None and status.leader_id in followers:
                            elected_at.append(time.monotonic())
                            return
                    time.sleep(0.01)

            watcher = threading.Thread(target=watch)
            paused_at = time.monotonic()
            cluster.pause(leader)
            watcher.start()
            try:
                result = kv.put("after-pause", b"v")
                acknowledged_at = time.monotonic()
                watcher.join(timeout=10)
            finally:
                stop.set()
                cluster.resume(leader)
            assert elected_at, "no new leader was elected"
            election_s = elected_at[0] - paused_at
            write_s = acknowledged_at - paused_at
            print(f"election {election_s:.2f}s, first acknowledged write {write_s:.2f}s "
                  f"(answered by {result.node_id})")
            assert result.node_id in followers
            # 1.5x the election, plus 0.5 s for the polling and scheduling noise of a
            # machine shared with other jobs (measured at load average 24: 1.90 s and
            # 2.89 s once; usually the write comes within 0.1 s of the election).
            assert write_s <= 1.5 * election_s + 0.5, (
                f"first write after {write_s:.2f}s; the election took {election_s:.2f}s")
        finally:
            kv.close()
