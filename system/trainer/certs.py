"""Which certificate each trainer process presents, the flags that give them, and the one
line a worker or a coordinator prints when TLS refuses a connection.

Names and roles (what `run --tls` generates; an operator's own CA can follow them):
- `coordinator`: role `node` (it serves), with `localhost` and `127.0.0.1` and the hosts it
  was made for in its subject alternative names. Every coordinator of a job presents it
  (coordinator ids change at every restart; the address workers dial does not), and a
  worker checks it names the host of the address in the lease record.
- `worker-<i>`: role `client`, one per worker.
- `trainer-run`: role `client`, what `run` itself presents (the store, `Status` calls).
The coordinator takes gradients and parameter pulls from `client` and `node` certificates
of its CA; an `admin` certificate (membership changes) is refused, as is any caller TLS
rejects (no certificate, another CA, expired).

The store: each process presents the same certificate to the store unless given the
store's own (`--kv-cert-file` ...: a store with another CA).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from system.kv import tls
from system.kv.tls import TlsFiles

if TYPE_CHECKING:  # grpc is imported where it is used: see quiet_grpc_client_logs
    import grpc

COORDINATOR = "coordinator"
RUN = "trainer-run"
TRAINING_ROLES = ("client", "node")  # who may pull parameters and push gradients


def worker_name(index: int) -> str:
    return f"worker-{index}"


@dataclass(frozen=True)
class TrainerTls:
    """The certificates of a job's processes: `directory` (one `<name>.crt`/`.key` per
    process, written by `generate`) or `shared` (one certificate for every process, which
    must then be a `node` certificate naming the coordinators' host); `kv` the store's
    client certificate when it differs from each process's own."""

    directory: Path | None = None
    shared: TlsFiles | None = None
    kv: TlsFiles | None = None

    def files(self, name: str) -> TlsFiles:
        if self.shared is not None:
            return self.shared
        assert self.directory is not None
        return TlsFiles.in_dir(self.directory, name)

    def kv_files(self, name: str) -> TlsFiles:
        return self.kv or self.files(name)

    def args(self, name: str) -> list[str]:
        """The flags a child process `name` is started with."""
        args = self.files(name).args()
        if self.kv is not None:
            args += self.kv.args("kv-")
        return args


def generate(out: Path, workers: int, store_nodes: list[str] | None = None,
             coordinator_hosts: list[str] | None = None) -> TrainerTls:
    """A throw-away CA and the certificates of a job (and of the store's nodes, when the run
    starts its own store and gives it these): `run --tls`. `coordinator_hosts`: names or
    addresses workers dial besides localhost and 127.0.0.1 (a container's name)."""
    clients = [worker_name(i) for i in range(workers)] + [RUN]
    if store_nodes:
        clients.append("client")  # what LocalCluster's own Status polling presents
    nodes = {COORDINATOR: list(coordinator_hosts or []), **{n: [] for n in store_nodes or []}}
    tls.generate(out, nodes, clients=clients)
    return TrainerTls(directory=out)


# --- flags -------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--cert-file --key-file --trusted-ca-file` (etcdctl's `--cert --key --cacert` too),
    and the store's own `--kv-cert-file ...` when its CA differs."""
    for prefix, what in (("", "this process"), ("kv-", "the store client (default: the same)")):
        p.add_argument(f"--{prefix}cert-file", *([] if prefix else ["--cert"]),
                       dest=f"{prefix.replace('-', '_')}cert_file", default=None,
                       help=f"TLS certificate of {what}")
        p.add_argument(f"--{prefix}key-file", *([] if prefix else ["--key"]),
                       dest=f"{prefix.replace('-', '_')}key_file", default=None,
                       help="its private key")
        p.add_argument(f"--{prefix}trusted-ca-file", *([] if prefix else ["--cacert"]),
                       dest=f"{prefix.replace('-', '_')}trusted_ca_file", default=None,
                       help="the CA that signed the other side's certificate")


def _trio(args: argparse.Namespace, prefix: str) -> TlsFiles | None:
    flags = ("cert_file", "key_file", "trusted_ca_file")
    values = [getattr(args, f"{prefix}{flag}", None) for flag in flags]
    if not any(values):
        return None
    if not all(values):
        missing = [f"--{prefix.replace('_', '-')}{flag.replace('_', '-')}"
                   for flag, value in zip(flags, values, strict=True) if not value]
        raise tls.TlsError(f"TLS needs all three files: missing {' '.join(missing)}")
    return TlsFiles(*(Path(value) for value in values))


def from_args(args: argparse.Namespace, read: bool = True) -> tuple[TlsFiles | None, TlsFiles | None]:
    """(this process's certificate, the store client's) from the flags; TlsError says
    which flag or file is wrong (with `read`, the files are read now: a missing or
    unreadable file is one line at start, not a failed call later)."""
    own, kv = _trio(args, ""), _trio(args, "kv_")
    if read:
        for files in (own, kv):
            if files is not None:
                files.read()
    return own, kv or own


# --- refusals, one line each -------------------------------------------------------------------

def check_caller(context: grpc.ServicerContext, what: str) -> str | None:
    """None when the caller of a TLS port may train, else why not. (Without a certificate
    from the CA, TLS itself refused the connection before any call.)"""
    return tls.check_role(tls.grpc_identity(context), TRAINING_ROLES, what)


def explain(error: grpc.RpcError, address: str, uses_tls: bool) -> str | None:
    """What to fix, when a failed call to the coordinator at `address` was TLS refusing the
    connection (gRPC says only "Socket closed" or the handshake's OpenSSL error), else
    None (a coordinator that died or is paused: not a line worth printing)."""
    import grpc

    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"the coordinator at {address} refused this worker: {details}"
    if code != grpc.StatusCode.UNAVAILABLE:
        return None
    if "Hostname Verification" in details or "No match found for server name" in details:
        return (f"TLS: the coordinator's certificate does not name the host of {address}; "
                "it needs that host in its subject alternative names")
    if "handshake" in details.lower() or "SSL_ERROR" in details:
        return (f"TLS handshake with {address} failed: check that --trusted-ca-file is the CA "
                f"that signed the coordinator's certificate ({details[-120:]})")
    if "Socket closed" in details and "failed to connect" in details:
        if uses_tls:
            return (f"TLS handshake with {address} failed: the coordinator closed the "
                    "connection; check that it uses TLS, that its CA is --trusted-ca-file and "
                    "that the same CA signed --cert-file")
        return (f"the coordinator at {address} closed the connection before any call: if it "
                "uses TLS, give this worker --cert-file, --key-file and --trusted-ca-file")
    return None


def quiet_grpc_client_logs() -> None:
    """In `run` and `inspect` (clients only), before gRPC is first imported: no gRPC INFO
    lines ("Handshake failed with error ...") above the one-line error that says what to
    fix, unless the user set GRPC_VERBOSITY. gRPC reads the variable when it is imported;
    it is taken back out at once, so the children (`run`'s coordinators and store nodes)
    keep those lines: in a coordinator's log they are its side of a refused handshake."""
    if "GRPC_VERBOSITY" in os.environ or "grpc" in sys.modules:
        return
    os.environ["GRPC_VERBOSITY"] = "ERROR"
    try:
        import grpc  # noqa: F401
    finally:
        del os.environ["GRPC_VERBOSITY"]


class OnceEach:
    """Prints each line once (a worker retries every half second; its log must not)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def print(self, line: str, prefix: str = "error: ") -> bool:
        with self._lock:
            if line in self._seen:
                return False
            self._seen.add(line)
        print(f"{prefix}{line}", file=sys.stderr, flush=True)
        return True
