"""One etcd member as the harness runs it: its command line, its data files, its version.

etcd comes from Debian's etcd-server package (`/usr/bin/etcd`, 3.4.23 on bookworm); on
this machine `bash benchmarks/setup_kv_bench.sh` installs it. Settings are etcd's defaults
except addresses and directories (heartbeat 100 ms, election timeout 1000 ms, no PreVote,
WAL fsynced before a proposal is acknowledged).

Data files (etcd 3.4's layout under `--data-dir`), for the file faults:
- `member/wal/<seq>-<index>.wal`: the write-ahead log, segments preallocated to 64 MB;
- `member/snap/<term>-<index>.snap`: raft snapshots (one per 100,000 entries by default,
  so a short run may have none);
- `member/snap/db`: the bbolt database holding the key space (the applied state).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from system.kv.tls import TlsFiles

SETUP_HINT = "etcd is not installed: run `bash benchmarks/setup_kv_bench.sh` (Debian's etcd-server)"
WAL_DIR = "member/wal"
WAL_SUFFIX = ".wal"
SNAP_DIR = "member/snap"
SNAP_SUFFIX = ".snap"
DB_FILE = "member/snap/db"


def etcd_binary() -> str | None:
    """The `etcd` on PATH, or None."""
    return shutil.which("etcd")


def installed() -> bool:
    return etcd_binary() is not None


def require_installed() -> str:
    """The etcd binary's path, or FileNotFoundError with the one-line setup hint."""
    binary = etcd_binary()
    if binary is None:
        raise FileNotFoundError(SETUP_HINT)
    return binary


def version(binary: str | None = None) -> str:
    """etcd's version from `etcd --version` ("3.4.23"), or "unknown" if it cannot say."""
    binary = binary or etcd_binary()
    if binary is None:
        return "unknown"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


@dataclass(frozen=True)
class EtcdMember:
    """What one member's command line needs. `client` and `peer` are HOST:PORT it listens
    on (and advertises: the harness dials members where they listen); `cluster` is every
    member's name -> peer HOST:PORT, itself included, as the others reach it; `new` False
    for a member added to a running cluster (`--initial-cluster-state existing`, then
    `cluster` lists the members it joins plus itself). `tls`: its certificate, key and CA
    for both ports (mutual TLS on both, URLs https)."""

    name: str
    data_dir: Path
    client: str
    peer: str
    cluster: Mapping[str, str]
    new: bool = True
    tls: TlsFiles | None = None
    token: str = "mao-etcd"
    listen_client: str | None = None  # where it binds, when not where it is reached
    listen_peer: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def url(self, address: str) -> str:
        return f"{self.scheme}://{address}"

    def initial_cluster(self) -> str:
        return ",".join(f"{name}={self.url(peer)}" for name, peer in self.cluster.items())

    def command(self, binary: str = "etcd", extra: Sequence[str] = ()) -> list[str]:
        """argv that runs this member in the foreground, logging to stderr."""
        argv = [
            binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url(self.listen_client or self.client),
            "--advertise-client-urls", self.url(self.client),
            "--listen-peer-urls", self.url(self.listen_peer or self.peer),
            "--initial-advertise-peer-urls", self.url(self.peer),
            "--initial-cluster", self.initial_cluster(),
            "--initial-cluster-state", "new" if self.new else "existing",
            "--initial-cluster-token", self.token,
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip
        if self.tls is not None:
            # The same certificate on both ports, as our store's nodes use; clients and
            # peers must present one signed by the CA (etcd's mutual TLS).
            argv += self.tls.args() + ["--client-cert-auth"]
            argv += self.tls.args("peer-") + ["--peer-client-cert-auth"]
        return argv + list(extra)


def wal_files(data_dir: Path) -> list[Path]:
    return sorted((Path(data_dir) / WAL_DIR).glob(f"*{WAL_SUFFIX}"))


def snapshot_files(data_dir: Path) -> list[Path]:
    return sorted((Path(data_dir) / SNAP_DIR).glob(f"*{SNAP_SUFFIX}"))


def db_file(data_dir: Path) -> Path | None:
    path = Path(data_dir) / DB_FILE
    return path if path.exists() else None


def data_files(data_dir: Path) -> dict[str, list[Path]]:
    """The member's data files by kind ("wal", "snap", "db"): what the file faults damage."""
    db = db_file(data_dir)
    return {"wal": wal_files(data_dir), "snap": snapshot_files(data_dir),
            "db": [db] if db else []}
