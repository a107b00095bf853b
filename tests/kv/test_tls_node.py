"""Mutual TLS on a real 3-node cluster (issue 24): clients with a certificate from the
cluster's CA read and write; every wrong credential is refused with one line saying what
to check, at once rather than after the deadline; membership changes need an admin
certificate and Introduce the certificate of the node it speaks for; and the nodes keep
serving good clients while bad ones knock.

Not here: Raft traffic between nodes under the wrong id (tests of system/kv/transport.py
and peer_tcp.py).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from system.kv import member_client, tls
from system.kv.__main__ import main
from system.kv.client import KVClient, PermissionDenied, TlsFailure
from system.kv.local_cluster import REPO_ROOT, LocalCluster
from system.kv.proto import kv_pb2, kv_pb2_grpc

pytestmark = pytest.mark.integration

# A refusal must come at once, not as an "unavailable" after the client's deadline.
FAST_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("tls-cluster")
    with LocalCluster(3, base / "nodes", tls_dir=base / "tls") as c:
        c.start()
        c.wait_for_leader(timeout_s=30)
        c.wait_for_confirmed(timeout_s=30)
        yield c


def authority_of(cluster: LocalCluster) -> tls.Authority:
    ca = cluster.tls_files("client").ca
    return tls.Authority(
        serialization.load_pem_private_key((ca.parent / "ca.key").read_bytes(), None),
        x509.load_pem_x509_certificate(ca.read_bytes()))


def write_files(directory: Path, name: str, key, cert, ca: Path) -> tls.TlsFiles:  # noqa: ANN001
    directory.mkdir(parents=True, exist_ok=True)
    tls.write_key(directory / f"{name}.key", key)
    tls.write_cert(directory / f"{name}.crt", cert)
    return tls.TlsFiles(directory / f"{name}.crt", directory / f"{name}.key", ca)


def server_says(cluster: LocalCluster, text: str) -> None:
    """Wait until some node's stderr holds `text` (gRPC writes it from its own thread)."""
    cluster.wait_until(lambda: any(text in cluster.specs[n].stderr_file.read_text()
                                   for n in cluster.ids), 10, f"a node's stderr to say {text!r}")


def refused_fast(client: KVClient, error: type[Exception]) -> str:
    """The message of the `error` a put raises, checked to come before FAST_S."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        client.put("k", b"v")
    assert time.monotonic() - started < FAST_S, "refused only after the deadline"
    return str(caught.value)


def test_puts_and_gets_with_a_client_certificate_also_through_a_follower(cluster):
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.ids if n != leader)
    with cluster.client(timeout_s=10) as client:
        client.put("tls/a", b"1")
        assert client.get("tls/a").value == b"1"
        # The follower forwards the read to the leader over mutual TLS, checking that
        # the certificate there names the leader's id.
        answer = client.get("tls/a", via=cluster.specs[follower].address)
        assert (answer.value, answer.node_id) == (b"1", leader)


def test_a_plaintext_client_is_told_the_node_speaks_tls(cluster):
    with KVClient(cluster.addresses, timeout_s=10) as client:
        message = refused_fast(client, TlsFailure)
    assert "speaks TLS and this client does not" in message
    assert "--trusted-ca-file" in message
    server_says(cluster, "WRONG_VERSION_NUMBER")


def test_a_client_certificate_from_another_ca_is_refused_by_the_node(cluster, tmp_path):
    key, cert = tls.issue(tls.new_authority("another CA"), "mallory", "client")
    files = write_files(tmp_path, "mallory", key, cert, cluster.tls_files("client").ca)
    with KVClient(cluster.addresses, timeout_s=10, tls=files) as client:
        message = refused_fast(client, TlsFailure)
    assert "refused the client certificate" in message
    assert "not signed by the CA" in message


def test_a_client_trusting_another_ca_refuses_the_nodes(cluster, tmp_path):
    other = tls.new_authority("another CA")
    key, cert = tls.issue(other, "mallory", "client")
    tls.write_cert(tmp_path / "other-ca.crt", other.cert)
    files = write_files(tmp_path, "mallory", key, cert, tmp_path / "other-ca.crt")
    with KVClient(cluster.addresses, timeout_s=10, tls=files) as client:
        message = refused_fast(client, TlsFailure)
    assert "is not signed by the CA in" in message and "other-ca.crt" in message


def test_an_expired_client_certificate_is_refused(cluster, tmp_path):
    now = datetime.datetime.now(datetime.timezone.utc)
    key, cert = tls.issue(authority_of(cluster), "late", "client",
                          not_before=now - datetime.timedelta(days=3),
                          not_after=now - datetime.timedelta(days=1))
    files = write_files(tmp_path, "late", key, cert, cluster.tls_files("client").ca)
    with KVClient(cluster.addresses, timeout_s=10, tls=files) as client:
        message = refused_fast(client, TlsFailure)
    assert "refused the client certificate" in message and "it expired at" in message
    # The node's side of it: gRPC logs the refused handshake, with the reason, on stderr.
    server_says(cluster, "certificate has expired")


def test_a_membership_change_with_a_client_certificate_is_permission_denied(cluster):
    started = time.monotonic()
    with pytest.raises(member_client.MembershipDenied) as caught:
        member_client.change(cluster.addresses, "add", "n9", "127.0.0.1:1", timeout_s=10,
                             tls=cluster.tls_files("client"))
    assert time.monotonic() - started < FAST_S
    assert "ChangeMembership needs" in str(caught.value)
    assert "client 'client'" in str(caught.value)
    leader = cluster.status(cluster.wait_for_leader())
    assert leader is not None and "n9" not in leader.member_addresses
    # The node says who it refused, in its log.
    logs = "".join(cluster.specs[n].log_file.read_text() for n in cluster.ids)
    assert "refused a call: ChangeMembership needs" in logs and "client 'client'" in logs


def test_the_member_command_with_a_client_certificate_says_permission_denied(cluster):
    files = cluster.tls_files("client")
    done = subprocess.run(
        [sys.executable, "-m", "system.kv", "member", "add", "--cluster",
         ",".join(cluster.addresses), "--id", "n9", "--address", "127.0.0.1:1",
         "--cert", str(files.cert), "--key", str(files.key), "--cacert", str(files.ca),
         "--timeout-s", "10"],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: permission denied:"), lines
    assert "admin" in lines[0]


def test_an_admin_certificate_changes_the_membership(cluster):
    admin = cluster.tls_files("admin")
    added = member_client.change(cluster.addresses, "add", "n9", "127.0.0.1:1",
                                 timeout_s=20, tls=admin)
    assert "n9" in added.learners
    removed = member_client.change(cluster.addresses, "remove", "n9", timeout_s=20, tls=admin)
    assert "n9" not in removed.learners
    listing = member_client.status_with_leader(cluster.addresses, tls=admin)
    assert set(listing.voters) == {"n1", "n2", "n3"}


def introduce(cluster: LocalCluster, to: str, files: tls.TlsFiles, as_node: str
              ) -> kv_pb2.IntroduceResponse:
    async def call() -> kv_pb2.IntroduceResponse:
        channel = grpc.aio.secure_channel(cluster.specs[to].address,
                                          tls.grpc_channel_credentials(files),
                                          options=[tls.target_name_option(to)])
        async with channel:
            return await kv_pb2_grpc.KVStub(channel).Introduce(
                kv_pb2.IntroduceRequest(node_id=as_node, member_id="m-test"), timeout=5)
    return asyncio.run(call())


def test_introduce_under_another_nodes_id_is_refused(cluster):
    with pytest.raises(grpc.RpcError) as caught:
        introduce(cluster, "n2", cluster.tls_files("n1"), as_node="n3")
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Introduce as node 'n3' needs that node's certificate" in caught.value.details()
    assert "node 'n1'" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        introduce(cluster, "n2", cluster.tls_files("admin"), as_node="admin")
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Introduce needs a node certificate" in caught.value.details()
    # n3's voter record is untouched: its own introduction still matches.
    st = cluster.status("n2")
    assert st is not None and "n3" in st.voters


def test_a_node_keeps_serving_good_clients_while_bad_ones_are_refused(cluster, tmp_path):
    now = datetime.datetime.now(datetime.timezone.utc)
    key, cert = tls.issue(authority_of(cluster), "late", "client",
                          not_before=now - datetime.timedelta(days=3),
                          not_after=now - datetime.timedelta(days=1))
    expired = write_files(tmp_path, "late", key, cert, cluster.tls_files("client").ca)
    stop = threading.Event()
    refusals = {"plaintext": 0, "expired": 0}

    def knock() -> None:
        while not stop.is_set():
            for name, files in (("plaintext", None), ("expired", expired)):
                with KVClient(cluster.addresses, timeout_s=5, tls=files) as bad:
                    try:
                        bad.put("bad", b"x")
                    except TlsFailure:
                        refusals[name] += 1

    knocker = threading.Thread(target=knock, daemon=True)
    knocker.start()
    try:
        with cluster.client(timeout_s=10) as good:
            deadline = time.monotonic() + 30
            written = 0
            while written < 50 or min(refusals.values()) < 5:
                assert time.monotonic() < deadline, (written, refusals)
                good.put(f"good/{written}", b"v")
                written += 1
            assert good.get("good/0").value == b"v"
    finally:
        stop.set()
        knocker.join(timeout=30)
    assert all(cluster.is_running(n) for n in cluster.ids)
    assert cluster.leader() is not None


def test_a_node_certificate_that_does_not_name_the_address_is_refused_by_the_client(
        cluster, tmp_path):
    # n3 restarted with a certificate that names only its id: peers dialling "n3" still
    # accept it, a client dialling 127.0.0.1 must not.
    key, cert = tls.issue(authority_of(cluster), "n3", "node", ["n3"])
    own = cluster.tls_files("n3")
    narrow = write_files(tmp_path, "n3", key, cert, own.ca)
    cluster.kill("n3")
    cluster.start_node("n3", narrow.args())  # the later flags win
    try:
        address = cluster.specs["n3"].address
        cluster.wait_until(lambda: _accepts_tls(address), 20, "n3 listening again")
        with KVClient([address], timeout_s=10, tls=cluster.tls_files("client")) as client:
            message = refused_fast(client, TlsFailure)
        assert "does not name '127.0.0.1'" in message
    finally:
        cluster.kill("n3")
        cluster.start_node("n3")
        cluster.wait_for_leader(timeout_s=30)


def _accepts_tls(address: str) -> bool:
    import socket
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


# ----- serve's flags: refused before anything starts ---------------------------------------

def serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "system.kv", "serve", "--id", "n1", "--listen",
         "127.0.0.1:0", "--data-dir", str(tmp_path / "data"), "--log-file",
         str(tmp_path / "n1.log"), *flags],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def certs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tls.generate(tmp_path_factory.mktemp("certs"), {"n1": [], "n2": []},
                        clients=["c1"])


@pytest.mark.parametrize("flags, says", [
    (["--cert-file", "{d}/n1.crt"], "missing --key-file, --trusted-ca-file"),
    (["--peer-cert-file", "{d}/n1.crt"], "needs TLS on the client port too"),
    (["--client-cert-auth"], "--client-cert-auth needs TLS on the client port too"),
    (["--cert-file", "{d}/n1.crt", "--key-file", "{d}/n2.key", "--trusted-ca-file",
      "{d}/ca.crt"], "do not go together"),
    (["--cert-file", "{d}/n2.crt", "--key-file", "{d}/n2.key", "--trusted-ca-file",
      "{d}/ca.crt"], "names node 'n2', not node 'n1'"),
    (["--cert-file", "{d}/c1.crt", "--key-file", "{d}/c1.key", "--trusted-ca-file",
      "{d}/ca.crt"], "names client 'c1', not node 'n1'"),
    (["--cert-file", "{d}/nope.crt", "--key-file", "{d}/n1.key", "--trusted-ca-file",
      "{d}/ca.crt"], "cannot read the certificate"),
    (["--cert-file", "{d}/n1.crt", "--key-file", "{d}/n1.key", "--trusted-ca-file",
      "{d}/ca.crt", "--peer-key-file", "{d}/n1.key"], "go together"),
])
def test_serve_refuses_incomplete_or_wrong_tls_flags_in_one_line(tmp_path, certs_dir,
                                                                 flags, says):
    done = serve(tmp_path, *[f.format(d=certs_dir) for f in flags])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: node n1 refuses to start:"), lines
    assert says in lines[0]
    assert not (tmp_path / "data").exists()  # refused before anything was created


# ----- the certs command ------------------------------------------------------------------------

def test_certs_writes_keys_0600_names_and_roles(tmp_path, capsys):
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--nodes", "n1=10.0.0.1+db1.example,n2,n3",
                 "--clients", "alice", "bob", "--admins", "root", "--days", "3"]) == 0
    printed = capsys.readouterr().out
    names = ["ca", "n1", "n2", "n3", "alice", "bob", "root"]
    for name in names:
        assert str(out / f"{name}.key") in printed
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600, name
    roles = {"n1": "node", "n2": "node", "n3": "node", "alice": "client", "bob": "client",
             "root": "admin"}
    for name, role in roles.items():
        cert = x509.load_pem_x509_certificate((out / f"{name}.crt").read_bytes())
        assert tls.identity_of(cert) == tls.Identity(name, role)
        left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
        assert datetime.timedelta(days=2) < left <= datetime.timedelta(days=3)
    n1 = x509.load_pem_x509_certificate((out / "n1.crt").read_bytes())
    sans = n1.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"n1", "localhost", "db1.example"}
    assert {str(a) for a in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1",
                                                                          "10.0.0.1"}
    # Every certificate verifies against the CA it came with.
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    for name in roles:
        x509.load_pem_x509_certificate((out / f"{name}.crt").read_bytes()).verify_directly_issued_by(ca)


def test_certs_refuses_a_name_given_twice(tmp_path, capsys):
    assert main(["certs", "--out", str(tmp_path), "--nodes", "n1,n2",
                 "--clients", "n1"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_certs_refuses_a_bad_node_list(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["certs", "--out", str(tmp_path), "--nodes", "n1,,n2"])
    assert caught.value.code == 2
    assert "expected ID or ID=ADDR+ADDR" in capsys.readouterr().err


# ----- a node dialling another checks that it is the node it meant ------------------------------

async def _server_with(files: tls.TlsFiles) -> tuple[grpc.aio.Server, str]:
    """A TLS port presenting `files`' certificate, serving nothing (the handshake is what
    is tested; a call that gets through is UNIMPLEMENTED)."""
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_server_credentials(
        files, require_client_auth=True))
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_forwarding_checks_that_the_leaders_certificate_names_the_leader(certs_dir):
    from system.kv.forward import Forwarder, ForwardFailed

    async def run() -> tuple[str, str]:
        server, address = await _server_with(tls.TlsFiles.in_dir(certs_dir, "n2"))
        forwarder = Forwarder("n1", tls.TlsFiles.in_dir(certs_dir, "n1"))
        messages = []
        try:
            for leader_id in ("n3", "n2"):  # n2's certificate answers at that address
                with pytest.raises(ForwardFailed) as caught:
                    await forwarder.call(address, "get", kv_pb2.GetRequest(key="k"), 2.0,
                                         write=False, leader_id=leader_id)
                messages.append(caught.value.message)
        finally:
            await forwarder.close()
            await server.stop(None)
        return messages[0], messages[1]

    as_n3, as_n2 = asyncio.run(run())
    assert "TLS handshake failed" in as_n3 and "does not name 'n3'" in as_n3
    assert "TLS handshake failed" not in as_n2 and "UNIMPLEMENTED" in as_n2


def test_introduce_checks_that_the_peers_certificate_names_the_peer(certs_dir):
    from system.kv.node import _call_introduce

    async def run(peer: str) -> tuple[grpc.StatusCode, str]:
        server, address = await _server_with(tls.TlsFiles.in_dir(certs_dir, "n2"))
        try:
            await _call_introduce(address, kv_pb2.IntroduceRequest(node_id="n1"), peer,
                                  tls.TlsFiles.in_dir(certs_dir, "n1"))
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        finally:
            await server.stop(None)
        raise AssertionError("the call went through")

    code, details = asyncio.run(run("n3"))
    assert code == grpc.StatusCode.UNAVAILABLE and "Hostname Verification" in details
    code, _ = asyncio.run(run("n2"))
    assert code == grpc.StatusCode.UNIMPLEMENTED  # the handshake passed: n2 is n2
