"""The trainer's coordinators and workers as containers of a Docker run (`--platform docker`).

Each process runs in a container of its own, from the node image (which holds the
trainer's sources, numpy and its dataset files, nemesis/platforms/image.py), on the run's
network at an address of its own (.101 and up of the run's /24), so it reaches the store
nodes at their network addresses, and a coordinator serves its workers there. Every
container carries the run's labels (kind `trainer`): the platform's close() and `python -m
nemesis clean` remove it with the nodes; `close()` here removes them first.

The run folder's `trainer/` directory is bind-mounted at the same path (event logs,
process logs, pause-point arm files): this part needs the engine on this machine. With
`--tls`, so is the trainer's certificate directory (`tls_dir`, read-only, at the same path:
the flags name host paths); it lives in the run's temporary directory, never in the run
folder, and holds the trainer's certificates and keys and the store's client certificate
— not the CA keys, the store nodes' or the admin's. The coordinator certificate names
every address a trainer container can get (.101 to .249 of the run's /24): a worker checks
the address in the lease record, and a coordinator gets whichever address is next.

Faults, as on the store's nodes: kill = SIGKILL of the container; pause = the cgroup
freezer (`docker pause`); a coordinator stopped at a pause point (it SIGSTOPs itself; the
container's init, docker-init, is pid 1, so it can) is continued by `kill -CONT` inside.
Cut from the store / the store's answers dropped = iptables rules in the container's own
network namespace (a chain MAO jumped to from INPUT and OUTPUT); `reset` closes its
connections to the store (`ss -K`).

What it must never do: leave a container behind, or publish a port.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shlex
import time
from pathlib import Path
from typing import Any

from system.trainer.blas import BLAS_THREAD_VARIABLES, blas_kernel_env
from system.trainer.run import PolledProcess

COORDINATOR_PORT = 7100
FIRST_HOST = 101  # trainer containers' addresses: .101, .102, ... of the run's /24
LAST_HOST = 249
POLL_CACHE_S = 0.2  # an engine call per process at most this often (the supervisor polls)


class ContainerProcess(PolledProcess):
    """The part of subprocess.Popen that TrainerRun uses, for a container."""

    def __init__(self, container: Any, name: str, ip: str) -> None:
        self.container, self.name, self.ip = container, name, ip
        self.returncode: int | None = None
        self.pid = None  # no host process group: faults go through DockerTrainerProcesses
        self._polled_at = 0.0

    def poll(self) -> int | None:
        if self.returncode is not None or time.monotonic() - self._polled_at < POLL_CACHE_S:
            return self.returncode
        self._polled_at = time.monotonic()
        import docker.errors

        try:
            self.container.reload()
        except docker.errors.NotFound:
            self.returncode = -9  # removed: as good as killed
            return self.returncode
        state = self.container.attrs["State"]
        if state.get("Status") in ("exited", "dead"):
            self.returncode = int(state.get("ExitCode", -1))
        return self.returncode

    def _poll_sooner(self) -> None:
        self._polled_at = 0.0


class DockerTrainerProcesses:
    def __init__(self, platform: Any, run_dir: Path) -> None:
        self.platform = platform
        self.client = platform.client
        self.run_dir = run_dir
        node_ips = platform.node_ips
        first = ipaddress.ip_address(next(iter(node_ips.values())))
        self._network = ipaddress.ip_network(f"{first}/24", strict=False)
        self.node_ips = sorted(node_ips.values())
        self.kv_text = ",".join(f"{node}={ip}:7000" for node, ip in node_ips.items())
        self._next = FIRST_HOST
        self._count = 0
        self.procs: list[ContainerProcess] = []
        self.tls_dir: Path | None = None  # --tls: the trainer's certificates (read-only)

    def coordinator_hosts(self) -> list[str]:
        """Every address a trainer container may get: what a coordinator certificate names."""
        return [str(self._network.network_address + i) for i in range(FIRST_HOST, LAST_HOST + 1)]

    def start(self, name: str, args: list[str], log_path: Path,
              extra_env: dict[str, str] | None) -> ContainerProcess:
        import docker.errors

        ip = str(self._network.network_address + self._next)
        self._next += 1
        if self._next > LAST_HOST:
            self._next = FIRST_HOST  # long runs reuse the addresses of exited processes
        if args and args[0] == "coordinator":
            args = [*args, "--listen", f"{ip}:{COORDINATOR_PORT}"]
        # The BLAS kernel too: the reference run is computed here, in the harness.
        env = {"PYTHONUNBUFFERED": "1", **{v: "1" for v in BLAS_THREAD_VARIABLES},
               **blas_kernel_env(), **(extra_env or {})}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        script = f'exec python3 -m system.trainer "$@" >> {shlex.quote(str(log_path))} 2>&1'
        self._count += 1
        api = self.client.api
        container_name = f"{self.platform.prefix}-{name}-{self._count}"
        host_config = api.create_host_config(
            cap_add=["NET_ADMIN"], network_mode=self.platform.network_name, init=True,
            binds={str(self.run_dir): {"bind": str(self.run_dir), "mode": "rw"},
                   **({str(self.tls_dir): {"bind": str(self.tls_dir), "mode": "ro"}}
                      if self.tls_dir is not None else {})})
        networking = api.create_networking_config(
            {self.platform.network_name: api.create_endpoint_config(ipv4_address=ip)})
        try:
            created = api.create_container(
                self.platform.image, command=["sh", "-c", script, "trainer", *args],
                name=container_name, hostname=name, labels=self.platform.labels("trainer", name),
                environment=env, host_config=host_config, networking_config=networking,
                detach=True)
            container = self.client.containers.get(created["Id"])
            container.start()
        except docker.errors.APIError as exc:
            raise RuntimeError(f"could not start the trainer container {container_name}: "
                               f"{' '.join(str(exc).split())[:300]}") from None
        proc = ContainerProcess(container, name, ip)
        self.procs.append(proc)
        return proc

    # ----- faults ----------------------------------------------------------------------

    def kill(self, proc: ContainerProcess) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.APIError):
            proc.container.kill()
        proc._polled_at = 0.0
        proc.wait(timeout=20)

    def pause(self, proc: ContainerProcess) -> None:
        proc.container.pause()

    def resume(self, proc: ContainerProcess) -> None:
        """Unfreeze the container if frozen, and continue a process that stopped itself."""
        import docker.errors

        with contextlib.suppress(docker.errors.APIError):
            proc.container.reload()
            if proc.container.attrs["State"].get("Paused"):
                proc.container.unpause()
        self._exec(proc, "pkill -CONT -f '^python3 -m system.trainer'")

    def is_stopped(self, proc: ContainerProcess) -> bool:
        code, output = self._exec(proc, "grep -l 'State:.*stopped' /proc/[0-9]*/status")
        return code == 0 and bool(output.strip())

    def _rules_script(self, mode: str) -> str:
        """Shell that makes the chain MAO hold the rules of `mode`: "forward" (none), "cut"
        (nothing to or from the store's nodes), "drop-replies" (requests reach the nodes,
        their answers are dropped). nf_tables iptables, else the legacy backend."""
        rules = []
        for ip in self.node_ips:
            if mode in ("cut", "drop-replies"):
                rules.append(f"-A MAO -s {ip}/32 -j DROP")
            if mode == "cut":
                rules.append(f"-A MAO -d {ip}/32 -j DROP")
        restore = shlex.quote("\n".join(["*filter", ":MAO - [0:0]", *rules, "COMMIT", ""]))
        return (f"{{ printf %s {restore} | iptables-restore --noflush 2>/dev/null && ipt=iptables "
                f"|| {{ printf %s {restore} | iptables-legacy-restore --noflush && "
                f"ipt=iptables-legacy; }}; }} && "
                f"{{ $ipt -C INPUT -j MAO 2>/dev/null || $ipt -I INPUT 1 -j MAO; }} && "
                f"{{ $ipt -C OUTPUT -j MAO 2>/dev/null || $ipt -I OUTPUT 1 -j MAO; }}")

    def set_rules(self, proc: ContainerProcess, mode: str) -> None:
        if proc.poll() is not None:
            return  # exited: its network namespace, rules included, is gone
        code, output = self._exec(proc, self._rules_script(mode))
        if code != 0:
            raise RuntimeError(f"iptables in {proc.name}'s container failed: {output.strip()[-300:]}")

    def withhold_replies_when_fired(self, proc: ContainerProcess, fired: Path,
                                    timeout_s: float) -> str:
        """Started BEFORE the pause point is armed (an exec costs a good part of a second on
        a loaded engine, and the stopped coordinator's lease runs meanwhile): inside the
        container, wait for `fired` (the bind-mounted run folder) and for the process to
        stop, drop the nodes' answers, continue it. Returns "" or what went wrong (exit 4:
        the arming was never taken, nothing done)."""
        ticks = int(timeout_s * 100)
        script = (f"i=0; until [ -e {shlex.quote(str(fired))} ]; do i=$((i+1)); "
                  f"[ $i -gt {ticks} ] && exit 4; sleep 0.01; done; "
                  "i=0; until grep -qs 'State:.*stopped' /proc/[0-9]*/status; do i=$((i+1)); "
                  "[ $i -gt 200 ] && exit 3; sleep 0.01; done; "
                  + self._rules_script("drop-replies")
                  + " && pkill -CONT -f '^python3 -m system.trainer'")
        code, output = self._exec(proc, script)
        if code in (0, 4):
            return "" if code == 0 else "not fired"
        self.resume(proc)  # never leave it stopped
        return f"withholding {proc.name}'s answers failed (exit {code}): {output.strip()[-300:]}"

    def reset(self, proc: ContainerProcess) -> bool:
        """Close every connection of the container to the store's nodes (True if done)."""
        script = " && ".join(f"ss -K dst {ip}" for ip in self.node_ips)
        return self._exec(proc, script)[0] == 0

    def _exec(self, proc: ContainerProcess, script: str) -> tuple[int, str]:
        import docker.errors

        try:
            result = proc.container.exec_run(["sh", "-c", script], demux=False)
        except docker.errors.APIError as exc:
            return 1, " ".join(str(exc).split())
        return result.exit_code, (result.output or b"").decode(errors="replace")

    def close(self) -> None:
        import docker.errors

        for proc in self.procs:
            with contextlib.suppress(docker.errors.APIError):
                proc.container.remove(force=True)
            proc.returncode = proc.returncode if proc.returncode is not None else -9
