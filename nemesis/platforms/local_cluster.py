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

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


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
        self.link_proxies: dict[tuple[str, str], LinkProxy] = {}
        if proxy_peer_links:
            for src in self.specs:
                for dst, dst_spec in self.specs.items():
                    if src != dst:
                        self.link_proxies[(src, dst)] = LinkProxy(dst_spec.address,
                                                                  dst_spec.peer_address)

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
            extra_args=(*self.node_args, *self.per_node_args.get(node_id, []), *extra_args))

    def peer_address(self, src: str, dst: str) -> str:
        proxy = self.link_proxies.get((src, dst))
        return proxy.address if proxy is not None else super().peer_address(src, dst)

    def peer_link(self, src: str, dst: str) -> str:
        proxy = self.link_proxies.get((src, dst))
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
