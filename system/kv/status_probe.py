"""The Status RPC to nodes by address, for whoever watches a cluster: `LocalCluster`
(system/kv/local_cluster.py) and the harness's platforms (nemesis/platforms/)."""

from __future__ import annotations

import grpc

from system.kv.proto import kv_pb2, kv_pb2_grpc
from system.kv.tls import TlsFiles, grpc_channel_credentials, open_channel


class StatusProbe:
    """The Status RPC to nodes by address, one cached channel each, reconnecting quickly
    (a restarted node must be seen again within a poll, not after gRPC's default backoff).
    With `tls` (a certificate of any role), the channels are mutual TLS."""

    OPTIONS = (("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
               ("grpc.max_reconnect_backoff_ms", 500))

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        # Read once (TlsError now rather than at every poll).
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None

    def status(self, address: str, timeout_s: float) -> kv_pb2.StatusResponse | None:
        """The node's Status, or None if it does not answer within `timeout_s`."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._credentials,
                                                             self.OPTIONS)
        try:
            return kv_pb2_grpc.KVStub(channel).Status(kv_pb2.StatusRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return None

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
