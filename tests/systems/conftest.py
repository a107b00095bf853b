"""A real etcd cluster on loopback for the etcd system's tests (nemesis/systems/etcd).

Every test that asks for one skips, with the setup hint, when `etcd` is not on PATH.
Members run in their own process groups; every one is killed when the test (or module)
ends, failed or not. Waits poll a condition against a deadline; none sleeps a fixed time.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nemesis.systems.etcd import members
from nemesis.systems.etcd.node import SETUP_HINT, EtcdMember, etcd_binary
from system.kv.tls import TlsFiles, generate
from system.ports import free_ports
from tests.nemesis.waiting import wait_until

START_TIMEOUT_S = 60.0  # a loaded 2-core machine: etcd's first election plus start-up


class EtcdCluster:
    """`size` etcd members named e1.. on loopback, with `tls` (a directory written by
    system.kv.tls.generate) or without."""

    def __init__(self, root: Path, size: int = 3, tls_dir: Path | None = None) -> None:
        binary = etcd_binary()
        if binary is None:
            pytest.skip(SETUP_HINT)
        self.binary = binary
        self.root = root
        self.tls_dir = tls_dir
        self.names = [f"e{i + 1}" for i in range(size)]
        self.members: dict[str, EtcdMember] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        ports = free_ports(2 * size)
        cluster = {name: f"127.0.0.1:{ports[size + i]}" for i, name in enumerate(self.names)}
        for i, name in enumerate(self.names):
            self.members[name] = EtcdMember(
                name, root / name, f"127.0.0.1:{ports[i]}", cluster[name], cluster,
                tls=self.node_tls(name), token=f"test-{root.name}")

    def node_tls(self, name: str) -> TlsFiles | None:
        return TlsFiles.in_dir(self.tls_dir, name) if self.tls_dir else None

    @property
    def addresses(self) -> dict[str, str]:
        return {name: m.client for name, m in self.members.items()}

    def start(self, name: str) -> None:
        member = self.members[name]
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.procs[name] = subprocess.Popen(member.command(self.binary), stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def status(self, name: str) -> members.EtcdStatus | None:
        return members.status(self.members[name].client, timeout_s=1.0,
                              tls=self.client_tls())

    def client_tls(self) -> TlsFiles | None:
        return TlsFiles.in_dir(self.tls_dir, "client") if self.tls_dir else None

    def leader(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """The name of the leader every running member agrees on."""
        def agreed() -> str | None:
            views = [self.status(name) for name in self.procs]
            if any(v is None for v in views):
                return None
            leaders = {v.leader_id for v in views}  # type: ignore[union-attr]
            leader = leaders.pop() if len(leaders) == 1 else ""
            return leader if leader in self.procs else None  # a killed one is no answer
        return wait_until(agreed, timeout_s, "a leader all running members agree on")


@pytest.fixture
def etcd_cluster_factory(tmp_path: Path) -> Iterator[Callable[..., EtcdCluster]]:
    made: list[EtcdCluster] = []

    def make(size: int = 3, tls: bool = False, start: bool = True) -> EtcdCluster:
        root = tmp_path / f"etcd{len(made)}"
        root.mkdir()
        tls_dir = None
        if tls:
            tls_dir = generate(root / "tls", {f"e{i + 1}": [] for i in range(size + 1)},
                               clients=["client"])
        cluster = EtcdCluster(root, size, tls_dir)
        made.append(cluster)
        if start:
            cluster.start_all()
            cluster.leader()
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop_all()


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One running 3-member cluster shared by a module's tests (each uses its own keys)."""
    root = tmp_path_factory.mktemp("etcd")
    cluster = EtcdCluster(root, 3)
    try:
        cluster.start_all()
        cluster.leader()
        yield cluster
    finally:
        cluster.stop_all()
