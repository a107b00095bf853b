"""`python -m system.trainer run --hosts FILE`: the training job across machines reached over
SSH, with the nemesis ssh platform's pieces (nemesis/platforms/ssh_*.py): its hosts file,
its connections (one per host, host keys checked), its installer and its clean-up.

- The store: without --kv, three nodes on the first three hosts (`SshPlatform`, in its own
  run folder); with --kv, addresses that the hosts and this machine both reach.
- The trainer's processes: coordinators (the active one and the standbys) and workers are
  placed round-robin over all the hosts in the order they start (c1, c2, w0, w1, ...; a
  replacement takes the next host), each printed as it starts. They run from the project
  installed in RUN = /var/tmp/mao-<run id> on every host, with `setsid` (a process group of
  their own, outside the SSH session), and listen on the host's peer address, so the lease
  record names an address workers on other hosts reach. Gradients go host to host over
  gRPC as on one machine.
- Arithmetic: every process runs one BLAS thread and this machine's OpenBLAS kernel
  (`blas_kernel_env`), so the final parameters can be compared bit for bit with the
  one-process reference computed here.
- Logs and event logs are written on the hosts and copied back into the run directory
  when read; the coordinator's Status is reached through an SSH port forward.
- `close()` kills every process group, removes RUN (and the store's folder) from every
  host and closes the connections, on Ctrl-C too; a harness killed outright leaves RUN
  and its `owner` file, which `python -m nemesis clean --hosts FILE` removes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from system.kv.client import KVClient, KVError
from system.trainer.blas import BLAS_THREAD_VARIABLES, blas_kernel_env
from system.trainer.config import ConfigError
from system.trainer.lease import read_lease
from system.trainer.run import PolledProcess, TrainerRun

STORE_NODES = 3
STATE_CACHE_S = 0.5  # one round of state commands to the hosts at most this often
LEADER_WAIT_S = 60.0
# Where S3 is, for --checkpoint-store s3://; never credentials (a process list shows them).
PASSED_ON = ("TRAINER_S3_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION")


class HostProcess(PolledProcess):
    """The part of subprocess.Popen that TrainerRun uses, for a process on a host."""

    def __init__(self, run: HostsTrainerRun, name: str, host: int) -> None:
        self.run, self.name, self.host = run, name, host
        self.returncode: int | None = None
        self.pid = None  # no local process group: faults go through HostsTrainerRun

    def poll(self) -> int | None:
        if self.returncode is None:
            self.run.refresh_states()
        return self.returncode

    def _poll_sooner(self) -> None:
        self.run.refresh_states(force=True)


def placement(names: list[str], hosts: int, start: int = 0) -> list[int]:
    """Host index of each process started in this order: round-robin from `start`."""
    return [(start + i) % hosts for i in range(len(names))]


class HostsTrainerRun(TrainerRun):
    """A TrainerRun whose store (unless --kv) and processes live on SSH hosts."""

    def __init__(self, *args, hosts: list, known_hosts: Path | None = None,  # noqa: ANN002
                 accept_new: bool = False, log: Callable[[str], None] | None = None,
                 **kwargs) -> None:  # noqa: ANN003
        if kwargs.get("checkpoint_store", "inline") == "object":
            raise ConfigError("--checkpoint-store object is a folder of this machine, which "
                              "the hosts do not share; with --hosts use inline or s3://...")
        if kwargs.get("tls") is not None or kwargs.get("generate_tls"):
            raise ConfigError("--hosts runs without TLS: the certificates would have to name "
                              "every host's address; drop --tls and the certificate flags")
        super().__init__(*args, **kwargs)
        from nemesis.platforms.ssh import chain_name, remote_dir
        from nemesis.platforms.ssh_conn import SshHosts

        if not hosts:
            raise ConfigError("--hosts names no host")
        if self.kv_addresses is None and len(hosts) < STORE_NODES:
            raise ConfigError(f"--hosts names {len(hosts)} host(s): the store this run starts "
                              f"needs {STORE_NODES}; give more hosts or a store with --kv")
        self.hosts = hosts
        self.known_hosts, self.accept_new = known_hosts, accept_new
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.run_id = f"trainer-{self.run_token}"
        self.remote = remote_dir(self.run_id)
        self._chain, self._comment = chain_name(self.run_id), f"mao-run:{self.run_id}"
        self.ssh = SshHosts(hosts, known_hosts=known_hosts, accept_new=accept_new)
        self.platform = None  # the store's SshPlatform, without --kv
        self._host_kv = ",".join(self.kv_addresses) if self.kv_addresses else ""
        self._placed = 0
        self._states_at = 0.0
        self._forwards: dict[str, str] = {}
        self._connected = False

    # ----- starting --------------------------------------------------------------------

    def start(self) -> None:
        from nemesis.platforms.ssh_install import install_on_hosts, preflight

        t0 = time.monotonic()
        self.ssh.connect()
        self._connected = True
        preflight(self.ssh, self.remote, iptables=False)
        install_on_hosts(self.ssh, self.remote, self._chain, self._comment, self._log)
        self._ship_datasets()
        self._log(f"installed the trainer on {len(self.hosts)} hosts in {self.remote} "
                  f"({time.monotonic() - t0:.1f} s)")
        if self.kv_addresses is None:
            self._start_store()
        self._wait_for_store()
        super().start()

    def _ship_datasets(self) -> None:
        """The bundled datasets' files, as a namespace package `sklearn`/`river` under
        RUN/lib: where data.py looks, without installing those packages on the hosts."""
        from nemesis.platforms.image import _data_files

        files = list(_data_files())
        folders = sorted({str(Path(name).parent) for _, name in files})
        if not folders:
            return
        mkdir = "mkdir -p " + " ".join(shlex.quote(f"{self.remote}/lib/{f}") for f in folders)
        self.ssh.run_all({i: mkdir for i in range(len(self.hosts))}, timeout_s=60)
        for i in range(len(self.hosts)):
            for folder in folders:
                self.ssh.put(i, [p for p, name in files if str(Path(name).parent) == folder],
                             f"{self.remote}/lib/{folder}")

    def _start_store(self) -> None:
        from nemesis.platforms.base import ClusterConfig
        from nemesis.platforms.ssh import SshPlatform

        config = ClusterConfig(nodes=STORE_NODES, run_id=f"{self.run_id}-kv",
                               work_dir=self.run_dir / "kv")
        self.platform = SshPlatform(config, self.hosts, known_hosts=self.known_hosts,
                                    accept_new=self.accept_new, log=self._log)
        self.platform.start()
        nodes = self.platform.node_ids
        self._host_kv = ",".join(f"{n}={self.platform.member_address(n)}" for n in nodes)
        self.kv_addresses = dict(self.platform.client_addresses)  # SSH forwards, for here
        self._log("store: " + ", ".join(f"{n} on {self.hosts[i].label()} "
                                        f"({self.platform.member_address(n)})"
                                        for i, n in enumerate(nodes)))

    def _wait_for_store(self) -> None:
        kv = KVClient(self.kv_addresses, timeout_s=2.0, client_id="trainer-hosts-probe")
        deadline = time.monotonic() + LEADER_WAIT_S
        try:
            while True:
                try:
                    read_lease(kv, self.config.job, timeout_s=2.0)
                    return
                except KVError as exc:
                    if time.monotonic() >= deadline:
                        raise ConfigError(f"the store answered no read within "
                                          f"{LEADER_WAIT_S:g} s: {str(exc).splitlines()[0][:300]}"
                                          ) from None
                time.sleep(0.2)  # bounded by the deadline
        finally:
            kv.close()

    def worker_kv(self) -> str:
        return self._host_kv

    def coordinator_kv(self, cid: str) -> str:
        return self._host_kv

    def _remote_path(self, text: str) -> str:
        local = str(self.run_dir)
        return self.remote + text[len(local):] if text.startswith(local) else text

    def spawn_process(self, name: str, args: list[str], log_path: Path,
                      extra_env: dict[str, str] | None = None) -> HostProcess:
        index = placement([name], len(self.hosts), self._placed)[0]
        self._placed += 1
        host = self.hosts[index]
        args = [self._remote_path(a) for a in args]
        if args and args[0] == "coordinator":
            args += ["--listen", f"{host.peer_address}:0"]
        env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{self.remote}/lib",
               **{v: "1" for v in BLAS_THREAD_VARIABLES}, **blas_kernel_env(),
               **{k: os.environ[k] for k in PASSED_ON if os.environ.get(k)},
               **(extra_env or {})}
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        d, log = f"{self.remote}/procs", self._remote_path(str(log_path))
        wrapper = f'"$@"; echo $? > {d}/{name}.exit'
        script = (f"mkdir -p {d} && rm -f {d}/{name}.exit && cd {self.remote} || exit 1; "
                  f"env {exports} setsid sh -c {shlex.quote(wrapper)} {name} python3 -m "
                  f"system.trainer {' '.join(shlex.quote(a) for a in args)} "
                  f">> {shlex.quote(log)} 2>&1 < /dev/null & echo $! > {d}/{name}.pid")
        code, out = self.ssh.run(index, script, timeout_s=60)
        if code != 0:
            raise ConfigError(f"{host.label()}: starting {name} failed (exit {code}): "
                              f"{out.strip()[-300:]}")
        self._log(f"{name} on {host.label()} ({host.peer_address})")
        return HostProcess(self, name, index)

    # ----- observing -------------------------------------------------------------------

    def _host_procs(self) -> dict[int, list[HostProcess]]:
        out: dict[int, list[HostProcess]] = {}
        for proc in self.procs.values():
            if isinstance(proc, HostProcess) and proc.returncode is None:
                out.setdefault(proc.host, []).append(proc)
        return out

    def refresh_states(self, force: bool = False) -> None:
        """One command per host: which of its processes are gone, with their exit codes
        (a group killed by a signal took the shell that records it: -9)."""
        if not force and time.monotonic() - self._states_at < STATE_CACHE_S:
            return
        self._states_at = time.monotonic()
        d = f"{self.remote}/procs"
        scripts = {}
        by_host = self._host_procs()
        for index, procs in by_host.items():
            names = " ".join(p.name for p in procs)
            scripts[index] = (
                f"for n in {names}; do p=$(cat {d}/$n.pid 2>/dev/null); s=; [ -n \"$p\" ] && "
                f"s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1); "
                f"case \"$s\" in ''|Z|X) echo \"$n gone $(cat {d}/$n.exit 2>/dev/null)\";; "
                f"*) echo \"$n $s\";; esac; done")
        if not scripts:
            return
        answers = self.ssh.run_all(scripts, timeout_s=60)
        for index, (_, out) in answers.items():
            gone = {}
            for line in out.splitlines():
                fields = line.split()
                if len(fields) >= 2 and fields[1] == "gone":
                    code = fields[2] if len(fields) > 2 else ""
                    gone[fields[0]] = int(code) if code.lstrip("-").isdigit() else -9
            for proc in by_host[index]:
                if proc.name in gone:
                    proc.returncode = gone[proc.name]

    def collect(self) -> None:
        """Copy every process's log and event log back into the run directory."""
        for name, proc in self.procs.items():
            if not isinstance(proc, HostProcess):
                continue
            for file in (f"{name}.log", f"events-{name}.jsonl"):
                with contextlib.suppress(Exception):
                    self.ssh.get(proc.host, f"{self.remote}/{file}", self.run_dir / file)

    def events(self, cid: str | None = None) -> list[dict]:
        self.collect()
        return super().events(cid)

    def config_error(self) -> str | None:
        if any(p.poll() == 2 for p in self.procs.values()):
            self.collect()
        return super().config_error()

    def status(self, address: str | None = None):  # noqa: ANN201 - StatusReply | None
        """Status through an SSH forward to the coordinator's host: this machine need not
        reach the hosts' peer addresses."""
        if address is None:
            record = self.lease()
            if record is None:
                return None
            address = record.address
        if address not in self._forwards:
            ip, _, port = address.rpartition(":")
            index = next((i for i, h in enumerate(self.hosts) if h.peer_address == ip), None)
            if index is None or not port.isdigit():
                return super().status(address)
            local = self.ssh.forward(index, ip, int(port))
            self._forwards[address] = f"127.0.0.1:{local}"
        return super().status(self._forwards[address])

    # ----- faults ----------------------------------------------------------------------

    def _signal(self, name: str, sig: str) -> None:
        proc = self.procs[name]
        assert isinstance(proc, HostProcess)
        self.ssh.run(proc.host, f'kill -{sig} -"$(cat {self.remote}/procs/{name}.pid)"',
                     timeout_s=30)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self._signal(name, signal.Signals(sig).name.removeprefix("SIG"))
        if sig == signal.SIGKILL:
            self.procs[name].wait(timeout=20)

    def pause(self, name: str) -> None:
        self._signal(name, "STOP")

    def resume(self, name: str) -> None:
        self._signal(name, "CONT")

    # ----- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process group, remove RUN from every host, stop the store (its
        platform removes its own folder), close the connections."""
        from nemesis.platforms.base import PlatformError, last_line
        from nemesis.platforms.ssh import remove_script

        errors = []
        try:
            if self._connected:
                # It kills every process group in RUN/procs too (the workers' command
                # lines do not name RUN, which its pkill looks for).
                script = remove_script(self.remote, self._chain, self._comment)
                answers = self.ssh.run_all({i: script for i in range(len(self.hosts))},
                                           timeout_s=60)
                errors += [f"{self.hosts[i].label()}: {last_line(out)}"
                           for i, (code, out) in answers.items() if code != 0]
        except PlatformError as exc:
            errors.append(str(exc))
        finally:
            for proc in self.procs.values():
                proc.returncode = proc.returncode if proc.returncode is not None else -9
            self.procs.clear()
            if hasattr(self, "kv"):
                self.kv.close()
            if self.platform is not None:
                try:
                    self.platform.close()
                except PlatformError as exc:
                    errors.append(str(exc))
            self.ssh.close()
            if self._own_dir and not os.environ.get("TRAINER_KEEP_RUN_DIR"):
                shutil.rmtree(self.run_dir, ignore_errors=True)
        if errors:
            raise PlatformError("removing the run from the hosts failed: " + "; ".join(errors)
                                + " — run `python -m nemesis clean --hosts FILE`")


class HostsSupport:
    """`python -m system.trainer run --hosts FILE`: what the trainer's entry point hands its
    CLI (system/trainer/cli.py, `HostsSupport`), so the system never imports the harness."""

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        from nemesis.platforms.base import PlatformError

        return (PlatformError,)

    def make_run(self, config, hosts_file: Path, known_hosts: Path | None,  # noqa: ANN001, ANN201
                 accept_new: bool, **kwargs):
        from nemesis.platforms.ssh_hosts import HostsFileError, read_hosts

        try:
            hosts = read_hosts(hosts_file)
        except HostsFileError as exc:
            raise ConfigError(str(exc)) from None
        return HostsTrainerRun(config, hosts=hosts, known_hosts=known_hosts,
                               accept_new=accept_new, **kwargs)
