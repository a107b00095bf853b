"""A cluster of real KV node processes on loopback: the `cluster` command, the trainer, tests.

What it does: starts N `python -m system.kv serve` processes on 127.0.0.1 ports with one
data directory and one log file each (each node takes clients on one port and Raft traffic
from its peers, over plain TCP, on a second: `--peer-listen`, `--peer-links`), and gives the
operations a person or a fault-injection test needs: kill with any signal, pause/resume
(SIGSTOP/SIGCONT), restart, Status polling, and waiting for a condition with a deadline.

With `tls_dir`, every node runs with mutual TLS (`--cert-file ... --trusted-ca-file`):
the certificates are made there by `tls.generate` (nodes n1..nN, a client named
`client`, an admin named `admin`) unless the directory holds a CA already, the cluster's
own Status polling uses the client certificate, and `tls_files(name)` gives a test the
files of any of them (`issue_node` makes one for a node added later).

It is part of the system, not of the harness: `python -m system.kv cluster` and the
trainer's `TrainerRun` start it, and the system never imports the harness. The harness's
local platform builds on it (nemesis/platforms/local_cluster.py adds the fault-injecting
proxies on every peer link, through `peer_address`/`peer_link`).

What it must never do: leave a process behind. Every node runs in its own process group
(`start_new_session`), dies with its parent (it sets PR_SET_PDEATHSIG itself when
KV_PARENT_PID is in its environment), and `close()`
(also called by the context manager and by the finalizer) SIGKILLs every group and reaps
it. Waiting is always on a condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar

from system import child_processes
from system.kv.proto import kv_pb2
from system.kv.status_probe import StatusProbe
from system.kv.tls import TlsFiles
from system.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_PORT_OFFSET = 1000  # with a base port: node i takes peers on BASE+1000+i-1
T = TypeVar("T")


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    address: str  # 127.0.0.1:PORT, for clients (and peers without a TCP link)
    peer_address: str  # 127.0.0.1:PORT where it takes Raft traffic over TCP ("" = none)
    data_dir: Path
    log_file: Path  # the node's JSON-lines log
    stderr_file: Path  # what the process printed (startup errors land here)


class ClusterTimeout(AssertionError):
    """A condition the cluster was waited on did not hold before its deadline."""


def _kill_all(processes: dict[str, subprocess.Popen]) -> None:
    for proc in processes.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)


class LocalCluster:
    """N node processes on loopback. Use as a context manager, or call close().

    `tcp_peers=False` leaves out `--peer-listen`/`--peer-links`: peers then talk gRPC on
    the client port, as a node started without them does. A subclass may route node i's
    traffic to node j elsewhere (a proxy) by overriding `peer_address` and `peer_link`."""

    def __init__(
        self,
        nodes: int,
        base_dir: Path | None = None,
        *,
        base_port: int | None = None,
        host: str = "127.0.0.1",
        node_args: Sequence[str] = (),
        per_node_args: Mapping[str, Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
        tcp_peers: bool = True,
        tls_dir: Path | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self._own_dir = base_dir is None
        self.base_dir = Path(tempfile.mkdtemp(prefix="kv-cluster-")) if base_dir is None else base_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if base_port is None:
            ports = free_ports(2 * nodes, host)
        else:  # peers on BASE+1000+i-1
            ports = [base_port + i for i in range(nodes)]
            ports += [base_port + PEER_PORT_OFFSET + i for i in range(nodes)]
        self.specs: dict[str, NodeSpec] = {}
        for i, port in enumerate(ports[:nodes], start=1):
            node_id = f"n{i}"
            data_dir = self.base_dir / node_id
            self.specs[node_id] = NodeSpec(
                node_id=node_id,
                address=f"{host}:{port}",
                peer_address=f"{host}:{ports[nodes + i - 1]}" if tcp_peers else "",
                data_dir=data_dir,
                log_file=self.base_dir / f"{node_id}.log",
                stderr_file=self.base_dir / f"{node_id}.stderr",
            )
        self.node_args = list(node_args)
        self.per_node_args = {k: list(v) for k, v in (per_node_args or {}).items()}
        self.env = dict(env or {})
        self.processes: dict[str, subprocess.Popen] = {}
        self._expected_exit: set[str] = set()
        self._reported_exit: set[str] = set()
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        if self.tls_dir is not None and not (self.tls_dir / "ca.crt").exists():
            from system.kv import tls

            tls.generate(self.tls_dir, {node_id: [] for node_id in self.specs},
                         clients=["client"], admins=["admin"])
        self._probe = StatusProbe(tls=self.tls_files("client") if self.tls_dir else None)
        # Last line of defence if the owner forgets close(): kill the groups.
        self._finalizer = weakref.finalize(self, _kill_all, self.processes)

    # ----- processes -------------------------------------------------------------------

    @property
    def ids(self) -> list[str]:
        return list(self.specs)

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.specs.values()]

    def command(self, node_id: str, extra_args: Sequence[str] = ()) -> list[str]:
        spec = self.specs[node_id]
        others = [s.node_id for s in self.specs.values() if s.node_id != node_id]
        peers = ",".join(f"{o}={self.peer_address(node_id, o)}" for o in others)
        tcp = []
        if spec.peer_address:
            links = ",".join(f"{o}={self.peer_link(node_id, o)}" for o in others)
            tcp = ["--peer-listen", spec.peer_address] + (["--peer-links", links] if others else [])
        return [
            sys.executable, "-m", "system.kv", "serve",
            "--id", node_id, "--listen", spec.address, "--peers", peers, *tcp,
            "--data-dir", str(spec.data_dir), "--log-file", str(spec.log_file),
            *(self.tls_files(node_id).args() if self.tls_dir is not None else []),
            *self.node_args, *self.per_node_args.get(node_id, []), *extra_args,
        ]

    def tls_files(self, name: str) -> TlsFiles:
        """The certificate, key and CA of `name` (a node id, "client", "admin") in
        `tls_dir`; ValueError on a cluster without TLS."""
        if self.tls_dir is None:
            raise ValueError("this cluster runs without TLS (no tls_dir)")
        return TlsFiles.in_dir(self.tls_dir, name)

    def issue_node(self, node_id: str, addresses: Sequence[str] = ()) -> TlsFiles:
        """A node certificate for `node_id` (a member added at run time), signed by the
        cluster's CA in `tls_dir`."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        from system.kv import tls

        files = self.tls_files(node_id)
        authority = tls.Authority(
            serialization.load_pem_private_key((files.ca.parent / "ca.key").read_bytes(), None),
            x509.load_pem_x509_certificate(files.ca.read_bytes()))
        key, cert = tls.issue(authority, node_id, "node", tls.node_sans(node_id, addresses))
        tls.write_key(files.key, key)
        tls.write_cert(files.cert, cert)
        return files

    def peer_address(self, src: str, dst: str) -> str:
        """Where node `src` reaches node `dst`'s client port (gRPC peer lanes, forwarding)."""
        return self.specs[dst].address

    def peer_link(self, src: str, dst: str) -> str:
        """Where node `src` reaches node `dst`'s peer port (TCP peer lanes)."""
        return self.specs[dst].peer_address

    def start(self) -> None:
        for node_id in self.specs:
            self.start_node(node_id)

    def start_node(self, node_id: str, extra_args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None) -> subprocess.Popen:
        if self.is_running(node_id):
            raise RuntimeError(f"{node_id} is already running (pid {self.processes[node_id].pid})")
        spec = self.specs[node_id]
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [full_env.get("PYTHONPATH")])])
        full_env.update(self.env)
        if env:
            full_env.update(env)
        # The node asks the kernel to SIGKILL it when we die (see __main__.serve). No
        # preexec_fn here: that forces a plain fork() of this process, and forking a
        # process with live gRPC threads runs gRPC's fork handlers in the child, which
        # sometimes abort it ("Check failed: next_worker->state == KICKED").
        full_env["KV_PARENT_PID"] = str(os.getpid())
        with open(spec.stderr_file, "ab") as stderr:
            proc = child_processes.popen(
                self.command(node_id, extra_args),
                cwd=REPO_ROOT, env=full_env, stdin=subprocess.DEVNULL,
                stdout=stderr, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[node_id] = proc
        self._expected_exit.discard(node_id)
        self._reported_exit.discard(node_id)
        return proc

    def is_running(self, node_id: str) -> bool:
        proc = self.processes.get(node_id)
        return proc is not None and proc.poll() is None

    def send_signal(self, node_id: str, sig: int) -> None:
        proc = self.processes[node_id]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)

    def send_kill(self, node_id: str) -> None:
        """SIGKILL without waiting (`kill` waits): to kill several nodes at one moment."""
        self._expected_exit.add(node_id)
        with contextlib.suppress(ProcessLookupError, KeyError):
            self.send_signal(node_id, signal.SIGKILL)

    def kill(self, node_id: str, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int | None:
        """Send `sig` (default SIGKILL) and wait for the process to exit; returns its code."""
        proc = self.processes[node_id]
        self._expected_exit.add(node_id)
        if proc.poll() is None:
            # The group may be gone already (killed by `send_kill` a moment ago and not yet
            # reaped): nothing left to signal, the wait below reaps it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            if sig == signal.SIGTERM:
                # A stopped process cannot handle SIGTERM.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
        return proc.wait(timeout=timeout_s)

    def stop(self, node_id: str, timeout_s: float = 10.0) -> int | None:
        """Graceful stop (SIGTERM); returns the exit code."""
        return self.kill(node_id, signal.SIGTERM, timeout_s)

    def pause(self, node_id: str) -> None:
        self.send_signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: str) -> None:
        self.send_signal(node_id, signal.SIGCONT)

    def restart(self, node_id: str, extra_args: Sequence[str] = ()) -> None:
        if self.is_running(node_id):
            self.kill(node_id)
        self.start_node(node_id, extra_args)

    def exit_code(self, node_id: str) -> int | None:
        proc = self.processes.get(node_id)
        return None if proc is None else proc.poll()

    def exited_nodes(self) -> list[str]:
        """Nodes that exited without being told to, each reported once."""
        out = []
        for node_id, proc in self.processes.items():
            if (proc.poll() is not None and node_id not in self._expected_exit
                    and node_id not in self._reported_exit):
                self._reported_exit.add(node_id)
                out.append(node_id)
        return out

    def close(self) -> None:
        """SIGKILL every node's process group, reap them, close channels, remove a temp dir."""
        _kill_all(self.processes)
        self._probe.close()
        if self._own_dir and not os.environ.get("KV_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- observing -------------------------------------------------------------------

    def status(self, node_id: str, timeout_s: float = 0.5) -> kv_pb2.StatusResponse | None:
        """The node's Status, or None if it does not answer within `timeout_s`."""
        if not self.is_running(node_id):
            return None
        return self._probe.status(self.specs[node_id].address, timeout_s)

    def wait_until(self, condition: Callable[[], T | None], timeout_s: float, what: str,
                   poll_s: float = 0.02) -> T:
        """Poll `condition` until it returns something truthy; raise ClusterTimeout after
        `timeout_s` naming `what` and each node's last status."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise ClusterTimeout(f"timed out after {timeout_s:g}s waiting for {what}; "
                                     f"nodes: {self.describe()}")
            time.sleep(poll_s)

    def describe(self) -> str:
        parts = []
        for node_id in self.specs:
            st = self.status(node_id, timeout_s=0.2)
            if st is None:
                code = self.exit_code(node_id)
                parts.append(f"{node_id}=down(exit {code})" if code is not None else f"{node_id}=no-answer")
            else:
                parts.append(f"{node_id}={st.role}/t{st.term}/leader={st.leader_id or '-'}"
                             f"/commit={st.commit_index}/applied={st.applied_index}"
                             + ("/vote-withheld" if st.vote_withheld else ""))
        return ", ".join(parts)

    def leader(self, among: Iterable[str] | None = None) -> str | None:
        """The leader that every answering node in `among` (default: running nodes) agrees
        on, if that leader itself says it leads; else None."""
        ids = [i for i in (among if among is not None else self.specs) if self.is_running(i)]
        statuses = {i: self.status(i) for i in ids}
        if not ids or any(st is None for st in statuses.values()):
            return None
        leaders = {st.leader_id for st in statuses.values() if st is not None}
        if len(leaders) != 1:
            return None
        (leader,) = leaders
        if not leader or leader not in statuses:
            return None
        st = statuses[leader]
        return leader if st is not None and st.role == "leader" else None

    def wait_for_leader(self, timeout_s: float = 15.0, among: Iterable[str] | None = None) -> str:
        among = list(among) if among is not None else None
        return self.wait_until(lambda: self.leader(among), timeout_s, "a leader all nodes agree on")

    def wait_for_confirmed(self, timeout_s: float = 15.0) -> None:
        """Until every running node may vote: a fresh node withholds its vote until the
        other voters confirmed its identity (docs/kv.md, "Identity and rejoining"). A test
        that cuts or kills a node right after the first election must wait for this, or the
        two left may be unable to elect anyone (one of them still waiting for the lost
        node's welcome)."""
        def confirmed() -> bool:
            statuses = [self.status(i) for i in self.specs if self.is_running(i)]
            return bool(statuses) and all(st is not None and not st.vote_withheld for st in statuses)
        self.wait_until(confirmed, timeout_s, "every node's identity confirmed (no vote withheld)")

    def wait_for_leader_change(self, current: str | None, timeout_s: float) -> str | None:
        """For the CLI: return when the agreed leader differs from `current`, a node exited,
        or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader != current and (leader is not None or current is not None):
                return leader
            if any(p.poll() is not None and i not in self._expected_exit
                   and i not in self._reported_exit for i, p in self.processes.items()):
                return current
            time.sleep(0.2)
        return current

    def wait_for_applied(self, node_id: str, index: int, timeout_s: float = 15.0) -> kv_pb2.StatusResponse:
        return self.wait_until(
            lambda: (st if (st := self.status(node_id)) is not None and st.applied_index >= index else None),
            timeout_s, f"{node_id} to apply index {index}")

    def client(self, **kwargs: object):  # noqa: ANN201 - KVClient, imported lazily
        from system.kv.client import KVClient

        if self.tls_dir is not None:
            kwargs.setdefault("tls", self.tls_files("client"))
        return KVClient(self.addresses, **kwargs)  # type: ignore[arg-type]
