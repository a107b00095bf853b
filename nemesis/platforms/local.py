"""The local platform: nodes as processes on loopback, links through fault-injecting proxies.

Each node is a process running the system's command line (`LocalCluster`, `System.node_command`); node i reaches node j
through its own TCP proxy (i, j), so cutting that proxy drops what i sends to j and nothing
else — a directed partition on one machine, no root needed. Kill is SIGKILL, pause is
SIGSTOP/SIGCONT of the node's process group. Loss holds chunks for a retransmission timeout
(see `tcp_proxy`), because a byte stream cannot drop a packet.

Data directories live in a temporary directory removed at `close()`; logs are copied into
the run folder by `collect_logs()`. Every node's environment carries MAO_RUN_ID, so
`clean()` can find and kill the processes of a harness that was itself SIGKILLed (the nodes
also die with their parent through PR_SET_PDEATHSIG, so that is a second line of defence).

With `lazy_disk`, each node's data directory is a mount of the lazy layer
(`nemesis.lazyfs`, managed by `lazy_mount.LazyMount`) over `nX.disk/` beside it, mounted
while the node may run: `start_node` mounts and then starts the node; `kill` and
`stop_node` end the node, flush the layer (a process crash keeps what the node wrote: the
page cache survives it) and unmount; `power_loss` SIGKILLs the nodes, then SIGKILLs their
layers, so every write they had not fsynced is gone. `clean()` also detaches lazy mounts a
dead harness left under its directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from nemesis.platforms import disk_damage
from nemesis.platforms.base import ClusterConfig, Platform, PlatformError, exit_line
from nemesis.platforms.lazy_mount import LazyMount, force_unmount, lazy_mounts
from nemesis.platforms.local_cluster import LocalCluster
from nemesis.platforms.tcp_proxy import ProxyMode
from nemesis.tls_run import TEMP_PREFIX as TLS_PREFIX

RUN_ENV_VAR = "MAO_RUN_ID"
TEMP_PREFIX = "mao-local-"
OWNER_FILE = "harness.pid"


class LocalPlatform(Platform):
    name = "local"

    def __init__(self, config: ClusterConfig) -> None:
        super().__init__(config)
        self._data_root = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{config.run_id}-"))
        # Who owns this directory: `clean` leaves it alone while that process lives.
        (self._data_root / OWNER_FILE).write_text(str(os.getpid()))
        env = dict(config.env)
        env[RUN_ENV_VAR] = config.run_id
        if config.tls is not None:
            # Every node is reached at 127.0.0.1 (clients directly, peers through the link
            # proxies), which every node certificate names; peers check the node id.
            config.tls.generate({node_id: [] for node_id in self.node_ids})
        self.cluster = LocalCluster(config.nodes, self._data_root, node_args=config.node_args,
                                    env=env, proxy_peer_links=True,
                                    tls_dir=config.tls.directory if config.tls else None,
                                    system=config.system)
        # The layer carries the run's id and our pid like a node, so `clean` kills it too.
        mount_env = {RUN_ENV_VAR: config.run_id, "KV_PARENT_PID": str(os.getpid())}
        self._mounts: dict[str, LazyMount] = {}
        if config.lazy_disk:
            for node_id, spec in self.cluster.specs.items():
                self._mounts[node_id] = LazyMount(
                    spec.data_dir.resolve(), self._data_root / f"{node_id}.disk",
                    self._data_root / f"{node_id}.ctl", self._data_root / f"{node_id}.lazyfs",
                    mount_env)
        self._closed = False

    def start(self) -> None:
        for node_id in self.node_ids:
            self.start_node(node_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.collect_logs()
        try:
            self.cluster.close()
        finally:
            with contextlib.suppress(Exception):
                self.system.close()
            for mount in self._mounts.values():
                with contextlib.suppress(Exception):
                    mount.power_off()
            shutil.rmtree(self._data_root, ignore_errors=True)

    @property
    def client_addresses(self) -> dict[str, str]:
        return {node_id: spec.address for node_id, spec in self.cluster.specs.items()}

    def start_node(self, node_id: str) -> None:
        mount = self._mounts.get(node_id)
        if mount is not None and not self.cluster.is_running(node_id):
            if mount.running:  # the node exited by itself: a process crash, not a power cut
                mount.flush()
                mount.stop()
            mount.start()
        self.cluster.start_node(node_id)

    def _unmount_after_crash(self, node_id: str) -> None:
        mount = self._mounts.get(node_id)
        if mount is not None:
            mount.flush()
            mount.stop()

    def stop_node(self, node_id: str) -> None:
        self.cluster.stop(node_id)
        self._unmount_after_crash(node_id)

    def kill(self, node_id: str) -> None:
        self.cluster.kill(node_id)
        self._unmount_after_crash(node_id)

    def supports_power_loss(self) -> bool:
        return self.config.lazy_disk

    def power_loss(self, node_ids: list[str]) -> None:
        if not self.config.lazy_disk:
            super().power_loss(node_ids)
        for node_id in node_ids:
            if node_id not in self._mounts:
                raise PlatformError(f"unknown node {node_id!r}: nodes are {', '.join(self.node_ids)}")
        # Every node dies before any layer does, all at once as far as the cluster can
        # tell; then each layer dies with its memory (the unsynced writes).
        started = [n for n in node_ids if n in self.cluster.processes]
        for node_id in started:
            self.cluster.send_kill(node_id)
        for node_id in started:
            self.cluster.kill(node_id)  # reaps it, and marks the exit as expected
        for node_id in node_ids:
            self._mounts[node_id].power_off()

    def slow_disk(self, node_id: str, low_ms: float, high_ms: float) -> None:
        mount = self._mounts.get(node_id)
        if mount is None:
            super().slow_disk(node_id, low_ms, high_ms)
            return
        mount.slow(low_ms, high_ms)

    def pause(self, node_id: str) -> None:
        self.cluster.pause(node_id)

    def resume(self, node_id: str) -> None:
        self.cluster.resume(node_id)

    def wipe(self, node_id: str) -> None:
        if self.cluster.is_running(node_id):
            raise PlatformError(f"{node_id} is running; kill or stop it before wiping its data")
        mount = self._mounts.get(node_id)
        if mount is not None:
            mount.power_off()  # its pending writes belong to the data being deleted
            shutil.rmtree(mount.backing, ignore_errors=True)
        shutil.rmtree(self.cluster.specs[node_id].data_dir, ignore_errors=True)

    def kill_nodes(self, node_ids: list[str]) -> None:
        # Every SIGKILL sent before waiting for any of them: the nodes die together.
        for node_id in node_ids:
            self.cluster.send_kill(node_id)
        for node_id in node_ids:
            self.cluster.kill(node_id)

    def supports_file_faults(self) -> bool:
        return self.system.data_layout() is not None

    def _stopped_dir(self, node_id: str) -> str:
        if node_id not in self.cluster.specs:
            raise PlatformError(f"unknown node {node_id!r}: nodes are {', '.join(self.node_ids)}")
        if self.cluster.is_running(node_id):
            raise PlatformError(f"{node_id} is running; kill or stop it before touching its files")
        mount = self._mounts.get(node_id)
        if mount is not None:  # on a lazy disk the files live in the backing directory
            return str(mount.backing)
        return str(self.cluster.specs[node_id].data_dir)

    def data_files(self, node_ids: list[str]) -> dict[str, dict[str, int]]:
        return disk_damage.handle({"op": "list", "layout": self._layout(),
                                   "dirs": {n: self._stopped_dir(n) for n in node_ids}})

    def _layout(self) -> dict:
        layout = self.system.data_layout()
        if layout is None:
            raise PlatformError(f"the {self.system.name} system names no data files to damage")
        return layout.as_request()

    def damage_files(self, damages: dict[str, list[dict]]) -> dict[str, list[dict]]:
        dirs = {n: self._stopped_dir(n) for n in damages}
        try:
            return disk_damage.handle({"op": "damage", "dirs": dirs, "damage": damages,
                                       "layout": self._layout()})
        except (OSError, ValueError) as exc:
            raise PlatformError(f"damaging {', '.join(damages)}'s files failed: {exc}") from None

    def save_data(self, node_id: str) -> None:
        data = Path(self._stopped_dir(node_id))
        copy = data.with_name(f"{data.name}.saved")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(data, copy, symlinks=True)

    def restore_data(self, node_id: str) -> None:
        data = Path(self._stopped_dir(node_id))
        copy = data.with_name(f"{data.name}.saved")
        if not copy.is_dir():
            raise PlatformError(f"no saved copy of {node_id}'s data directory to restore")
        shutil.rmtree(data)
        shutil.copytree(copy, data, symlinks=True)

    def member_address(self, node_id: str) -> str:
        return self.cluster.specs[node_id].address

    def member_peer_address(self, node_id: str) -> str:
        # The node's own peer port: the per-link proxies exist only for the links named
        # on each node's command line (NodeSetup.peer_links); with source-aware proxies
        # (System.one_peer_address) the address it advertises is its proxy's.
        if self.cluster.source_links is not None:
            return self.cluster.source_links.proxies[node_id].address
        return self.cluster.specs[node_id].peer_address

    def is_running(self, node_id: str) -> bool:
        return self.cluster.is_running(node_id)

    def exit_code(self, node_id: str) -> int | None:
        return self.cluster.exit_code(node_id)

    def exit_reason(self, node_id: str) -> str:
        spec = self.cluster.specs[node_id]
        for source in (spec.stderr_file, spec.log_file):  # a refusal prints; a crash logs
            try:
                with source.open("rb") as f:
                    f.seek(max(0, source.stat().st_size - 65536))
                    line = exit_line(f.read().decode(errors="replace"))
            except OSError:
                continue
            if line:
                return line
        return ""

    def _proxy(self, src: str, dst: str):  # noqa: ANN202 - a TcpProxy
        proxy = self.cluster.link_proxies.get((src, dst))
        if proxy is None:
            raise PlatformError(f"no link {src}->{dst}: nodes are {', '.join(self.node_ids)}")
        return proxy

    def cut(self, src: str, dst: str) -> None:
        self._proxy(src, dst).set_mode(ProxyMode.CUT)

    def heal_link(self, src: str, dst: str) -> None:
        proxy = self._proxy(src, dst)
        proxy.set_loss(0.0)
        proxy.set_mode(ProxyMode.FORWARD)
        lane = getattr(proxy, "raft", None)
        if lane is not None:
            lane.set_reorder(0.0)

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        self._proxy(src, dst).set_loss(probability)

    def set_reorder(self, src: str, dst: str, probability: float) -> None:
        """Frames of the peer lane src -> dst late (behind later ones) or twice, with this
        probability (nemesis/platforms/frame_reorder.py); healed by `heal_link`."""
        if not 0 < probability < 1:
            raise ValueError(f"reorder probability must be in (0, 1), got {probability}")
        lane = self._lane(src, dst)
        lane.set_reorder(probability)
        lane.reset()  # frames are found from a connection's first byte: both ends reconnect

    def reordered_frames(self) -> tuple[int, int]:
        """(frames written behind later ones, frames written twice) over every peer lane
        since the platform started."""
        lanes = [lane for proxy in self.cluster.link_proxies.values()
                 if (lane := getattr(proxy, "raft", None)) is not None]
        return (sum(lane.frames_reordered for lane in lanes),
                sum(lane.frames_duplicated for lane in lanes))

    # The `hold` fault (nemesis/faults.py): the proxies keep what a node sends, in order,
    # and deliver it late. stale-leader: the held leader's peers elect a new leader and
    # take writes, and at the release its old-term APPENDs and answers arrive in the newer
    # term. overtaken (`hold_in_flight`): the leader's held connections are cut at its end
    # only, so what it sends next overtakes what they hold.
    released_in_window = 0  # the simulator's early release; never here
    crashed_by_hold: str | None = None  # restarted by the next release_held
    overtaken_landed = False  # the last overtaken strike's aim was met

    def hold_from(self, node_id: str) -> None:
        for (src, _), link in self.cluster.link_proxies.items():
            if src == node_id:
                if not hasattr(link, "hold"):
                    raise PlatformError(f"the {self.system.name} nodes' links cannot hold "
                                        f"messages (one proxy per destination)")
                link.hold()

    def hold_in_flight(self, node_id: str) -> int:
        """The overtaken shape on byte streams; returns the bytes held. `node_id` is the
        leader. Its peer lanes to each follower, and theirs back, are reset (both ends
        reconnect at once), so the proxies read the new connections from their first byte
        (`peer_frames`). Its lanes to the followers then hold until each has kept an
        APPEND with entries (up to 2 s), and those connections are cut at the leader's end
        only (`TcpProxy.overtake`): it reconnects and its newer APPENDs pass. The moment a
        follower's answer acknowledging past the held entries passes its proxy, the held
        bytes are written to that follower on its old connection, right behind its answer —
        older APPENDs of the same term after newer ones, before the leader can tell it the
        new commit index: what a follower must not let shorten its log
        (`truncates-without-a-conflict`). Once a majority's worth of followers has been
        released (up to 3 s), what the leader sends is kept, their answers reach it, and
        once it applied past the held entries (it counted those answers and persisted its
        commit index; up to 1 s) it is SIGKILLed, down until the heal, as if it died before
        it could repair them: what it sent meanwhile is lost with it."""
        from nemesis.platforms.peer_frames import APPEND, APPEND_RESPONSE, PeerFrames

        followers = sorted(dst for (src, dst) in self.cluster.link_proxies if src == node_id)
        out = {f: getattr(self.cluster.link_proxies[(node_id, f)], "raft", None) for f in followers}
        back = {f: getattr(self.cluster.link_proxies[(f, node_id)], "raft", None) for f in followers}
        if any(proxy is None for proxy in [*out.values(), *back.values()]) \
                or self.config.tls is not None:
            raise PlatformError("the overtaken strike reads the store's plaintext TCP peer "
                                "lanes; these nodes have none")
        if self.status(node_id, timeout_s=1.0) is None:
            raise PlatformError(f"{node_id} does not answer its Status")
        lock = threading.Lock()
        readers: dict[int, PeerFrames] = {}
        held_last = dict.fromkeys(followers, 0)  # last entry index of the APPENDs kept
        released: dict[str, threading.Event] = {f: threading.Event() for f in followers}
        overtaken = threading.Event()

        def messages(pair, data: bytes):  # noqa: ANN001 - a proxy connection
            with lock:
                reader = readers.setdefault(id(pair), PeerFrames())
            return reader.feed(data)

        def watch_out(f: str):  # noqa: ANN202
            def seen(pair, data: bytes) -> None:  # noqa: ANN001
                for m in messages(pair, data):
                    if pair.holding and m.type == APPEND and m.entries \
                            and not overtaken.is_set():
                        held_last[f] = max(held_last[f], m.entries[-1].index)
            return seen

        def watch_back(f: str):  # noqa: ANN202
            def seen(pair, data: bytes) -> None:  # noqa: ANN001
                for m in messages(pair, data):
                    if overtaken.is_set() and not released[f].is_set() \
                            and m.type == APPEND_RESPONSE and not m.reject \
                            and m.index > held_last[f]:
                        # The first such answer: every follower's answers are kept from
                        # here on, so the leader learns of no newer entry and no
                        # follower of a newer commit index until all are released.
                        with lock:
                            for proxy in back.values():
                                if not proxy.holding:
                                    proxy.hold()
                        released[f].set()
                        out[f].release()  # the older APPENDs, behind the newer ones
            return seen

        held = 0
        try:
            for f in followers:
                out[f].watch(watch_out(f))
                back[f].watch(watch_back(f))
                back[f].reset()
                out[f].reset()
                out[f].hold()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not all(held_last.values()):
                time.sleep(0.005)
            held = sum(proxy.held_bytes() for proxy in out.values())
            overtaken.set()
            for f in followers:
                out[f].overtake()
            needed = len(self.node_ids) // 2 + 1 if len(followers) > 2 else len(followers)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline \
                    and sum(e.is_set() for e in released.values()) < needed:
                time.sleep(0.002)
            self.overtaken_landed = sum(e.is_set() for e in released.values()) >= needed
            # What the leader sends from now on stays on the wire and dies with it: it
            # must not repair the followers before it crashes.
            for proxy in out.values():
                proxy.hold()
            for proxy in back.values():  # the followers' answers reach the leader now
                proxy.release()
            last_held = max(held_last.values())
            deadline = time.monotonic() + 1.0
            while self.overtaken_landed and time.monotonic() < deadline:
                now = self.status(node_id, timeout_s=0.5)
                # Applied past them: the node persists a Ready (its commit index with it)
                # before it applies, so the restarted leader knows them committed, and
                # the clients have their answers.
                if now is None or now.role != "leader" or now.applied_index > last_held:
                    break
                time.sleep(0.002)
        except BaseException:
            for f in followers:
                out[f].release()
            raise
        finally:
            for f in followers:
                out[f].watch(None)
                back[f].watch(None)
                back[f].release()
        self.kill(node_id)
        self.crashed_by_hold = node_id
        for f in followers:
            out[f].discard()
        return held

    # The election fault's late-grant shape (nemesis/elections.py): one peer lane held
    # (a voter's answers to a candidate), delivered the moment the candidate asks for votes
    # in a later term, ahead of every answer of that term.

    def _lane(self, src: str, dst: str):  # noqa: ANN202 - a TcpProxy
        lane = getattr(self._proxy(src, dst), "raft", None)
        if lane is None or self.config.tls is not None:
            raise PlatformError("this reads the store's plaintext TCP peer lanes (a held vote, "
                                "reordered frames); these nodes have none")
        return lane

    def hold_lane(self, src: str, dst: str) -> None:
        """Keep what `src` sends `dst` on its peer lane, in order, until released."""
        self._lane(src, dst).hold()

    def lane_held_bytes(self, src: str, dst: str) -> int:
        return self._lane(src, dst).held_bytes()

    def release_on_vote(self, src: str, dsts: list[str], term: int,
                        held: tuple[str, str]) -> threading.Event:
        """Read what `src` sends each of `dsts` on connections opened from now on (the
        open ones are reset); the moment a VOTE request of `term` or later passes, and
        before it is forwarded, the held lane `held` writes what it kept. Returns an Event
        set then. `stop_watching` ends it."""
        from nemesis.platforms.peer_frames import VOTE, PeerFrames

        held_lane = self._lane(*held)
        lanes = [self._lane(src, dst) for dst in dsts]
        lock = threading.Lock()
        readers: dict[int, PeerFrames] = {}
        fired = threading.Event()

        def seen(pair, data: bytes) -> None:  # noqa: ANN001 - a proxy connection
            with lock:
                messages = readers.setdefault(id(pair), PeerFrames()).feed(data)
                if not fired.is_set() and any(m.type == VOTE and m.term >= term
                                              for m in messages):
                    held_lane.release()
                    fired.set()

        for lane in lanes:
            lane.watch(seen)
            lane.reset()
        return fired

    def stop_watching(self, src: str, dsts: list[str]) -> None:
        for dst in dsts:
            self._lane(src, dst).watch(None)

    def release_held(self) -> int:
        """Deliver every held byte (and restart a leader the overtaken shape crashed);
        returns how many bytes there were."""
        released = sum(link.release() for link in self.cluster.link_proxies.values()
                       if hasattr(link, "release"))
        if self.crashed_by_hold is not None:
            node, self.crashed_by_hold = self.crashed_by_hold, None
            self.start_node(node)
        return released

    def heal_all(self) -> None:
        self.release_held()
        super().heal_all()

    def collect_logs(self) -> dict[str, Path]:
        out_dir = self.config.work_dir / "nodes"
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, Path] = {}
        for spec in self.cluster.specs.values():
            lazy = [self._mounts[spec.node_id].log_file] if spec.node_id in self._mounts else []
            for source in (spec.log_file, spec.stderr_file, *lazy):
                if source.exists():
                    target = out_dir / source.name
                    shutil.copyfile(source, target)
                    written[source.name] = target
        return written


def _env_of(pid_dir: Path) -> dict[str, str]:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _alive(pid: str) -> bool:
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def clean(run_id: str | None = None) -> list[str]:
    """Kill node processes left by a harness that died (found by MAO_RUN_ID in their
    environment) and remove their temporary data directories. Returns what it removed.

    Without `run_id`, runs whose harness is still alive are left alone (a second terminal's
    run is not a leftover); with it, that run is removed whatever its state."""
    removed: list[str] = []
    live_runs: set[str] = set()
    own = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == own:
            continue
        env = _env_of(entry)
        found = env.get(RUN_ENV_VAR)
        if found is None or (run_id is not None and found != run_id):
            continue
        if run_id is None and _alive(env.get("KV_PARENT_PID", "")):
            live_runs.add(found)
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            removed.append(f"process {entry.name} (run {found})")
    # The run's own data directories, and the certificate directories of --tls runs
    # (nemesis/tls_run.py; on either platform), both owned the same way.
    leftovers = [(prefix, path) for prefix in (TEMP_PREFIX, TLS_PREFIX)
                 for path in Path(tempfile.gettempdir()).glob(f"{prefix}{run_id or ''}*")]
    for prefix, path in leftovers:
        if not path.is_dir():
            continue
        if run_id is None:
            try:
                owner = (path / OWNER_FILE).read_text().strip()
            except OSError:
                owner = ""
            if _alive(owner) or any(path.name.startswith(f"{prefix}{r}-") for r in live_runs):
                continue
        for mountpoint in lazy_mounts():  # a layer we killed above leaves a dead mount
            if mountpoint.is_relative_to(path.resolve()):
                try:
                    force_unmount(mountpoint)
                    removed.append(f"mount {mountpoint}")
                except PlatformError as exc:
                    removed.append(f"mount {mountpoint} NOT removed: {exc}")
        shutil.rmtree(path, ignore_errors=True)
        removed.append(f"directory {path}")
    return removed
