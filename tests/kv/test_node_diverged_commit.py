"""Real processes: an old leader whose committed log diverged from the new leader's is
reported by both (ERROR lines naming it and the indexes), refuses stale reads of the
writes the cluster no longer has, and is repaired by the new leader's snapshot once that
leader has applied beyond its commit index (docs/raft.md, "A follower whose committed
log diverged").

The divergence is built as in the issue: a write is committed on the leader L and on B
only (the link L-A is cut); L is then cut off; B's data directory comes back as an older
copy (taken before the write: not empty, same incarnation, so its identity does not catch
it) and B, not knowing it lost anything, elects a leader with A, which never had the
write. When L's links come back, L follows that leader and finds, at or before the
write's index, an entry of another term below its commit index. Every wait is on a
condition with a deadline (generous: the machine is shared).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from nemesis.platforms.tcp_proxy import ProxyMode
from system.kv.client import KVClient, NotFound

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _applied(client: KVClient, key: str, by: str = "", address: str = "") -> bool:
    """Whether a stale read finds `key` (asked of `address` first and answered by node
    `by`, if given: a client otherwise keeps asking the node that answered last)."""
    try:
        result = client.get(key, consistency="stale", via=address or None)
    except NotFound:
        return False
    return not by or result.node_id == by


def _error_lines(log_file) -> list[str]:  # noqa: ANN001
    lines = []
    for raw in log_file.read_text().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if record.get("level") == "error":
            lines.append(record.get("msg", ""))
    return lines


def test_an_old_leader_whose_committed_log_diverged_is_reported_and_repaired(tmp_path) -> None:
    with LocalCluster(3, tmp_path, proxy_peer_links=True) as cluster:
        cluster.start()
        old = cluster.wait_for_leader(timeout_s=60)
        a, b = [n for n in cluster.ids if n != old]
        with KVClient([cluster.specs[old].address], timeout_s=20) as kv:
            kv.put("before", b"1")
        # B's older copy: taken while B is stopped, after it applied "before".
        with KVClient([cluster.specs[b].address], timeout_s=20) as direct:
            cluster.wait_until(lambda: _applied(direct, "before"), 60,
                               f"{b} to apply the first write")
        assert cluster.stop(b) == 0
        backup = tmp_path / "backup"
        shutil.copytree(cluster.specs[b].data_dir, backup)
        cluster.start_node(b)
        for link in ((old, a), (a, old)):
            cluster.link_proxies[link].set_mode(ProxyMode.CUT)
        with KVClient([cluster.specs[old].address], timeout_s=60) as kv:
            written = kv.put("x", b"acknowledged")  # committed by the old leader and B
        with KVClient([cluster.specs[b].address], timeout_s=20) as direct:
            cluster.wait_until(lambda: _applied(direct, "x"), 60,
                               f"{b} to apply the acknowledged write")
        cluster.isolate(old)
        cluster.kill(b)
        shutil.rmtree(cluster.specs[b].data_dir)
        shutil.copytree(backup, cluster.specs[b].data_dir)  # B's disk went back in time
        cluster.start_node(b)
        for link, proxy in cluster.link_proxies.items():
            if old not in link:
                proxy.set_mode(ProxyMode.FORWARD)
        # The new leader's NOOP lands right after B's older log: at or below the write.
        cluster.wait_for_leader(timeout_s=90, among=[a, b])
        cluster.heal()
        cluster.wait_until(
            lambda: [line for line in _error_lines(cluster.specs[old].log_file)
                     if "committed log diverged from leader" in line], 90,
            f"{old} to find its committed log diverged")
        (own,) = [line for line in _error_lines(cluster.specs[old].log_file)
                  if "committed log diverged from leader" in line]
        found = re.search(r"diverged from leader (\w+)'s at index (\d+) .* at or below its "
                          r"commit index (\d+)", own)
        assert found, own
        leader, at, commit = found.group(1), int(found.group(2)), int(found.group(3))
        # Where the logs differ: after B's older copy ends, at or before the write, which
        # the old leader had committed.
        assert leader in (a, b) and at <= written.applied_index <= commit, own
        cluster.wait_until(
            lambda: any(f"follower {old}'s committed log diverged from ours at index {at} "
                        f"(its commit index {commit}, ours" in line
                        for line in _error_lines(cluster.specs[leader].log_file)),
            60, f"{leader} to log an ERROR naming {old}")
        # Both lines carry the `safety` mark the harness gathers into the history
        # (nemesis/safety_reports.py): a repaired divergence shows in no answer.
        from nemesis.safety_reports import scan

        reported = {(r["node"], r["rule"]) for r in scan(cluster.specs[old].log_file.parent)}
        assert {(old, "committed-log-diverged"), (leader, "committed-log-diverged")} <= reported
        # Until it is repaired it serves not even a stale read of what the cluster lost:
        # it refuses, naming the leader, and the client asks the leader instead.
        with KVClient([cluster.specs[old].address], timeout_s=20) as direct:
            with pytest.raises(NotFound) as answer:
                direct.get("x", consistency="stale")
            assert answer.value.node_id == leader
            assert direct.get("before", consistency="stale").node_id == leader
        # The others carry on; once the leader has applied beyond the old leader's commit
        # index, its snapshot replaces the old leader's log and state.
        cluster.wait_for_leader(timeout_s=90, among=[a, b])
        with KVClient([cluster.specs[a].address, cluster.specs[b].address], timeout_s=60) as kv:
            for i in range(commit + 1):
                kv.put(f"after-{i}", b"2")
        with KVClient([cluster.specs[old].address], timeout_s=20) as direct:
            # (Answered by the old leader itself: while it refuses, the leader answers.)
            address = cluster.specs[old].address
            cluster.wait_until(lambda: _applied(direct, f"after-{commit}", old, address), 90,
                               f"{old} to be repaired and catch up")
            with pytest.raises(NotFound) as answer:
                direct.get("x", consistency="stale", via=address)
            assert answer.value.node_id == old  # the write the cluster lost is gone here too
        assert cluster.is_running(old)
        text = cluster.specs[old].log_file.read_text()
        assert f"replaced by leader {leader}'s snapshot" in text
