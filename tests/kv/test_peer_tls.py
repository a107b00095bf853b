"""Raft traffic over mutual TLS (issue 24): on the TCP peer lane (system/kv/peer_tcp.py)
and on the gRPC RaftPeer service (system/kv/transport.py), a batch is delivered only from
a node certificate of the cluster's CA that names the batch's sender, and only to the
peer the sender meant; every refusal is a log line, and the listener goes on serving.

Real sockets on 127.0.0.1 inside one event loop, certificates from tls.generate in a
temporary directory; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
from pathlib import Path

import grpc
import pytest

from system.kv import peer_tcp, tls
from system.kv.peer_tcp import MAGIC, TcpPeerSender, serve_peers
from system.kv.proto import raft_pb2, raft_pb2_grpc
from system.kv.tls import TlsFiles
from system.kv.transport import PeerSender, PeerService, Transport, encode_batch
from system.ports import free_ports
from system.raft.messages import Message, MessageType
from system.raft.types import Entry


def append(index: int, src: str = "n1", dst: str = "n2") -> Message:
    return Message(MessageType.APPEND, src, dst, 3, log_term=3, index=index - 1,
                   entries=(Entry(term=3, index=index, data=b"v"),), commit=index - 1)


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


async def wait_for(condition, what: str, timeout_s: float = 5.0) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tls.generate(tmp_path_factory.mktemp("certs"), {"n1": [], "n2": [], "n3": []},
                        clients=["c1"], admins=["admin"])


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates with the same names, from a CA the cluster does not trust."""
    return tls.generate(tmp_path_factory.mktemp("other"), {"n1": [], "n2": []})


def issue(certs: Path, out: Path, name: str, role: str, expired: bool = False) -> TlsFiles:
    """A certificate from `certs`' CA that tls.generate would not make: a client or admin
    named like a node, or one that expired yesterday."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    authority = tls.Authority(
        serialization.load_pem_private_key((certs / "ca.key").read_bytes(), password=None),
        x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes()))
    now = datetime.datetime.now(datetime.UTC)
    dates = ({"not_before": now - datetime.timedelta(days=2),
              "not_after": now - datetime.timedelta(days=1)} if expired else {})
    key, cert = tls.issue(authority, name, role,
                          tls.node_sans(name) if role == "node" else (), **dates)
    out.mkdir(parents=True, exist_ok=True)
    tls.write_key(out / f"{name}.key", key)
    tls.write_cert(out / f"{name}.crt", cert)
    return TlsFiles(out / f"{name}.crt", out / f"{name}.key", certs / "ca.crt")


@pytest.fixture(scope="module")
def expired(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """n1's and n2's certificates from the cluster's CA, expired yesterday."""
    out = tmp_path_factory.mktemp("expired")
    for name in ("n1", "n2"):
        issue(certs, out, name, "node", expired=True)
    (out / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    return out


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "peer connection refused"]


class Receiver:
    """Node `node_id`'s TLS peer listener on a free port, recording what it delivers; it
    knows every other node, so only the certificate checks can refuse a batch."""

    def __init__(self, certs: Path, node_id: str = "n2") -> None:
        self.node_id = node_id
        self.files = TlsFiles.in_dir(certs, node_id)
        self.delivered: list[Message] = []
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.listener = None

    async def __aenter__(self) -> Receiver:
        self.listener = await serve_peers(self.address, self.node_id,
                                          {"n1", "n2", "n3"}.__contains__,
                                          self.delivered.extend, tls=self.files)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.listener.close()


async def tls_connection(address: str, files: TlsFiles, peer_id: str
                         ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port), ssl=tls.client_ssl_context(files),
                                         server_hostname=peer_id)


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Whether the other side closes the connection (after its MAGIC, if it sends one)."""
    try:
        answer = await asyncio.wait_for(reader.read(len(MAGIC)), 5.0)
        if answer == MAGIC:
            answer = await asyncio.wait_for(reader.read(1), 5.0)
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False
    return answer == b""


async def a_good_sender_delivers(receiver: Receiver, certs: Path) -> None:
    """n1, with its own certificate, still gets a batch through."""
    before = len(receiver.delivered)
    reader, writer = await tls_connection(receiver.address, TlsFiles.in_dir(certs, "n1"),
                                          receiver.node_id)
    assert await asyncio.wait_for(reader.readexactly(len(MAGIC)), 5.0) == MAGIC
    writer.write(MAGIC + frame(encode_batch("n1", [append(7, dst=receiver.node_id)])))
    await wait_for(lambda: len(receiver.delivered) > before, "a good peer's batch")
    writer.close()


def test_the_tcp_lane_delivers_batches_over_tls_through_the_transport(certs: Path) -> None:
    async def scenario() -> list[Message]:
        async with Receiver(certs) as receiver:
            transport = Transport("n1", {"n2": "127.0.0.1:1"},
                                  tcp_links={"n2": receiver.address},
                                  tls=TlsFiles.in_dir(certs, "n1"))
            transport.start()
            try:
                transport.send([append(2)])
                await wait_for(lambda: receiver.delivered, "the first batch")
                transport.send([append(3), append(4)])
                await wait_for(lambda: len(receiver.delivered) == 3, "the next batch")
                return receiver.delivered
            finally:
                await transport.close()

    assert asyncio.run(scenario()) == [append(2), append(3), append(4)]


def test_a_node_holding_n2s_certificate_cannot_speak_as_n3_on_the_tcp_lane(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[bool, list[Message]]:
        async with Receiver(certs, "n1") as receiver:
            reader, writer = await tls_connection(receiver.address,
                                                  TlsFiles.in_dir(certs, "n2"), "n1")
            writer.write(MAGIC + frame(encode_batch("n3", [append(2, "n3", "n1")])))
            closed = await closed_by_peer(reader)
            writer.close()
            delivered = list(receiver.delivered)
            await a_good_sender_delivers(receiver, certs)
            return closed, delivered

    closed, delivered = asyncio.run(scenario())
    assert closed and delivered == []
    [line] = refusals(caplog)
    assert line.certificate == "node 'n2'" and line.claimed == "n3"


@pytest.mark.parametrize("role", ["client", "admin"])
def test_a_client_or_admin_certificate_cannot_send_raft_traffic_on_the_tcp_lane(
        certs: Path, role: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Even one that names a node: a client named n3 is not node n3."""
    files = issue(certs, tmp_path, "n3", role)

    async def scenario() -> tuple[bool, list[Message]]:
        async with Receiver(certs) as receiver:
            reader, writer = await tls_connection(receiver.address, files, "n2")
            writer.write(MAGIC + frame(encode_batch("n3", [append(2, "n3", "n2")])))
            closed = await closed_by_peer(reader)
            writer.close()
            delivered = list(receiver.delivered)
            await a_good_sender_delivers(receiver, certs)
            return closed, delivered

    closed, delivered = asyncio.run(scenario())
    assert closed and delivered == []
    [line] = refusals(caplog)
    assert "needs a node certificate" in line.reason and line.certificate == f"{role} 'n3'"


def test_plaintext_to_the_tls_peer_port_is_one_line_and_the_listener_serves_on(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[bool, list[Message]]:
        async with Receiver(certs) as receiver:
            host, _, port = receiver.address.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(MAGIC + frame(encode_batch("n1", [append(2)])))
            closed = await closed_by_peer(reader)
            writer.close()
            delivered = list(receiver.delivered)
            await a_good_sender_delivers(receiver, certs)
            return closed, delivered

    closed, delivered = asyncio.run(scenario())
    assert closed and delivered == []
    [line] = refusals(caplog)
    assert "not TLS" in line.reason
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


def test_a_silent_connection_does_not_hold_up_others_and_is_closed_after_a_while(
        certs: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_tcp, "_HANDSHAKE_TIMEOUT_S", 0.3)

    async def scenario() -> bool:
        async with Receiver(certs) as receiver:
            host, _, port = receiver.address.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))  # says nothing
            await a_good_sender_delivers(receiver, certs)
            assert not refusals(caplog)
            closed = await closed_by_peer(reader)
            writer.close()
            return closed

    assert asyncio.run(scenario())
    [line] = refusals(caplog)
    assert line.reason == "no TLS handshake within 0.3 s"


@pytest.mark.parametrize("untrusted", ["sender", "receiver"])
def test_a_certificate_from_another_ca_is_refused(
        certs: Path, other_ca: Path, untrusted: str, caplog: pytest.LogCaptureFixture) -> None:
    """The sender's certificate from another CA: the receiver refuses it; the receiver's:
    the sender refuses to send. Either way nothing arrives, and the sender's failure
    line says what to fix. (Each side trusts the cluster's CA.)"""
    sender_certs, receiver_certs = ((other_ca, certs) if untrusted == "sender"
                                    else (certs, other_ca))

    async def scenario() -> list[Message]:
        async with Receiver(receiver_certs) as receiver:
            sender = TcpPeerSender("n1", "n2", receiver.address, tls=TlsFiles(
                sender_certs / "n1.crt", sender_certs / "n1.key", certs / "ca.crt"))
            sender.start()
            try:
                sender.enqueue(append(2))
                sender.flush()
                await wait_for(lambda: sender.dropped_messages >= 1 or receiver.delivered,
                               "the batch dropped (or delivered)")
                return list(receiver.delivered)
            finally:
                await sender.close()

    assert asyncio.run(scenario()) == []
    [failure] = [r for r in caplog.records if r.getMessage().startswith("peer unreachable")]
    if untrusted == "sender":
        assert "peer n2 at" in failure.reason
        assert "closed the connection without accepting this node's certificate" in failure.reason
        [line] = refusals(caplog)
        assert "certificate is refused" in line.reason
    else:
        assert "peer n2's certificate is not signed by this node's CA" in failure.reason


@pytest.mark.parametrize("holder", ["sender", "receiver"])
def test_an_expired_certificate_is_refused(certs: Path, expired: Path, holder: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    sender_certs, receiver_certs = ((expired, certs) if holder == "sender"
                                    else (certs, expired))

    async def scenario() -> list[Message]:
        async with Receiver(receiver_certs) as receiver:
            sender = TcpPeerSender("n1", "n2", receiver.address,
                                   tls=TlsFiles.in_dir(sender_certs, "n1"))
            sender.start()
            try:
                sender.enqueue(append(2))
                sender.flush()
                await wait_for(lambda: sender.dropped_messages >= 1 or receiver.delivered,
                               "the batch dropped (or delivered)")
                return list(receiver.delivered)
            finally:
                await sender.close()

    assert asyncio.run(scenario()) == []
    [failure] = [r for r in caplog.records if r.getMessage().startswith("peer unreachable")]
    if holder == "sender":
        [line] = refusals(caplog)
        assert "certificate has expired" in line.reason
    else:
        assert "peer n2's certificate is refused: certificate has expired" in failure.reason


def test_a_tls_sender_at_a_plaintext_peer_port_is_told_apart_from_a_stray_client(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[Message]:
        delivered: list[Message] = []
        (port,) = free_ports(1)
        listener = await serve_peers(f"127.0.0.1:{port}", "n2", {"n1"}.__contains__,
                                     delivered.extend)
        sender = TcpPeerSender("n1", "n2", f"127.0.0.1:{port}",
                               tls=TlsFiles.in_dir(certs, "n1"))
        sender.start()
        try:
            sender.enqueue(append(2))
            sender.flush()
            await wait_for(lambda: sender.dropped_messages >= 1 or delivered,
                           "the batch dropped (or delivered)")
            return delivered
        finally:
            await sender.close()
            listener.close()

    assert asyncio.run(scenario()) == []
    [line] = refusals(caplog)
    assert "a TLS connection at a peer port without TLS" in line.reason
    [failure] = [r for r in caplog.records if r.getMessage().startswith("peer unreachable")]
    assert "n2 does not serve TLS on its peer port" in failure.reason


def test_a_peer_refused_again_and_again_is_one_line_not_a_flood(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        async with Receiver(certs, "n1") as receiver:
            closed = 0
            for index in range(2, 12):
                reader, writer = await tls_connection(receiver.address,
                                                      TlsFiles.in_dir(certs, "n2"), "n1")
                writer.write(MAGIC + frame(encode_batch("n3", [append(index, "n3", "n1")])))
                closed += await closed_by_peer(reader)
                writer.close()
            assert receiver.delivered == []
            return closed

    assert asyncio.run(scenario()) == 10
    assert len(refusals(caplog)) == 1


def test_a_sender_dialling_n3_does_not_deliver_to_a_node_holding_n2s_certificate(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """n3's address is wrong (it leads to n2): the peer id is the name checked."""
    async def scenario() -> list[Message]:
        async with Receiver(certs, "n2") as receiver:
            sender = TcpPeerSender("n1", "n3", receiver.address,
                                   tls=TlsFiles.in_dir(certs, "n1"))
            sender.start()
            try:
                sender.enqueue(append(2, dst="n2"))  # n2 would take it: only the name stops it
                sender.flush()
                await wait_for(lambda: sender.dropped_messages >= 1 or receiver.delivered,
                               "the batch dropped (or delivered)")
                return list(receiver.delivered)
            finally:
                await sender.close()

    assert asyncio.run(scenario()) == []
    [failure] = [r for r in caplog.records if r.getMessage().startswith("peer unreachable")]
    assert "peer n3's certificate names node 'n2'" in failure.reason


# --- the gRPC lanes --------------------------------------------------------------------------

class GrpcReceiver:
    """Node `node_id`'s RaftPeer service on a port that requires client certificates."""

    def __init__(self, certs: Path, node_id: str = "n1") -> None:
        self.node_id = node_id
        self.files = TlsFiles.in_dir(certs, node_id)
        self.delivered: list[Message] = []
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.server: grpc.aio.Server | None = None

    async def __aenter__(self) -> GrpcReceiver:
        self.server = grpc.aio.server()
        raft_pb2_grpc.add_RaftPeerServicer_to_server(
            PeerService(self.node_id, {"n1", "n2", "n3"}, self.delivered.extend,
                        require_identity=True), self.server)
        self.server.add_secure_port(self.address, tls.grpc_server_credentials(
            self.files, require_client_auth=True))
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(grace=None)

    async def send(self, files: TlsFiles, src: str) -> grpc.StatusCode:
        """Send one batch from `src` with `files`' certificate; the call's status."""
        async with grpc.aio.secure_channel(
                self.address, tls.grpc_channel_credentials(files),
                options=(tls.target_name_option(self.node_id),)) as channel:
            stub = raft_pb2_grpc.RaftPeerStub(channel)
            batch = raft_pb2.MessageBatch.FromString(
                encode_batch(src, [append(2, src, self.node_id)]))
            try:
                await stub.Send(batch, timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK


@pytest.mark.parametrize(("holder", "role", "claims"), [
    ("n2", "node", "n3"), ("n3", "client", "n3"), ("n3", "admin", "n3")])
def test_the_grpc_peer_service_takes_batches_only_from_the_node_a_certificate_names(
        certs: Path, holder: str, role: str, claims: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    files = (TlsFiles.in_dir(certs, holder) if role == "node"
             else issue(certs, tmp_path, holder, role))

    async def scenario() -> tuple[grpc.StatusCode, list[Message], grpc.StatusCode]:
        async with GrpcReceiver(certs) as receiver:
            refused = await receiver.send(files, claims)
            delivered = list(receiver.delivered)
            good = await receiver.send(TlsFiles.in_dir(certs, "n2"), "n2")
            return refused, delivered, good

    refused, delivered, good = asyncio.run(scenario())
    assert refused is grpc.StatusCode.PERMISSION_DENIED and delivered == []
    assert good is grpc.StatusCode.OK
    [line] = [r for r in caplog.records if r.getMessage() == "peer refused"]
    assert line.certificate == f"{role} {holder!r}" and line.claimed == claims


def test_a_grpc_lane_streams_as_the_node_it_is_and_not_as_another(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PeerSender's StreamPieces lane with n2's certificate: as n3 it is refused (and says
    so once, however many batches it tries), as n2 it delivers."""
    def lines(message: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(message)]

    async def scenario() -> list[Message]:
        async with GrpcReceiver(certs) as receiver:
            honest = PeerSender("n2", "n1", receiver.address, tls=TlsFiles.in_dir(certs, "n2"))
            impostor = PeerSender("n3", "n1", receiver.address,
                                  tls=TlsFiles.in_dir(certs, "n2"))
            honest.start()
            impostor.start()
            try:
                for index in range(2, 40):  # a batch every 20 ms, as heartbeats would
                    impostor.enqueue(append(index, "n3", "n1"))
                    await asyncio.sleep(0.02)
                    if lines("peer unreachable") and index > 20:
                        break
                await wait_for(lambda: lines("peer unreachable"), "the sender's failure line")
                honest.enqueue(append(3, "n2", "n1"))
                await wait_for(lambda: receiver.delivered, "the honest batch")
                return list(receiver.delivered)
            finally:
                await honest.close()
                await impostor.close()

    assert asyncio.run(scenario()) == [append(3, "n2", "n1")]
    [line] = lines("peer refused")
    assert line.certificate == "node 'n2'" and line.claimed == "n3"
    # Both senders dial n1, so both log as peer n1: on a loaded machine the honest one's
    # first connection can fail too (and then recover); the impostor's line is the one
    # that names the refusal, once, and the impostor never reaches n1.
    unreachable = lines("peer unreachable")
    [failure] = [r for r in unreachable if "claim to come from 'n3'" in getattr(r, "reason", "")]
    assert failure.peer == "n1" and failure.code == "PERMISSION_DENIED"
    honest_outages = len(unreachable) - 1
    assert len(lines("peer reachable again")) <= honest_outages


def test_a_grpc_lane_dialling_n3_does_not_deliver_to_a_node_holding_n2s_certificate(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[Message]:
        async with GrpcReceiver(certs, "n2") as receiver:
            sender = PeerSender("n1", "n3", receiver.address, tls=TlsFiles.in_dir(certs, "n1"))
            sender.start()
            try:
                sender.enqueue(append(2, dst="n2"))
                await wait_for(lambda: sender.dropped_messages >= 1 or receiver.delivered,
                               "the batch dropped (or delivered)")
                return list(receiver.delivered)
            finally:
                await sender.close()

    assert asyncio.run(scenario()) == []
    [failure] = [r for r in caplog.records if r.getMessage().startswith("peer unreachable")]
    assert "peer n3's certificate does not name 'n3'" in failure.reason


def test_every_lane_of_every_peer_gets_the_certificates_and_a_misnamed_one_is_said_at_start(
        certs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[TlsFiles | None]:
        transport = Transport("n3", {"n1": "h:1"}, tcp_links={"n1": "h:2"},
                              tls=TlsFiles.in_dir(certs, "n2"))
        transport.set_peer("n4", "h:3", "h:4")
        transport.set_peer("n5", "h:5")
        files = [sender.tls for sender in transport.senders]
        await transport.close()
        return files

    assert asyncio.run(scenario()) == [TlsFiles.in_dir(certs, "n2")] * 6
    [line] = [r for r in caplog.records if "does not name it" in r.getMessage()]
    assert line.names == "node 'n2'"
