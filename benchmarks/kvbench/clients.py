"""Asynchronous clients the load generator drives, one per protocol: etcd's v3 gRPC API,
and our store's `manyasone.kv.KV` service (spoken by our nodes and by the PySyncObj front).

Each client owns one gRPC channel to one member, so N clients are N connections, as N
separate client programs would be. Errors come out as `grpc.aio.AioRpcError`; counting
them is the caller's job. This module must never retry: a retry would hide the latency
and the failures the benchmark is there to measure.
"""

from __future__ import annotations

import enum
import itertools
import os
from typing import Protocol

import grpc

from nemesis.systems.etcd.proto import etcd_pb2 as etcd_rpc_pb2
from nemesis.systems.etcd.proto import etcd_pb2_grpc as etcd_rpc_pb2_grpc
from system.kv.client import SESSION_MAX_PAYLOAD_BYTES
from system.kv.proto import kv_pb2, kv_pb2_grpc
from system.kv.tls import open_channel

# Enough for the 1 MiB row with room to spare; our store must take 64 MiB checkpoints.
MAX_MESSAGE_BYTES = 80 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Without this, channels to the same address share one connection in the process-wide
    # subchannel pool, and 64 "clients" would be 64 streams on one TCP connection.
    ("grpc.use_local_subchannel_pool", 1),
]


class ClientKind(enum.Enum):
    """Which wire protocol a cluster's members speak to clients."""

    ETCD = "etcd"  # etcdserverpb.KV (Put, Range)
    KV = "kv"  # manyasone.kv.KV unary calls (the PySyncObj front)
    KV_SESSION = "kv-session"  # manyasone.kv.KV Session stream, as our client library (ours)


class AsyncClient(Protocol):
    async def wait_connected(self, timeout_s: float) -> None: ...
    async def put(self, key: str, value: bytes, timeout_s: float) -> None: ...
    async def get(self, key: str, linearizable: bool, timeout_s: float) -> None: ...
    async def close(self) -> None: ...


TLS_CLIENT_NAME = "bench"  # the load generator's certificate in a TLS target's directory


def aio_channel(address: str, tls_dir: str = "") -> grpc.aio.Channel:
    """A channel to one member: plaintext, or mutual TLS with the benchmark's client
    certificate from `tls_dir` (written by system.kv.tls.generate)."""
    return open_channel(address, _credentials(tls_dir) if tls_dir else None, CHANNEL_OPTIONS,
                        aio=True)


def sync_channel(address: str, tls_dir: str = "") -> grpc.Channel:
    return open_channel(address, _credentials(tls_dir) if tls_dir else None, CHANNEL_OPTIONS)


def _credentials(tls_dir: str) -> grpc.ChannelCredentials:
    from system.kv.tls import TlsFiles, grpc_channel_credentials

    return grpc_channel_credentials(TlsFiles.in_dir(tls_dir, TLS_CLIENT_NAME))


class _ChannelClient:
    def __init__(self, address: str, tls_dir: str = ""):
        self.address = address
        self.tls_dir = tls_dir
        self.channel = aio_channel(address, tls_dir)

    async def wait_connected(self, timeout_s: float) -> None:
        import asyncio

        await asyncio.wait_for(self.channel.channel_ready(), timeout_s)

    async def close(self) -> None:
        await self.channel.close()


class EtcdClient(_ChannelClient):
    """etcd v3: Put, and Range on one key (serializable=false is etcd's linearizable read,
    confirmed through the leader; serializable=true is served locally, may be stale)."""

    def __init__(self, address: str, tls_dir: str = ""):
        super().__init__(address, tls_dir)
        self.kv = etcd_rpc_pb2_grpc.KVStub(self.channel)

    async def put(self, key: str, value: bytes, timeout_s: float) -> None:
        await self.kv.Put(etcd_rpc_pb2.PutRequest(key=key.encode(), value=value), timeout=timeout_s)

    async def get(self, key: str, linearizable: bool, timeout_s: float) -> None:
        await self.kv.Range(
            etcd_rpc_pb2.RangeRequest(key=key.encode(), serializable=not linearizable),
            timeout=timeout_s,
        )


_request_counter = itertools.count(1)


class KVServiceClient(_ChannelClient):
    """manyasone.kv.KV: every put carries a fresh request id, as our client library's do,
    so the store pays for its deduplication table as it would in use.

    A member that cannot serve a request and cannot forward it (our nodes with no leader
    known, or started with --no-forward; the PySyncObj front) answers UNAVAILABLE with the
    leader's address in the trailing metadata. Like our client library, this client then
    moves to that address for its next operations. The failed operation itself is not
    retried: it counts as an error."""

    def __init__(self, address: str, follow_leader_hints: bool = True, tls_dir: str = ""):
        super().__init__(address, tls_dir)
        self.kv = kv_pb2_grpc.KVStub(self.channel)
        self.follow_leader_hints = follow_leader_hints
        self._id_prefix = f"bench-{os.getpid()}-{id(self):x}"

    async def put(self, key: str, value: bytes, timeout_s: float) -> None:
        request_id = f"{self._id_prefix}-{next(_request_counter)}"
        request = kv_pb2.PutRequest(key=key, value=value, request_id=request_id)
        await self._call(self.kv.Put, request, timeout_s, follow_hint=True)

    async def get(self, key: str, linearizable: bool, timeout_s: float) -> None:
        consistency = kv_pb2.LINEARIZABLE if linearizable else kv_pb2.STALE
        request = kv_pb2.GetRequest(key=key, consistency=consistency)
        # A stale read is served by whichever member was asked; only the others need the leader.
        await self._call(self.kv.Get, request, timeout_s, follow_hint=linearizable)

    async def _call(self, method, request, timeout_s: float, follow_hint: bool) -> None:
        try:
            await method(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            if self.follow_leader_hints and follow_hint and error.code() is grpc.StatusCode.UNAVAILABLE:
                await self._move_to(dict(error.trailing_metadata() or ()).get("leader-address", ""))
            raise

    async def _move_to(self, address: str) -> None:
        if not address or address == self.address:
            return
        old = self.channel
        self.address = address
        self.channel = aio_channel(address, self.tls_dir)
        self.kv = kv_pb2_grpc.KVStub(self.channel)
        await old.close(grace=None)


class KVSessionClient(KVServiceClient):
    """manyasone.kv.KV over one long-lived Session stream per client, as our client library
    does (values above 256 KiB as unary calls, as it does too): one request in flight at a time here, so answers come back in order. A follower
    forwards to the leader; an UNAVAILABLE answer with a leader address (no forwarding
    possible) moves the client there, as KVServiceClient does."""

    def __init__(self, address: str, follow_leader_hints: bool = True, tls_dir: str = ""):
        super().__init__(address, follow_leader_hints, tls_dir)
        self._stream = None
        self._seq = itertools.count(1)

    async def put(self, key: str, value: bytes, timeout_s: float) -> None:
        if len(value) > SESSION_MAX_PAYLOAD_BYTES:  # as our client library: large values go unary
            await super().put(key, value, timeout_s)
            return
        request_id = f"{self._id_prefix}-{next(_request_counter)}"
        frame = kv_pb2.SessionRequest(put=kv_pb2.PutRequest(key=key, value=value, request_id=request_id))
        await self._exchange(frame, timeout_s, follow_hint=True)

    async def get(self, key: str, linearizable: bool, timeout_s: float) -> None:
        consistency = kv_pb2.LINEARIZABLE if linearizable else kv_pb2.STALE
        frame = kv_pb2.SessionRequest(get=kv_pb2.GetRequest(key=key, consistency=consistency))
        await self._exchange(frame, timeout_s, follow_hint=linearizable)

    async def _exchange(self, frame: kv_pb2.SessionRequest, timeout_s: float, follow_hint: bool) -> None:
        import asyncio

        if self._stream is None or self._stream.done():
            self._stream = self.channel.stream_stream(
                "/manyasone.kv.KV/Session", request_serializer=None, response_deserializer=None
            )()
        frame.seq = next(self._seq)
        frame.timeout_ms = int(timeout_s * 1000)
        stream = self._stream
        # A timer cancels this task at the deadline (cheaper than wait_for's extra task).
        task = asyncio.current_task()
        timer = asyncio.get_running_loop().call_later(timeout_s, task.cancel)
        try:
            await stream.write(frame.SerializeToString())
            raw = await stream.read()
        except asyncio.CancelledError:
            self._stream = None
            stream.cancel()
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "session request timed out") from None
        finally:
            timer.cancel()
        if raw is grpc.aio.EOF:
            self._stream = None
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "session stream ended")
        answer = kv_pb2.SessionResponse.FromString(raw)
        if answer.WhichOneof("response") != "error":
            return
        error = answer.error
        if self.follow_leader_hints and follow_hint and error.code == grpc.StatusCode.UNAVAILABLE.value[0]:
            self._stream = None
            await self._move_to(error.leader_address)
        raise _rpc_error(_CODES.get(error.code, grpc.StatusCode.UNKNOWN), error.message)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def open_client(kind: ClientKind, address: str, follow_leader_hints: bool = True,
                tls_dir: str = "") -> AsyncClient:
    """A client for one member; call inside a running event loop (grpc.aio binds to it).
    follow_leader_hints=False pins it to that member (the leader-kill probe wants that: a
    survivor may still name the dead leader)."""
    if kind is ClientKind.ETCD:
        return EtcdClient(address, tls_dir)
    if kind is ClientKind.KV_SESSION:
        return KVSessionClient(address, follow_leader_hints, tls_dir)
    return KVServiceClient(address, follow_leader_hints, tls_dir)
