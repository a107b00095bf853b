"""The system interface: what the harness needs from a system under test (Jepsen's `db` and
`client`). A platform (local processes, docker containers) asks a `System` what to run and
how to ask a node; it keeps process control (start, kill, pause, resume), the network cuts,
the file damage and the logs. A workload asks it for a client (`kv_client`).

One outcome vocabulary for every client operation, as in Jepsen:
- a result: `ok` — the operation took effect (a read saw that value and version);
- `Fail` raised: the operation certainly did NOT take effect, anywhere, ever;
- `Unknown` raised (or any other exception): it may have taken effect, now or later.
  When in doubt a write is `Unknown`: calling a write that applied `Fail` makes the
  checker reject a correct history, and calling one that did not apply `Unknown` costs
  only search time. A read changes nothing, so a read that could not be served is `Fail`.

Nothing here imports a system: `nemesis/systems/store.py` is the store's implementation,
docs/systems.md shows how to add one.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from system.kv.tls import TlsFiles


class SystemError_(RuntimeError):  # noqa: N801 - `SystemError` is a builtin
    """The system cannot do what was asked; the message says what."""


class Unsupported(SystemError_):
    """The system has no such operation (membership changes, a read consistency...)."""


# ----- the client -------------------------------------------------------------------


class Fail(Exception):
    """The operation certainly did not take effect (refused, or never sent)."""


class Unknown(Exception):
    """The operation may have taken effect: the client lost track of it (timeout, a
    connection lost after sending, an error it cannot classify)."""


class VersionMismatch(Exception):
    """A conditional put/delete whose expected version did not match: `ok`, not applied.
    `current_version` is the key's version (0: absent) as the system reported it."""

    def __init__(self, current_version: int, node: str | None = None) -> None:
        super().__init__(f"version is {current_version}")
        self.current_version = current_version
        self.node = node


@dataclass(frozen=True)
class KvResult:
    """An `ok` outcome. `version` is the key's version after a write (the version removed,
    for a delete), or the version read (0: the key is absent; `value` is then None).
    Versions count the writes of one key since it was created (1, 2, ...), as etcd's
    `version` does; a delete resets it to 0. `node`/`term`/`applied_index` say who
    answered, where the system tells (None otherwise)."""

    version: int
    value: bytes | None = None
    node: str | None = None
    term: int | None = None
    applied_index: int | None = None


class KvClient(Protocol):
    """The kv workload's client (workloads/kv.py). One operation at a time per client.
    Every call returns a `KvResult` or raises `Fail`, `Unknown` or (conditional writes)
    `VersionMismatch`; any other exception counts as `Unknown` for a write, `Fail` for a
    read. `expected_version` None: unconditional; 0: the key must be absent."""

    @property
    def node_addresses(self) -> Mapping[str, str]:
        """node id -> address, the preferred node first."""

    def get(self, key: str, *, consistency: str = "linearizable",
            via: str | None = None) -> KvResult:
        """Read `key`: "linearizable" (sees every write acknowledged before it was sent)
        or "stale" (served by one node without a recency promise). `via` is a node address
        to ask first."""

    def put(self, key: str, value: bytes, *, expected_version: int | None = None,
            request_id: str | None = None) -> KvResult: ...

    def delete(self, key: str, *, expected_version: int | None = None,
               request_id: str | None = None) -> KvResult: ...

    def new_request_id(self) -> str:
        """An id for the next write (recorded in the history; a system that deduplicates
        retries uses it, others may ignore it)."""

    def close(self) -> None: ...


# ----- nodes ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSetup:
    """Everything a platform knows about node `node_id` when it starts it.

    `listen`: HOST:PORT for clients; `peer_listen`: HOST:PORT for peer traffic ("" when the
    system uses one port). `peers`: other node id -> where this node reaches its client
    port; `peer_links`: other node id -> where it reaches its peer port (through the
    platform's fault-injecting proxies on the local platform). `tls`: this node's
    certificate, key and CA (certificates name the node id, localhost, 127.0.0.1 and, on
    docker, the container's name and address), None without --tls. `platform`: "local"
    or "docker" (the interpreter or binary path may differ)."""

    node_id: str
    listen: str
    peer_listen: str
    peers: Mapping[str, str]
    peer_links: Mapping[str, str]
    data_dir: Path
    log_file: Path
    tls: TlsFiles | None
    platform: str
    extra_args: Sequence[str] = ()
    # Where the others reach this node's peer port when that is not `peer_listen` (the
    # local platform's per-destination proxy, for a system like etcd whose members each
    # advertise one peer URL); "" when it is `peer_listen`.
    peer_advertise: str = ""


@dataclass(frozen=True)
class DataLayout:
    """Where the file faults look in a node's data directory (nemesis/platforms/disk_damage.py).
    `wal`: (folder, suffix) of the fsynced log segments — truncate cuts them, bitflip
    flips bits in them, wipe-wal removes the folder; `snapshots`: (folder, suffix) of
    snapshot files (bitflip only). Folders are relative to the data directory."""

    wal: tuple[str, str]
    snapshots: tuple[str, str] | None = None
    # WAL segments are preallocated (sparse): damage is drawn below the written end.
    preallocated_wal: bool = True

    def as_request(self) -> dict:
        return {"wal": list(self.wal), "snapshots": list(self.snapshots) if self.snapshots else None,
                "preallocated": self.preallocated_wal}


class NodeStatus(Protocol):
    """What `Platform.status/ready/leader/describe` read of a node's answer. `role` is
    "leader", "follower", "candidate" or "learner"; `leader_id` "" when unknown.
    `vote_withheld`: the node may not vote yet (False when the system has no such notion).
    A system may return more (the store's StatusResponse does: windows.py reads it)."""

    role: str
    leader_id: str
    term: int
    applied_index: int
    vote_withheld: bool


@dataclass
class SimpleStatus:
    """A `NodeStatus` for systems that have nothing more to say."""

    role: str
    leader_id: str
    term: int
    applied_index: int = 0
    vote_withheld: bool = False
    extra: dict = field(default_factory=dict)


class System(abc.ABC):
    """A system under test. Subclasses set `name` and implement the abstract methods;
    the optional ones have refusing defaults."""

    name: str = ""
    # True only for our store: the sim platform runs its Raft core in memory (system/sim).
    simulated: bool = False
    # True only for our store: its status carries the Raft fields (commit and config index,
    # learners, snapshot transfers) that nemesis/windows.py times leader faults by.
    status_windows: bool = False
    # True when every member reaches a given member at the one peer address that member
    # advertises (etcd: its member id is derived from it), so a platform cannot give each
    # sender its own address per link; the local platform then cuts links with one
    # source-aware proxy per destination (nemesis/platforms/source_proxy.py).
    one_peer_address: bool = False
    # Exit codes a node uses to refuse its data (the harness then rejoins it, docs/kv.md).
    refuses_data_exit_codes: tuple[int, ...] = ()
    # True when a write carrying a request id the system already applied returns its first
    # result and changes nothing (our store, docs/kv.md); the kv workload then replays
    # acknowledged writes (`replay` in its mix). etcd has no request ids.
    idempotent_request_ids: bool = False

    def refuses_data(self, exit_code: int, reason: str) -> bool:
        """Whether a node that exited with `exit_code`, its last log line `reason`,
        refused its data directory (the harness then rejoins it). A system whose refusal
        exit code is also its generic one (etcd's 1) reads the line too."""
        return exit_code in self.refuses_data_exit_codes

    @abc.abstractmethod
    def version(self) -> str:
        """The system's version, for test.json, results.json, the report and JUnit."""

    # ----- running a node ------------------------------------------------------------

    @abc.abstractmethod
    def node_command(self, setup: NodeSetup) -> list[str]:
        """argv that starts node `setup.node_id` in the foreground, on its existing data
        (an empty directory the first time). It must log to `setup.log_file` or stderr."""

    def node_env(self, setup: NodeSetup) -> dict[str, str]:
        """Environment added to the node's (the platform adds its own bookkeeping)."""
        return {}

    def file_fault_args(self, snapshot_every: int, node_args: Sequence[str]) -> list[str]:
        """Arguments added to every node when a file fault runs: snapshots every
        `snapshot_every` entries or so, so damage reaches snapshot files in short runs
        (unless `node_args` already says). [] when the system has no such setting."""
        return []

    def data_layout(self) -> DataLayout | None:
        """Where the node keeps its log and snapshots, for the file faults; None: the file
        faults are refused for this system."""
        return None

    # ----- asking a node -------------------------------------------------------------

    @abc.abstractmethod
    def status(self, address: str, *, timeout_s: float,
               tls: TlsFiles | None) -> NodeStatus | None:
        """The node's view (role, leader, term) through its client address; None when it
        does not answer within `timeout_s`. Must never raise for an unreachable node."""

    def close(self) -> None:  # noqa: B027 - optional: most systems keep nothing open
        """Release what `status` keeps open (channels)."""

    # ----- membership (the member fault) --------------------------------------------

    def supports_membership(self) -> bool:
        return False

    def change_membership(self, addresses: Sequence[str], action: str, node_id: str,
                          address: str, *, peer_address: str, timeout_s: float,
                          tls: TlsFiles | None) -> None:
        """`action` "add" (as a learner or non-voting member, reached at `address`: its
        client address as peers see it, and `peer_address`: its peer port), "promote" (to
        voter), "remove"; through any of `addresses`; returns once committed, raises
        otherwise (a timeout may still commit later: the harness reads `membership`
        again). The node added is then started with its usual `node_command` on an empty
        data directory."""
        raise Unsupported(f"the {self.name} system has no membership changes here")

    # Whether `change_membership_once` works (the member fault's aimed shapes need it).
    single_membership_changes = False

    def change_membership_once(self, address: str, action: str, node_id: str, *,
                               timeout_s: float, tls: TlsFiles | None) -> None:
        """One attempt of "promote" or "remove" at the member reached at `address`, without
        retry or redirection (the `member` fault's changes aimed at a given leader);
        returns once committed, raises with the system's reason otherwise."""
        raise Unsupported(f"the {self.name} system has no single-attempt membership "
                          f"changes here")

    def membership(self, addresses: Sequence[str], *, timeout_s: float,
                   tls: TlsFiles | None) -> tuple[set[str], set[str]]:
        """(voters, learners) by node id, as the leader sees them."""
        raise Unsupported(f"the {self.name} system has no membership changes here")

    # ----- clients -------------------------------------------------------------------

    @abc.abstractmethod
    def kv_client(self, addresses: Mapping[str, str], *, timeout_s: float, client_id: str,
                  tls: TlsFiles | None, unsafe: object = None) -> KvClient:
        """A client of the kv workload; `addresses` node id -> address, preferred first.
        `timeout_s` bounds each operation. `unsafe`: a client canary (the store's only)."""

    # ----- canaries (deliberately broken builds, docs/canaries.md) --------------------

    def canaries(self) -> tuple[str, ...]:
        """Node-side `--unsafe` names this system knows (none for most)."""
        return ()

    def client_canaries(self) -> tuple[str, ...]:
        return ()

    def unsafe_allow_env(self) -> str | None:
        """The environment variable a canary needs set, or None."""
        return None

    def client_canary(self, name: str | None, environ: dict[str, str] | None = None) -> object:
        """What `kv_client(unsafe=)` takes for the client canary `name`; None for None."""
        if name:
            raise Unsupported(f"the {self.name} system has no client canary {name!r}")
        return None
