"""Read the store's peer-lane bytes as a link proxy forwards them: the Raft messages in them.

The store's TCP peer lane (system/kv/peer_tcp.py) is MAGIC, then frames of a 4-byte
big-endian length and a protobuf `MessageBatch`. The local platform's `overtaken` strike
(LocalPlatform.hold_in_flight) watches one connection from its first byte: which APPENDs
the leader's held bytes carry, and the moment a follower acknowledges past them. Only the
connections opened while a proxy watches are read (a stream cannot be picked up in the
middle of a frame), and only for the few seconds of a strike: parsing every frame of a
run in the proxy's threads would cost the nodes CPU. TLS lanes cannot be read: a watcher
sees nothing there.
"""

from __future__ import annotations

from system.kv.peer_tcp import MAGIC, MAX_FRAME_BYTES
from system.kv.proto import raft_pb2


class PeerFrames:
    """Feed bytes in order; get back the messages of every complete frame."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._greeted = False
        self.broken = False  # not a peer lane, or a frame that does not parse: stop reading

    def feed(self, data: bytes) -> list[raft_pb2.RaftMessage]:
        if self.broken:
            return []
        buffer = self._buffer
        buffer += data
        if not self._greeted:
            if len(buffer) < len(MAGIC):
                return []
            if buffer[:len(MAGIC)] != MAGIC:
                self.broken = True
                return []
            del buffer[:len(MAGIC)]
            self._greeted = True
        messages: list[raft_pb2.RaftMessage] = []
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if size > MAX_FRAME_BYTES:
                self.broken = True
                return messages
            if len(buffer) < 4 + size:
                break
            batch = raft_pb2.MessageBatch()
            try:
                batch.ParseFromString(bytes(buffer[4:4 + size]))
            except Exception:  # protobuf's DecodeError: not ours to judge, stop reading
                self.broken = True
                return messages
            del buffer[:4 + size]
            messages.extend(batch.messages)
        return messages


APPEND = raft_pb2.APPEND
VOTE = raft_pb2.VOTE
APPEND_RESPONSE = raft_pb2.APPEND_RESPONSE
