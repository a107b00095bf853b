"""Real processes under real faults: kill -9 of the leader loses no acknowledged write, and
a write whose reply was lost, retried with the same request id on the next leader, applies
exactly once.

Every wait is on a condition with a deadline; every load loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from nemesis.platforms.tcp_proxy import ProxyMode, TcpProxy
from system.kv.client import Indeterminate, KVClient, KVError, NotFound

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Writers:
    """Threads writing unique keys until told to stop (bounded per thread and in time)."""

    def __init__(self, cluster: LocalCluster, threads: int, max_writes_each: int,
                 max_seconds: float) -> None:
        self.acked: dict[str, bytes] = {}
        self.indeterminate: set[str] = set()
        self.failed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._threads = [
            threading.Thread(target=self._run, args=(cluster, n, max_writes_each), daemon=True)
            for n in range(threads)
        ]

    def _run(self, cluster: LocalCluster, n: int, max_writes: int) -> None:
        with cluster.client(timeout_s=5, attempt_timeout_s=1.0) as kv:
            for i in range(max_writes):
                if self._stop.is_set() or time.monotonic() > self._deadline:
                    return
                key, value = f"w{n}-{i}", f"value-{n}-{i}".encode()
                try:
                    kv.put(key, value)
                except Indeterminate:
                    with self._lock:
                        self.indeterminate.add(key)
                except KVError:
                    with self._lock:
                        self.failed.add(key)
                else:
                    with self._lock:
                        self.acked[key] = value

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def test_kill_9_of_the_leader_loses_no_acknowledged_write(tmp_path) -> None:
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        old_leader = cluster.wait_for_leader(timeout_s=20)
        writers = Writers(cluster, threads=4, max_writes_each=3000, max_seconds=90)
        writers.start()
        try:
            cluster.wait_until(lambda: writers.count() >= 100, 30, "100 acknowledged writes")
            cluster.kill(old_leader)  # SIGKILL: no chance to flush or say goodbye
            acked_at_kill = writers.count()
            survivors = [i for i in cluster.ids if i != old_leader]
            new_leader = cluster.wait_for_leader(timeout_s=20, among=survivors)
            assert new_leader != old_leader
            # Writes go on under the new leader...
            cluster.wait_until(lambda: writers.count() >= acked_at_kill + 100, 30,
                               "100 more acknowledged writes after the kill")
            cluster.start_node(old_leader)  # ...and the killed node comes back meanwhile.
            cluster.wait_until(lambda: writers.count() >= acked_at_kill + 200, 30,
                               "writes to continue while the old leader rejoins")
        finally:
            writers.stop()

        leader = cluster.wait_for_leader(timeout_s=20)
        commit = cluster.status(leader).commit_index
        cluster.wait_for_applied(old_leader, commit, timeout_s=30)
        assert writers.acked, "no write was acknowledged at all"

        with cluster.client(timeout_s=10) as kv:
            for key, value in sorted(writers.acked.items()):
                assert kv.get(key).value == value, f"acknowledged write {key} lost or changed"
            for key in writers.indeterminate:  # may or may not exist; never garbage
                with contextlib.suppress(NotFound):
                    assert kv.get(key).value.startswith(b"value-")
        # The restarted node replayed or received everything it must have.
        with KVClient([cluster.specs[old_leader].address]) as direct:
            for key, value in sorted(writers.acked.items())[:: max(1, len(writers.acked) // 200)]:
                assert direct.get(key, consistency="stale").value == value


def _retry_after_lost_reply_across_leader_kill(cluster: LocalCluster) -> tuple[int, int, int]:
    """Write once, lose the reply, kill the leader, retry with the same request id.

    Returns (version the retry reports, version a linearizable read sees, how many
    versions the key moved by)."""
    cluster.start()
    leader = cluster.wait_for_leader(timeout_s=20)
    with TcpProxy(cluster.specs[leader].address) as proxy, \
            KVClient([proxy.address], timeout_s=5, attempt_timeout_s=1.0, retries=0) as via_proxy:
        first = via_proxy.put("checkpoint", b"step-1")
        assert first.version == 1
        proxy.set_mode(ProxyMode.DROP_REPLIES)  # the request arrives; the answer never does
        with pytest.raises(Indeterminate) as cut:
            via_proxy.put("checkpoint", b"step-2", timeout_s=1.0)
        request_id = cut.value.request_id
    # The write did commit: every follower applies version 2.
    followers = [i for i in cluster.ids if i != leader]
    for follower in followers:
        with KVClient([cluster.specs[follower].address]) as direct:
            cluster.wait_until(
                lambda d=direct: d.get("checkpoint", consistency="stale").version >= 2, 20,
                f"{follower} to apply the cut write")
    cluster.kill(leader)
    cluster.wait_for_leader(timeout_s=20, among=followers)
    with KVClient([cluster.specs[f].address for f in followers], timeout_s=10) as kv:
        retried = kv.put("checkpoint", b"step-2", request_id=request_id)
        assert retried.node_id != leader
        now = kv.get("checkpoint")
        return retried.version, now.version, now.version - first.version


def test_retry_with_the_same_request_id_on_a_new_leader_applies_once(tmp_path) -> None:
    with LocalCluster(3, tmp_path) as cluster:
        retry_version, read_version, moved_by = _retry_after_lost_reply_across_leader_kill(cluster)
    assert retry_version == 2, "the retry must return the first application's result"
    assert read_version == 2
    assert moved_by == 1, "the write applied more than once"


def test_without_dedup_the_same_retry_applies_twice(tmp_path) -> None:
    """The previous test can fail: with the no-dedup canary the retry applies again."""
    with LocalCluster(3, tmp_path, node_args=["--unsafe", "no-dedup"],
                      env={"MAO_ALLOW_UNSAFE": "1"}) as cluster:
        retry_version, read_version, moved_by = _retry_after_lost_reply_across_leader_kill(cluster)
    assert (retry_version, read_version, moved_by) == (3, 3, 2)
