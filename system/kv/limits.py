"""How large a message a node's gRPC port reads: shared by the node (system/kv/server.py)
and the client library (system/kv/client.py), which names the limit when a node refuses.

Why a limit of its own: gRPC reads a whole message before the handler sees it, so a value
over --max-value-bytes used to be received, copied and parsed before it was refused (a
refused 64 MiB put took 3-11 s on a loaded machine and left the leader hundreds of MiB
larger). With the port's receive limit following --max-value-bytes, gRPC refuses such a
request from its length alone (RESOURCE_EXHAUSTED "Received message larger than max (N vs.
LIMIT)") and nothing of it reaches Python. Peers send their batches on the same port in
pieces well under the limit (proto/raft.proto, StreamPieces), so any batch still gets
through.

What it must never do: refuse a legal request: the limit leaves room for the largest key
and request id and for protobuf's framing on top of the largest value.
"""

from __future__ import annotations

import re

# On top of the value and the key: the request id (at most 256 bytes), the expected
# version and protobuf's tags and lengths need well under a KiB; one MiB keeps the limit
# clear of every legal request and of the peers' pieces (transport.PEER_PIECE_BYTES).
REQUEST_ROOM_BYTES = 1024 * 1024

_REFUSED_UNREAD = re.compile(r"Received message larger than max \((\d+) vs\. (\d+)\)")


def request_limit_bytes(max_value_bytes: int, max_key_bytes: int) -> int:
    """The largest message a node with these limits reads on its gRPC port."""
    return max_value_bytes + max_key_bytes + REQUEST_ROOM_BYTES


def value_limit_of_refusal(details: str, max_key_bytes: int) -> int | None:
    """The --max-value-bytes of the node whose gRPC port refused a message as too large
    (`details` of its RESOURCE_EXHAUSTED, with the key limit the caller assumes the node
    has), or None if `details` is not such a refusal."""
    match = _REFUSED_UNREAD.search(details or "")
    if match is None:
        return None
    return max(0, int(match.group(2)) - max_key_bytes - REQUEST_ROOM_BYTES)
