"""Our store (system/kv) as a `System`: the one place in nemesis/ that names it.

A node is `python -m system.kv serve` with a client port, a TCP peer port (`--peer-listen`,
`--peer-links`), its data directory and JSON-lines log; with --tls, its certificate on both
ports and client certificates required. Status, membership and the kv client are the
store's own gRPC API (system/kv/status_probe.py, member_client.py, client.py); the client's
typed errors map onto the harness's outcomes below. The trainer workload also needs this
system (it keeps its state in the store): it asks `kv_client_class` for the raw client.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from nemesis.store import source_version
from nemesis.systems.base import (
    DataLayout,
    Fail,
    KvResult,
    NodeSetup,
    NodeStatus,
    System,
    Unknown,
    VersionMismatch,
)

if TYPE_CHECKING:
    from system.kv.tls import TlsFiles


class StoreSystem(System):
    name = "store"
    simulated = True
    status_windows = True
    idempotent_request_ids = True
    # 3: the node refused its data directory (docs/kv.md, "Identity and rejoining").
    refuses_data_exit_codes = (3,)

    def __init__(self) -> None:
        self._probes: dict[object, object] = {}
        self._member_channels: dict[str, object] = {}
        self._lock = threading.Lock()

    def version(self) -> str:
        return source_version()  # the store is this repository: its commit

    # ----- running a node ------------------------------------------------------------

    def node_command(self, setup: NodeSetup) -> list[str]:
        from nemesis.tls_run import node_flags

        python = sys.executable if setup.platform == "local" else "python3"
        peers = ",".join(f"{o}={a}" for o, a in setup.peers.items())
        tcp: list[str] = []
        if setup.peer_listen:
            links = ",".join(f"{o}={a}" for o, a in setup.peer_links.items())
            tcp = ["--peer-listen", setup.peer_listen] + (["--peer-links", links] if links else [])
        return [python, "-m", "system.kv", "serve", "--id", setup.node_id,
                "--listen", setup.listen, "--peers", peers, *tcp,
                "--data-dir", str(setup.data_dir), "--log-file", str(setup.log_file),
                *(node_flags(setup.tls) if setup.tls is not None else []), *setup.extra_args]

    def file_fault_args(self, snapshot_every: int, node_args: Sequence[str]) -> list[str]:
        if "--snapshot-entries" in node_args:
            return []
        return ["--snapshot-entries", str(snapshot_every)]

    def data_layout(self) -> DataLayout:
        return DataLayout(wal=("wal", ".wal"), snapshots=("snapshots", ".snap"))

    # ----- asking a node -------------------------------------------------------------

    def _probe(self, tls: TlsFiles | None):  # noqa: ANN202 - a StatusProbe
        from system.kv.status_probe import StatusProbe

        key = None if tls is None else (str(tls.cert), str(tls.key), str(tls.ca))
        with self._lock:
            probe = self._probes.get(key)
            if probe is None:
                probe = self._probes[key] = StatusProbe(tls=tls)
            return probe

    def status(self, address: str, *, timeout_s: float,
               tls: TlsFiles | None) -> NodeStatus | None:
        # The StatusResponse itself: windows.py reads its Raft fields beyond NodeStatus.
        return self._probe(tls).status(address, timeout_s)

    def close(self) -> None:
        with self._lock:
            probes, self._probes = list(self._probes.values()), {}
            channels, self._member_channels = list(self._member_channels.values()), {}
        for probe in probes:
            probe.close()
        for channel in channels:
            channel.close()

    # ----- membership ----------------------------------------------------------------

    def supports_membership(self) -> bool:
        return True

    def change_membership(self, addresses: Sequence[str], action: str, node_id: str,
                          address: str, *, peer_address: str, timeout_s: float,
                          tls: TlsFiles | None) -> None:
        from system.kv import member_client

        # The store names a member by its client address; peers keep their --peer-links.

        member_client.change(list(addresses), action, node_id, address,
                             timeout_s=timeout_s, tls=tls)

    single_membership_changes = True

    def change_membership_once(self, address: str, action: str, node_id: str, *,
                               timeout_s: float, tls: TlsFiles | None) -> None:
        from system.kv import member_client

        # One channel per member for the run: the member fault asks every node again and
        # again for a change until a new leader takes it, within milliseconds of its
        # election, and a connection per call would cost more than that.
        with self._lock:
            channel = self._member_channels.get(address)
            if channel is None:
                channel = self._member_channels[address] = member_client.member_channel(address, tls)
        member_client.change_once(address, action, node_id, timeout_s=timeout_s, tls=tls,
                                  channel=channel)

    def membership(self, addresses: Sequence[str], *, timeout_s: float,
                   tls: TlsFiles | None) -> tuple[set[str], set[str]]:
        from system.kv import member_client

        st = member_client.status_with_leader(list(addresses), timeout_s=timeout_s,
                                              leader_only=True, tls=tls)
        return set(st.voters), set(st.learners)

    # ----- clients -------------------------------------------------------------------

    def kv_client(self, addresses: Mapping[str, str], *, timeout_s: float, client_id: str,
                  tls: TlsFiles | None, unsafe: object = None) -> StoreKvClient:
        from system.kv.client import KVClient

        return StoreKvClient(KVClient(dict(addresses), timeout_s=timeout_s,
                                      client_id=client_id, unsafe=unsafe, tls=tls))

    @staticmethod
    def kv_client_class():  # noqa: ANN205 - system.kv.client.KVClient
        """The store's own client, for the trainer workload (it needs the store itself)."""
        from system.kv.client import KVClient

        return KVClient

    # ----- canaries --------------------------------------------------------------------

    def canaries(self) -> tuple[str, ...]:
        from system.kv.unsafe import CANARIES

        return tuple(CANARIES)

    def client_canaries(self) -> tuple[str, ...]:
        from system.kv.unsafe import CLIENT_CANARIES

        return tuple(CLIENT_CANARIES)

    def unsafe_allow_env(self) -> str:
        from system.kv.unsafe import ALLOW_ENV_VAR

        return ALLOW_ENV_VAR

    def client_canary(self, name: str | None, environ: dict[str, str] | None = None) -> object:
        """The client-library canary `name` (None: the safe client); UnsafeRefused unless
        allowed (system/kv/unsafe.py)."""
        from system.kv.unsafe import client_canary

        return client_canary(name, environ)


class StoreKvClient:
    """The store's KVClient with its typed errors mapped onto the harness's outcomes:
    Unavailable and InvalidArgument are `Fail` (the store guarantees nothing was applied),
    Indeterminate is `Unknown`, CasMismatch is `VersionMismatch`, NotFound a version-0 read."""

    def __init__(self, client) -> None:  # noqa: ANN001 - system.kv.client.KVClient
        self.client = client

    @property
    def node_addresses(self) -> Mapping[str, str]:
        return self.client.node_addresses

    def new_request_id(self) -> str:
        return self.client.new_request_id()

    def close(self) -> None:
        self.client.close()

    def get(self, key: str, *, consistency: str = "linearizable",
            via: str | None = None) -> KvResult:
        from system.kv.client import Indeterminate, InvalidArgument, NotFound, Unavailable

        try:
            r = self.client.get(key, consistency=consistency, via=via)
        except NotFound as exc:
            return KvResult(version=0, node=exc.node_id or None, applied_index=exc.applied_index)
        except (Unavailable, Indeterminate, InvalidArgument) as exc:
            raise Fail(str(exc)) from exc
        return KvResult(version=r.version, value=r.value, node=r.node_id,
                        applied_index=r.applied_index)

    def put(self, key: str, value: bytes, *, expected_version: int | None = None,
            request_id: str | None = None) -> KvResult:
        return self._write(self.client.put, key, value, expected_version=expected_version,
                           request_id=request_id)

    def delete(self, key: str, *, expected_version: int | None = None,
               request_id: str | None = None) -> KvResult:
        return self._write(self.client.delete, key, expected_version=expected_version,
                           request_id=request_id)

    @staticmethod
    def _write(call, *args, **kwargs) -> KvResult:  # noqa: ANN001, ANN002, ANN003
        from system.kv.client import (
            CasMismatch,
            Indeterminate,
            InvalidArgument,
            Unavailable,
        )

        try:
            w = call(*args, **kwargs)
        except CasMismatch as exc:  # (a delete's DeleteVersionMismatch too)
            raise VersionMismatch(exc.current_version, exc.node_id or None) from exc
        except (Unavailable, InvalidArgument) as exc:
            raise Fail(str(exc)) from exc
        except Indeterminate as exc:
            raise Unknown(str(exc)) from exc
        return KvResult(version=w.version, node=w.node_id, term=w.term,
                        applied_index=w.applied_index)
