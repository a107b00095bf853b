"""Reorder and duplicate whole frames of one peer lane: the `reorder` fault on local.

A byte stream cannot be reordered byte by byte without corrupting it, but the store's
TCP peer lane (system/kv/peer_tcp.py) is MAGIC, then frames of a 4-byte big-endian length
and a protobuf `MessageBatch`, and each frame stands alone: the receiver steps its
messages whatever came before. So a link proxy can cut the stream at frame boundaries and
write the frames in another order (a frame of several messages first split into frames
of one) — some held back behind the next few, some written
twice — which is what a lane that reconnects and resends, UDP, or a retrying transport
does, and what Raft must survive: an older APPEND after a newer one, an answer or a vote
grant of an older term, the same APPEND twice. The simulator's `reorder` does the same
to its messages (nemesis/platforms/sim.py).

Pure: bytes in, bytes out, decisions from the `random.Random` it is given. A stream that
does not start with MAGIC (TLS, gRPC) passes through untouched.
"""

from __future__ import annotations

import random

from system.kv.peer_tcp import MAGIC, MAX_FRAME_BYTES
from system.kv.proto import raft_pb2

MAX_LATE_FRAMES = 8  # a late frame is written after at most this many later ones


def _split(frame: bytes) -> list[bytes]:
    """A frame of several messages as frames of one each (the sender batches what it has
    queued for the peer: a busy lane's frame holds several APPENDs, which must be able to
    overtake each other); a frame that does not parse is kept whole."""
    try:
        batch = raft_pb2.MessageBatch.FromString(frame[4:])
    except Exception:  # protobuf's DecodeError: the receiver judges it, not the proxy
        return [frame]
    if len(batch.messages) < 2:
        return [frame]
    frames = []
    for message in batch.messages:
        payload = raft_pb2.MessageBatch(src=batch.src, messages=[message]).SerializeToString()
        frames.append(len(payload).to_bytes(4, "big") + payload)
    return frames


class FrameReorderer:
    """One connection's client-to-server bytes: `feed` returns what to write now."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._buffer = bytearray()
        self._greeted = False
        self.passthrough = False  # not a peer lane: bytes go as they came
        self._late: list[list] = []  # [frames still to pass it, frame bytes]
        self.reordered = 0  # frames written after later ones
        self.duplicated = 0

    def feed(self, data: bytes, probability: float) -> bytes:
        """`data` as received; frames complete so far are written (late ones included
        once their turn comes), with `probability` each held back and, half as often,
        also written now. With `probability` 0 every late frame goes out first."""
        if self.passthrough:
            return data
        buffer = self._buffer
        buffer += data
        out = bytearray()
        if not self._greeted:
            if len(buffer) < len(MAGIC):
                return b""
            if buffer[:len(MAGIC)] != MAGIC:
                self.passthrough = True
                data, self._buffer = bytes(buffer), bytearray()
                return data
            out += buffer[:len(MAGIC)]
            del buffer[:len(MAGIC)]
            self._greeted = True
        if probability <= 0 and self._late:
            out += self.flush()
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if size > MAX_FRAME_BYTES:  # not ours to judge: pass the rest untouched
                self.passthrough = True
                out += self.flush() + buffer
                self._buffer = bytearray()
                return bytes(out)
            if len(buffer) < 4 + size:
                break
            frame = bytes(buffer[:4 + size])
            del buffer[:4 + size]
            for one in (_split(frame) if probability > 0 else [frame]):
                out += self._place(one, probability)
        return bytes(out)

    def _place(self, frame: bytes, probability: float) -> bytes:
        out = bytearray()
        late_now = probability > 0 and self.rng.random() < probability
        if not late_now or self.rng.random() < 0.5:
            out += frame  # on time; a late frame half the time too (then twice)
            self.duplicated += int(late_now)
        due = []
        for late in self._late:  # the frames held back before this one
            late[0] -= 1
            if late[0] <= 0:
                due.append(late)
        for late in due:
            self._late.remove(late)
            out += late[1]
            self.reordered += 1
        if late_now:
            self._late.append([self.rng.randint(1, MAX_LATE_FRAMES), frame])
        return bytes(out)

    def flush(self) -> bytes:
        """Every late frame, oldest first (the fault healed)."""
        out = b"".join(frame for _, frame in self._late)
        self.reordered += len(self._late)
        self._late = []
        return out
