"""Peer transport over plain TCP: Raft message batches as length-prefixed frames.

What it does: the same batches as the gRPC lanes (`transport.encode_batch`, a protobuf
`MessageBatch`), each sent as a 4-byte big-endian length and the batch, on one TCP
connection per lane and peer, written straight from the event loop. A node listens for
them on its peer address (`serve --peer-listen`, as etcd has a client URL and a peer URL).

Why: a gRPC stream message costs a Python process a round trip through gRPC's own
threads (its event engine, the completion-queue poller that wakes the loop), about 0.1 ms
of CPU each way and 0.2-0.35 ms of latency a hop between members; a write at one client
crosses two such hops, and its follower's answer is what commits it (docs/benchmarks.md).

What it must never do: block the loop, retry a message (Raft retransmits: a batch lost
with a connection is simply dropped, as on the gRPC lanes), accept a frame from a peer it
does not know, or let a stranger's bytes crash the node: a frame that is too large or
not a MessageBatch closes that connection with a log line.

With TLS (`serve --peer-cert-file ...`): the connection is mutual TLS, and MAGIC and the
frames travel inside it. The receiver accepts only a node certificate from its CA, says
so by answering MAGIC (TLS 1.3 checks the dialler's certificate after the dialler thinks
the handshake done, so without the answer a refused sender would learn nothing and
reconnect for every batch), and delivers a frame only when its sender is the node the
certificate names. The sender checks that the peer's certificate names the peer id it
dialled. A failed handshake is one log line on each side, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from system.kv.proto import raft_pb2
from system.kv.tls import (
    Identity,
    TlsFiles,
    client_ssl_context,
    server_ssl_context,
    ssl_identity,
)
from system.kv.transport import (
    MAX_GRPC_MESSAGE_BYTES,
    PeerSender,
    RefusalLog,
    encode_batch,
    messages_for,
    peer_refusal,
)
from system.raft.messages import Message

log = logging.getLogger("kv.peer_tcp")

MAGIC = b"MAOR"  # first bytes of every connection: refuses a gRPC client (or anything else)
MAX_FRAME_BYTES = MAX_GRPC_MESSAGE_BYTES
_CONNECT_TIMEOUT_S = 1.0
# A TLS handshake (P-256 keys) takes about a millisecond; a peer that takes this long is
# not going to finish, and an unfinished one holds a socket.
_HANDSHAKE_TIMEOUT_S = 5.0
# Unacknowledged bytes older than this end the connection (TCP_USER_TIMEOUT): a peer cut
# off by a partition that drops packets is noticed, and the next batch opens a new
# connection, instead of TCP's retransmissions backing off for minutes.
_USER_TIMEOUT_MS = 2000
# Pause sending while this much is queued in the kernel and the transport's buffer.
_HIGH_WATER_BYTES = 8 * 1024 * 1024


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class _SenderProtocol(asyncio.Protocol):
    """The sending end: never reads anything of use; tells the sender when it may write."""

    def __init__(self) -> None:
        self._may_write = asyncio.Event()
        self._may_write.set()
        self._accepted = asyncio.Event()  # TLS: the receiver answered MAGIC
        self._answer = bytearray()
        self.closed = False
        self.error: Exception | None = None  # why the connection was lost, if it says

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self._may_write.set()
        self._accepted.set()

    def pause_writing(self) -> None:
        self._may_write.clear()

    def resume_writing(self) -> None:
        self._may_write.set()

    def data_received(self, data: bytes) -> None:
        # Only a TLS receiver answers, once: MAGIC when it accepted our certificate.
        if not self._accepted.is_set():
            self._answer += data
            if len(self._answer) >= len(MAGIC):
                self._accepted.set()

    async def accepted(self) -> None:
        """Wait for the receiver's answer; ConnectionError when it closes instead."""
        await self._accepted.wait()
        if self.closed or bytes(self._answer[:len(MAGIC)]) != MAGIC:
            raise _Refused(self.error)

    @property
    def may_write(self) -> bool:
        return self._may_write.is_set() and not self.closed

    async def writable(self) -> None:
        await self._may_write.wait()


class _Refused(ConnectionError):
    """The TLS receiver closed the connection instead of accepting it."""

    def __init__(self, cause: Exception | None) -> None:
        super().__init__(f"closed before accepting: {cause!r}")
        self.cause = cause


class TcpPeerSender(PeerSender):
    """PeerSender's bounded queue and coalescing, written to a TCP connection.

    A connected lane that is not held back by flow control writes a Ready's messages in
    `flush`, on the caller's stack: no task wake-up between the drive loop and the socket
    (one loop iteration, 50-80 us a hop on a busy machine). Its task connects, waits out
    flow control and backs off after failures.
    """

    _transport: asyncio.Transport | None = None
    _protocol: _SenderProtocol | None = None
    _busy = False  # the task is connecting or waiting to write: flush leaves it the queue

    _ssl: ssl.SSLContext | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        if self.tls is not None:
            self._ssl = client_ssl_context(self.tls)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"send-tcp-{self.peer_id}-{self.lane}")

    def _queued(self) -> None:
        pass  # flush() decides: write now, or wake the task

    def _ready_to_write(self) -> bool:
        return (not self._busy and self._transport is not None
                and self._protocol is not None and self._protocol.may_write)

    def flush(self) -> None:
        if not self._queue or self._closed:
            return
        if self._ready_to_write():
            self._write_queued()
        if self._queue and self._wakeup is not None:
            self._wakeup.set()

    def _write_queued(self) -> None:
        """Write every queued message, a batch (bounded by max_batch_bytes) per frame,
        until flow control says stop."""
        assert self._transport is not None and self._protocol is not None
        while self._queue and self._protocol.may_write:
            batch = self._take_batch()
            if self.trace is not None:
                self.trace.hops_sent(batch)
            self._transport.write(_frame(encode_batch(self.src, batch)))
            for message in batch:
                self._forget(message)

    async def _connect(self) -> None:
        host, _, port = self.address.rpartition(":")
        loop = asyncio.get_running_loop()
        # With TLS the peer's certificate must name the peer id (server_hostname), whatever
        # address this node was given for it.
        tls = {} if self._ssl is None else {"ssl": self._ssl, "server_hostname": self.peer_id}
        transport, protocol = await asyncio.wait_for(
            loop.create_connection(_SenderProtocol, host.strip("[]"), int(port), **tls),
            _CONNECT_TIMEOUT_S + (_HANDSHAKE_TIMEOUT_S if tls else 0))
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)
        transport.set_write_buffer_limits(high=_HIGH_WATER_BYTES)
        transport.write(MAGIC)
        if self._ssl is not None:
            try:
                await asyncio.wait_for(protocol.accepted(), _HANDSHAKE_TIMEOUT_S)
            except BaseException:
                transport.abort()
                raise
        self._transport, self._protocol = transport, protocol

    def _drop_connection(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._transport = self._protocol = None

    async def _run(self) -> None:
        assert self._wakeup is not None
        backoff_s = 0.02
        while not self._closed:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._busy = True
            try:
                if self._protocol is None or self._protocol.closed:
                    self._drop_connection()
                    await self._connect()
                assert self._protocol is not None
                await self._protocol.writable()
                if self._protocol.closed:
                    raise ConnectionError("the connection closed")
                self._write_queued()
            except asyncio.CancelledError:
                self._drop_connection()
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: new connection after backoff
                self._drop_connection()
                details = {"transport": "tcp", "details": repr(exc)[:300]}
                if self._ssl is not None and not self._failing:  # what a transition logs
                    details["reason"] = await self._tls_reason(exc)
                self._failed(**details)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 0.5)
                continue
            finally:
                self._busy = False
            self._reached()
            backoff_s = 0.02
        self._drop_connection()

    async def _close_connection(self) -> None:
        self._drop_connection()

    async def _tls_reason(self, exc: Exception) -> str:
        """What went wrong with a TLS link to the peer, in words that say what to fix."""
        peer, tls = self.peer_id, self.tls
        assert tls is not None
        if isinstance(exc, _Refused):
            if isinstance(exc.cause, ssl.SSLError):
                return (f"peer {peer} refused this node's certificate {tls.cert} "
                        f"({exc.cause.reason or exc.cause}): check that it is a node "
                        f"certificate signed by the CA {peer} trusts")
            # asyncio's server side drops its TLS alert (it closes before sending it),
            # so mostly this is all a refused sender can know.
            return (f"peer {peer} at {self.address} closed the connection without accepting "
                    f"this node's certificate {tls.cert}: its log says why (not signed by "
                    "the CA it trusts, not a node certificate, or no TLS on its peer port)")
        if isinstance(exc, ssl.SSLCertVerificationError):
            if exc.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
                names = await self._names_instead()
                return (f"peer {peer}'s certificate names {names or 'another node'}, not "
                        f"{peer!r}: {self.address} is not {peer}'s address, or {peer} holds "
                        "another node's certificate")
            if exc.verify_code in (2, 19, 20, 21):  # issuer unknown, self-signed chain
                return (f"peer {peer}'s certificate is not signed by this node's CA "
                        f"{tls.ca}: both nodes need the same --peer-trusted-ca-file")
            return f"peer {peer}'s certificate is refused: {exc.verify_message}"
        if isinstance(exc, ssl.SSLError):
            return (f"TLS handshake with peer {peer} at {self.address} failed "
                    f"({str(exc) or type(exc).__name__}): "
                    f"check that {peer} serves TLS on its peer port")
        if isinstance(exc, ConnectionResetError):
            # A plaintext port resets a ClientHello, but so does a network cut or a
            # proxy dropping the link: say both, rather than blame the configuration.
            return (f"the connection to peer {peer} at {self.address} was reset during the "
                    f"TLS handshake: the network or a proxy cut it, or {peer} does not "
                    "serve TLS on its peer port")
        return repr(exc)[:300]

    async def _names_instead(self) -> str:
        """Whom the certificate at the peer's address names (after a name mismatch,
        once per outage): a second handshake, checking the CA but not the name."""
        assert self.tls is not None
        host, _, port = self.address.rpartition(":")
        context = client_ssl_context(self.tls)
        context.check_hostname = False
        transport = None
        try:
            transport, _ = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                asyncio.Protocol, host.strip("[]"), int(port), ssl=context),
                _CONNECT_TIMEOUT_S + _HANDSHAKE_TIMEOUT_S)
            identity = ssl_identity(transport.get_extra_info("ssl_object"))
            return str(identity) if identity is not None else ""
        except Exception:  # noqa: BLE001 - only to make a log line better
            return ""
        finally:
            if transport is not None:
                transport.abort()


class _ReceiverProtocol(asyncio.Protocol):
    """One incoming peer connection: (with TLS, a handshake that must show a node
    certificate, answered with MAGIC), MAGIC, then frames; each batch goes to `deliver`."""

    def __init__(self, node_id: str, is_known: Callable[[str], bool],
                 deliver: Callable[[list[Message]], None],
                 connections: set[asyncio.Transport],
                 tls: ssl.SSLContext | None = None,
                 refusals: RefusalLog | None = None) -> None:
        self._connections = connections
        self._node_id = node_id
        self._is_known = is_known
        self._deliver = deliver
        self._tls = tls
        self._refusals = refusals or RefusalLog(log)
        self._buffer = bytearray()
        self._start = 0  # parsed up to here; compacted when it passes half the buffer
        self._greeted = False
        self._raw: asyncio.Transport | None = None  # the TCP connection, TLS or not
        self._transport: asyncio.Transport | None = None  # what frames arrive on
        self._identity: Identity | None = None  # with TLS: whom the certificate names
        self._handshake: asyncio.Task[None] | None = None
        self._accepted = False  # with TLS: a node certificate; frames may be read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]
        self._connections.add(self._raw)
        if self._tls is None:
            self._transport = self._raw
            return
        # Nothing may be read as frames before the handshake: start_tls takes over.
        self._raw.pause_reading()
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls())

    async def _start_tls(self) -> None:
        """Upgrade the connection (rather than create_server(ssl=...), which drops a failed
        handshake without a word) and accept a node certificate only."""
        raw = self._raw
        assert raw is not None and self._tls is not None
        if raw.is_closing():  # aborted before this task ran (the listener closing)
            self._connections.discard(raw)
            return
        try:
            transport = await asyncio.get_running_loop().start_tls(
                raw, self, self._tls, server_side=True,
                ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - ssl.SSLError, resets, timeouts: one line each
            self._connections.discard(raw)
            raw.abort()
            self._log_refusal(_handshake_failure(exc), ("handshake", str(exc)))
            return
        if transport is None:  # closed during the handshake (the listener closing)
            self._connections.discard(raw)
            return
        self._transport = transport
        self._identity = ssl_identity(transport.get_extra_info("ssl_object"))
        why = peer_refusal(self._identity, self._identity.name if self._identity else "")
        if why is not None:
            self._refuse(why)
            return
        transport.write(MAGIC)  # accepted: see the module's docstring
        self._accepted = True
        self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self._raw)

    def _log_refusal(self, why: str, key: tuple[str, ...], claimed: str | None = None) -> None:
        """One line: who (address, certificate), what it claimed, why refused."""
        peer = self._raw.get_extra_info("peername") if self._raw else None
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        extra = {"from": str(peer), "reason": why}
        if self._identity is not None:
            extra["certificate"] = str(self._identity)
        if claimed is not None:
            extra["claimed"] = claimed
        self._refusals.refused((host, str(self._identity), *key), "peer connection refused",
                               **extra)

    def _refuse(self, why: str, claimed: str | None = None) -> None:
        key = ("claims", claimed) if claimed is not None else (why,)
        self._log_refusal(why, key, claimed)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        # With TLS, the first data can arrive before _start_tls has seen the certificate
        # (asyncio reads what came with the handshake at once): it waits for acceptance.
        if self._tls is None or self._accepted:
            self._parse()

    def _parse(self) -> None:
        buffer = self._buffer
        if not self._greeted:
            if len(buffer) < len(MAGIC):
                return
            if buffer[:len(MAGIC)] != MAGIC:
                if buffer[0] == 0x16:  # a TLS record: a ClientHello
                    self._refuse("a TLS connection at a peer port without TLS: start this "
                                 "node with --peer-cert-file, or the peer without")
                else:
                    self._refuse("not a peer connection (wrong first bytes): is a client "
                                 "pointed at the peer port?")
                return
            del buffer[:len(MAGIC)]
            self._greeted = True
        start = self._start
        while len(buffer) - start >= 4:
            size = int.from_bytes(buffer[start:start + 4], "big")
            if size > MAX_FRAME_BYTES:
                self._refuse(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
                return
            end = start + 4 + size
            if len(buffer) < end:
                break
            frame = bytes(memoryview(buffer)[start + 4:end])
            start = end
            if not self._receive(frame):
                return
        if start and start * 2 >= len(buffer):
            del buffer[:start]
            start = 0
        self._start = start

    def _receive(self, frame: bytes) -> bool:
        try:
            batch = raft_pb2.MessageBatch.FromString(frame)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
            self._refuse("a frame is not a MessageBatch")
            return False
        if self._tls is not None:  # every frame: a connection is one sender, but say so
            why = peer_refusal(self._identity, batch.src)
            if why is not None:
                self._refuse(why, claimed=batch.src)
                return False
        if not self._is_known(batch.src):
            self._refuse(f"node {self._node_id} does not know peer {batch.src!r}; check --peers")
            return False
        messages = messages_for(self._node_id, batch)
        if messages:
            self._deliver(messages)
        return True


class PeerListener:
    """The listening socket and every connection it accepted."""

    def __init__(self, server: asyncio.Server, connections: set[asyncio.Transport]) -> None:
        self.server = server
        self.connections = connections  # the TCP connections, under TLS or not

    def close(self) -> None:
        self.server.close()
        for transport in list(self.connections):
            transport.abort()


async def serve_peers(address: str, node_id: str, is_known: Callable[[str], bool],
                      deliver: Callable[[list[Message]], None],
                      tls: TlsFiles | None = None) -> PeerListener:
    """Listen for peer connections on `address` (host:port), over mutual TLS with `tls`;
    OSError says why not (TlsError for unusable certificate files)."""
    host, _, port = address.rpartition(":")
    loop = asyncio.get_running_loop()
    connections: set[asyncio.Transport] = set()
    context = server_ssl_context(tls) if tls is not None else None
    refusals = RefusalLog(log)
    try:
        server = await loop.create_server(
            lambda: _ReceiverProtocol(node_id, is_known, deliver, connections, context,
                                      refusals),
            host.strip("[]") or None, int(port), reuse_address=True)
    except OSError as exc:
        raise OSError(f"cannot listen for peers on {address}: {exc.strerror or exc}; "
                      "choose a free port for --peer-listen") from None
    return PeerListener(server, connections)


def _handshake_failure(exc: BaseException) -> str:
    """A failed TLS handshake at the peer port, in words that say what to fix."""
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or ""
        if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL",
                      "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
            return (f"not TLS ({reason}): a peer without TLS (or a client) dialled this "
                    "node's TLS peer port; start it with --peer-cert-file")
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "the peer presented no certificate: it needs --peer-cert-file"
        if reason == "CERTIFICATE_VERIFY_FAILED":
            detail = getattr(exc, "verify_message", "") or str(exc)
            if getattr(exc, "verify_code", 0) in (9, 10):  # not yet valid, expired
                return f"the peer's certificate is refused ({detail}): it needs a new one"
            return (f"the peer's certificate is refused ({detail}): it must be a node "
                    "certificate signed by this node's --peer-trusted-ca-file")
        if "ALERT" in reason:
            return (f"the peer refused this node's certificate during the handshake "
                    f"({reason}): see its log")
        return f"TLS handshake failed: {reason or exc}"
    if isinstance(exc, ConnectionResetError):  # asyncio's client closes without an alert
        return ("the peer closed the connection during the TLS handshake: it probably "
                "refused this node's certificate (its log says why)")
    if isinstance(exc, (asyncio.TimeoutError, ConnectionAbortedError)):
        return f"no TLS handshake within {_HANDSHAKE_TIMEOUT_S:g} s"
    return f"TLS handshake failed: {exc!r}"
