"""Linearizable gets on the Session stream: the leader answers them in their ReadIndex
round's callback, without a task each (system/kv/server.py). Every get sent on a stream is
answered, with its own seq and the value of the last write acknowledged before it, also
when the client half-closes the stream right after sending; a follower's gets still take
the general path (it forwards them).

Real processes on loopback; every wait has a deadline.
"""

from __future__ import annotations

import grpc
import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.client import KVClient
from system.kv.proto import kv_pb2

pytestmark = pytest.mark.integration

GETS = 200


def _pipelined_gets(address: str, key: str) -> dict[int, kv_pb2.SessionResponse]:
    """Send GETS linearizable gets on one stream without waiting, half-close, and read
    every answer until the stream ends."""
    frames = [kv_pb2.SessionRequest(seq=seq, timeout_ms=10_000, get=kv_pb2.GetRequest(
        key=key, consistency=kv_pb2.LINEARIZABLE)) for seq in range(1, GETS + 1)]
    with grpc.insecure_channel(address) as channel:
        session = channel.stream_stream(
            "/manyasone.kv.KV/Session",
            request_serializer=kv_pb2.SessionRequest.SerializeToString,
            response_deserializer=kv_pb2.SessionResponse.FromString)
        answers = list(session(iter(frames), timeout=30))  # the iterator ends: half-close
    return {answer.seq: answer for answer in answers}


@pytest.mark.parametrize("member", ["leader", "follower"])
def test_every_pipelined_get_is_answered_with_the_acknowledged_value(
        cluster: LocalCluster, member: str) -> None:
    leader = cluster.wait_for_leader(timeout_s=20)
    target = leader if member == "leader" else next(i for i in cluster.ids if i != leader)
    key = f"session-reads-{member}"
    with KVClient([cluster.specs[leader].address], timeout_s=10) as kv:
        written = kv.put(key, b"the acknowledged value")
    answers = _pipelined_gets(cluster.specs[target].address, key)
    assert sorted(answers) == list(range(1, GETS + 1))
    for answer in answers.values():
        assert answer.WhichOneof("response") == "get", answer
        assert answer.get.found and answer.get.value == b"the acknowledged value"
        assert answer.get.version == written.version and not answer.get.stale


def test_a_get_of_an_invalid_key_still_gets_its_error(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(timeout_s=20)
    answers = _pipelined_gets(cluster.specs[leader].address, "")
    assert len(answers) == GETS
    assert all(a.WhichOneof("response") == "error" and "key is empty" in a.error.message
               for a in answers.values())
