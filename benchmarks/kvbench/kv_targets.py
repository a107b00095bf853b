"""The two targets that speak our client API (`manyasone.kv.KV`): our store, and PySyncObj
behind its thin front. Both find their leader with the KV service's Status call.

They only start, inspect and stop member processes; they never load them.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import grpc

from benchmarks.kvbench.clients import ClientKind, sync_channel
from benchmarks.kvbench.processes import REPO_ROOT, ManagedProcess
from benchmarks.kvbench.target import CLUSTER_SIZE, Target
from system.kv.proto import kv_pb2, kv_pb2_grpc
from system.ports import free_ports


class KVServiceTarget(Target):
    client_kind = ClientKind.KV
    id_prefix = "n"

    def __init__(self, work_dir: Path, tls: bool = False):
        super().__init__(work_dir, tls)
        self.ids = [f"{self.id_prefix}{i + 1}" for i in range(CLUSTER_SIZE)]
        self.client_ports = free_ports(CLUSTER_SIZE)

    def member_names(self) -> list[str]:
        return list(self.ids)

    def client_addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.client_ports]

    def status(self, index: int) -> kv_pb2.StatusResponse:
        with sync_channel(self.client_addresses()[index], self.tls_dir) as channel:
            return kv_pb2_grpc.KVStub(channel).Status(kv_pb2.StatusRequest(), timeout=1.0)

    def _view_of(self, index: int) -> tuple[str, int]:
        status = self.status(index)
        return status.leader_id, status.term

    def _leader_seen_by(self, index: int) -> int | None:
        """The leader only when a majority agrees: it says it leads and enough live members
        name it. A deposed leader may still believe it leads for a while (PySyncObj's step
        down only after leaderFallbackTimeout, 30 s), and killing that one would time the
        wrong thing."""
        statuses = {}
        for other in self.live_member_indexes():
            try:
                statuses[other] = self.status(other)
            except grpc.RpcError:
                continue
        claimants = [i for i, status in statuses.items() if status.role == "leader"]
        if not claimants:
            return None
        leader = max(claimants, key=lambda i: statuses[i].term)
        votes = sum(
            1
            for i, status in statuses.items()
            if i == leader or (status.leader_id == self.ids[leader] and status.role != "leader")
        )
        return leader if votes > CLUSTER_SIZE // 2 else None


class PySyncObjTarget(KVServiceTarget):
    name = "pysyncobj"
    client_kind = ClientKind.KV_SESSION  # its front speaks our Session stream too
    durability = "memory only, never fsyncs"
    id_prefix = "p"

    def __init__(self, work_dir: Path):
        super().__init__(work_dir)
        try:
            import pysyncobj  # noqa: F401
        except ImportError as error:
            raise FileNotFoundError(
                "pysyncobj is not installed: run `bash benchmarks/setup_kv_bench.sh`"
            ) from error
        raft_ports = free_ports(CLUSTER_SIZE)
        self.members_arg = ",".join(
            f"{member_id}=127.0.0.1:{client}/127.0.0.1:{raft}"
            for member_id, client, raft in zip(self.ids, self.client_ports, raft_ports, strict=True)
        )

    def version(self) -> str:
        return importlib.metadata.version("pysyncobj")

    def _start_member(self, index: int) -> ManagedProcess:
        argv = [
            sys.executable, "-m", "benchmarks.kvbench.pysyncobj_member",
            "--id", self.ids[index],
            "--members", self.members_arg,
        ]  # fmt: skip
        return ManagedProcess(self.ids[index], argv, self.work_dir / f"{self.ids[index]}.log")


class OursTarget(KVServiceTarget):
    name = "ours"
    client_kind = ClientKind.KV_SESSION  # what our client library speaks
    durability = "fsync WAL before ack"
    id_prefix = "n"

    def __init__(self, work_dir: Path, tcp_peers: bool = True, tls: bool = False):
        super().__init__(work_dir, tls)
        self.tcp_peers = tcp_peers  # False: peers talk gRPC on the client port
        ports = free_ports(2 * CLUSTER_SIZE)  # one draw: no port twice
        self.client_ports, self.peer_ports = ports[:CLUSTER_SIZE], ports[CLUSTER_SIZE:]

    def version(self) -> str:
        """The commit, marked dirty only when the store's own code (system/) has changes."""

        def git(*args: str) -> str | None:
            out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
            return out.stdout.strip() if out.returncode == 0 else None

        commit = git("rev-parse", "--short", "HEAD")
        if commit is None:
            return "this checkout"
        return f"checkout {commit}" + ("-dirty" if git("status", "--porcelain", "--", "system") else "")

    def _start_member(self, index: int) -> ManagedProcess:
        peers = ",".join(
            f"{member_id}={address}"
            for i, (member_id, address) in enumerate(zip(self.ids, self.client_addresses(), strict=True))
            if i != index
        )
        links = ",".join(
            f"{member_id}=127.0.0.1:{port}"
            for i, (member_id, port) in enumerate(zip(self.ids, self.peer_ports, strict=True))
            if i != index
        )
        argv = [
            sys.executable, "-m", "system.kv", "serve",
            "--id", self.ids[index],
            "--listen", self.client_addresses()[index],
            "--peers", peers,
            "--data-dir", str(self.work_dir / self.ids[index]),
        ]  # fmt: skip
        if self.tcp_peers:  # Raft traffic on a second port, as etcd's peer URLs
            argv += ["--peer-listen", f"127.0.0.1:{self.peer_ports[index]}", "--peer-links", links]
        if self.tls_dir:  # etcd's flag names; the same certificate for both ports
            from system.kv.tls import TlsFiles

            argv += [*TlsFiles.in_dir(self.tls_dir, self.ids[index]).args(), "--client-cert-auth"]
        return ManagedProcess(self.ids[index], argv, self.work_dir / f"{self.ids[index]}.log")
