"""A 3-node cluster of real node processes elects a leader and serves the client API;
every bad input gets its own clear error and no input takes a node down.

Real processes on loopback; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import queue

import grpc
import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.client import CasMismatch, InvalidArgument, KVClient, NotFound
from system.kv.proto import kv_pb2, kv_pb2_grpc

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(3, tmp_path_factory.mktemp("cluster3"),
                      node_args=["--max-value-bytes", "4096", "--max-key-bytes", "64"]) as c:
        c.start()
        c.wait_for_leader(timeout_s=20)
        yield c


@pytest.fixture
def client(cluster: LocalCluster):
    with cluster.client(timeout_s=10) as kv:
        yield kv


def _raw_stub(address: str) -> tuple[grpc.Channel, kv_pb2_grpc.KVStub]:
    channel = grpc.insecure_channel(address)
    return channel, kv_pb2_grpc.KVStub(channel)


def test_three_nodes_elect_one_leader_all_agree_on(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(timeout_s=10)
    statuses = [cluster.status(node_id) for node_id in cluster.ids]
    assert all(st is not None for st in statuses)
    assert [st.role for st in statuses].count("leader") == 1
    assert {st.leader_id for st in statuses} == {leader}
    assert len({st.term for st in statuses}) == 1


def test_put_get_cas_delete_round_trip(client: KVClient) -> None:
    first = client.put("fruit", b"apple")
    assert first.version == 1
    got = client.get("fruit")
    assert (got.value, got.version, got.stale) == (b"apple", 1, False)

    second = client.cas("fruit", b"banana", expected_version=1)
    assert second.version == 2
    with pytest.raises(CasMismatch) as mismatch:
        client.cas("fruit", b"cherry", expected_version=1)
    assert mismatch.value.current_version == 2
    assert client.get("fruit").value == b"banana"

    created = client.cas("new-key", b"x", expected_version=0)  # 0 = must not exist
    assert created.version == 1
    with pytest.raises(CasMismatch) as exists:
        client.cas("new-key", b"y", expected_version=0)
    assert exists.value.current_version == 1

    deleted = client.delete("fruit")
    assert (deleted.existed, deleted.version) == (True, 2)
    with pytest.raises(NotFound):
        client.get("fruit")
    again = client.delete("fruit")
    assert again.existed is False


def test_stale_read_on_a_follower_says_it_is_stale_and_how_far_it_got(cluster: LocalCluster,
                                                                        client: KVClient) -> None:
    written = client.put("stale-demo", b"v1")
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.ids if i != leader)
    cluster.wait_for_applied(follower, written.applied_index)
    with KVClient([cluster.specs[follower].address]) as direct:
        got = direct.get("stale-demo", consistency="stale")
    assert got.stale is True
    assert got.node_id == follower
    assert got.applied_index >= written.applied_index
    assert got.value == b"v1"


def test_client_reaches_the_leader_from_a_follower(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.ids if i != leader)
    # The follower is listed first: it forwards (tests/kv/test_node_forwarding.py; with
    # --no-forward the client follows its hint instead).
    addresses = [cluster.specs[follower].address, cluster.specs[leader].address]
    with KVClient(addresses) as kv:
        assert kv.put("redirected", b"1").node_id == leader


@pytest.mark.parametrize(
    ("call", "expected_message"),
    [
        (lambda kv: kv.put("", b"v"), "key is empty"),
        (lambda kv: kv.put("k" * 65, b"v"), "65 bytes long; the limit is 64"),
        (lambda kv: kv.put("k", b"v" * 4097), "4097 bytes; the limit is 4096"),
        (lambda kv: kv.get(""), "key is empty"),
        (lambda kv: kv.delete("k" * 100), "100 bytes long; the limit is 64"),
        (lambda kv: kv.get("k", consistency="eventual"), "consistency must be"),
    ],
    ids=["empty-key", "long-key", "big-value", "get-empty-key", "delete-long-key", "bad-consistency"],
)
def test_client_bad_input_gets_invalid_argument(client: KVClient, call, expected_message: str) -> None:
    with pytest.raises(InvalidArgument, match=expected_message):
        call(client)


def test_expected_version_on_missing_key_is_a_cas_mismatch_at_version_zero(client: KVClient) -> None:
    with pytest.raises(CasMismatch) as mismatch:
        client.put("never-written", b"v", expected_version=3)
    assert mismatch.value.current_version == 0
    with pytest.raises(CasMismatch) as on_delete:
        client.delete("never-written", expected_version=1)
    assert on_delete.value.current_version == 0
    with pytest.raises(NotFound):
        client.get("never-written")


def test_raw_bad_requests_get_invalid_argument_and_the_node_survives(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    address = cluster.specs[leader].address
    channel = grpc.insecure_channel(address)
    with channel:
        raw_put = channel.unary_unary("/manyasone.kv.KV/Put")  # bytes in, bytes out
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28"):
            with pytest.raises(grpc.RpcError) as err:
                raw_put(garbage, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid manyasone.kv.PutRequest" in err.value.details()

        stub = kv_pb2_grpc.KVStub(channel)
        with pytest.raises(grpc.RpcError) as bad_enum:
            stub.Get(kv_pb2.GetRequest(key="k", consistency=7), timeout=5)
        assert bad_enum.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "consistency 7 is not one of" in bad_enum.value.details()

        with pytest.raises(grpc.RpcError) as unknown_method:
            channel.unary_unary("/manyasone.kv.KV/Explode")(b"", timeout=5)
        assert unknown_method.value.code() == grpc.StatusCode.UNIMPLEMENTED

        # Every node still answers.
        for node_id in cluster.ids:
            assert cluster.status(node_id, timeout_s=5) is not None


def test_the_session_stream_answers_each_request_by_seq_and_refuses_garbage_per_request(
        cluster: LocalCluster) -> None:
    """One stream carries many requests; a bad one gets its own error and the stream and
    the node carry on."""
    leader = cluster.wait_for_leader()
    frames = [
        kv_pb2.SessionRequest(seq=1, put=kv_pb2.PutRequest(key="sess", value=b"a",
                                                           request_id="sess-1")),
        kv_pb2.SessionRequest(seq=2, get=kv_pb2.GetRequest(key="sess")),
        kv_pb2.SessionRequest(seq=3, put=kv_pb2.PutRequest(key="", value=b"a")),
        kv_pb2.SessionRequest(seq=4),  # no request in it
        kv_pb2.SessionRequest(seq=5, delete=kv_pb2.DeleteRequest(key="sess")),
    ]
    raw = [frame.SerializeToString() for frame in frames]
    raw.insert(3, b"\xff\xff\xff")  # not a SessionRequest at all
    with grpc.insecure_channel(cluster.specs[leader].address) as channel:
        session = channel.stream_stream("/manyasone.kv.KV/Session")  # bytes in, bytes out
        # One request at a time (the next leaves once the previous is answered): the
        # node serves a stream's requests concurrently, in no promised order.
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        call = session(iter(outbox.get, None), timeout=10)
        answers = []
        for frame in raw:
            outbox.put(frame)
            answers.append(kv_pb2.SessionResponse.FromString(next(call)))
        outbox.put(None)
    by_seq = {a.seq: a for a in answers}
    assert by_seq[1].put.version >= 1 and by_seq[1].put.applied
    assert by_seq[1].put.header.node_id == leader
    assert (by_seq[2].get.found, by_seq[2].get.value) == (True, b"a")
    assert by_seq[3].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "key is empty" in by_seq[3].error.message
    assert by_seq[3].error.outcome == "not-applied"
    assert by_seq[4].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "no put, get or delete" in by_seq[4].error.message
    assert "not a valid manyasone.kv.SessionRequest" in by_seq[0].error.message
    assert by_seq[5].delete.existed


def test_rate_limit_answers_resource_exhausted_with_the_limit(tmp_path) -> None:
    with LocalCluster(1, tmp_path, node_args=["--max-requests-per-s", "5"]) as single:
        single.start()
        single.wait_for_leader(timeout_s=20)
        channel, stub = _raw_stub(single.addresses[0])
        codes = []
        with channel:
            for i in range(500):  # bounded; a 5/s budget runs out within the first few dozen
                try:
                    stub.Get(kv_pb2.GetRequest(key=f"k{i}", consistency=kv_pb2.STALE), timeout=5)
                    codes.append("ok")
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert "rate limit of 5 requests/s" in exc.details()
                    assert dict(exc.trailing_metadata())["kv-outcome"] == "not-applied"
                    codes.append("limited")
                    break
        assert codes[0] == "ok" and codes[-1] == "limited"


def test_garbage_on_the_peer_port_is_refused_and_the_node_survives(cluster: LocalCluster) -> None:
    from system.kv.proto import raft_pb2

    address = cluster.specs[cluster.ids[0]].address
    with grpc.insecure_channel(address) as channel:
        raw_send = channel.unary_unary("/manyasone.raft.RaftPeer/Send")
        with pytest.raises(grpc.RpcError) as garbage:
            raw_send(b"\xff\xfe\xfd", timeout=5)
        assert "Error parsing message" in garbage.value.details()  # gRPC's own refusal
        stranger = raft_pb2.MessageBatch(
            src="intruder", messages=[raft_pb2.RaftMessage(type=raft_pb2.VOTE, src="intruder",
                                                           dst=cluster.ids[0], term=99)])
        with pytest.raises(grpc.RpcError) as unknown_peer:
            raw_send(stranger.SerializeToString(), timeout=5)
        assert unknown_peer.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "does not know peer 'intruder'" in unknown_peer.value.details()
    leader = cluster.wait_for_leader(timeout_s=10)
    assert cluster.status(leader).term < 99  # the stranger's term was never taken up
