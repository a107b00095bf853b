"""The one interface every platform implements: where the store's nodes run and how to hurt them.

A platform owns a cluster of nodes of a system under test (`nemesis/systems/`: what to run,
how to ask a node its status, its membership operations) for the length of a run.
The harness asks it to start, stop, kill, pause, resume and restart nodes, to cut and heal
directed links between nodes, to add and remove packet loss on links, and to hand over each
node's log. Clients (the workload, the final read) reach the nodes only through
`client_addresses`, which are always on 127.0.0.1 of the machine running the harness.

Link vocabulary (Jepsen's "grudge"): `cut(src, dst)` makes the network drop what `src`
sends to `dst`; the reverse direction is untouched unless cut too. Client traffic is never
cut: a partition separates nodes from each other, not from the harness.

What a platform must never do: leave a process, container, network, volume or rule behind
after `close()` — which must be safe to call twice, from a signal handler's cleanup path, and
after a failed `start()`.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nemesis.systems.base import NodeStatus, System

if TYPE_CHECKING:
    from nemesis.tls_run import RunTls
    from system.kv.tls import TlsFiles


def _default_system() -> System:
    from nemesis.systems.store import StoreSystem

    return StoreSystem()


def last_line(text: str, limit: int = 300) -> str:
    """The last non-blank line of what a process printed, cut to `limit` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def exit_line(text: str, limit: int = 300) -> str:
    """Why a node exited, from what it printed last: a plain line as it is (a refusal to
    start), or for the node's JSON log line its message and the last line of its exception
    (`fatal error in the Raft drive loop; ...: ValueError: ...`), not 300 characters of
    JSON and traceback."""
    line = last_line(text, limit=10**6)
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("msg"), str):
        cause = last_line(str(record.get("exception") or ""), limit=10**6)
        line = record["msg"] + (f": {cause}" if cause else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


NO_FILE_FAULTS = ("the {platform} platform cannot damage a node's files (truncate, bitflip, "
                  "wipe-wal run on --platform local and docker)")


class PlatformError(RuntimeError):
    """A platform cannot do what was asked; the message says what and what to do about it."""


class PlatformUnavailable(PlatformError):
    """The platform cannot run on this machine at all (no Docker engine, no image...)."""


@dataclass(frozen=True)
class ClusterConfig:
    """What the harness asks of a platform.

    `run_id` names everything the platform creates (labels, names), so `python -m nemesis
    clean` can find what a crashed run left. `work_dir` is the run's folder: node logs are
    copied under `work_dir/nodes/` by `collect_logs`. `node_args` go to every `serve`
    (e.g. `--unsafe no-dedup`); `env` is added to every node's environment (e.g.
    MAO_ALLOW_UNSAFE=1). `lazy_disk` puts every node's data directory on a layer that
    holds writes until fsync (the `lose-unsynced` fault needs it: `power_loss`). `tls`
    (`--tls`): the run's certificate directory, which the platform fills before a node
    starts (it knows where they are reached) and every node, probe, client and membership
    step then uses. `system`: what runs on the nodes (default: our store).
    """

    nodes: int
    run_id: str
    work_dir: Path
    node_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    lazy_disk: bool = False
    tls: RunTls | None = None
    system: System = field(default_factory=_default_system)


class Platform(abc.ABC):
    """Base of `LocalPlatform` and `DockerPlatform`. Node ids are n1..nN."""

    name: str = ""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.node_ids: list[str] = [f"n{i}" for i in range(1, config.nodes + 1)]

    @property
    def system(self) -> System:
        return self.config.system

    # ----- lifecycle -------------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Create whatever the cluster needs and start every node. Does not wait for a leader."""

    @abc.abstractmethod
    def close(self) -> None:
        """Tear everything down: nodes, proxies/rules, containers, networks, volumes. Idempotent."""

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- nodes -----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def client_addresses(self) -> dict[str, str]:
        """node id -> 127.0.0.1:PORT where clients reach it (stable across restarts)."""

    @abc.abstractmethod
    def start_node(self, node_id: str) -> None:
        """Start a node that is not running, on its existing data (kept across restarts)."""

    @abc.abstractmethod
    def stop_node(self, node_id: str) -> None:
        """Graceful stop (SIGTERM), waiting (bounded) for the process to exit."""

    @abc.abstractmethod
    def kill(self, node_id: str) -> None:
        """SIGKILL the node; its data survives for a restart."""

    @abc.abstractmethod
    def pause(self, node_id: str) -> None:
        """Freeze the node (SIGSTOP / cgroup freezer): it holds its sockets but does nothing."""

    @abc.abstractmethod
    def resume(self, node_id: str) -> None:
        """Undo `pause`; does nothing to a node that is not paused."""

    def restart(self, node_id: str) -> None:
        """Kill if running, then start again on the same data."""
        if self.is_running(node_id):
            self.kill(node_id)
        self.start_node(node_id)

    @abc.abstractmethod
    def wipe(self, node_id: str) -> None:
        """Delete the data directory of a node that is not running (its disk is lost; its
        log survives for the report). The next `start_node` starts it on an empty
        directory with its usual command line: a new incarnation, which may vote only
        once the cluster took it back through a membership change (docs/kv.md)."""

    def supports_power_loss(self) -> bool:
        """Whether `power_loss` can drop unsynced writes here (the cluster runs with
        `lazy_disk`, or the platform's disks are simulated)."""
        return False

    def slow_disk(self, node_id: str, low_ms: float, high_ms: float) -> None:
        """Make each fsync of `node_id` wait a random [low_ms, high_ms] first (0, 0: as
        before); kept across its restarts until changed."""
        raise PlatformError(f"the {self.name} platform cannot slow a disk (run with "
                            f"slow-disk in --faults to put nodes on a lazy disk)")

    def power_loss(self, node_ids: list[str]) -> None:
        """Crash `node_ids` at once (SIGKILL) and lose every write of theirs that was not
        fsynced, as a power cut would; they stay stopped until `start_node`."""
        raise PlatformError(f"the {self.name} platform cannot lose unsynced writes "
                            f"(run with lose-unsynced in --faults to put nodes on a lazy disk)")

    def kill_nodes(self, node_ids: list[str]) -> None:
        """SIGKILL several nodes as close to at once as the platform can (`kill-all`)."""
        for node_id in node_ids:
            self.kill(node_id)

    def wait_started(self, node_id: str, timeout_s: float) -> int | None:
        """After `start_node`: None once the node answers Status, or its exit code if it
        exits first (3: it refused its data, docs/kv.md). Raises PlatformError when it does
        neither within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.exit_code(node_id)
            if code is not None:
                return code
            if self.status(node_id, timeout_s=0.5) is not None:
                return None
            if time.monotonic() >= deadline:
                raise PlatformError(f"{node_id} neither answered nor exited within "
                                    f"{timeout_s:g} s of its start: {self.describe()}")
            time.sleep(0.1)

    # ----- file faults (nemesis/platforms/disk_damage.py) ------------------------------

    def supports_file_faults(self) -> bool:
        """Whether `data_files` and `damage_files` work here (the truncate, bitflip and
        wipe-wal faults)."""
        return False

    def data_files(self, node_ids: list[str]) -> dict[str, dict[str, int]]:
        """For stopped nodes: node -> {file: size in bytes} of its WAL segments and snapshot
        files, named relative to its data directory ("wal/0000000000000001.wal")."""
        raise PlatformError(NO_FILE_FAULTS.format(platform=self.name))

    def damage_files(self, damages: dict[str, list[dict]]) -> dict[str, list[dict]]:
        """Damage stopped nodes' files, node -> damages as `disk_damage` describes them
        (truncate, flip, remove-wal), all in one go where the platform can; returns, per
        node, each damage with the file's size before and after."""
        raise PlatformError(NO_FILE_FAULTS.format(platform=self.name))

    def save_data(self, node_id: str) -> None:
        """Keep a copy of a stopped node's whole data directory (one per node; a later
        save replaces it): the backup `restore_data` brings back (the `rollback` fault)."""
        raise PlatformError(f"the {self.name} platform cannot copy a node's data directory")

    def restore_data(self, node_id: str) -> None:
        """Replace a stopped node's data directory with the copy `save_data` kept: its own
        data, older but consistent (a VM restored from a backup)."""
        raise PlatformError(f"the {self.name} platform cannot copy a node's data directory")

    @abc.abstractmethod
    def member_address(self, node_id: str) -> str:
        """HOST:PORT to name in `member add` for this node: where its peers reach it.
        (Peers that route to it through a proxy keep doing so: --peers wins.)"""

    def member_peer_address(self, node_id: str) -> str:
        """HOST:PORT of this node's peer port as the other nodes reach it ("" when the
        platform has none): what a system that registers peer URLs in its membership
        (etcd) names in `member add`."""
        return ""

    @abc.abstractmethod
    def is_running(self, node_id: str) -> bool:
        """The node's process/container exists and has not exited (paused counts as running)."""

    @abc.abstractmethod
    def exit_code(self, node_id: str) -> int | None:
        """The exit code of a node that has exited, else None."""

    def exit_reason(self, node_id: str) -> str:
        """The last line an exited node printed (its refusal to start, say), or ''."""
        return ""

    # ----- TLS (--tls) ---------------------------------------------------------------

    @property
    def client_tls(self) -> TlsFiles | None:
        """The workload's certificate (role client), once `start()` made it; None
        without TLS."""
        return self.config.tls.client if self.config.tls is not None else None

    @property
    def admin_tls(self) -> TlsFiles | None:
        """The certificate membership changes need (role admin); None without TLS."""
        return self.config.tls.admin if self.config.tls is not None else None

    # ----- membership ----------------------------------------------------------------

    def supports_membership(self) -> bool:
        """Whether `change_membership` works here (the member fault, and the rejoin of a
        node that refused its data): the system's say."""
        return self.system.supports_membership()

    def change_membership(self, action: str, node_id: str, *, timeout_s: float = 30.0) -> None:
        """`member add|promote|remove` of `node_id`, through any node that answers; returns
        once committed. Raises what the system's `change_membership` raises."""
        adding = action == "add"
        self.system.change_membership(
            list(self.client_addresses.values()), action, node_id,
            self.member_address(node_id) if adding else "",
            peer_address=self.member_peer_address(node_id) if adding else "",
            timeout_s=timeout_s, tls=self.admin_tls)

    # Whether `change_membership_at` returns only once the change commits (real nodes), or
    # once appended (the simulator, whose time stands still during the call).
    changes_wait = True

    def change_membership_at(self, node: str, action: str, node_id: str, *,
                             timeout_s: float = 10.0) -> None:
        """One attempt of `member promote|remove` of `node_id` at `node` (no retry, no
        redirection to another leader); returns once committed, raises otherwise."""
        self.system.change_membership_once(self.client_addresses[node], action, node_id,
                                           timeout_s=timeout_s, tls=self.admin_tls)

    def membership(self, *, timeout_s: float = 10.0) -> tuple[set[str], set[str]]:
        """(voters, learners) in effect on the leader. Raises when no leader answers in
        time."""
        return self.system.membership(list(self.client_addresses.values()),
                                      timeout_s=timeout_s, tls=self.client_tls)

    # ----- network -------------------------------------------------------------------

    @abc.abstractmethod
    def cut(self, src: str, dst: str) -> None:
        """Drop what `src` sends to `dst` (one direction)."""

    @abc.abstractmethod
    def heal_link(self, src: str, dst: str) -> None:
        """Undo `cut(src, dst)` and any loss on that link."""

    def heal_all(self) -> None:
        """Every link forwards again, without loss."""
        for src in self.node_ids:
            for dst in self.node_ids:
                if src != dst:
                    self.heal_link(src, dst)

    def cut_links(self, links: Iterable[tuple[str, str]]) -> None:
        for src, dst in links:
            self.cut(src, dst)

    def heal_links(self, links: Iterable[tuple[str, str]]) -> None:
        """`heal_link` of each; a platform whose every change is a round trip (ssh) heals
        them all in one round."""
        for src, dst in links:
            self.heal_link(src, dst)

    @abc.abstractmethod
    def set_loss(self, src: str, dst: str, probability: float) -> None:
        """Lose a share of what `src` sends to `dst` (0 < probability < 1)."""

    def supports_delay(self) -> bool:
        """Whether the platform can add latency to links (no: tc netem is absent here)."""
        return False

    # ----- observing -----------------------------------------------------------------

    def status(self, node_id: str, timeout_s: float = 0.5) -> NodeStatus | None:
        """The node's status as the system reports it (`System.status`) through its client
        address, or None if it does not answer."""
        address = self.client_addresses.get(node_id)
        if address is None:
            return None
        return self.system.status(address, timeout_s=timeout_s, tls=self.client_tls)

    @abc.abstractmethod
    def collect_logs(self) -> dict[str, Path]:
        """Copy every node's log (and what it printed) under `work_dir/nodes/`; return the
        files written, by name. Safe to call after nodes died, and more than once."""

    def describe(self) -> str:
        """One line: each node's role, term, leader and applied index, or why it is silent."""
        parts = []
        for node_id in self.node_ids:
            st = self.status(node_id, timeout_s=0.3)
            if st is None:
                code = self.exit_code(node_id)
                if code is None:
                    parts.append(f"{node_id}=silent")
                else:
                    reason = self.exit_reason(node_id)
                    parts.append(f"{node_id}=exited({code})" + (f" [{reason}]" if reason else ""))
            else:
                parts.append(f"{node_id}={st.role}/t{st.term}/leader={st.leader_id or '-'}"
                             f"/applied={st.applied_index}")
        return ", ".join(parts)

    def ready(self) -> str | None:
        """The leader, once every node answers and none withholds its vote — a fresh node
        may vote only after the others have confirmed its identity (docs/kv.md, "Identity
        and rejoining"); a fault before that can leave a cluster with no electable majority,
        which would say nothing about the store under test. None until then."""
        statuses = {n: self.status(n, timeout_s=0.5) for n in self.node_ids}
        if any(st is None or st.vote_withheld for st in statuses.values()):
            return None
        return _leader_of(statuses)

    def leader(self) -> str | None:
        """A node that says it leads (of several — a deposed one in a minority — the one
        with the highest term); None when no answering node leads."""
        return _leader_of({n: self.status(n, timeout_s=0.3) for n in self.node_ids})


def _leader_of(statuses: dict[str, NodeStatus | None]) -> str | None:
    leaders = [n for n, st in statuses.items() if st is not None and st.role == "leader"]
    if not leaders:
        return None
    # Several self-declared leaders (a deposed one in a minority): take the highest term.
    return max(leaders, key=lambda n: statuses[n].term)  # type: ignore[union-attr]
