"""The `reorder` fault on local: the link proxies write a peer lane's frames late (behind
later ones) and some twice, each frame whole; any other stream passes untouched; the heal
writes what was held back."""

from __future__ import annotations

import random

from nemesis.platforms.frame_reorder import MAX_LATE_FRAMES, FrameReorderer
from nemesis.platforms.peer_frames import PeerFrames
from nemesis.platforms.tcp_proxy import TcpProxy
from system.kv.peer_tcp import MAGIC
from system.kv.proto import raft_pb2
from tests.nemesis.test_proxy_hold import _dial, _Sink
from tests.nemesis.waiting import wait_until


def _frame(*indexes: int) -> bytes:
    batch = raft_pb2.MessageBatch(src="n1", messages=[
        raft_pb2.RaftMessage(type=raft_pb2.APPEND, src="n1", dst="n2", term=3, index=i)
        for i in indexes])
    payload = batch.SerializeToString()
    return len(payload).to_bytes(4, "big") + payload


def _indexes(stream: bytes) -> list[int]:
    return [m.index for m in PeerFrames().feed(stream)]


def test_frames_come_out_whole_some_late_some_twice_and_the_heal_flushes_the_rest() -> None:
    reorderer = FrameReorderer(random.Random(7))
    sent = list(range(1, 201))
    stream = MAGIC + b"".join(_frame(i) for i in sent)
    out = bytearray()
    for start in range(0, len(stream), 7):  # chunks that cut frames anywhere
        out += reorderer.feed(stream[start:start + 7], 0.5)
    out += reorderer.feed(b"", 0.0)  # healed: the late ones go with the next bytes
    got = _indexes(bytes(out))
    assert out.startswith(MAGIC)
    assert sorted(set(got)) == sent  # nothing lost, every frame parses whole
    overtaken = sum(1 for a, b in zip(got, got[1:], strict=False) if b < a)
    assert overtaken > 10 and len(got) - len(sent) > 10  # late ones, and twice
    assert reorderer.reordered >= overtaken and reorderer.duplicated == len(got) - len(sent)
    # A late frame waits for at most MAX_LATE_FRAMES later ones placed after it (each of
    # which may bring other late frames out with it): bounded, not lost in the lane.
    for position, index in enumerate(got):
        assert sum(1 for later in got[:position] if later > index) <= 2 * MAX_LATE_FRAMES


def test_a_frame_of_several_messages_is_split_so_they_can_overtake_each_other() -> None:
    reorderer = FrameReorderer(random.Random(1))
    out = reorderer.feed(MAGIC + b"".join(_frame(i, i + 1, i + 2) for i in range(1, 300, 3)), 0.5)
    out += reorderer.feed(b"", 0.0)
    got = _indexes(out)
    assert sorted(set(got)) == list(range(1, 301))
    assert any(b < a for a, b in zip(got, got[1:], strict=False))


def test_without_the_fault_a_lane_passes_in_order_and_other_streams_untouched() -> None:
    lane = MAGIC + b"".join(_frame(i) for i in range(1, 50))
    assert FrameReorderer(random.Random(2)).feed(lane, 0.0) == lane
    grpc = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(range(256)) * 4
    other = FrameReorderer(random.Random(2))
    assert other.feed(grpc[:10], 0.5) + other.feed(grpc[10:], 0.5) == grpc
    assert other.passthrough


def test_the_proxy_reorders_only_while_set_and_counts_what_it_moved() -> None:
    sink = _Sink()
    with TcpProxy(sink.address, seed=3) as proxy:
        proxy.set_reorder(0.5)
        conn = _dial(proxy.address)
        conn.sendall(MAGIC + b"".join(_frame(i) for i in range(1, 101)))
        wait_until(lambda: proxy.frames_reordered > 0, 10, "frames moved")
        proxy.set_reorder(0.0)
        conn.sendall(_frame(101))  # the heal: held-back frames go with the next bytes
        wait_until(lambda: 101 in _indexes(b"".join(sink.snapshot())), 10, "the last frame")
        got = _indexes(b"".join(sink.snapshot()))
        assert sorted(set(got)) == list(range(1, 102))
        assert any(b < a for a, b in zip(got, got[1:], strict=False))
        assert proxy.frames_duplicated == len(got) - 101
        conn.close()
