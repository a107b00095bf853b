"""EtcdClient when members die: a SIGKILLed leader costs a write at most an `info`, a
member without a leader refuses writes as certainly-not-applied, and the history of
writers running through a leader's death is linearizable under versioned-kv."""

from __future__ import annotations

import contextlib
import threading

import pytest

from checker import check_linearizable, check_lost_writes, models
from histories.pairing import pair_operations
from histories.read import read_history
from histories.write import HistoryWriter
from nemesis.systems.etcd.client import (
    CasMismatch,
    EtcdClient,
    Indeterminate,
    NotFound,
    Unavailable,
)
from tests.nemesis.waiting import wait_until

pytestmark = pytest.mark.integration


def test_write_to_a_killed_leader_fails_over(etcd_cluster_factory):
    cluster = etcd_cluster_factory()
    leader = cluster.leader()
    ordered = {leader: cluster.addresses[leader],
               **{n: a for n, a in cluster.addresses.items() if n != leader}}
    with EtcdClient(ordered, timeout_s=10.0) as client:
        assert client.put("k", b"1").version == 1
        cluster.kill(leader)
        # Right after the kill a follower still forwards proposals to the dead leader,
        # where they are lost: etcd answers "request timed out, possibly due to previous
        # leader failure" after its 7 s request timeout — unknown, never a wrong ok.
        with contextlib.suppress(Indeterminate, Unavailable):
            assert client.put("k", b"2").version == 2
        new_leader = cluster.leader()
        assert new_leader != leader
        # The dead member refuses connections: nothing is sent there, the next one serves.
        seen = client.get("k").version
        assert seen in (1, 2)
        w = client.put("k", b"3", expected_version=seen)
        assert w.version == seen + 1 and w.node_id != leader
        assert client.get("k").value == b"3"


def test_member_without_leader_refuses_writes_as_not_applied(etcd_cluster_factory):
    cluster = etcd_cluster_factory()
    alone = cluster.names[0]
    for name in cluster.names[1:]:
        cluster.kill(name)
    wait_until(lambda: (s := cluster.status(alone)) is not None and s.leader_id == "", 30.0,
               f"{alone} to know no leader")
    with EtcdClient({alone: cluster.addresses[alone]}, timeout_s=1.5) as client:
        with pytest.raises(Unavailable) as refused:
            client.put("nl", b"never")
        assert "no leader" in str(refused.value)
        with pytest.raises(Unavailable):
            client.get("nl")  # linearizable: needs a leader
        with pytest.raises(NotFound):
            client.get("nl", consistency="stale")  # its own state: served, and empty
    for name in cluster.names[1:]:
        cluster.start(name)
    cluster.leader()
    with EtcdClient(cluster.addresses, timeout_s=10.0) as client, pytest.raises(NotFound):
        client.get("nl")  # certainly not applied, indeed


def test_writers_through_a_leader_kill_stay_linearizable(etcd_cluster_factory, tmp_path):
    """Three writers on one key (puts and compare-and-swaps) while the leader is
    SIGKILLed: every outcome is ok, fail (certainly not applied) or info, and the history
    with a final read passes versioned-kv — no acknowledged write lost, no wrong ok."""
    cluster = etcd_cluster_factory()
    leader = cluster.leader()
    path = tmp_path / "history.jsonl"
    stop = threading.Event()
    outcomes: dict[str, int] = {"ok": 0, "fail": 0, "info": 0}
    lock = threading.Lock()

    def writer(history: HistoryWriter, thread_no: int) -> None:
        process = thread_no
        client = EtcdClient(cluster.addresses, timeout_s=3.0, client_id=f"p{process}")
        seen, n = 0, 0
        try:
            while not stop.is_set():
                n += 1
                value = f"{process}-{n}"
                expected = seen if n % 2 else None
                i = history.invoke(process, "put", "hot", value,
                                   **({} if expected is None else {"expected_version": expected}))
                try:
                    w = client.put("hot", value.encode(), expected_version=expected)
                    history.complete(i, "ok", value, version=w.version, applied=True)
                    seen, kind = w.version, "ok"
                except CasMismatch as exc:
                    history.complete(i, "ok", value, version=exc.current_version, applied=False)
                    seen, kind = exc.current_version, "ok"
                except Unavailable as exc:
                    history.complete(i, "fail", value, error=str(exc)[:200])
                    kind = "fail"
                except Indeterminate as exc:
                    history.complete(i, "info", value, error=str(exc)[:200])
                    kind = "info"
                    client.close()  # the process retires, as the workload's does
                    process += 3
                    client = EtcdClient(cluster.addresses, timeout_s=3.0,
                                        client_id=f"p{process}")
                with lock:
                    outcomes[kind] += 1
        finally:
            client.close()

    with HistoryWriter(path) as history:
        threads = [threading.Thread(target=writer, args=(history, t)) for t in range(3)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: outcomes["ok"] >= 20, 30.0, "some writes before the kill")
            before = outcomes["ok"]
            cluster.kill(leader)
            wait_until(lambda: outcomes["ok"] >= before + 20, 30.0,
                       "writes acknowledged after the kill")
        finally:
            stop.set()
            for t in threads:
                t.join(30.0)
        cluster.start(leader)
        cluster.leader()
        with EtcdClient(cluster.addresses, timeout_s=10.0) as reader:
            i = history.invoke(99, "get", "hot", None, consistency="linearizable")
            r = reader.get("hot")
            history.complete(i, "ok", r.value.decode(), version=r.version)
    operations = pair_operations(read_history(path))
    lin = check_linearizable(operations, models.versioned_kv(), budget_s=60, all_keys=True)
    assert lin.valid is True, (outcomes, lin.to_json())
    assert check_lost_writes(operations).valid is True
    print(f"outcomes through the leader kill: {outcomes}")
