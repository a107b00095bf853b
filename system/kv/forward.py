"""A follower's one hop to the leader: writes and linearizable reads it cannot serve itself.

What it does: sends the client's request, unchanged (same key, value, request id), to the
node this follower believes leads, as a unary call on the leader's KV service with what is
left of the client's deadline, and hands back the leader's answer. The call carries the
metadata `kv-forwarded-by: <this node>`; a node that receives such a call never forwards it
again (one hop), it answers "not the leader" with its own hint, which the follower passes
on to the client as is.

Outcomes: an answer or an error the leader decided ("kv-outcome" in its trailing metadata)
is passed through unchanged. A hop that failed on the way: for a read it certainly changed
nothing; for a write it is "not applied" only when the connection was never made, else
"unknown" — the leader may have applied it, and the client's retry under the same request
id is deduplicated (docs/kv-node.md, "request ids").

What it must never do: forward twice, change the request id, or report "not applied" for
a write the leader may have applied.
"""

from __future__ import annotations

import contextlib

import grpc
from google.protobuf.message import Message as ProtoMessage

from system.kv.transport import CHANNEL_OPTIONS

FORWARDED_BY = "kv-forwarded-by"
# Used when the client gave no deadline (a unary call without one): the client library
# always sends one.
DEFAULT_TIMEOUT_S = 5.0


class ForwardFailed(Exception):
    """The hop ended in an error; fields as a unary call's status and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, outcome: str,
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome
        self.metadata = metadata  # leader-id / leader-address from the leader, if any


def _never_connected(error: grpc.aio.AioRpcError) -> bool:
    text = (error.details() or "").lower()
    return error.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in text or "connection refused" in text or "name resolution" in text)


class Forwarder:
    """One channel per leader address, reused by every forwarded request."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.forwarded = 0  # requests sent on (for the operator and the tests)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=list(CHANNEL_OPTIONS))
        return channel

    async def call(self, address: str, method: str, request: ProtoMessage,
                   response_type: type[ProtoMessage], timeout_s: float | None,
                   write: bool) -> ProtoMessage:
        """The leader's answer to `request`; raises ForwardFailed."""
        rpc = self._channel(address).unary_unary(
            f"/manyasone.kv.KV/{method}", request_serializer=None,
            response_deserializer=response_type.FromString)
        self.forwarded += 1
        try:
            return await rpc(request.SerializeToString(),
                             timeout=timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S,
                             metadata=((FORWARDED_BY, self.node_id),))
        except grpc.aio.AioRpcError as error:
            trailing = tuple((k, v) for k, v in (error.trailing_metadata() or ())
                             if isinstance(v, str))
            outcome = dict(trailing).get("kv-outcome", "")
            if outcome:  # the leader decided: pass it through
                hints = tuple((k, v) for k, v in trailing if k in ("leader-id", "leader-address"))
                raise ForwardFailed(error.code(), error.details() or "", outcome, hints) from None
            if not write or _never_connected(error):
                raise ForwardFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"forwarding to the leader at {address} failed ({error.code().name}: "
                    f"{error.details()}); not applied; retry", "not-applied") from None
            raise ForwardFailed(
                grpc.StatusCode.UNKNOWN,
                f"forwarding to the leader at {address} failed ({error.code().name}: "
                f"{error.details()}); the write may have applied: retry with the same "
                f"request id", "unknown") from None

    async def close(self) -> None:
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close(grace=None)
        self._channels.clear()
