"""Certificates for the store and the trainer: a CA, and a key and certificate per node,
client and admin; the gRPC credentials and `ssl` contexts built from them; and who a
verified peer is.

Who a certificate names: its subject's common name is the holder's name (a node id such
as `n2`, or a client's name) and its organizational unit its role: `node`, `client` or
`admin`. A node certificate also carries the node id as a DNS name, with `localhost`,
`127.0.0.1` and the addresses it was made for, so a client verifies the node it dialled,
and a node verifies that the peer it dialled as `n3` is n3 (the peer id is the name it
checks, whatever address it used). Nodes accept Raft traffic only under the id their
peer's certificate names, and membership changes only from an `admin` certificate.

Why a role in the subject rather than a separate authorization table: a cluster started
by the harness or by an operator from `python -m system.kv certs` has nothing else to
configure, and the CA that signed a certificate is the one place that decided what it may
do (as with etcd's `CN`-as-user and Kubernetes' `O`-as-group).

Files: `ca.crt` (and `ca.key`, which only `certs` reads), `<name>.crt` and `<name>.key`.
Every private key is written 0600. Every error says which file and what was wrong.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("node", "client", "admin")
DEFAULT_DAYS = 365
_ALWAYS_SANS = ("localhost", "127.0.0.1")


class TlsError(Exception):
    """A certificate, key or CA file that cannot be used, with the file and the reason."""


@dataclass(frozen=True)
class TlsFiles:
    """The three files one side of a TLS connection needs (etcd's `--cert-file`,
    `--key-file`, `--trusted-ca-file`)."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def in_dir(cls, directory: Path | str, name: str) -> TlsFiles:
        """`name`'s files in a directory written by `generate`."""
        directory = Path(directory)
        return cls(directory / f"{name}.crt", directory / f"{name}.key", directory / "ca.crt")

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain PEM, key PEM, CA PEM), each checked to parse."""
        cert, key, ca = (_read(self.cert, "certificate"), _read(self.key, "key"),
                         _read(self.ca, "CA certificate"))
        _load_cert(self.cert, cert)
        _load_cert(self.ca, ca)
        try:
            serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as exc:
            raise TlsError(f"{self.key}: not an unencrypted PEM private key ({exc})") from None
        return cert, key, ca

    def args(self, prefix: str = "") -> list[str]:
        """The command-line flags that name these files (`--cert-file` ... or, with
        prefix "peer-", `--peer-cert-file` ...)."""
        return [f"--{prefix}cert-file", str(self.cert), f"--{prefix}key-file", str(self.key),
                f"--{prefix}trusted-ca-file", str(self.ca)]


@dataclass(frozen=True)
class Identity:
    """Who a verified certificate names."""

    name: str
    role: str

    def __str__(self) -> str:
        return f"{self.role} {self.name!r}"


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def _load_cert(path: Path, data: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise TlsError(f"{path}: not a PEM certificate ({exc})") from None


# --- who a certificate names ---------------------------------------------------------------

def identity_of(cert: x509.Certificate) -> Identity:
    def one(oid: x509.ObjectIdentifier) -> str:
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""

    return Identity(one(NameOID.COMMON_NAME), one(NameOID.ORGANIZATIONAL_UNIT_NAME))


@lru_cache(maxsize=256)
def identity_of_pem(pem: bytes) -> Identity:
    """The identity in a PEM certificate that TLS already verified; cached, since every
    peer RPC asks it of the same few certificates."""
    return identity_of(x509.load_pem_x509_certificate(pem))


def identity_of_der(der: bytes) -> Identity:
    return identity_of(x509.load_der_x509_certificate(der))


def grpc_identity(context) -> Identity | None:  # noqa: ANN001 - grpc(.aio) ServicerContext
    """The verified client certificate's identity of a gRPC call, or None when the call
    presented none (plaintext, or a port that does not ask for client certificates)."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") if auth else None
    if not pems:
        return None
    return identity_of_pem(bytes(pems[0]))


def ssl_identity(ssl_object) -> Identity | None:  # noqa: ANN001 - ssl.SSLObject/SSLSocket
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return identity_of_der(der) if der else None


# --- credentials -----------------------------------------------------------------------------

def grpc_server_credentials(files: TlsFiles, require_client_auth: bool):  # noqa: ANN201
    import grpc

    cert, key, ca = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=require_client_auth)


def grpc_channel_credentials(files: TlsFiles | None, ca: Path | None = None):  # noqa: ANN201
    """Credentials of a client: its certificate (mutual TLS) when `files` is given, else
    only the CA that must have signed the server's."""
    import grpc

    if files is not None:
        cert, key, ca_pem = files.read()
        return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key,
                                            certificate_chain=cert)
    if ca is None:
        raise TlsError("a TLS client needs a CA certificate (--trusted-ca-file / --cacert)")
    ca_pem = _read(ca, "CA certificate")
    _load_cert(ca, ca_pem)
    return grpc.ssl_channel_credentials(root_certificates=ca_pem)


def open_channel(address: str, tls: TlsFiles | object | None, options: Sequence = (), *,
                 peer_name: str | None = None, aio: bool = False):  # noqa: ANN201
    """A gRPC channel to `address`: plaintext when `tls` is None, else mutual TLS with
    `tls` — a TlsFiles, or credentials a caller read once from grpc_channel_credentials.
    `peer_name`: the name the server's certificate must carry (a node id) instead of the
    address dialled. `aio`: a grpc.aio channel. Every client of the project dials
    through here, so the plaintext-or-TLS choice is made in one place."""
    import grpc

    api = grpc.aio if aio else grpc
    options = list(options)
    if tls is None:
        return api.insecure_channel(address, options=options)
    credentials = grpc_channel_credentials(tls) if isinstance(tls, TlsFiles) else tls
    if peer_name:
        options.append(target_name_option(peer_name))
    return api.secure_channel(address, credentials, options=options)


def target_name_option(name: str) -> tuple[str, str]:
    """The channel option that makes a client check the server's certificate for `name`
    (a node id) rather than the address it dialled."""
    return ("grpc.ssl_target_name_override", name)


def server_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """Mutual TLS for the peer port: the peer must present a certificate from the CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, files)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """The dialling side of the peer port: presents `files`' certificate and checks the
    server's against the peer id given as `server_hostname`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, files)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> None:
    files.read()  # the clear error first: ssl's own are "[SSL] PEM lib (_ssl.c:3917)"
    try:
        context.load_cert_chain(str(files.cert), str(files.key))
        context.load_verify_locations(cafile=str(files.ca))
    except ssl.SSLError as exc:
        raise TlsError(f"{files.cert} and {files.key} do not go together, or "
                       f"{files.ca} is not a CA: {exc.reason or exc}") from None


def check_role(identity: Identity | None, roles: Iterable[str], what: str) -> str | None:
    """None when `identity` holds one of `roles`, else the one line that says why not."""
    roles = tuple(roles)
    wanted = " or ".join(roles)
    article = "an" if wanted[0] in "aeiou" else "a"
    if identity is None:
        return f"{what} needs {article} {wanted} certificate; the caller presented none"
    if identity.role not in roles:
        return (f"{what} needs {article} {wanted} certificate; the caller's names "
                f"{identity}")
    return None


# --- making certificates -----------------------------------------------------------------------

@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def new_authority(name: str = "mao test CA", days: int = DEFAULT_DAYS) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(key, cert)


def issue(authority: Authority, name: str, role: str, sans: Sequence[str] = (),
          not_before: datetime.datetime | None = None,
          not_after: datetime.datetime | None = None
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for `name` in `role`, signed by `authority`. Node
    certificates may serve and dial (server and client auth); the others only dial."""
    if role not in ROLES:
        raise TlsError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    if not name:
        raise TlsError("a certificate needs a name")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == "node":
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME,
                                                           role)]))
               .issuer_name(authority.cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
               .not_valid_after(not_after or now + datetime.timedelta(days=DEFAULT_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   authority.key.public_key()), critical=False))
    if role == "node" or sans:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_general_names(sans)), critical=False)
    return key, builder.sign(authority.key, hashes.SHA256())


def node_sans(node_id: str, addresses: Iterable[str] = ()) -> list[str]:
    """The names a node certificate carries: its id, localhost, 127.0.0.1 and the hosts
    of `addresses` (host or host:port)."""
    names = [node_id, *_ALWAYS_SANS]
    for address in addresses:
        host = _host_of(address)
        if host and host not in names:
            names.append(host)
    return names


def _host_of(address: str) -> str:
    if address.count(":") == 1:
        return address.rpartition(":")[0]
    return address.strip("[]").rpartition("]:")[0] or address.strip("[]")


def _general_names(sans: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    return names


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key readable by its owner only, from its first byte."""
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def generate(out: Path | str, nodes: Mapping[str, Sequence[str]],
             clients: Iterable[str] = (), admins: Iterable[str] = ("admin",),
             days: int = DEFAULT_DAYS) -> Path:
    """A new CA in `out` and a key and certificate per node (`nodes`: id -> extra
    addresses), client and admin. Returns `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    authority = new_authority(days=days)
    write_key(out / "ca.key", authority.key)
    write_cert(out / "ca.crt", authority.cert)
    wanted = [(node_id, "node", node_sans(node_id, addresses))
              for node_id, addresses in nodes.items()]
    wanted += [(name, "client", []) for name in clients]
    wanted += [(name, "admin", []) for name in admins]
    seen: set[str] = set()
    for name, role, sans in wanted:
        if name in seen or name == "ca":
            raise TlsError(f"the name {name!r} is given twice (or is 'ca'): every node, "
                           "client and admin needs its own")
        seen.add(name)
        key, cert = issue(authority, name, role, sans,
                          not_after=_now() + datetime.timedelta(days=days))
        write_key(out / f"{name}.key", key)
        write_cert(out / f"{name}.crt", cert)
    return out


@dataclass(frozen=True)
class NodeTls:
    """A node's TLS settings (`serve --cert-file ... --peer-cert-file ...`).

    `client` secures the client port (gRPC: clients, forwarded requests, Introduce and
    Raft over gRPC); `peer` the peer port (`--peer-listen`) and every connection this
    node dials to a peer. Client certificates are always required on both ports: grpc's
    Python API can require a client certificate or not ask for one, never ask for an
    optional one, and nodes identify each other on the client port (Introduce, Raft over
    gRPC). `--client-cert-auth` is accepted, as etcd operators write it, and is implied.
    """

    client: TlsFiles
    peer: TlsFiles
