"""The one small interface every benchmarked system implements: a 3-member cluster on free
loopback ports in a temporary directory that can be started, asked for its leader, have its
leader SIGKILLed, and be stopped for sure.

A target never generates load itself (that is `loadgen`'s job, in other processes); it
only starts, inspects and stops its own members.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from pathlib import Path

from benchmarks.kvbench.clients import ClientKind, open_client
from benchmarks.kvbench.processes import ClusterError, ManagedProcess, wait_until

CLUSTER_SIZE = 3
STARTUP_TIMEOUT_S = 60.0


class Target(ABC):
    name: str  # short name used on the command line and in the table: "ours", "etcd", ...
    durability: str  # what an acknowledged write has survived, shown beside every figure
    client_kind: ClientKind

    def __init__(self, work_dir: Path, tls: bool = False):
        self.work_dir = work_dir
        # With tls, every member serves clients and peers over mutual TLS with
        # certificates from a CA made for this cluster (tls_dir, "" when plaintext).
        self.tls_dir = str(work_dir / "tls") if tls else ""
        self.members: list[ManagedProcess | None] = [None] * CLUSTER_SIZE

    # --- what each system says about itself -------------------------------------------

    @abstractmethod
    def _start_member(self, index: int) -> ManagedProcess:
        """Start member `index` (ports and directories chosen in __init__)."""

    @abstractmethod
    def client_addresses(self) -> list[str]:
        """host:port a client dials for each member, by member index."""

    @abstractmethod
    def _leader_seen_by(self, index: int) -> int | None:
        """The member index that member `index` says leads and that says so itself, or
        None when it knows none. Raises if the member cannot be asked."""

    @abstractmethod
    def _view_of(self, index: int) -> tuple[str, int]:
        """(leader as member `index` names it, term) as it reports them; raises if it
        cannot be asked."""

    def version(self) -> str:
        return ""

    # --- shared behaviour -------------------------------------------------------------

    def member_names(self) -> list[str]:
        """Each member's name, as its certificate names it."""
        return [f"m{i + 1}" for i in range(CLUSTER_SIZE)]

    def start(self) -> None:
        """Start all members and return once a leader is elected and accepts a write."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.tls_dir:
            from benchmarks.kvbench.clients import TLS_CLIENT_NAME
            from system.kv.tls import generate

            generate(self.tls_dir, {name: [] for name in self.member_names()},
                     clients=[TLS_CLIENT_NAME])
        for index in range(CLUSTER_SIZE):
            self.members[index] = self._start_member(index)
        def leader_unless_a_member_died() -> int | None:
            dead = [m.name for m in self.members if m is not None and not m.alive()]
            if dead:
                raise ClusterError(
                    f"{self.name}: member(s) {', '.join(dead)} exited during start-up\n{self.describe_logs()}"
                )
            return self.find_leader()

        try:
            leader = wait_until(
                leader_unless_a_member_died, STARTUP_TIMEOUT_S, what=f"{self.name} to elect a leader"
            )
            address = self.client_addresses()[leader]
            wait_until(
                lambda: self._probe_write(address, 1.0),
                STARTUP_TIMEOUT_S,
                what=f"{self.name} to accept a write",
            )
            self.wait_settled(STARTUP_TIMEOUT_S)
        except TimeoutError as error:
            raise ClusterError(f"{self.name}: {error}\n{self.describe_logs()}") from error

    def find_leader(self) -> int | None:
        """Index of the member that a live member reports as leader and that agrees."""
        for index, member in enumerate(self.members):
            if member is None or not member.alive():
                continue
            with contextlib.suppress(Exception):
                leader = self._leader_seen_by(index)
                if leader is not None:
                    return leader
        return None

    def settled(self) -> bool:
        """Every live member names the same leader in the same term. Right after start a
        member may still be connecting or electing; a leader kill measured then would time
        an election already under way."""
        views = set()
        for index in self.live_member_indexes():
            leader, term = self._view_of(index)
            if not leader:
                return False
            views.add((leader, term))
        return len(views) == 1

    def wait_settled(self, timeout_s: float) -> None:
        try:
            wait_until(lambda: self.settled() or None, timeout_s, what=f"{self.name} members to agree on a leader")
        except TimeoutError as error:
            raise ClusterError(f"{self.name}: {error}\n{self.describe_logs()}") from error

    def kill_leader(self) -> int:
        """SIGKILL the current leader; return its index. The member stays dead."""
        leader = self.find_leader()
        if leader is None:
            raise ClusterError(f"{self.name}: no leader to kill\n{self.describe_logs()}")
        member = self.members[leader]
        assert member is not None
        member.kill_hard()
        return leader

    def live_member_indexes(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m is not None and m.alive()]

    def server_pids(self) -> list[int]:
        return [m.pid for m in self.members if m is not None and m.alive()]

    def stop(self) -> None:
        """Stop every member; safe to call more than once and after a failed start."""
        for member in self.members:
            if member is not None:
                member.stop()

    def describe_logs(self) -> str:
        parts = []
        for member in self.members:
            if member is not None:
                state = "running" if member.alive() else f"exited {member.popen.returncode}"
                parts.append(f"--- {member.name} ({state}), log {member.log_path}:\n{member.log_tail()}")
        return "\n".join(parts)

    def _probe_write(self, address: str, timeout_s: float) -> bool:
        async def probe() -> bool:
            client = open_client(self.client_kind, address, tls_dir=self.tls_dir)
            try:
                await client.put("kvbench-probe", b"ready", timeout_s)
                return True
            finally:
                await client.close()

        return asyncio.run(probe())

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
