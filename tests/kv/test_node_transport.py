"""The peer transport's wire encoding: every field of every message type survives the trip,
and the hand-assembled batch (encode_batch) parses to exactly what protobuf would build."""

from __future__ import annotations

import pytest

from system.kv.proto import raft_pb2
from system.kv.transport import (
    PEER_PIECE_BYTES,
    BadPeerMessage,
    PeerSender,
    batch_pieces,
    encode_batch,
    message_from_proto,
    message_to_proto,
)
from system.raft.messages import Message, MessageType
from system.raft.types import Entry, EntryKind, SnapshotMeta


def _every_kind_of_message() -> list[Message]:
    entries = (
        Entry(term=3, index=7, kind=EntryKind.NOOP),
        Entry(term=3, index=8, data=b"x" * 300),
        Entry(term=4, index=9, data=bytes(range(256)) * 600),  # > 128 KiB: multi-byte varint
    )
    snapshot = SnapshotMeta(index=6, term=2, voters=("n1", "n2", "n3"))
    out = []
    for message_type in MessageType:
        out.append(Message(message_type, "n1", "n2", 4))
    out += [
        Message(MessageType.APPEND, "n1", "n2", 4, log_term=2, index=6, entries=entries, commit=5),
        Message(MessageType.APPEND_RESPONSE, "n2", "n1", 4, index=6, reject=True,
                reject_hint=3, reject_term=2),
        Message(MessageType.HEARTBEAT, "n1", "n3", 4, commit=9, context=b"\x00" * 8),
        Message(MessageType.SNAPSHOT, "n1", "n3", 4, index=6, snapshot=snapshot, offset=65536,
                data=b"chunk" * 1000, done=True),
        Message(MessageType.SNAPSHOT, "n1", "n3", 4, index=6, snapshot=snapshot, offset=0,
                data=b"", done=False),
    ]
    return out


@pytest.mark.parametrize("message", _every_kind_of_message(), ids=lambda m: m.type.name)
def test_message_survives_proto_round_trip(message: Message) -> None:
    pb = raft_pb2.RaftMessage.FromString(message_to_proto(message).SerializeToString())
    assert message_from_proto(pb) == message


def test_hand_assembled_batch_parses_to_the_protobuf_built_batch() -> None:
    messages = _every_kind_of_message()
    wire = encode_batch("n1", messages)
    expected = raft_pb2.MessageBatch(src="n1", messages=[message_to_proto(m) for m in messages])
    parsed = raft_pb2.MessageBatch.FromString(wire)
    assert parsed == expected
    assert [message_from_proto(pb) for pb in parsed.messages] == messages


def test_a_batch_cut_in_pieces_joins_back_whole_and_each_piece_fits_a_small_port() -> None:
    big = Message(MessageType.APPEND, "n1", "n2", 4, log_term=2, index=6, commit=5,
                  entries=(Entry(term=4, index=7, data=bytes(range(256)) * 4000),))
    wire = encode_batch("n1", [*_every_kind_of_message(), big])
    pieces = [raft_pb2.BatchPiece.FromString(p) for p in batch_pieces(wire)]
    assert len(pieces) == -(-len(wire) // PEER_PIECE_BYTES) > 1
    assert [p.more for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert all(len(p) <= PEER_PIECE_BYTES + 16 for p in batch_pieces(wire))
    assert b"".join(p.data for p in pieces) == wire
    small = encode_batch("n1", [Message(MessageType.HEARTBEAT, "n1", "n2", 4)])
    [only] = [raft_pb2.BatchPiece.FromString(p) for p in batch_pieces(small)]
    assert only.data == small and not only.more


def test_unknown_message_type_or_entry_kind_is_refused_not_crashed_on() -> None:
    with pytest.raises(BadPeerMessage, match="unknown message type"):
        message_from_proto(raft_pb2.RaftMessage(type=0, src="n9"))
    bad_entry = raft_pb2.RaftMessage(type=raft_pb2.APPEND, src="n1",
                                     entries=[raft_pb2.Entry(term=1, index=1, kind=7)])
    with pytest.raises(BadPeerMessage, match="unknown entry kind 7"):
        message_from_proto(bad_entry)


def test_sender_queue_is_bounded_and_coalesces_retransmissions() -> None:
    sender = PeerSender("n1", "n2", "127.0.0.1:1", max_queue_messages=3)
    append = Message(MessageType.APPEND, "n1", "n2", 4, index=6,
                     entries=(Entry(term=4, index=7, data=b"v" * 100),))
    sender.enqueue(append)
    sender.enqueue(append)  # the same APPEND again, still queued: not sent twice
    assert sender.coalesced_messages == 1
    for i in range(5):
        sender.enqueue(Message(MessageType.HEARTBEAT, "n1", "n2", 4, commit=i))
    assert len(sender._queue) == 3  # oldest shed first
    assert sender.dropped_messages == 3
    assert [m.commit for m, _ in sender._queue] == [2, 3, 4]
    # The shed APPEND is forgotten: a later retransmission is queued again.
    sender.enqueue(append)
    assert sender.coalesced_messages == 1
