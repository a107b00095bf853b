"""The store's local cluster with a fault-injecting proxy on every peer link: a partition on one machine.

What it does: `LocalCluster` is the system's cluster of node processes on loopback
(system/kv/local_cluster.py: start, kill, pause, restart, Status, waits with deadlines)
plus, with `proxy_peer_links=True`, one pair of TCP proxies (`tcp_proxy`) per directed
peer link, so node i reaches node j through its own proxy (i, j) and a test or the local
platform can cut, slow or heal any directed link. The harness builds on the system here,
never the reverse: the system's `python -m system.kv cluster` and the trainer's runs use
the plain cluster.

What it must never do: leave a proxy behind; `close()` closes them after the nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from nemesis.platforms.source_proxy import SourceAwareProxy
from nemesis.platforms.tcp_proxy import ProxyMode, TcpProxy
from nemesis.systems.base import NodeSetup, System
from system.kv import local_cluster
from system.kv.local_cluster import REPO_ROOT, ClusterTimeout, NodeSpec

__all__ = ["REPO_ROOT", "ClusterTimeout", "LinkProxy", "LocalCluster", "NodeSpec"]


class LinkProxy:
    """The proxies of one directed link src -> dst: its gRPC connections (client-port
    traffic: gRPC peer lanes, forwarded requests) and its TCP peer lanes, switched as one."""

    def __init__(self, address: str, peer_address: str) -> None:
        self.grpc = TcpProxy(address)
        self.raft = TcpProxy(peer_address) if peer_address else None

    @property
    def proxies(self) -> list[TcpProxy]:
        return [self.grpc] + ([self.raft] if self.raft is not None else [])

    @property
    def address(self) -> str:
        return self.grpc.address

    def set_mode(self, mode: ProxyMode) -> None:
        for proxy in self.proxies:
            proxy.set_mode(mode)

    def set_loss(self, probability: float) -> None:
        for proxy in self.proxies:
            proxy.set_loss(probability)

    def hold(self) -> None:
        for proxy in self.proxies:
            proxy.hold()

    def release(self) -> int:
        return sum(proxy.release() for proxy in self.proxies)

    def overtake(self) -> int:
        return sum(proxy.overtake() for proxy in self.proxies)

    def held_bytes(self) -> int:
        return sum(proxy.held_bytes() for proxy in self.proxies)

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


class SourceLinks:
    """The links of a system whose members each advertise one peer address
    (`System.one_peer_address`, etcd): one `SourceAwareProxy` per destination node, in
    front of its peer port, told apart by the sending member's process.

    A cut of src -> dst cuts both src's connections to dst and dst's to src: etcd sends
    a member's messages to a peer on streams the *peer* dials (a stream reader) as well as
    on connections the sender dials (pipelines, snapshots), so no choice of connections
    cuts one direction of messages only. A directed cut is therefore a cut of the pair
    (stronger than asked, never weaker); the pair is whole again once neither direction is
    cut. Loss likewise applies to the pair."""

    def __init__(self, specs: Mapping[str, NodeSpec], members) -> None:  # noqa: ANN001
        self.proxies = {n: SourceAwareProxy(spec.peer_address, members)
                        for n, spec in specs.items()}
        self._cut: set[tuple[str, str]] = set()
        self._loss: dict[tuple[str, str], float] = {}

    def _apply(self, a: str, b: str) -> None:
        cut = (a, b) in self._cut or (b, a) in self._cut
        loss = max(self._loss.get((a, b), 0.0), self._loss.get((b, a), 0.0))
        for dst, src in ((b, a), (a, b)):
            self.proxies[dst].set_loss(src, loss)
            self.proxies[dst].set_mode(src, ProxyMode.CUT if cut else ProxyMode.FORWARD)

    def link(self, src: str, dst: str) -> SourceLink:
        return SourceLink(self, src, dst)

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


class SourceLink:
    """The directed link src -> dst of `SourceLinks`, with LinkProxy's surface."""

    def __init__(self, links: SourceLinks, src: str, dst: str) -> None:
        self.links, self.src, self.dst = links, src, dst

    @property
    def address(self) -> str:
        return self.links.proxies[self.dst].address

    def set_mode(self, mode: ProxyMode) -> None:
        if mode is ProxyMode.CUT:
            self.links._cut.add((self.src, self.dst))
        else:
            self.links._cut.discard((self.src, self.dst))
        self.links._apply(self.src, self.dst)

    def set_loss(self, probability: float) -> None:
        self.links._loss[(self.src, self.dst)] = probability
        self.links._apply(self.src, self.dst)

    def close(self) -> None:
        """The proxies are the SourceLinks' (closed once, by the cluster)."""


class LocalCluster(local_cluster.LocalCluster):
    """N node processes on loopback (see system/kv/local_cluster.py); with
    `proxy_peer_links=True`, every directed peer link through its own `LinkProxy`. With
    `system`, each node's command line is that system's (`System.node_command`), given
    the addresses, directories and certificates this cluster chose; without, the store's
    own (the base class's)."""

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
        proxy_peer_links: bool = False,
        tcp_peers: bool = True,
        tls_dir: Path | None = None,
        system: System | None = None,
    ) -> None:
        self.system = system
        super().__init__(nodes, base_dir, base_port=base_port, host=host, node_args=node_args,
                         per_node_args=per_node_args, env=env, tcp_peers=tcp_peers,
                         tls_dir=tls_dir)
        # With proxy_peer_links, node i reaches node j through its own proxy (i, j), so a
        # test can cut any directed link: a partition on one machine.
        self.link_proxies: dict[tuple[str, str], LinkProxy | SourceLink] = {}
        self.source_links: SourceLinks | None = None
        if proxy_peer_links and system is not None and system.one_peer_address:
            self.source_links = SourceLinks(self.specs, self.member_pids)
            for src in self.specs:
                for dst in self.specs:
                    if src != dst:
                        self.link_proxies[(src, dst)] = self.source_links.link(src, dst)
        elif proxy_peer_links:
            for src in self.specs:
                for dst, dst_spec in self.specs.items():
                    if src != dst:
                        self.link_proxies[(src, dst)] = LinkProxy(dst_spec.address,
                                                                  dst_spec.peer_address)

    def member_pids(self) -> dict[int, str]:
        """pid -> node id of the running nodes (asked by the source-aware proxies per
        connection: a restarted node has a new pid)."""
        return {proc.pid: node_id for node_id, proc in list(self.processes.items())
                if proc.poll() is None}

    def command(self, node_id: str, extra_args: Sequence[str] = ()) -> list[str]:
        if self.system is None:
            return super().command(node_id, extra_args)
        return self.system.node_command(self.setup(node_id, extra_args))

    def start_node(self, node_id: str, extra_args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None):  # noqa: ANN201 - a Popen
        if self.system is not None:
            env = {**self.system.node_env(self.setup(node_id, extra_args)), **(env or {})}
        return super().start_node(node_id, extra_args, env)

    def setup(self, node_id: str, extra_args: Sequence[str] = ()) -> NodeSetup:
        """What `System.node_command` is told about `node_id`."""
        spec = self.specs[node_id]
        others = [o for o in self.specs if o != node_id]
        return NodeSetup(
            node_id=node_id, listen=spec.address, peer_listen=spec.peer_address,
            peers={o: self.peer_address(node_id, o) for o in others},
            peer_links={o: self.peer_link(node_id, o) for o in others if spec.peer_address},
            data_dir=spec.data_dir, log_file=spec.log_file,
            tls=self.tls_files(node_id) if self.tls_dir is not None else None,
            platform="local",
            extra_args=(*self.node_args, *self.per_node_args.get(node_id, []), *extra_args),
            peer_advertise=(self.source_links.proxies[node_id].address
                            if self.source_links is not None else ""))

    def peer_address(self, src: str, dst: str) -> str:
        proxy = self.link_proxies.get((src, dst))
        if proxy is None or isinstance(proxy, SourceLink):  # (a SourceLink: peer port only)
            return super().peer_address(src, dst)
        return proxy.address

    def peer_link(self, src: str, dst: str) -> str:
        proxy = self.link_proxies.get((src, dst))
        if isinstance(proxy, SourceLink):
            return proxy.address
        if proxy is not None and proxy.raft is not None:
            return proxy.raft.address
        return super().peer_link(src, dst)

    def isolate(self, node_id: str) -> None:
        """Cut every peer link to and from `node_id` (needs proxy_peer_links=True).
        Clients still reach it directly."""
        if not self.link_proxies:
            raise RuntimeError("isolate() needs LocalCluster(..., proxy_peer_links=True)")
        for (src, dst), proxy in self.link_proxies.items():
            if node_id in (src, dst):
                proxy.set_mode(ProxyMode.CUT)

    def heal(self) -> None:
        for proxy in self.link_proxies.values():
            proxy.set_mode(ProxyMode.FORWARD)

    def close(self) -> None:
        """The nodes first (see the base class), then every link's proxies."""
        super().close()
        for proxy in self.link_proxies.values():
            proxy.close()
        if self.source_links is not None:
            self.source_links.close()
