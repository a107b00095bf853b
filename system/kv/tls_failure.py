"""What went wrong when a TLS connection to a node failed, in one line a person can act on.

Why: gRPC reports every failed handshake as UNAVAILABLE "failed to connect to all
addresses ... Socket closed" (the node refused our certificate, or we spoke plaintext to
a TLS port) or "... Tls handshake failed ... CERTIFICATE_VERIFY_FAILED" (we refused the
node's). Retried, that looks like a node that is down until the deadline. `explain`
turns it into the reason, from the error text, from our own certificate (expired? signed
by the CA we were given?) and, where the text cannot tell, from one probe of the address:
does it speak TLS at all, and does it keep the connection once it has seen our
certificate.

`explain` returns None when the failure is not about TLS (the node is down, refused the
connection): the caller retries as usual.
"""

from __future__ import annotations

import datetime
import socket
import ssl

from cryptography import x509

from system.kv.tls import TlsFiles, TlsError

_HINT = "(--cert-file/--key-file/--trusted-ca-file, or KVClient(tls=TlsFiles(...)))"


class TlsMismatch(Exception):
    """A connection to a node failed for a reason of certificates; the message says which
    and what to check. Retrying does not help."""


def explain(address: str, details: str, files: TlsFiles | None, name: str = "",
            timeout_s: float = 1.0) -> str | None:
    """Why the connection to `address` failed (gRPC's error `details`), or None if it
    is not a TLS problem. `files`: what we dialled with (None: plaintext); `name`: the
    name we required the node's certificate to carry (a node id), "" for its address."""
    text = details or ""
    lowered = text.lower()
    if "failed to connect" not in lowered and "handshake" not in lowered:
        return None  # a call that got through: the node itself answered
    if files is None:
        if "socket closed" in lowered and _probe(address, None, timeout_s) != "not-tls":
            return (f"{address} speaks TLS and this client does not: give it the cluster's "
                    f"CA and a client certificate {_HINT}")
        return None
    if "wrong_version_number" in lowered:
        return (f"{address} does not speak TLS (a plaintext node?): start the node with "
                f"--cert-file/--key-file/--trusted-ca-file, or dial it without TLS")
    if "hostname verification" in lowered or "no match found for server name" in lowered:
        wanted = name or address.rpartition(":")[0]
        return (f"the certificate of the node at {address} does not name {wanted!r}: check "
                f"the address, and that the node runs with its own certificate "
                f"(`python -m system.kv certs` names each node's id, localhost, 127.0.0.1 and "
                f"the addresses given as ID=ADDR+ADDR)")
    if "certificate_verify_failed" in lowered or "tls handshake failed" in lowered:
        if "expired" in lowered:
            return (f"the certificate of the node at {address} has expired: issue it a new "
                    f"one (python -m system.kv certs)")
        return (f"the certificate of the node at {address} is not signed by the CA in "
                f"{files.ca}: check --trusted-ca-file (it must be the cluster's ca.crt)")
    if "socket closed" not in lowered:
        return None
    # The node closed the connection during the handshake: it refused our certificate,
    # or it is plaintext. Our certificate may say why before any probe does.
    own = _own_certificate_problem(files)
    if own:
        return f"the node at {address} refused the client certificate {files.cert}: {own}"
    verdict = _probe(address, files, timeout_s)
    if verdict == "not-tls":
        return (f"{address} does not speak TLS (a plaintext node?): start the node with "
                f"--cert-file/--key-file/--trusted-ca-file, or dial it without TLS")
    if verdict == "refused":
        return (f"the node at {address} refused the client certificate {files.cert}: it is "
                f"not signed by a CA the node trusts; check that the node's --trusted-ca-file "
                f"is the CA that signed it")
    return None  # the node accepts us now: a passing failure, retry


def _own_certificate_problem(files: TlsFiles) -> str:
    """What is wrong with our certificate as such (validity, issuer), or ""."""
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    except (OSError, ValueError):
        return ""  # TlsFiles.read() reported it when the channel was made
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        return (f"it expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; issue a new "
                f"one (python -m system.kv certs)")
    if cert.not_valid_before_utc > now:
        return (f"it is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
                f"(check this host's clock)")
    if cert.issuer != ca.subject:
        return (f"it is not signed by the CA in {files.ca} ({cert.issuer.rfc4514_string()} "
                f"signed it); use the certificate and CA of the same `certs` run")
    return ""


def _probe(address: str, files: TlsFiles | None, timeout_s: float) -> str:
    """"not-tls", "refused" (a TLS node that closes the connection after seeing our
    certificate), "accepted", or "unknown" (unreachable)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # we only ask what the node does with us
    context.set_alpn_protocols(["h2"])  # gRPC closes a connection without it
    try:
        if files is not None:
            context.load_cert_chain(str(files.cert), str(files.key))
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw:
            with context.wrap_socket(raw) as conn:
                # HTTP/2's preface: a node that took our certificate answers with SETTINGS.
                conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                return "accepted" if conn.recv(9) else "refused"
    except ssl.SSLError as exc:
        if exc.reason == "WRONG_VERSION_NUMBER" or "wrong version" in str(exc).lower():
            return "not-tls"
        return "refused"
    except (OSError, ValueError, TlsError):
        return "unknown"
