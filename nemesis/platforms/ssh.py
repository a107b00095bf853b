"""The ssh platform: one node per host, reached over SSH, as Jepsen drives its nodes.

`--platform ssh --hosts FILE` (`ssh_hosts`: one host per line) puts node nI on the I-th
host. Over one SSH connection per host (`ssh_conn`, host keys checked) it:

- installs the project in the run's folder on the host, RUN = /var/tmp/mao-<run id>, from
  wheels built here (`ssh_install`); every file it writes is under RUN, which also holds
  each node's data (RUN/nodes/nX/data), log (node.log), what it printed (out), its process
  group id (pid) and its exit code (exit), and `owner`, the harness that made it;
- starts a node with `setsid`, detached from the SSH session, under a shell that records
  the node's exit code; kill is SIGKILL of the node's process group, stop SIGTERM (then
  SIGKILL after a bounded wait), pause and resume SIGSTOP and SIGCONT of the group;
- cuts links with iptables on the receiving host: a chain of the run's own (MAO-<hash of
  the run id>), jumped to from INPUT by a rule carrying the comment `mao-run:<run id>`,
  holding `-s <sender> -p tcp --ports 7000,7001 -j DROP` per cut link (only the nodes'
  ports: the host's SSH and other services are left alone), with `-m statistic` for loss.
  Each change rewrites the chain in one `iptables-restore --noflush`;
- reaches each node's client port through an SSH port forward to 127.0.0.1 here, so the
  workload's clients need no route to the hosts, and partitions never cut them;
- runs the file faults (`disk_damage`, the same script as on docker) with python3 on the
  host of each stopped node;
- copies node.log and out back as `nodes/nX.log` and `nodes/nX.stderr` (`collect_logs`);
- `close()` kills every node's process group, deletes the chain and its jump, removes RUN
  and closes the connections: nothing of the run is left on a host. It runs on Ctrl-C
  too (the runner's tear-down); a harness killed outright leaves RUN and its `owner` file,
  which `python -m nemesis clean --hosts FILE` finds (`ssh_clean`).

Hosts need: sshd, root (or passwordless sudo), python3 >= 3.11, iptables, and for
`--system etcd` an `etcd` binary on PATH. Lazy disks (lose-unsynced) are not supported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from nemesis.platforms import disk_damage
from nemesis.platforms.base import ClusterConfig, Platform, PlatformError, exit_line, last_line
from nemesis.platforms.docker import _name_part
from nemesis.platforms.ssh_conn import SshHosts
from nemesis.platforms.ssh_hosts import Host
from nemesis.systems.base import NodeSetup
from system.kv.tls import TlsFiles

NODE_PORT = 7000
PEER_PORT = 7001
REMOTE_ROOT = "/var/tmp"
STOP_WAIT_S = 10.0


def remote_dir(run_id: str) -> str:
    return f"{REMOTE_ROOT}/mao-{_name_part(run_id)}"


def chain_name(run_id: str) -> str:
    """iptables chain names are at most 28 characters: a hash of the run id."""
    return "MAO-" + hashlib.sha256(run_id.encode()).hexdigest()[:10]


def remove_script(run_dir: str, chain: str, comment: str) -> str:
    """Kill the run's node groups (nodes/*/pid; procs/*.pid: the trainer's processes,
    nemesis/trainer_hosts.py) and anything else still working in its folder (an
    install that Ctrl-C interrupted), delete its iptables chain and jump, remove the folder.
    Safe to run twice, and on a host where some of it never existed."""
    rules = ""
    for ipt in ("iptables", "iptables-legacy"):
        rules += (f"if command -v {ipt} >/dev/null 2>&1; then "
                  f"while {ipt} -D INPUT -m comment --comment {shlex.quote(comment)} "
                  f"-j {chain} 2>/dev/null; do :; done; "
                  f"{ipt} -F {chain} 2>/dev/null; {ipt} -X {chain} 2>/dev/null; fi; ")
    # The folder's name is split in this script's own text, so pkill -f, which matches
    # command lines, finds the processes using the folder and not this shell.
    head, tail = run_dir.rsplit("/", 1)
    return (f"R={shlex.quote(head + '/')}''{shlex.quote(tail)}; "
            f'for f in "$R"/nodes/*/pid "$R"/procs/*.pid; do [ -f "$f" ] && '
            f'kill -KILL -"$(cat "$f")" 2>/dev/null; done; '
            f'if command -v pkill >/dev/null 2>&1; then pkill -KILL -f "$R" ; fi; '
            f'{rules}rm -rf "$R"; true')


class SshPlatform(Platform):
    """N nodes on the first N hosts of the hosts file."""

    name = "ssh"

    def __init__(self, config: ClusterConfig, hosts: list[Host], *,
                 known_hosts: Path | None = None, accept_new: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(config)
        if len(hosts) < config.nodes:
            raise PlatformError(f"--nodes {config.nodes} needs {config.nodes} hosts; the hosts "
                                f"file names {len(hosts)}")
        if config.lazy_disk:
            raise PlatformError("the ssh platform has no lazy disk: lose-unsynced runs on "
                                "--platform local and docker")
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.hosts = {n: hosts[i] for i, n in enumerate(self.node_ids)}
        self._index = {n: i for i, n in enumerate(self.node_ids)}
        self.ssh = SshHosts(hosts[:config.nodes], known_hosts=known_hosts, accept_new=accept_new)
        self.dir = remote_dir(config.run_id)
        self.chain = chain_name(config.run_id)
        self.comment = f"mao-run:{config.run_id}"[:250]
        self._ports: dict[str, int] = {}
        self._pids: dict[str, str] = {}
        self._cuts: set[tuple[str, str]] = set()
        self._losses: dict[tuple[str, str], float] = {}
        self._iptables: dict[str, str] = {}
        self._started = False
        self._closed = False

    # ----- lifecycle -------------------------------------------------------------------

    def _run(self, node_id: str, script: str, timeout_s: float = 60.0) -> tuple[int, str]:
        return self.ssh.run(self._index[node_id], script, timeout_s=timeout_s)

    def _must(self, node_id: str, script: str, what: str, timeout_s: float = 60.0) -> str:
        code, out = self._run(node_id, script, timeout_s)
        if code != 0:
            raise PlatformError(f"{node_id} on {self.hosts[node_id].label()}: {what} failed "
                                f"(exit {code}): {last_line(out)}")
        return out

    def start(self) -> None:
        if self._closed or self._started:
            raise PlatformError("an SshPlatform starts once; make a new one to start again")
        self._started = True
        t0 = time.monotonic()
        self.ssh.connect()
        self._preflight()
        self._install()
        self._log(f"installed the project on {len(self.node_ids)} hosts "
                  f"({time.monotonic() - t0:.1f} s)")
        if self.config.tls is not None:
            self.config.tls.generate({n: [self.hosts[n].peer_address] for n in self.node_ids})
            for node_id in self.node_ids:
                self._copy_tls(node_id)
        for node_id in self.node_ids:
            self._ports[node_id] = self.ssh.forward(self._index[node_id],
                                                    self.hosts[node_id].peer_address, NODE_PORT)
        for node_id in self.node_ids:
            self._sync(node_id)
        for node_id in self.node_ids:
            self.start_node(node_id)

    def _preflight(self) -> None:
        from nemesis.platforms.ssh_install import preflight

        preflight(self.ssh, self.dir, iptables=True)

    def _install(self) -> None:
        from nemesis.platforms.ssh_install import install_on_hosts

        install_on_hosts(self.ssh, self.dir, self.chain, self.comment, self._log)

    def _copy_tls(self, node_id: str) -> None:
        files = self.config.tls.files(node_id)  # type: ignore[union-attr]
        index = self._index[node_id]
        self.ssh.put(index, [files.cert, files.key, files.ca], f"{self.dir}/tls")
        self._must(node_id, f"chmod 600 {self.dir}/tls/{files.key.name}", "securing the key")

    def _tls_files(self, node_id: str) -> TlsFiles | None:
        if self.config.tls is None:
            return None
        files = self.config.tls.files(node_id)
        return TlsFiles(Path(self.dir, "tls", files.cert.name), Path(self.dir, "tls",
                        files.key.name), Path(self.dir, "tls", files.ca.name))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.system.close()
        script = remove_script(self.dir, self.chain, self.comment)
        try:
            if self._started:
                answers = self.ssh.run_all({i: script for i in range(len(self.node_ids))},
                                           timeout_s=60)
                bad = [f"{self.ssh.hosts[i].label()}: {last_line(out)}"
                       for i, (code, out) in answers.items() if code != 0]
                if bad:
                    raise PlatformError("removing the run from the hosts failed: "
                                        + "; ".join(bad) + " — run `python -m nemesis clean "
                                        "--hosts FILE`")
        finally:
            self.ssh.close()

    # ----- nodes -----------------------------------------------------------------------

    @property
    def client_addresses(self) -> dict[str, str]:
        return {n: f"127.0.0.1:{p}" for n, p in self._ports.items()}

    def _node_dir(self, node_id: str) -> str:
        if node_id not in self.hosts:
            raise PlatformError(f"unknown node {node_id!r}: this cluster has "
                                f"{', '.join(self.node_ids)}")
        return f"{self.dir}/nodes/{node_id}"

    def _setup(self, node_id: str) -> NodeSetup:
        others = [p for p in self.node_ids if p != node_id]
        peer = {n: self.hosts[n].peer_address for n in self.node_ids}
        node_dir = self._node_dir(node_id)
        return NodeSetup(
            node_id=node_id, listen=f"{peer[node_id]}:{NODE_PORT}",
            peer_listen=f"{peer[node_id]}:{PEER_PORT}",
            peers={p: f"{peer[p]}:{NODE_PORT}" for p in others},
            peer_links={p: f"{peer[p]}:{PEER_PORT}" for p in others},
            data_dir=Path(node_dir, "data"), log_file=Path(node_dir, "node.log"),
            tls=self._tls_files(node_id), platform="ssh",
            extra_args=tuple(self.config.node_args))

    def start_node(self, node_id: str) -> None:
        if self.is_running(node_id):
            raise PlatformError(f"{node_id} is already running; kill or stop it first")
        setup = self._setup(node_id)
        command = self.system.node_command(setup)
        env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{self.dir}/lib",
               **self.system.node_env(setup), **self.config.env}
        d = self._node_dir(node_id)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # setsid: the node leads a process group of its own, outside the SSH session, so
        # SIGKILL/SIGSTOP of the group reach the node and nothing else; the shell around
        # it records the exit code of a node that ends by itself.
        wrapper = f'"$@"; echo $? > {d}/exit'
        script = (f"mkdir -p {d}/data && rm -f {d}/exit && cd {d} || exit 1; "
                  f"env {exports} setsid sh -c {shlex.quote(wrapper)} node "
                  f"{' '.join(shlex.quote(c) for c in command)} >> {d}/out 2>&1 < /dev/null & "
                  f"echo $! > {d}/pid; cat {d}/pid")
        out = self._must(node_id, script, "starting the node")
        self._pids[node_id] = out.strip().splitlines()[-1]

    def _group_signal(self, node_id: str, signal: str) -> str:
        # `kill -SIG -PGID`: dash's kill takes no `--`.
        return f'kill -{signal} -"$(cat {self._node_dir(node_id)}/pid)" 2>/dev/null'

    def _state_script(self, node_id: str) -> str:
        """Prints the group leader's state: R/S/D/T..., or `gone` (exited, or a zombie)."""
        d = self._node_dir(node_id)
        return (f'p=$(cat {d}/pid 2>/dev/null); s=; [ -n "$p" ] && '
                f's=$(sed "s/.*) //" /proc/$p/stat 2>/dev/null | cut -d" " -f1); '
                f'case "$s" in ""|Z|X) echo gone;; *) echo "$s";; esac')

    def _state(self, node_id: str) -> str:
        if node_id not in self._pids:
            self._node_dir(node_id)
            return "gone"
        return self._must(node_id, self._state_script(node_id), "asking the node's state"
                          ).strip().splitlines()[-1]

    def _wait_gone(self, node_id: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._state(node_id) != "gone":
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def kill(self, node_id: str) -> None:
        if not self.is_running(node_id):
            return
        self._run(node_id, self._group_signal(node_id, "KILL"))
        if not self._wait_gone(node_id, 20):
            raise PlatformError(f"{node_id} survived SIGKILL for 20 s on "
                                f"{self.hosts[node_id].label()}")
        # The shell that records exit codes died with the group: record it here.
        self._run(node_id, f"echo 137 > {self._node_dir(node_id)}/exit")

    def stop_node(self, node_id: str) -> None:
        if not self.is_running(node_id):
            return
        self._run(node_id, self._group_signal(node_id, "CONT") + "; "
                  + self._group_signal(node_id, "TERM"))
        if not self._wait_gone(node_id, STOP_WAIT_S):
            self.kill(node_id)

    def pause(self, node_id: str) -> None:
        if self.is_running(node_id):
            self._run(node_id, self._group_signal(node_id, "STOP"))

    def resume(self, node_id: str) -> None:
        if self.is_running(node_id):
            self._run(node_id, self._group_signal(node_id, "CONT"))

    def wipe(self, node_id: str) -> None:
        if self.is_running(node_id):
            raise PlatformError(f"{node_id} is running; kill or stop it before wiping its data")
        self._must(node_id, f"rm -rf {self._node_dir(node_id)}/data", "wiping the data")

    def is_running(self, node_id: str) -> bool:
        return self._state(node_id) != "gone"

    def exit_code(self, node_id: str) -> int | None:
        if node_id not in self._pids:
            return None
        d = self._node_dir(node_id)
        code, out = self._run(node_id, f"{self._state_script(node_id)}; cat {d}/exit 2>/dev/null")
        lines = out.split()
        if not lines or lines[0] != "gone":
            return None
        return int(lines[1]) if len(lines) > 1 and lines[1].lstrip("-").isdigit() else -1

    def exit_reason(self, node_id: str) -> str:
        if node_id not in self._pids:
            return ""
        _, out = self._run(node_id, f"tail -n 20 {self._node_dir(node_id)}/out 2>/dev/null")
        return exit_line(out)

    def member_address(self, node_id: str) -> str:
        self._node_dir(node_id)
        return f"{self.hosts[node_id].peer_address}:{NODE_PORT}"

    def member_peer_address(self, node_id: str) -> str:
        self._node_dir(node_id)
        return f"{self.hosts[node_id].peer_address}:{PEER_PORT}"

    # ----- file faults -----------------------------------------------------------------

    def supports_file_faults(self) -> bool:
        return self.system.data_layout() is not None

    def data_files(self, node_ids: list[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for node_id in node_ids:
            out.update(self._disk_damage(node_id, {"op": "list"}))
        return out

    def damage_files(self, damages: dict[str, list[dict]]) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for node_id, items in damages.items():
            out.update(self._disk_damage(node_id, {"op": "damage", "damage": {node_id: items}}))
        return out

    def _disk_damage(self, node_id: str, request: dict) -> dict:
        """`disk_damage` run with python3 on the node's host (standard library only)."""
        if self.is_running(node_id):
            raise PlatformError(f"{node_id} is running; kill or stop it before touching its "
                                f"files")
        layout = self.system.data_layout()
        if layout is None:
            raise PlatformError(f"the {self.system.name} system names no data files to damage")
        request = {**request, "layout": layout.as_request(),
                   "dirs": {node_id: f"{self._node_dir(node_id)}/data"}}
        source = Path(disk_damage.__file__).read_text(encoding="utf-8")
        _, out = self._run(node_id, f"python3 -c {shlex.quote(source)} "
                                    f"{shlex.quote(json.dumps(request))}")
        try:
            answer = json.loads(last_line(out, limit=10**9))
        except ValueError:
            answer = {"error": out.strip()[-300:]}
        if "ok" not in answer:
            raise PlatformError(f"touching {node_id}'s files on {self.hosts[node_id].label()} "
                                f"failed: {answer.get('error')}")
        return answer["ok"]

    # ----- network -------------------------------------------------------------------

    def _check_link(self, src: str, dst: str) -> None:
        for node_id in (src, dst):
            self._node_dir(node_id)
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
        self._sync_many(self.node_ids)

    # A partition changes many links at once: one round of commands, every host at once
    # (one by one, a five-node partition took 10-20 s at load 40).
    def cut_links(self, links: Iterable[tuple[str, str]]) -> None:
        links = list(links)
        for src, dst in links:
            self._check_link(src, dst)
        self._cuts.update(links)
        self._sync_many(sorted({dst for _, dst in links}))

    def heal_links(self, links: Iterable[tuple[str, str]]) -> None:
        links = list(links)
        for link in links:
            self._check_link(*link)
            self._cuts.discard(link)
            self._losses.pop(link, None)
        self._sync_many(sorted({dst for _, dst in links}))

    def _sync_many(self, node_ids: list[str]) -> None:
        """`_sync` of several hosts in one round; a host whose iptables backend is not
        known yet, or whose round failed, gets `_sync` alone (which tries both)."""
        known = [n for n in node_ids if n in self._iptables]
        if len(known) > 1:
            answers = self.ssh.run_all({self._index[n]: self._sync_script(n, self._iptables[n])
                                        for n in known}, timeout_s=60)
            done = {n for n in known if answers[self._index[n]][0] == 0}
        else:
            done = set()
        for node_id in node_ids:
            if node_id not in done:
                self._sync(node_id)

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        self._check_link(src, dst)
        if not 0.0 < probability < 1.0:
            raise PlatformError(f"loss probability must be strictly between 0 and 1, got "
                                f"{probability}")
        self._losses[(src, dst)] = probability
        self._sync(dst)

    def _rules(self, dst: str) -> list[str]:
        rules = []
        for src in self.node_ids:
            match = (f"-A {self.chain} -s {self.hosts[src].peer_address} -p tcp -m multiport "
                     f"--ports {NODE_PORT},{PEER_PORT}")
            if (src, dst) in self._cuts:
                rules.append(f"{match} -j DROP")
            elif (src, dst) in self._losses:
                rules.append(f"{match} -m statistic --mode random --probability "
                             f"{self._losses[(src, dst)]:.4f} -j DROP")
        return rules

    def _sync(self, node_id: str) -> None:
        """Make the run's chain on node_id's host hold exactly the rules for links into it
        (iptables' nf_tables backend first, the legacy one where the kernel lacks it)."""
        tried = []
        for ipt in ([self._iptables[node_id]] if node_id in self._iptables
                    else ["iptables", "iptables-legacy"]):
            code, out = self._run(node_id, self._sync_script(node_id, ipt))
            if code == 0:
                self._iptables[node_id] = ipt
                return
            tried.append(f"{ipt}: {last_line(out)}")
        raise PlatformError(f"{node_id} on {self.hosts[node_id].label()}: installing the link "
                            f"rules failed: {'; '.join(tried)} — the host needs iptables with "
                            f"the multiport, comment and statistic matches")

    def _sync_script(self, node_id: str, ipt: str) -> str:
        restore = "\n".join(["*filter", f":{self.chain} - [0:0]", *self._rules(node_id),
                             "COMMIT", ""])
        comment = shlex.quote(self.comment)
        return (f"printf %s {shlex.quote(restore)} | {ipt}-restore --noflush && "
                f"{{ {ipt} -C INPUT -m comment --comment {comment} -j {self.chain} "
                f"2>/dev/null || {ipt} -I INPUT 1 -m comment --comment {comment} "
                f"-j {self.chain}; }}")

    # ----- observing -----------------------------------------------------------------

    def collect_logs(self) -> dict[str, Path]:
        out_dir = self.config.work_dir / "nodes"
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, Path] = {}
        if not self._started or self._closed:
            return written
        for node_id in self.node_ids:
            d = self._node_dir(node_id)
            for remote, name in ((f"{d}/node.log", f"{node_id}.log"),
                                 (f"{d}/out", f"{node_id}.stderr")):
                with contextlib.suppress(PlatformError, OSError):
                    if self.ssh.get(self._index[node_id], remote, out_dir / name):
                        written[name] = out_dir / name
        return written
