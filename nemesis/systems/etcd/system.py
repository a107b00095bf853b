"""etcd as a `System` (nemesis/systems/base.py): `python -m nemesis run --system etcd`.

The pieces beside this module do the work — node.py (command line, data files, version),
client.py (the kv workload's client; it raises system/kv/client.py's exception types, so
the store's outcome mapping `StoreKvClient` is reused unchanged), members.py (membership
and status). What this module adds is the bookkeeping etcd's membership needs:

- etcd names a member by the peer URL it advertises (member ids are derived from those
  URLs), so every member must be listed with the same URL everywhere. The node's own URL
  is `NodeSetup.peer_advertise` (the platform's source-aware proxy on the local
  platform, its container address on docker) and the others' are `peer_links`.
- A member added at run time (the member fault, a refused data directory's rejoin) is
  started with `--initial-cluster-state existing` and an `--initial-cluster` listing the
  members as etcd has them at the time of the add: `change_membership("add")` reads
  them and the node's next `node_command` uses them. A member later restarted on its own
  data ignores both flags (etcd reads its WAL instead).
- A learner that has not started yet has no name in etcd's member list, only its peer
  URL: `membership()` maps that URL back to the node id.
- etcd's refusal of damaged data is exit code 1 with a fatal log line, the same exit
  code as any other fatal error: `refuses_data` reads the line (DATA_REFUSALS). A WAL
  cut short is different: etcd 3.4 repairs a torn tail at start (the entries in it are
  gone) and runs, and raft panics (exit 2) once the leader's commit index is past its
  log ("Was the raft log corrupted, truncated, or lost?"): that is a refusal of its data
  too, with the same remedy (remove, wipe, add back). The node runs with
  GOTRACEBACK=none so that the panic's message, not a goroutine trace, is its last line.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from nemesis.systems.base import (
    DataLayout,
    NodeSetup,
    NodeStatus,
    System,
    Unsupported,
)
from nemesis.systems.etcd import node

if TYPE_CHECKING:
    from system.kv.tls import TlsFiles

# Words of etcd 3.4's fatal log lines when it will not run on its data directory: a
# damaged WAL or snapshot (walpb/wal/snap "crc mismatch", a record it cannot decode, a
# snapshot the WAL names but that is missing or unreadable), or a data directory whose
# WAL is gone while the cluster remembers the member ("has already been bootstrapped").
DATA_REFUSALS = (
    "crc mismatch",
    "failed to read WAL",
    "failed to open WAL",
    "failed to find database snapshot file",
    "failed to recover v3 backend",
    "failed to load snapshot",
    "failed to unmarshal",
    "has already been bootstrapped",
    "walpb:",
    "wal: ",
    "snap: ",
    "proto: Record",  # a WAL record that no longer decodes (a flipped bit in its framing)
    "unexpected EOF",
)
# raft's panic when the leader's commit index is past the member's log (exit code 2).
LOG_LOST = "Was the raft log corrupted, truncated, or lost?"


class EtcdSystem(System):
    name = "etcd"
    one_peer_address = True  # member ids derive from the advertised peer URLs
    refuses_data_exit_codes = (1, 2)  # with a line of DATA_REFUSALS / LOG_LOST

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[int, str] = {}  # etcd member id -> name, for status
        self._peer_urls: dict[str, str] = {}  # node id -> the peer URL it advertises
        self._joining: dict[str, dict[str, str]] = {}  # node id -> initial cluster (existing)
        self._tls = False

    def version(self) -> str:
        return node.version()

    def refuses_data(self, exit_code: int, reason: str) -> bool:
        if exit_code == 1:
            return any(words in reason for words in DATA_REFUSALS)
        return exit_code == 2 and LOG_LOST in reason

    # ----- running a node ------------------------------------------------------------

    def node_command(self, setup: NodeSetup) -> list[str]:
        binary = node.require_installed() if setup.platform == "local" else "etcd"
        advertise = setup.peer_advertise or setup.peer_listen
        with self._lock:
            joining = self._joining.get(setup.node_id)
            self._peer_urls[setup.node_id] = (
                f"{'https' if setup.tls is not None else 'http'}://{advertise}")
        cluster = joining if joining is not None else {setup.node_id: advertise,
                                                       **setup.peer_links}
        member = node.EtcdMember(setup.node_id, setup.data_dir, setup.listen, advertise,
                                 cluster, new=joining is None, tls=setup.tls,
                                 listen_peer=setup.peer_listen)
        # etcd's strict reconfiguration check refuses every member add unless the leader
        # has been connected to every voter for 5 s: with one voter down (killed, or a
        # second node that refused its data) the harness could never add a node back.
        # Raft's one-at-a-time changes stay safe without it; it guards availability only.
        return member.command(binary, ["--strict-reconfig-check=false", *setup.extra_args])

    def node_env(self, setup: NodeSetup) -> dict[str, str]:
        # A Go panic prints its message and no goroutine traces: the message is the last
        # line the platform reads (`refuses_data`); etcd's own log line of it keeps the stack.
        return {"GOTRACEBACK": "none"}

    def file_fault_args(self, snapshot_every: int, node_args: Sequence[str]) -> list[str]:
        if "--snapshot-count" in node_args:
            return []
        return ["--snapshot-count", str(snapshot_every)]

    def data_layout(self) -> DataLayout:
        return DataLayout(wal=(node.WAL_DIR, node.WAL_SUFFIX),
                          snapshots=(node.SNAP_DIR, node.SNAP_SUFFIX))

    # ----- asking a node -------------------------------------------------------------

    def status(self, address: str, *, timeout_s: float,
               tls: TlsFiles | None) -> NodeStatus | None:
        from nemesis.systems.etcd import members

        try:
            return members.status(address, timeout_s=timeout_s, tls=tls, names=self._names)
        except Exception:  # noqa: BLE001 - must never raise for a node that cannot answer
            return None

    # ----- membership ----------------------------------------------------------------

    def supports_membership(self) -> bool:
        return True

    def _url(self, node_id: str, peer_address: str = "", tls: TlsFiles | None = None) -> str:
        with self._lock:
            known = self._peer_urls.get(node_id)
        if known:
            return known
        return f"{'https' if tls is not None else 'http'}://{peer_address}"

    def change_membership(self, addresses: Sequence[str], action: str, node_id: str,
                          address: str, *, peer_address: str, timeout_s: float,
                          tls: TlsFiles | None) -> None:
        from nemesis.systems.etcd import members

        url = self._url(node_id, peer_address, tls)
        if action == "add":
            found = members.find_member(members.member_list(addresses, timeout_s=timeout_s,
                                                            tls=tls), url)
            if found is None:  # (an earlier add that timed out may have committed)
                members.add_learner(addresses, url, timeout_s=timeout_s, tls=tls)
            listed = members.member_list(addresses, timeout_s=timeout_s, tls=tls)
            cluster: dict[str, str] = {}
            for m in listed:
                if url in m.peer_urls:
                    cluster[node_id] = _host_port(url)
                elif m.name:
                    cluster[m.name] = _host_port(m.peer_urls[0])
            with self._lock:
                self._joining[node_id] = cluster
        elif action == "promote":
            members.promote(addresses, url, timeout_s=timeout_s, tls=tls)
        elif action == "remove":
            members.remove(addresses, url, timeout_s=timeout_s, tls=tls)
        else:
            raise Unsupported(f"the etcd system has no membership action {action!r}")

    def membership(self, addresses: Sequence[str], *, timeout_s: float,
                   tls: TlsFiles | None) -> tuple[set[str], set[str]]:
        from nemesis.systems.etcd import members

        with self._lock:
            by_url = {url: n for n, url in self._peer_urls.items()}
        voters, learners = set(), set()
        for m in members.member_list(addresses, timeout_s=timeout_s, tls=tls):
            name = m.name or next((by_url[u] for u in m.peer_urls if u in by_url),
                                  m.peer_urls[0] if m.peer_urls else m.hex_id)
            (learners if m.is_learner else voters).add(name)
        return voters, learners

    # ----- clients -------------------------------------------------------------------

    def kv_client(self, addresses: Mapping[str, str], *, timeout_s: float, client_id: str,
                  tls: TlsFiles | None, unsafe: object = None):  # noqa: ANN201 - StoreKvClient
        from nemesis.systems.etcd.client import EtcdClient
        from nemesis.systems.store import StoreKvClient

        if unsafe is not None:
            raise Unsupported("the etcd system has no client canaries")
        # EtcdClient raises system/kv/client.py's types: the store's mapping applies as is.
        return StoreKvClient(EtcdClient(dict(addresses), timeout_s=timeout_s,
                                        client_id=client_id, tls=tls))


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1]
