"""etcd as a benchmark target: three `etcd` members (Debian's etcd-server) on loopback.

Settings are etcd's defaults except addresses and directories: heartbeat 100 ms, election
timeout 1000 ms, PreVote off (etcd 3.4's default), snapshot every 100,000 entries, and
the write-ahead log fsynced before a proposal is acknowledged (etcd cannot turn that off:
`--unsafe-no-fsync` only appeared in 3.5). Its leader is found with Maintenance.Status
over gRPC, so `etcdctl` (package etcd-client) is not needed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc

from benchmarks.kvbench.clients import ClientKind, sync_channel
from benchmarks.kvbench.processes import ManagedProcess
from benchmarks.kvbench.target import CLUSTER_SIZE, Target
from nemesis.systems.etcd.proto import etcd_pb2 as etcd_rpc_pb2
from nemesis.systems.etcd.proto import etcd_pb2_grpc as etcd_rpc_pb2_grpc
from system.ports import free_ports

SETUP_HINT = "run `bash benchmarks/setup_kv_bench.sh` (installs Debian's etcd-server)"


class EtcdTarget(Target):
    name = "etcd"
    durability = "fsync WAL before ack"
    client_kind = ClientKind.ETCD

    def __init__(self, work_dir: Path, tls: bool = False):
        super().__init__(work_dir, tls)
        self.scheme = "https" if tls else "http"
        self.binary = shutil.which("etcd")
        if self.binary is None:
            raise FileNotFoundError(f"etcd is not installed: {SETUP_HINT}")
        ports = free_ports(2 * CLUSTER_SIZE)
        self.client_ports = ports[:CLUSTER_SIZE]
        self.peer_ports = ports[CLUSTER_SIZE:]
        self.names = [f"m{i + 1}" for i in range(CLUSTER_SIZE)]
        self.initial_cluster = ",".join(
            f"{name}={self.scheme}://127.0.0.1:{port}" for name, port in zip(self.names, self.peer_ports, strict=True)
        )
        self._member_ids: dict[int, int] = {}  # etcd member id -> our index, learned from Status

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, check=False)
        return out.stdout.splitlines()[0].replace("etcd Version: ", "") if out.stdout else "?"

    def _start_member(self, index: int) -> ManagedProcess:
        data_dir = self.work_dir / self.names[index]
        client_url = f"{self.scheme}://127.0.0.1:{self.client_ports[index]}"
        peer_url = f"{self.scheme}://127.0.0.1:{self.peer_ports[index]}"
        argv = [
            self.binary,
            "--name", self.names[index],
            "--data-dir", str(data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"kvbench-{self.work_dir.name}",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.tls_dir:  # etcd's own flags; the same certificate for both ports, as ours
            name, tls = self.names[index], Path(self.tls_dir)
            files = [f"{tls}/{name}.crt", f"{tls}/{name}.key", f"{tls}/ca.crt"]
            argv += ["--cert-file", files[0], "--key-file", files[1], "--trusted-ca-file", files[2],
                     "--client-cert-auth",
                     "--peer-cert-file", files[0], "--peer-key-file", files[1],
                     "--peer-trusted-ca-file", files[2], "--peer-client-cert-auth"]
        return ManagedProcess(f"etcd-{self.names[index]}", argv, self.work_dir / f"{self.names[index]}.log")

    def client_addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.client_ports]

    def _status(self, index: int) -> etcd_rpc_pb2.StatusResponse:
        with sync_channel(self.client_addresses()[index], self.tls_dir) as channel:
            stub = etcd_rpc_pb2_grpc.MaintenanceStub(channel)
            return stub.Status(etcd_rpc_pb2.StatusRequest(), timeout=1.0)

    def _view_of(self, index: int) -> tuple[str, int]:
        status = self._status(index)
        return (f"{status.leader:x}" if status.leader else ""), status.raftTerm

    def _leader_seen_by(self, index: int) -> int | None:
        status = self._status(index)
        self._member_ids[status.header.member_id] = index
        if status.leader == 0:
            return None
        if status.leader not in self._member_ids:
            # Learn the ids of the others (a member only reports its own).
            for other in range(CLUSTER_SIZE):
                member = self.members[other]
                if other != index and member is not None and member.alive():
                    try:
                        self._member_ids[self._status(other).header.member_id] = other
                    except grpc.RpcError:
                        continue
        leader = self._member_ids.get(status.leader)
        if leader is None or leader == index:
            return leader
        # Ask the named leader whether it agrees, so a stale view is not taken for truth.
        return leader if self._status(leader).leader == status.leader else None
