"""A follower forwards writes and linearizable reads to the leader (one hop, the same
request id), so a client that does not know the leader pays no redirect; a retry of a
forwarded write across a leader change still applies once.

Real processes on loopback; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import time

import grpc
import pytest

from nemesis.platforms.local_cluster import LocalCluster
from nemesis.platforms.tcp_proxy import ProxyMode, TcpProxy
from system.kv.client import Indeterminate, KVClient
from system.kv.forward import FORWARDED_BY
from system.kv.proto import kv_pb2, kv_pb2_grpc

pytestmark = pytest.mark.integration


def _follower(cluster: LocalCluster) -> tuple[str, str]:
    leader = cluster.wait_for_leader(timeout_s=20)
    return leader, next(i for i in cluster.ids if i != leader)


def test_a_follower_forwards_a_put_a_delete_and_a_linearizable_read(cluster: LocalCluster) -> None:
    leader, follower = _follower(cluster)
    # Only the follower's address and no retries: the answer cannot come from a redirect.
    with KVClient([cluster.specs[follower].address], retries=0, timeout_s=10) as kv:
        written = kv.put("forwarded", b"v1", request_id="fwd-1")
        assert written.node_id == leader, "the leader applied it and answered through the follower"
        assert written.request_id == "fwd-1"
        read = kv.get("forwarded")
        assert (read.value, read.version, read.stale, read.node_id) == (b"v1", 1, False, leader)
        assert kv.delete("forwarded").existed
    # A stale read is the follower's own business: never forwarded.
    cluster.wait_for_applied(follower, written.applied_index)
    with KVClient([cluster.specs[follower].address], retries=0) as kv:
        assert kv.put("stale-local", b"x").node_id == leader
        cluster.wait_until(lambda: _stale_found(kv, "stale-local"), 10, "the follower to apply")
        assert kv.get("stale-local", consistency="stale").node_id == follower


def _stale_found(kv: KVClient, key: str) -> bool | None:
    try:
        kv.get(key, consistency="stale")
    except Exception:  # noqa: BLE001 - not applied there yet
        return None
    return True


def test_a_forwarded_request_is_never_forwarded_again(cluster: LocalCluster) -> None:
    """One hop: a node that receives a forwarded request it cannot serve answers with its
    leader hint (the forwarding follower passes that on to the client)."""
    leader, follower = _follower(cluster)
    with grpc.insecure_channel(cluster.specs[follower].address) as channel:
        stub = kv_pb2_grpc.KVStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(kv_pb2.PutRequest(key="k", value=b"v", request_id="twice"), timeout=5,
                     metadata=((FORWARDED_BY, "n-elsewhere"),))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        metadata = dict(err.value.trailing_metadata())
        assert metadata["leader-id"] == leader
        assert metadata["leader-address"] == cluster.specs[leader].address
        assert metadata["kv-outcome"] == "not-applied"
        # The same on a Session stream marked as forwarded (how followers forward).
        session = channel.stream_stream("/manyasone.kv.KV/Session")
        frame = kv_pb2.SessionRequest(seq=9, put=kv_pb2.PutRequest(key="k", value=b"v"))
        answers = session(iter([frame.SerializeToString()]), timeout=5,
                          metadata=((FORWARDED_BY, "n-elsewhere"),))
        answer = kv_pb2.SessionResponse.FromString(next(answers))
    assert answer.seq == 9
    assert answer.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert (answer.error.leader_id, answer.error.outcome) == (leader, "not-applied")
    assert answer.error.leader_address == cluster.specs[leader].address


def test_a_forwarded_request_carries_the_clients_deadline(cluster: LocalCluster) -> None:
    """The leader is paused: the follower gives up on the hop when the client's deadline
    (800 ms, sent in the request) runs out, with the outcome unknown, rather than after
    its own default of 5 s."""
    leader, follower = _follower(cluster)
    # One forwarded put first, so the follower's connection to the leader is open: a
    # connection that cannot even be set up fails at once as "not applied" (the test
    # depended on an earlier test of the module having forwarded, and failed alone).
    warm = kv_pb2.SessionRequest(seq=0, put=kv_pb2.PutRequest(
        key="deadline-warm", value=b"v", request_id="deadline-0"))
    with grpc.insecure_channel(cluster.specs[follower].address) as channel:
        session = channel.stream_stream("/manyasone.kv.KV/Session")
        warmed = kv_pb2.SessionResponse.FromString(next(session(
            iter([warm.SerializeToString()]), timeout=10)))
        assert not warmed.HasField("error"), warmed
    frame = kv_pb2.SessionRequest(seq=1, timeout_ms=800, put=kv_pb2.PutRequest(
        key="deadline", value=b"v", request_id="deadline-1"))
    cluster.pause(leader)
    try:
        with grpc.insecure_channel(cluster.specs[follower].address) as channel:
            session = channel.stream_stream("/manyasone.kv.KV/Session")
            started = time.monotonic()
            answers = session(iter([frame.SerializeToString()]), timeout=10)
            answer = kv_pb2.SessionResponse.FromString(next(answers))
            elapsed = time.monotonic() - started
    finally:
        cluster.resume(leader)
    assert answer.error.code == grpc.StatusCode.UNKNOWN.value[0], answer
    assert answer.error.outcome == "unknown"
    assert elapsed < 3.0, f"the hop outlived the client's deadline: {elapsed:.2f} s"
    cluster.wait_for_leader(timeout_s=20)


def test_with_no_forward_a_follower_refuses_with_the_leader_hint(tmp_path) -> None:
    with LocalCluster(3, tmp_path, node_args=["--no-forward"]) as cluster:
        cluster.start()
        leader, follower = _follower(cluster)
        with grpc.insecure_channel(cluster.specs[follower].address) as channel, \
                pytest.raises(grpc.RpcError) as err:
            kv_pb2_grpc.KVStub(channel).Get(kv_pb2.GetRequest(key="k"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        metadata = dict(err.value.trailing_metadata())
        assert (metadata["leader-id"], metadata["kv-outcome"]) == (leader, "not-applied")
        assert metadata["leader-address"] == cluster.specs[leader].address
        # The client library follows the hint instead.
        with KVClient([cluster.specs[follower].address, cluster.specs[leader].address]) as kv:
            assert kv.put("redirected", b"1").node_id == leader


def _forwarded_retry_across_leader_kill(cluster: LocalCluster) -> tuple[int, int, int]:
    """Write through a follower, lose the reply, kill the leader, retry the same request id
    through a follower of the new leader (forwarded again).

    Returns (version the retry reports, version a linearizable read sees, how many
    versions the key moved by)."""
    cluster.start()
    leader, follower = _follower(cluster)
    with TcpProxy(cluster.specs[follower].address) as proxy, \
            KVClient([proxy.address], timeout_s=5, attempt_timeout_s=1.0, retries=0) as via_proxy:
        first = via_proxy.put("checkpoint", b"step-1")
        assert (first.version, first.node_id) == (1, leader)
        proxy.set_mode(ProxyMode.DROP_REPLIES)  # forwarded and applied; the answer is lost
        with pytest.raises(Indeterminate) as cut:
            via_proxy.put("checkpoint", b"step-2", timeout_s=1.0)
        request_id = cut.value.request_id
    survivors = [i for i in cluster.ids if i != leader]
    for node in survivors:
        with KVClient([cluster.specs[node].address]) as direct:
            cluster.wait_until(
                lambda d=direct: d.get("checkpoint", consistency="stale").version >= 2, 20,
                f"{node} to apply the cut write")
    cluster.kill(leader)
    new_leader = cluster.wait_for_leader(timeout_s=20, among=survivors)
    new_follower = next(i for i in survivors if i != new_leader)
    with KVClient([cluster.specs[new_follower].address], timeout_s=10, retries=0) as kv:
        retried = kv.put("checkpoint", b"step-2", request_id=request_id)
        assert retried.node_id == new_leader, "the retry went through the follower's hop"
        now = kv.get("checkpoint")
        return retried.version, now.version, now.version - first.version


def test_a_forwarded_retry_across_a_leader_change_applies_once(tmp_path) -> None:
    with LocalCluster(3, tmp_path) as cluster:
        retry_version, read_version, moved_by = _forwarded_retry_across_leader_kill(cluster)
    assert retry_version == 2, "the retry must return the first application's result"
    assert read_version == 2
    assert moved_by == 1, "the forwarded write applied more than once"


def test_without_dedup_the_forwarded_retry_applies_twice(tmp_path) -> None:
    """The previous test can fail: with the no-dedup canary the retry applies again."""
    with LocalCluster(3, tmp_path, node_args=["--unsafe", "no-dedup"],
                      env={"MAO_ALLOW_UNSAFE": "1"}) as cluster:
        retry_version, read_version, moved_by = _forwarded_retry_across_leader_kill(cluster)
    assert (retry_version, read_version, moved_by) == (3, 3, 2)
