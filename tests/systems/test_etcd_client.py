"""EtcdClient (nemesis/systems/etcd/client.py) against a real 3-member etcd on loopback:
every operation and outcome the kv workload uses, and its versions against the
versioned-kv model, through the workload itself and the project's checker."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

import workloads.kv as kv_workload
from checker import check_linearizable, check_lost_writes, models
from histories.pairing import pair_operations
from histories.read import read_history
from histories.write import HistoryWriter
from nemesis.systems.etcd.client import (
    CasMismatch,
    DeleteVersionMismatch,
    EtcdClient,
    InvalidArgument,
    NotFound,
    outcome_of,
)
from tests.nemesis.waiting import wait_until
from workloads.base import RunContext

pytestmark = pytest.mark.integration


@pytest.fixture
def client(etcd_cluster):
    with EtcdClient(etcd_cluster.addresses, timeout_s=10.0) as c:
        yield c


def test_put_get_and_versions_count_writes(client):
    assert client.put("pg", b"a").version == 1
    w = client.put("pg", b"b")
    assert w.version == 2 and w.node_id in ("e1", "e2", "e3") and w.term > 0
    r = client.get("pg")
    assert (r.value, r.version, r.stale) == (b"b", 2, False)
    with pytest.raises(NotFound) as missing:
        client.get("pg-never-written")
    assert missing.value.node_id in ("e1", "e2", "e3")


def test_stale_get_on_every_member_catches_up(client, etcd_cluster):
    client.put("stale", b"x")
    client.put("stale", b"y")
    for name in etcd_cluster.names:
        # A serializable read is the member's own state: it may lag, never run ahead.
        def caught_up(name=name):
            try:
                r = client.get("stale", consistency="stale", via=name)
            except NotFound as exc:  # a member that has not applied the first put yet
                assert exc.node_id == name
                return False
            assert r.stale and r.node_id == name and r.version <= 2
            return r.version == 2 and r.value == b"y"
        wait_until(caught_up, 10.0, f"{name} to apply version 2")
    with pytest.raises(InvalidArgument):
        client.get("stale", consistency="bounded")


def test_compare_and_swap_right_wrong_absent_future(client):
    assert client.put("cas", b"v1", expected_version=0).version == 1  # absent, expected 0
    assert client.cas("cas", b"v2", 1).version == 2  # right
    for expected in (1, 0, 7):  # stale, "absent" on an existing key, future
        with pytest.raises(CasMismatch) as mismatch:
            client.cas("cas", b"never", expected)
        assert (mismatch.value.expected_version, mismatch.value.current_version) == (expected, 2)
    assert client.get("cas").value == b"v2"
    with pytest.raises(CasMismatch) as absent:  # a version on a key that does not exist
        client.cas("cas-absent", b"never", 3)
    assert absent.value.current_version == 0
    with pytest.raises(NotFound):
        client.get("cas-absent")


def test_delete_with_and_without_version(client):
    client.put("del", b"a")
    client.put("del", b"b")
    with pytest.raises(DeleteVersionMismatch) as wrong:
        client.delete("del", expected_version=1)
    assert wrong.value.current_version == 2
    assert client.get("del").version == 2  # nothing deleted
    d = client.delete("del", expected_version=2)
    assert (d.existed, d.version) == (True, 2)  # the version it removed
    with pytest.raises(NotFound):
        client.get("del")
    gone = client.delete("del")
    assert (gone.existed, gone.version) == (False, 0)
    assert client.delete("del", expected_version=0).existed is False
    with pytest.raises(DeleteVersionMismatch) as on_absent:
        client.delete("del", expected_version=2)
    assert on_absent.value.current_version == 0
    assert client.put("del", b"again").version == 1  # re-created: versions start over
    d = client.delete("del")
    assert (d.existed, d.version) == (True, 1)


def test_refused_arguments_send_nothing(client):
    for bad in ("", None, 3):
        with pytest.raises(InvalidArgument):
            client.put(bad, b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        client.put("k", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        client.cas("k", b"x", -1)


def test_error_classes():
    """Only errors that prove nothing was proposed are "not-applied"."""
    u = grpc.StatusCode.UNAVAILABLE
    assert outcome_of(u, "etcdserver: no leader") == "not-applied"
    assert outcome_of(grpc.StatusCode.UNKNOWN, "raft proposal dropped") == "not-applied"
    assert outcome_of(u, "etcdserver: rpc not supported for learner") == "not-applied"
    assert outcome_of(u, "failed to connect to all addresses; last error: UNKNOWN: "
                         "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"
                      ) == "not-applied"
    for unknown in ("etcdserver: request timed out",
                    "etcdserver: request timed out, possibly due to previous leader failure",
                    "etcdserver: leader changed", "etcdserver: server stopped", "Socket closed"):
        assert outcome_of(u, unknown) == "unknown", unknown
    assert outcome_of(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") == "unknown"
    assert outcome_of(grpc.StatusCode.INVALID_ARGUMENT,
                      "etcdserver: request is too large") == "invalid"


def _check(path):
    operations = pair_operations(read_history(path))
    lin = check_linearizable(operations, models.versioned_kv(), budget_s=60, all_keys=True)
    return operations, lin, check_lost_writes(operations)


def test_kv_workload_history_is_linearizable_under_versioned_kv(etcd_cluster, tmp_path):
    """The kv workload itself (every operation kind and version class) drives etcd for a
    few seconds through EtcdClient; the recorded history passes the versioned-kv model,
    and a history with one version changed does not (the check has teeth)."""
    from nemesis.systems.store import StoreKvClient, StoreSystem

    class EtcdThroughTheStoreMapping(StoreSystem):
        """The store's system with etcd's client in its place: EtcdClient raises the
        store client's error types, so the store's outcome mapping applies as is. etcd
        has no request ids: no replays (a replayed write would apply again)."""

        idempotent_request_ids = False

        def kv_client(self, addresses, *, timeout_s, client_id, tls=None, **_):  # noqa: ANN001, ANN201
            return StoreKvClient(EtcdClient(addresses, timeout_s=timeout_s,
                                            client_id=client_id, tls=tls))

    path = tmp_path / "history.jsonl"
    workload = kv_workload.KVWorkload(concurrency=4, rate=200, op_timeout_s=5.0, keys=2,
                                      ops_per_key=40, system=EtcdThroughTheStoreMapping())
    with HistoryWriter(path) as history:
        ctx = RunContext(dict(etcd_cluster.addresses), history, seed=7,
                         deadline=time.monotonic() + 3.0, stop=threading.Event())
        workload.start(ctx)
        assert workload.join(30.0)
        final = workload.final_reads(ctx, 10.0)
    assert final["unread"] == [] and not workload.harness_errors
    operations, lin, lost = _check(path)
    counts = workload.counts.snapshot()
    assert sum(row["ok"] for row in counts.values()) > 50, counts
    applied = [op for op in operations if op.f == "put" and op.applied is True]
    refused = [op for op in operations if op.applied is False]
    assert applied and refused  # compare-and-swaps that matched and that did not
    assert lin.valid is True, lin.to_json()
    assert lost.valid is True, lost.to_json()

    # One put's reported version off by one: the model must reject it.
    lines = path.read_text().splitlines()
    victim = next(i for i, line in enumerate(lines)
                  if '"type":"ok"' in line and '"f":"put"' in line and '"applied":true' in line)
    import json
    record = json.loads(lines[victim])
    record["version"] += 1
    lines[victim] = json.dumps(record, separators=(",", ":"))
    bad = tmp_path / "tampered.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert _check(bad)[1].valid is False
