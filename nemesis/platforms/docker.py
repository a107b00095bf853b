"""Docker platform: one container per node on a bridge network the run creates.

What it does:
- talks to the engine `docker.from_env()` names (so DOCKER_HOST works); no engine means
  `PlatformUnavailable` with the reason; `docker_available()` answers in ~2 s for the CLI;
- runs the offline image of `nemesis.platforms.image` (built on first use, then cached);
- gives each node a container `mao-<run>-nX` (`--cap-add NET_ADMIN`, hostname nX) with a
  fixed IP on the run's network `mao-<run>` (a free /24 under 10.213.0.0/16, checked against
  the engine's other networks and the host's routes), so a restarted node keeps its address;
  peers talk to each other on that network only, on port 7000;
- publishes each node's port 7000 on 127.0.0.1 of the host only, on a port chosen free at
  creation and kept for the container's life (`client_addresses`);
- keeps the node's data and its JSON log on a named volume `mao-<run>-nX` mounted at
  /var/lib/mao (data in data/, log in log/node.log); it survives kill/stop/restart, which
  reuse the same container; what the node prints goes to `docker logs`.
  `collect_logs()` copies both into `work_dir/nodes/nX.log` and `nX.stderr` through the
  engine API (no bind mount, so a remote engine works too);
- faults: kill = SIGKILL (`container.kill()`), stop = SIGTERM then a bounded wait,
  pause/resume = the cgroup freezer (`docker pause`), restart = kill + start of the same
  container on the same volume;
- links: `cut(src, dst)` is a real packet drop in dst's network namespace:
  `iptables -A MAO -s <src ip> -j DROP`, where MAO is a chain of our own jumped to from
  INPUT; `set_loss` is the same rule with `-m statistic --mode random --probability P`.
  Each change rewrites dst's whole MAO chain in one atomic `iptables-restore --noflush`.
  When dst is paused (a paused container cannot `exec`), the same command runs in a
  short-lived helper container that joins dst's network namespace, so cuts and heals take
  effect at once whatever the node's state. Rules live in the namespace, which a restart
  replaces: every start of a node waits (a shell gate before `exec python3`) until the
  platform has installed the current rules of that node, so a node restarted inside a
  partition stays partitioned from its first packet;
- `supports_delay()` is False: tc netem is absent on these machines.
- with `tls` (`run --tls`), `start()` makes the run's certificates once the addresses are
  known — each node's names its id, its container's name, its address on the run's network
  and 127.0.0.1 (where the published port is reached) — and copies each node's key,
  certificate and the CA certificate into its container at TLS_DIR (`put_archive`, before
  the first start: no bind mount, so a remote engine works too; the key 0600, and only that
  node's). Nodes then serve both ports with mutual TLS; the Status probe, the workload and
  the membership steps present the run's client or admin certificate.
- with `lazy_disk`, the container also gets /dev/fuse and CAP_SYS_ADMIN, and its shell
  (pid 1, no longer exec'd away) mounts the lazy layer (`nemesis.lazyfs`) at LAZY_DATA_DIR
  over DATA_DIR on the volume, runs the node on LAZY_DATA_DIR, and when the node exits
  (crash or stop) flushes the layer — a process crash keeps what the page cache holds —
  before exiting with the node's code. `power_loss` SIGKILLs the containers: the layer's
  memory, every write not fsynced, dies with them. `kill` first asks the layer (docker
  exec) to flush and write through, then SIGKILLs, so it stays a process crash.

What it must never do: leave a container, network or volume behind after `close()`
(idempotent, safe after a failed `start()`; it removes by the run's label, so it also
catches what a half-finished call created), publish a node port beyond 127.0.0.1, or
register anything global. `clean()` removes what crashed runs left.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import shlex
import socket
import struct
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nemesis.platforms import disk_damage
from nemesis.platforms.base import (
    ClusterConfig,
    Platform,
    PlatformError,
    PlatformUnavailable,
    exit_line,
    last_line,
)
from nemesis.platforms.image import LABEL_KIND, LABEL_PROJECT, PROJECT, ensure_image
from nemesis.systems.base import NodeSetup, NodeStatus
from system.kv.tls import TlsFiles
from system.ports import free_ports

LABEL_RUN = "mao.run"
LABEL_NODE = "mao.node"
# Which harness made a resource: `clean` without --run leaves a live harness's run alone.
LABEL_OWNER = "mao.owner"  # "<hostname>:<pid>:<process start time in clock ticks>"
NODE_PORT = 7000
PEER_PORT = 7001  # Raft traffic over plain TCP (--peer-listen); never published to the host
VOLUME_MOUNT = "/var/lib/mao"
DATA_DIR = f"{VOLUME_MOUNT}/data"
LOG_FILE = f"{VOLUME_MOUNT}/log/node.log"
READY_DIR = "/run/mao"  # a tmpfs: empty at every start of the container
LAZY_DATA_DIR = "/mnt/mao-data"  # with lazy_disk: the layer's mount over DATA_DIR
LAZY_CONTROL = f"{READY_DIR}/lazyfs.sock"
LAZY_FLUSH = (f"if [ -S {LAZY_CONTROL} ]; then "  # no layer up yet: nothing to flush
              f"python3 -m nemesis.lazyfs flush {LAZY_CONTROL} >/dev/null; fi")
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")
TLS_DIR = "/etc/mao-tls"  # in the container's own filesystem: it lives as long as the container
START_GATE_S = 60  # a node whose rules were not installed by then exits 75
T = TypeVar("T")


def engine(timeout_s: float = 120.0):  # noqa: ANN201 - docker.DockerClient
    """A client of the engine `docker.from_env()` names, checked with a ping."""
    try:
        import docker
        import docker.errors
    except ImportError:
        raise PlatformUnavailable("the docker Python package is missing: run "
                                  "`python3 -m pip install -e .`") from None
    try:
        client = docker.from_env(timeout=5)  # a silent engine fails the ping in seconds
        client.ping()
    except Exception as exc:  # noqa: BLE001 - DockerException, requests errors, OSError
        raise PlatformUnavailable(f"no Docker engine answers at {_engine_address()}: "
                                  f"{_one_line(exc)}") from None
    client.api.timeout = timeout_s  # builds and removals may take longer than a ping
    return client


def _engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _one_line(exc: BaseException) -> str:
    """The engine's own sentence for an API error (`explanation`: "driver failed programming
    external connectivity on endpoint ...: Bind for 127.0.0.1:7001 failed: port is already
    allocated"), not the request URL that str() starts with, which used up the 300
    characters before the reason (seen in a run that exited 3)."""
    explanation = getattr(exc, "explanation", None)
    text = " ".join(str(explanation if explanation else exc).split())
    return text[:500] or type(exc).__name__


def docker_available(timeout_s: float = 2.0) -> tuple[bool, str]:
    """Whether a Docker engine answers (within ~timeout_s), and one sentence saying so."""
    try:
        import docker
    except ImportError:
        return False, "no Docker engine: the docker Python package is not installed"
    client = None
    try:
        client = docker.from_env(timeout=timeout_s)
        version = client.version().get("Version", "?")
        return True, f"Docker engine {version} answers at {_engine_address()}"
    except Exception as exc:  # noqa: BLE001
        return False, f"no Docker engine: {_one_line(exc)}"
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _name_part(run_id: str) -> str:
    """run_id made safe for container/network/volume names."""
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_id).strip("-.") or "run"
    return cleaned[:60]


def _host_routes() -> list[ipaddress.IPv4Network]:
    """Networks the host routes (a subnet of ours must not shadow them); empty if unknown."""
    routes = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8 or fields[1] == "00000000":
                continue
            dest = socket.inet_ntoa(struct.pack("<L", int(fields[1], 16)))
            mask = socket.inet_ntoa(struct.pack("<L", int(fields[7], 16)))
            with contextlib.suppress(ValueError):
                routes.append(ipaddress.ip_network(f"{dest}/{mask}", strict=False))
    return routes


def _process_start(pid: int) -> str:
    """The process's start time (field 22 of /proc/PID/stat), which tells a live process
    from a later one that reused its pid; '' when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname():
        return True  # another machine's harness: we cannot tell, so never touch it
    return pid.isdigit() and bool(started) and _process_start(int(pid)) == started


def _labels(run_id: str | None = None) -> list[str]:
    labels = [f"{LABEL_PROJECT}={PROJECT}"]
    if run_id is not None:
        labels.append(f"{LABEL_RUN}={run_id}")
    return labels


def _labels_of(item) -> dict[str, str]:  # noqa: ANN001 - a container, network or volume
    attrs = getattr(item, "attrs", {}) or {}
    labels = attrs.get("Labels") or (attrs.get("Config") or {}).get("Labels") or {}
    return dict(labels)


def _remove_labelled(client, run_id: str | None) -> list[str]:  # noqa: ANN001
    """Remove containers, then networks, then volumes carrying the project's (and run's)
    labels; return what was removed, e.g. 'container mao-r1-n1'."""
    try:
        return _remove_labelled_once(client, run_id)
    except PlatformError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine went away, a timeout...
        raise PlatformError(f"could not list or remove the run's containers, networks and "
                            f"volumes: {_one_line(exc)} — run `python -m nemesis clean` once "
                            f"the Docker engine answers.") from None


def _remove_labelled_once(client, run_id: str | None) -> list[str]:  # noqa: ANN001
    import docker.errors

    removed: list[str] = []
    problems: list[str] = []
    filters = {"label": _labels(run_id)}
    containers = client.containers.list(all=True, filters=filters)
    networks = client.networks.list(filters=filters)
    volumes = client.volumes.list(filters=filters)
    if run_id is None:
        # Leave alone every run whose harness is still running (a run in another terminal
        # is not a leftover); `--run ID` removes one run whatever its state.
        live = {}
        for item in (*containers, *networks, *volumes):
            labels = _labels_of(item)
            owner = labels.get(LABEL_OWNER, "")
            if owner and _owner_alive(owner):
                live[labels.get(LABEL_RUN, "?")] = owner
        for run, owner in sorted(live.items()):
            print(f"left run {run} alone: its harness ({owner.split(':')[0]} pid "
                  f"{owner.split(':')[1]}) is still running; `python -m nemesis clean --run "
                  f"{run}` removes it anyway", file=sys.stderr)
        containers = [c for c in containers if _labels_of(c).get(LABEL_RUN) not in live]
        networks = [n for n in networks if _labels_of(n).get(LABEL_RUN) not in live]
        volumes = [v for v in volumes if _labels_of(v).get(LABEL_RUN) not in live]
    for container in containers:
        try:
            container.remove(force=True)
            removed.append(f"container {container.name}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            problems.append(f"container {container.name}: {_one_line(exc)}")
    for network in networks:
        try:
            network.remove()
            removed.append(f"network {network.name}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            problems.append(f"network {network.name}: {_one_line(exc)}")
    for volume in volumes:
        try:
            volume.remove(force=True)
            removed.append(f"volume {volume.name}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            problems.append(f"volume {volume.name}: {_one_line(exc)}")
    if problems:
        raise PlatformError("could not remove " + "; ".join(problems)
                            + " — run `python -m nemesis clean` again, or remove them with "
                              "the docker CLI.")
    return removed


def clean(run_id: str | None = None, *, images: bool = False) -> list[str]:
    """Remove every container, network and volume the project labelled (only those of
    `run_id` if given), and with `images=True` the project's images too. Returns what was
    removed. For `python -m nemesis clean [--images]`."""
    client = engine()
    try:
        removed = _remove_labelled(client, run_id)
        if images:
            from nemesis.platforms.image import remove_images

            removed.extend(remove_images(client))
        return removed
    finally:
        client.close()


class DockerPlatform(Platform):
    """N KV nodes in containers. Use as a context manager, or call close()."""

    name = "docker"

    def __init__(self, config: ClusterConfig, *, image: str | None = None,
                 log: Callable[[str], None] | None = None, client=None) -> None:  # noqa: ANN001
        super().__init__(config)
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.client = client if client is not None else engine()
        self._image = image
        self.prefix = f"mao-{_name_part(config.run_id)}"
        self.network_name = self.prefix
        self._ips: dict[str, str] = {}
        self._ports: dict[str, int] = {}
        self._commands: dict[str, list[str]] = {}  # each container's command (fixed at creation)
        self._earlier_output: dict[str, bytes] = {}  # what replaced containers printed
        self._containers: dict[str, object] = {}  # node id -> docker Container
        self._cuts: set[tuple[str, str]] = set()
        self._losses: dict[tuple[str, str], float] = {}
        self._applied: dict[str, tuple[str, ...] | None] = {}  # rules now in each namespace
        self._iptables: str | None = None  # "iptables" (nft) or "iptables-legacy"
        self._started = False
        self._closed = False
        self._owner = owner_label()

    # ----- lifecycle -------------------------------------------------------------------

    @property
    def image(self) -> str:
        if self._image is None:
            self._image = ensure_image(self.client, self._log)
        return self._image

    def _label_dict(self, kind: str, node_id: str | None = None) -> dict[str, str]:
        labels = {LABEL_PROJECT: PROJECT, LABEL_RUN: self.config.run_id, LABEL_KIND: kind,
                  LABEL_OWNER: self._owner}
        if node_id is not None:
            labels[LABEL_NODE] = node_id
        return labels

    def labels(self, kind: str, name: str | None = None) -> dict[str, str]:
        """This run's labels for a resource of another kind (the trainer workload's
        containers): `close()` and `clean` find it with the nodes."""
        return self._label_dict(kind, name)

    def start(self) -> None:
        if self._closed:
            raise PlatformError("this DockerPlatform was closed; make a new one to start again")
        if self._started:
            raise PlatformError("start() was already called on this DockerPlatform")
        self._started = True
        image = self.image
        subnet = self._create_network()
        hosts = list(subnet.hosts())
        for i, node_id in enumerate(self.node_ids, start=1):
            self._ips[node_id] = str(hosts[9 + i])  # .11, .12, ...
        if self.config.tls is not None:
            self.config.tls.generate({n: [f"{self.prefix}-{n}", self._ips[n]]
                                      for n in self.node_ids})
        for node_id in self.node_ids:
            self._create_node(node_id, image)
        for node_id in self.node_ids:
            self._first_start(node_id, image)

    def _first_start(self, node_id: str, image: str) -> None:
        """Start a new node; if its host port was taken since we chose it, make the
        container again on another port (the port is fixed for the container's life)."""
        for attempt in range(5):
            try:
                self.start_node(node_id)
                return
            except PlatformError as exc:
                text = str(exc).lower()
                if attempt == 4 or not ("port is already allocated" in text
                                        or "address already in use" in text):
                    raise
            self._containers.pop(node_id).remove(force=True)
            self._create_node(node_id, image, volume_exists=True)

    def _create_network(self) -> ipaddress.IPv4Network:
        import docker.errors
        from docker.types import IPAMConfig, IPAMPool

        taken: list[ipaddress.IPv4Network] = []
        for network in self.client.networks.list():
            for cfg in (network.attrs.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    net = ipaddress.ip_network(cfg["Subnet"], strict=False)
                    if net.version == 4:
                        taken.append(net)
        taken += [r for r in _host_routes() if r.prefixlen > 0]
        candidates = list(SUBNET_POOL.subnets(new_prefix=24))
        offset = sum(self.config.run_id.encode()) % len(candidates)
        last_error = "every /24 of 10.213.0.0/16 is in use"
        for subnet in candidates[offset:] + candidates[:offset]:
            if any(subnet.overlaps(t) for t in taken):
                continue
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet),
                                                     gateway=str(subnet.network_address + 1))])
            try:
                self.client.networks.create(
                    self.network_name, driver="bridge", ipam=ipam,
                    labels=self._label_dict("network"), check_duplicate=True)
                return subnet
            except docker.errors.APIError as exc:
                text = str(exc).lower()
                if "overlap" in text:  # another engine user took it just now
                    last_error = _one_line(exc)
                    continue
                raise PlatformError(f"could not create the network {self.network_name}: "
                                    f"{_one_line(exc)}. If an earlier run with this id "
                                    f"crashed, run `python -m nemesis clean`.") from None
        raise PlatformError(f"no free subnet for the network {self.network_name}: {last_error}")

    def _setup(self, node_id: str) -> NodeSetup:
        """What `System.node_command` and `node_env` are told about `node_id`."""
        others = [p for p in self.node_ids if p != node_id]
        return NodeSetup(
            node_id=node_id, listen=f"{self._ips[node_id]}:{NODE_PORT}",
            peer_listen=f"{self._ips[node_id]}:{PEER_PORT}",
            peers={p: f"{self._ips[p]}:{NODE_PORT}" for p in others},
            peer_links={p: f"{self._ips[p]}:{PEER_PORT}" for p in others},
            data_dir=Path(LAZY_DATA_DIR if self.config.lazy_disk else DATA_DIR),
            log_file=Path(LOG_FILE), tls=self._tls_files(node_id), platform="docker",
            extra_args=tuple(self.config.node_args))

    def _node_command(self, node_id: str) -> list[str]:
        serve = self.system.node_command(self._setup(node_id))
        # The gate: the node starts only once the platform has installed its link rules in
        # this (fresh) network namespace and touched READY_DIR/ready.
        gate = (f'i=0; while [ ! -e {READY_DIR}/ready ]; do i=$((i+1)); '
                f'if [ "$i" -gt {START_GATE_S * 20} ]; then echo "node {node_id}: link rules '
                f'were not installed within {START_GATE_S} s; not starting" >&2; exit 75; fi; '
                f'sleep 0.05; done; ')
        if not self.config.lazy_disk:
            return ["sh", "-c", gate + 'exec "$@"', "gate", *serve]
        return ["sh", "-c", self._lazy_script(node_id, gate), "gate", *serve]

    def _tls_files(self, node_id: str) -> TlsFiles | None:
        """Where `_copy_tls` puts this node's certificate, key and CA in its container."""
        if self.config.tls is None:
            return None
        return TlsFiles(Path(TLS_DIR, f"{node_id}.crt"), Path(TLS_DIR, f"{node_id}.key"),
                        Path(TLS_DIR, "ca.crt"))

    def _copy_tls(self, node_id: str, container) -> None:  # noqa: ANN001 - a docker Container
        """This node's certificate and key and the CA certificate into its container."""
        import docker.errors

        if self.config.tls is None:
            return
        files = self.config.tls.files(node_id)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            folder = tarfile.TarInfo(TLS_DIR.strip("/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(folder)
            for source, name, mode in ((files.cert, f"{node_id}.crt", 0o644),
                                       (files.key, f"{node_id}.key", 0o600),
                                       (files.ca, "ca.crt", 0o644)):
                data = source.read_bytes()
                info = tarfile.TarInfo(f"{TLS_DIR.strip('/')}/{name}")
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
        try:
            container.put_archive("/", buffer.getvalue())
        except docker.errors.APIError as exc:
            raise PlatformError(f"could not copy {node_id}'s certificates into "
                                f"{container.name}: {_one_line(exc)}") from None

    def _lazy_script(self, node_id: str, gate: str) -> str:
        """The shell stays pid 1: it mounts the layer, runs the node, forwards SIGTERM to
        it, and flushes the layer once the node exited (a process crash, not a power cut)."""
        mounted = f"grep -q ' {LAZY_DATA_DIR} fuse.mao-lazyfs ' /proc/mounts"
        return (
            "node=; trap 'if [ -n \"$node\" ]; then kill -TERM \"$node\"; else exit 143; fi' "
            "TERM INT; " + gate
            + f"mkdir -p {DATA_DIR} {LAZY_DATA_DIR}; "
            f"python3 -m nemesis.lazyfs mount {LAZY_DATA_DIR} --backing {DATA_DIR} "
            f"--control {LAZY_CONTROL} & lazy=$!; "
            f"i=0; until {mounted} && [ -S {LAZY_CONTROL} ]; do i=$((i+1)); "
            f'if ! kill -0 "$lazy" 2>/dev/null || [ "$i" -gt {START_GATE_S * 20} ]; then '
            f'echo "node {node_id}: the lazy disk did not mount at {LAZY_DATA_DIR}; not '
            f'starting" >&2; exit 75; fi; sleep 0.05; done; '
            '"$@" & node=$!; '
            # wait returns early (>128) when the trap runs: wait again until the node is gone.
            'while :; do wait "$node"; code=$?; kill -0 "$node" 2>/dev/null || break; done; '
            f"{{ {LAZY_FLUSH}; }} || echo \"node {node_id}: flushing the lazy disk failed\" >&2; "
            'kill -TERM "$lazy"; wait "$lazy"; exit "$code"')

    def _create_node(self, node_id: str, image: str, volume_exists: bool = False,
                     port: int | None = None) -> None:
        import docker.errors

        api = self.client.api
        name = f"{self.prefix}-{node_id}"
        if not volume_exists:
            self.client.volumes.create(name=name, labels=self._label_dict("volume", node_id))
        env = {"PYTHONUNBUFFERED": "1", **self.system.node_env(self._setup(node_id)),
               **self.config.env}
        if port is None:
            (port,) = free_ports(1)
        lazy = self.config.lazy_disk
        host_config = api.create_host_config(
            # FUSE: the device, and mount(2) needs CAP_SYS_ADMIN (Docker's seccomp profile
            # then allows it); an AppArmor host's docker-default profile denies mounts.
            cap_add=["NET_ADMIN", *(["SYS_ADMIN"] if lazy else [])],
            devices=["/dev/fuse:/dev/fuse:rwm"] if lazy else None,
            security_opt=["apparmor=unconfined"] if lazy else None,
            port_bindings={NODE_PORT: ("127.0.0.1", port)},
            binds={name: {"bind": VOLUME_MOUNT, "mode": "rw"}},
            tmpfs={READY_DIR: "size=1m"},
            network_mode=self.network_name,
            init=False,
        )
        networking = api.create_networking_config(
            {self.network_name: api.create_endpoint_config(ipv4_address=self._ips[node_id])})
        command = self._node_command(node_id)
        try:
            created = api.create_container(
                image, command=command, name=name, hostname=node_id,
                labels=self._label_dict("node", node_id), environment=env,
                ports=[NODE_PORT], host_config=host_config, networking_config=networking,
                detach=True)
        except docker.errors.APIError as exc:
            raise PlatformError(f"could not create the container {name}: {_one_line(exc)}. "
                                f"If an earlier run with this id crashed, run "
                                f"`python -m nemesis clean`.") from None
        self._containers[node_id] = self.client.containers.get(created["Id"])
        self._copy_tls(node_id, self._containers[node_id])
        self._ports[node_id] = port
        self._commands[node_id] = command
        self._applied[node_id] = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.system.close()
        try:
            _remove_labelled(self.client, self.config.run_id)
        finally:
            self._containers.clear()
            with contextlib.suppress(Exception):
                self.client.close()

    # ----- nodes -----------------------------------------------------------------------

    @property
    def client_addresses(self) -> dict[str, str]:
        return {n: f"127.0.0.1:{p}" for n, p in self._ports.items()}

    @property
    def node_ips(self) -> dict[str, str]:
        """node id -> its address on the run's network (what peers use)."""
        return dict(self._ips)

    def _container(self, node_id: str):  # noqa: ANN202
        if node_id not in self.node_ids:
            raise PlatformError(f"unknown node {node_id!r}: this cluster has "
                                f"{', '.join(self.node_ids)}")
        container = self._containers.get(node_id)
        if container is None:
            raise PlatformError(f"node {node_id} has no container: call start() first"
                                if not self._closed else f"node {node_id}: the platform is closed")
        return container

    def _state(self, node_id: str) -> dict:
        import docker.errors

        container = self._container(node_id)
        try:
            container.reload()
        except docker.errors.NotFound:
            raise PlatformError(f"the container of {node_id} ({container.name}) is gone; was "
                                f"it removed by `python -m nemesis clean`?") from None
        return container.attrs["State"]

    def start_node(self, node_id: str) -> None:
        import docker.errors

        container = self._container(node_id)
        if self.is_running(node_id):
            raise PlatformError(f"{node_id} is already running; kill or stop it first")
        if self._node_command(node_id) != self._commands.get(node_id):
            # The system's command line changed (etcd: a member added back starts with
            # --initial-cluster-state existing); a container's command is fixed at its
            # creation, so make it again on the same volume and host port, keeping what
            # the old one printed for collect_logs.
            with contextlib.suppress(docker.errors.APIError):
                self._earlier_output[node_id] = (self._earlier_output.get(node_id, b"")
                                                 + container.logs(stdout=True, stderr=True))
            self._containers.pop(node_id).remove(force=True)
            self._create_node(node_id, self.image, volume_exists=True,
                              port=self._ports[node_id])
            container = self._container(node_id)
        try:
            container.start()
        except docker.errors.APIError as exc:
            raise PlatformError(f"could not start {node_id} ({container.name}): "
                                f"{_one_line(exc)}") from None
        self._applied[node_id] = None  # a fresh network namespace: no rules yet
        try:
            self._install_rules(node_id, open_gate=True)
        except PlatformError:
            with contextlib.suppress(docker.errors.APIError):
                container.kill()  # do not leave it waiting at the gate
            raise

    def stop_node(self, node_id: str, timeout_s: float = 10.0) -> None:
        container = self._container(node_id)
        if self._state(node_id).get("Paused"):
            container.unpause()  # a frozen process cannot handle SIGTERM
        container.stop(timeout=int(timeout_s))
        self._wait_exited(node_id, timeout_s + 10)

    def kill(self, node_id: str) -> None:
        import docker.errors

        container = self._container(node_id)
        flushed = (0, "")
        if self.is_running(node_id):
            if self.config.lazy_disk:
                # A process crash keeps the page cache: the layer writes everything back
                # and writes through from now on, so the SIGKILL below loses nothing.
                if self.is_paused(node_id):
                    self.resume(node_id)  # a frozen layer cannot flush
                flushed = self._exec(node_id, LAZY_FLUSH)
            with contextlib.suppress(docker.errors.APIError):  # it may exit meanwhile
                container.kill()
        self._wait_exited(node_id, 20)
        if flushed[0] != 0 and self.exit_code(node_id) == 137:
            raise PlatformError(f"{node_id} was killed, but its lazy disk could not be flushed "
                                f"first (exit {flushed[0]}: {flushed[1].strip()[-300:]}): its "
                                f"unsynced writes may be lost as in a power cut")

    def supports_power_loss(self) -> bool:
        return self.config.lazy_disk

    def power_loss(self, node_ids: list[str]) -> None:
        import docker.errors

        if not self.config.lazy_disk:
            super().power_loss(node_ids)
        containers = [self._container(n) for n in node_ids]
        # SIGKILL to each container's pid 1 ends its pid namespace, the layer with it:
        # all the kills go out before any wait.
        for container in containers:
            with contextlib.suppress(docker.errors.APIError):  # not running: nothing to do
                container.kill()
        for node_id in node_ids:
            self._wait_exited(node_id, 20)

    def _wait_exited(self, node_id: str, timeout_s: float) -> None:
        self._wait(lambda: not self.is_running(node_id), timeout_s,
                   f"{node_id}'s container to exit")
        self._applied[node_id] = None

    def pause(self, node_id: str) -> None:
        import docker.errors

        try:
            self._container(node_id).pause()
        except docker.errors.APIError as exc:
            raise PlatformError(f"could not pause {node_id}: {_one_line(exc)}") from None

    def resume(self, node_id: str) -> None:
        """Unpause; a node that is not paused is left as it is (the end-of-run heal resumes
        every node without knowing which the nemesis paused)."""
        import docker.errors

        if not self.is_paused(node_id):
            return
        try:
            self._container(node_id).unpause()
        except docker.errors.APIError as exc:
            raise PlatformError(f"could not resume {node_id}: {_one_line(exc)}") from None

    def wipe(self, node_id: str) -> None:
        """Empty the data directory on the node's volume through a short-lived helper
        container (a stopped container cannot exec); the log beside it stays."""
        container = self._container(node_id)
        if self.is_running(node_id):
            raise PlatformError(f"{node_id} is running; kill or stop it before wiping its data")
        code, output = self._run_helper(
            node_id, f"rm -rf {DATA_DIR}", network_mode="none",
            volumes={container.name: {"bind": VOLUME_MOUNT, "mode": "rw"}})
        if code != 0:
            raise PlatformError(f"wiping {node_id}'s data failed: {output.strip()[-300:]}")

    def kill_nodes(self, node_ids: list[str]) -> None:
        """Every container told to die before waiting for any (`kill-all`)."""
        import docker.errors

        for node_id in node_ids:
            if self.is_running(node_id):
                with contextlib.suppress(docker.errors.APIError):
                    self._container(node_id).kill()
        for node_id in node_ids:
            self._wait_exited(node_id, 20)

    def supports_file_faults(self) -> bool:
        return self.system.data_layout() is not None

    def data_files(self, node_ids: list[str]) -> dict[str, dict[str, int]]:
        return self._disk_damage({"op": "list"}, node_ids)

    def damage_files(self, damages: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return self._disk_damage({"op": "damage", "damage": damages}, list(damages))

    def _disk_damage(self, request: dict, node_ids: list[str]) -> dict:
        """Run `disk_damage` in one helper container with every named node's volume
        mounted (a helper costs about a second, so one for all of them)."""
        volumes = {}
        for node_id in node_ids:
            container = self._container(node_id)
            if self.is_running(node_id):
                raise PlatformError(f"{node_id} is running; kill or stop it before touching "
                                    f"its files")
            volumes[container.name] = {"bind": f"/mao-damage/{node_id}", "mode": "rw"}
        layout = self.system.data_layout()
        if layout is None:
            raise PlatformError(f"the {self.system.name} system names no data files to damage")
        request = {**request, "layout": layout.as_request(),
                   "dirs": {n: f"/mao-damage/{n}/data" for n in node_ids}}
        source = Path(disk_damage.__file__).read_text(encoding="utf-8")
        script = f"python3 -c {shlex.quote(source)} {shlex.quote(json.dumps(request))}"
        code, output = self._run_helper(node_ids[0], script, network_mode="none",
                                        volumes=volumes)
        try:
            answer = json.loads(last_line(output, limit=10**9))
        except ValueError:
            answer = {"error": output.strip()[-300:] or f"exit code {code}"}
        if "ok" not in answer:
            raise PlatformError(f"the helper that touches {', '.join(node_ids)}'s files failed: "
                                f"{answer.get('error')}")
        return answer["ok"]

    def member_address(self, node_id: str) -> str:
        self._container(node_id)  # an unknown node is an error, as elsewhere
        return f"{self._ips[node_id]}:{NODE_PORT}"

    def member_peer_address(self, node_id: str) -> str:
        self._container(node_id)
        return f"{self._ips[node_id]}:{PEER_PORT}"

    def is_running(self, node_id: str) -> bool:
        state = self._state(node_id)
        return bool(state.get("Running")) or bool(state.get("Paused"))

    def is_paused(self, node_id: str) -> bool:
        return bool(self._state(node_id).get("Paused"))

    def exit_code(self, node_id: str) -> int | None:
        if node_id in self.node_ids and node_id not in self._containers:
            return None
        state = self._state(node_id)
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None

    def exit_reason(self, node_id: str) -> str:
        import docker.errors

        container = self._containers.get(node_id)
        if container is None:
            return ""
        try:
            return exit_line(container.logs(stdout=True, stderr=True, tail=20)
                             .decode(errors="replace"))
        except docker.errors.APIError:
            return ""

    # ----- network -------------------------------------------------------------------

    def supports_delay(self) -> bool:
        return False

    def _check_link(self, src: str, dst: str) -> None:
        for node_id in (src, dst):
            if node_id not in self.node_ids:
                raise PlatformError(f"unknown node {node_id!r}: this cluster has "
                                    f"{', '.join(self.node_ids)}")
        if src == dst:
            raise PlatformError(f"a link joins two different nodes, got {src} -> {dst}")

    def cut(self, src: str, dst: str) -> None:
        self._check_link(src, dst)
        self._cuts.add((src, dst))
        self._sync(dst)

    def heal_link(self, src: str, dst: str) -> None:
        self._check_link(src, dst)
        self._cuts.discard((src, dst))
        self._losses.pop((src, dst), None)
        self._sync(dst)

    def heal_all(self) -> None:
        self._cuts.clear()
        self._losses.clear()
        for node_id in self.node_ids:
            self._sync(node_id)

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        self._check_link(src, dst)
        if not 0.0 < probability < 1.0:
            raise PlatformError(f"loss probability must be strictly between 0 and 1, got "
                                f"{probability}; use cut() to drop everything, heal_link() "
                                f"to drop nothing")
        self._losses[(src, dst)] = probability
        self._sync(dst)

    @property
    def links(self) -> dict[tuple[str, str], float]:
        """The faulty links now: (src, dst) -> share of packets dropped (1.0 = cut)."""
        out = dict(self._losses)
        out.update({link: 1.0 for link in self._cuts})
        return out

    def _rules(self, dst: str) -> tuple[str, ...]:
        rules = []
        for src in self.node_ids:
            if (src, dst) in self._cuts:
                rules.append(f"-A MAO -s {self._ips[src]}/32 -j DROP")
            elif (src, dst) in self._losses:
                rules.append(f"-A MAO -s {self._ips[src]}/32 -m statistic --mode random "
                             f"--probability {self._losses[(src, dst)]:.4f} -j DROP")
        return tuple(rules)

    def _sync(self, node_id: str) -> None:
        """Make node_id's MAO chain hold exactly the current rules for links into it."""
        if node_id not in self._containers:
            return  # not started yet: start() installs the rules
        if not self.is_running(node_id):
            self._applied[node_id] = None  # installed at its next start
            return
        if self._applied.get(node_id) != self._rules(node_id):
            self._install_rules(node_id, open_gate=False)

    def _install_rules(self, node_id: str, open_gate: bool) -> None:
        rules = self._rules(node_id)
        ipt = self._iptables or "iptables"
        restore = "\n".join(["*filter", ":MAO - [0:0]", *rules, "COMMIT", ""])
        script = (f"printf %s {shlex.quote(restore)} | {ipt}-restore --noflush && "
                  f"{{ {ipt} -C INPUT -j MAO 2>/dev/null || {ipt} -I INPUT 1 -j MAO; }}")
        if open_gate:
            script += f" && touch {READY_DIR}/ready"
        code, output = self._exec(node_id, script)
        if code != 0 and self._iptables is None and "iptables-legacy" not in script:
            # The kernel may lack nf_tables: the image also has the legacy backend.
            self._iptables = "iptables-legacy"
            return self._install_rules(node_id, open_gate)
        if code != 0:
            raise PlatformError(f"installing the link rules in {node_id} failed (exit {code}): "
                                f"{output.strip()[-500:]} — the engine's kernel needs "
                                f"iptables (nf_tables or legacy) and xt_statistic.")
        self._iptables = ipt
        self._applied[node_id] = rules

    def _exec(self, node_id: str, script: str) -> tuple[int, str]:
        """Run `sh -c script` in node_id's network namespace: `docker exec` normally, a
        helper container joining that namespace when the node is paused."""
        import docker.errors

        container = self._container(node_id)
        if not self.is_paused(node_id):
            try:
                result = container.exec_run(["sh", "-c", script], demux=False)
                return result.exit_code, (result.output or b"").decode(errors="replace")
            except docker.errors.APIError as exc:
                if "paused" not in str(exc).lower():
                    return 1, _one_line(exc)
                # Paused between our check and the exec: use a helper.
        return self._run_helper(node_id, script, network_mode=f"container:{container.id}",
                                cap_add=["NET_ADMIN"])

    def _run_helper(self, node_id: str, script: str, **options) -> tuple[int, str]:  # noqa: ANN003
        """Run `sh -c script` in a short-lived container of the node image, labelled as
        node_id's helper (so `clean` finds it if we die meanwhile); its exit code and output."""
        import docker.errors

        helper = self.client.containers.run(
            self.image, ["sh", "-c", script], labels=self._label_dict("helper", node_id),
            detach=True, **options)
        try:
            outcome = helper.wait(timeout=60)
            output = helper.logs(stdout=True, stderr=True).decode(errors="replace")
            return int(outcome.get("StatusCode", 1)), output
        finally:
            with contextlib.suppress(docker.errors.APIError):
                helper.remove(force=True)

    # ----- observing -----------------------------------------------------------------

    def status(self, node_id: str, timeout_s: float = 0.5) -> NodeStatus | None:
        if node_id not in self._ports:
            return None
        return super().status(node_id, timeout_s)

    def _wait(self, condition: Callable[[], T], timeout_s: float, what: str,
              poll_s: float = 0.05) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise PlatformError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(poll_s)

    def wait_for_leader(self, timeout_s: float = 30.0) -> str:
        """A leader (see `Platform.leader`), waiting up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            leader = self.leader()
            if leader is not None:
                return leader
            if time.monotonic() >= deadline:
                raise PlatformError(f"no leader after {timeout_s:g} s: {self.describe()}")
            time.sleep(0.05)

    def collect_logs(self) -> dict[str, Path]:
        import docker.errors

        out_dir = self.config.work_dir / "nodes"
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, Path] = {}
        for node_id, container in self._containers.items():
            try:
                chunks, _ = container.get_archive(LOG_FILE)
                with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                    member = tar.next()
                    data = tar.extractfile(member).read() if member is not None else b""  # type: ignore[union-attr]
                path = out_dir / f"{node_id}.log"
                path.write_bytes(data)
                written[path.name] = path
            except (docker.errors.NotFound, docker.errors.APIError, tarfile.TarError):
                pass  # the node never wrote its log (never started, or the container is gone)
            with contextlib.suppress(docker.errors.APIError):
                path = out_dir / f"{node_id}.stderr"
                path.write_bytes(self._earlier_output.get(node_id, b"")
                                 + container.logs(stdout=True, stderr=True))
                written[path.name] = path
        return written
