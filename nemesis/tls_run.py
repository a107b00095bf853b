"""`python -m nemesis run --tls`: a throw-away certificate authority per run.

The CA and every key live in a temporary directory (`mao-tls-<run id>-*` under the
system's temporary folder, 0700), never in the run folder: `nemesis serve` hands run
folders out, and a key there would let whoever downloads one speak as a node or an admin
of a cluster started with the same files. The run folder gets `ca.crt` only (to inspect
what the nodes presented) and test.json's `config.tls`. The directory is removed when the
run ends, whatever ends it (`RunTls.close`, called from the runner's `finally`); a harness
killed with SIGKILL leaves it to `python -m nemesis clean` (nemesis/platforms/local.py
removes `mao-tls-*` whose owner process is gone, as it does the local platform's data).

The platform makes the certificates once it knows where each node is reached
(`RunTls.generate`): locally 127.0.0.1; on Docker also the container's name and its
address on the run's network. Names: every node under its id, the workload's clients
under `client`, the nemesis's membership steps under `admin` (the only role a node lets
change its membership).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from system.kv import tls
from system.kv.tls import TlsFiles

TEMP_PREFIX = "mao-tls-"
OWNER_FILE = "harness.pid"  # as the local platform's data directory: `clean` reads it
CLIENT = "client"  # the names LocalCluster(tls_dir=) gives them too
ADMIN = "admin"


class RunTls:
    """The run's certificate directory; `close()` removes it (idempotent)."""

    def __init__(self, run_id: str) -> None:
        # mkdtemp makes it 0700: the keys in it are 0600 as well (tls.write_key)
        self.directory = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{run_id}-"))
        (self.directory / OWNER_FILE).write_text(str(os.getpid()))

    @property
    def generated(self) -> bool:
        return (self.directory / "ca.crt").exists()

    def generate(self, nodes: Mapping[str, Sequence[str]]) -> None:
        """A new CA and the certificates of `nodes` (id -> the addresses it is reached at,
        beyond its id, localhost and 127.0.0.1), the client and the admin."""
        tls.generate(self.directory, nodes, clients=[CLIENT], admins=[ADMIN])

    def files(self, name: str) -> TlsFiles:
        return TlsFiles.in_dir(self.directory, name)

    @property
    def client(self) -> TlsFiles:
        return self.files(CLIENT)

    @property
    def admin(self) -> TlsFiles:
        return self.files(ADMIN)

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def node_flags(files: TlsFiles) -> list[str]:
    """What a node's `serve` is given: its certificate on both ports and client
    certificates required."""
    return [*files.args(), *peer_flags(files)]


def peer_flags(files: TlsFiles) -> list[str]:
    """The part of `node_flags` beyond `--cert-file --key-file --trusted-ca-file` (which
    LocalCluster(tls_dir=) gives itself): the peer port's files, which default to those,
    and `--client-cert-auth`, implied in TLS mode; both written out as an etcd operator
    would, so a node's command line says what it runs with."""
    return [*files.args("peer-"), "--client-cert-auth"]
