"""SessionBatch: a follower forwarding to the leader packs the requests that queued during
its previous write into one stream message, and the leader answers that stream in batches,
so a burst of forwarded writes is proposed in one Ready. Every request in a batch still
gets its own answer under its own seq; a nested batch or a frame that is not a request is
refused with a clear error, and the rest of the batch is served."""

from __future__ import annotations

import asyncio
import collections

import grpc
import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.forward import _LeaderSession
from system.kv.proto import kv_pb2
from system.kv.session import MAX_BATCH_BYTES, MAX_BATCH_FRAMES, take_batch
from system.ports import free_ports


def _frames(messages: list[bytes], kind=kv_pb2.SessionRequest) -> list[bytes]:  # noqa: ANN001
    """The frames one stream message stands for (itself, or its batch's frames)."""
    out: list[bytes] = []
    for raw in messages:
        message = kind.FromString(raw)
        field = "request" if kind is kv_pb2.SessionRequest else "response"
        out.extend(message.batch.frames if message.WhichOneof(field) == "batch" else [raw])
    return out


def test_take_batch_sends_one_frame_alone_and_packs_a_burst_within_its_bounds() -> None:
    alone = collections.deque([b"a"])
    assert take_batch(alone, kv_pb2.SessionRequest) == b"a" and not alone

    burst = collections.deque(kv_pb2.SessionRequest(seq=i).SerializeToString()
                              for i in range(1, MAX_BATCH_FRAMES + 11))
    first = take_batch(burst, kv_pb2.SessionRequest)
    assert len(_frames([first])) == MAX_BATCH_FRAMES and len(burst) == 10
    rest = take_batch(burst, kv_pb2.SessionRequest)
    assert [kv_pb2.SessionRequest.FromString(f).seq for f in _frames([first, rest])] == list(
        range(1, MAX_BATCH_FRAMES + 11)), "every frame once, in order"

    big = b"x" * MAX_BATCH_BYTES
    mixed = collections.deque([b"s", big, b"t"])
    assert take_batch(mixed, kv_pb2.SessionRequest) == b"s", "a large value is not packed"
    assert take_batch(mixed, kv_pb2.SessionRequest) == big and list(mixed) == [b"t"]


class _FakeLeader:
    """An aio gRPC server whose Session records each stream message and answers every
    request with version = its key, batches as one reversed batch (order is not promised)."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def session(self, request_iterator, context):  # noqa: ANN001, ANN201
        async for raw in request_iterator:
            self.messages.append(raw)
            request = kv_pb2.SessionRequest.FromString(raw)
            frames = list(request.batch.frames) if request.WhichOneof("request") == "batch" else [raw]
            answers = [self._answer(kv_pb2.SessionRequest.FromString(f)) for f in reversed(frames)]
            if len(answers) == 1:
                yield answers[0]
            else:
                yield kv_pb2.SessionResponse(batch=kv_pb2.SessionBatch(
                    frames=answers)).SerializeToString()

    @staticmethod
    def _answer(request: kv_pb2.SessionRequest) -> bytes:
        return kv_pb2.SessionResponse(seq=request.seq, put=kv_pb2.PutResponse(
            applied=True, version=int(request.put.key))).SerializeToString()


async def _forward_burst(count: int) -> tuple[list[int], list[bytes]]:
    fake = _FakeLeader()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("manyasone.kv.KV", {
        "Session": grpc.stream_stream_rpc_method_handler(fake.session)}),))
    (port,) = free_ports(1)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    session = _LeaderSession(channel, "n-follower")
    try:
        frames = [kv_pb2.SessionRequest(put=kv_pb2.PutRequest(key=str(i), value=b"v"))
                  for i in range(1, count + 1)]
        answers = await asyncio.gather(*(session.call(f, timeout_s=10) for f in frames))
        return [a.put.version for a in answers], fake.messages
    finally:
        session.close()
        await channel.close(grace=None)
        await server.stop(grace=None)


def test_a_forwarding_burst_leaves_in_batches_and_every_answer_finds_its_caller() -> None:
    versions, messages = asyncio.run(_forward_burst(40))
    assert versions == list(range(1, 41)), "each caller got the answer to its own request"
    assert len(_frames(messages)) == 40, "every request sent once"
    assert len(messages) < 40, f"the burst left unbatched ({len(messages)} messages)"


@pytest.mark.integration
def test_the_leader_serves_each_request_of_a_batch_and_refuses_what_is_not_one(
        cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(timeout_s=20)
    puts = [kv_pb2.SessionRequest(seq=i, timeout_ms=10_000, put=kv_pb2.PutRequest(
        key=f"batched-{i}", value=b"v", request_id=f"batched-{i}")) for i in (1, 2, 3)]
    nested = kv_pb2.SessionRequest(seq=4, batch=kv_pb2.SessionBatch(
        frames=[puts[0].SerializeToString()]))
    batch = kv_pb2.SessionRequest(batch=kv_pb2.SessionBatch(frames=[
        *(p.SerializeToString() for p in puts), nested.SerializeToString(), b"\xff\xff not one"]))
    with grpc.insecure_channel(cluster.specs[leader].address) as channel:
        stream = channel.stream_stream("/manyasone.kv.KV/Session")
        answers: dict[int, kv_pb2.SessionResponse] = {}
        errors_without_seq: list[kv_pb2.SessionResponse] = []
        for raw in stream(iter([batch.SerializeToString()]), timeout=15):
            for frame in _frames([raw], kv_pb2.SessionResponse):
                answer = kv_pb2.SessionResponse.FromString(frame)
                if answer.seq:
                    answers[answer.seq] = answer
                else:
                    errors_without_seq.append(answer)
    assert sorted(answers) == [1, 2, 3, 4]
    assert all(answers[i].put.applied and answers[i].put.version == 1 for i in (1, 2, 3))
    assert answers[4].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "never nested" in answers[4].error.message
    assert len(errors_without_seq) == 1
    assert "not a valid manyasone.kv.SessionRequest" in errors_without_seq[0].error.message
