"""Workload `trainer`: the data-parallel trainer (system/trainer) on the run's store, under faults.

The platform runs the store's nodes; this workload starts two or more coordinators (one
takes the lease, the others stand by) and the workers, through `TrainerRun`
(system/trainer/run.py), on the same platform. Locally they are processes, and each
coordinator reaches every store node through its own TCP proxy owned by the workload, so
the nemesis can cut one coordinator off the store (a real partition of that process from
every node, without root) while the nodes keep talking to each other. On Docker they are
containers on the run's network (workloads/trainer_docker.py) and the same faults are
`docker kill` / `docker pause` / iptables rules in the coordinator's namespace.

The nemesis draws from these processes beside the store's nodes (`ProcessTargets`):

| role | what it names |
|---|---|
| `coordinator` | the coordinator holding the lease now |
| `standby` | a coordinator not holding it |
| `worker` | a random worker |
| `coordinator-mid-write` | the active coordinator, stopped at its next checkpoint write |

kill = SIGKILL of the process group (healed by starting a replacement: a worker under its
index, a coordinator under a new id, as a standby — its old id is retired with its term);
pause = SIGSTOP/SIGCONT; partition `coordinator-from-store` = cut that coordinator's
proxies (existing connections closed, new ones refused) until the heal.

Faults that land inside a checkpoint write. A pause or a crash from outside almost never
falls between the coordinator's last lease check and its head CAS (well under a
millisecond of a checkpoint cycle), nor does a lost answer fall on the CAS, yet those are
the moments the fences exist for (a GC pause right before a write; a connection reset
after the store committed). Every coordinator is started with a pause point it can be
armed at (system/trainer/pause_points.py, `TRAINER_PAUSE_ARM_FILE`): the fault arms it, the
coordinator stops itself (SIGSTOP) after placing the blob and checking its lease, right
before the head CAS, and records a `paused-at` event; then
- pause `coordinator-mid-write`: it stays stopped until its lease record names another
  coordinator (a standby took over), then SIGCONT: its CAS is now a deposed writer's (if
  no standby takes over within four leases and 5 s, it is woken anyway and the resume
  record's `detail` says so, with every coordinator's state);
- kill `coordinator-mid-write`: SIGKILL there (blob placed, head not written);
- partition `coordinator-reply-lost`: its proxies forward requests but drop the store's
  answers, it is continued, and once the head has moved (its CAS committed) every one of
  its store connections is reset and forwarding resumes: the answer is lost, the write
  is retried over a new connection (the same request id must return the first result).
A write that does not come within 5 s is disarmed (the kill and pause then hit the
coordinator wherever it is; the history's `paused-at` events say where each one landed).
During a takeover these faults wait (two leases at most) for the successor to be active.

Windows (`target_windows`, `window_fault`; the nemesis sends its kills, pauses and
partitions there first, docs/nemesis.md): `checkpoint-write` (the pause point above),
`lease-renewal` (`inside-lease-renewal`: after the renewal's invoke, before its CAS) and
`takeover` (`after-lease-take`, armed in every standby: the holder is hurt, and the standby
that takes the lease stops before reading the head; then it is hurt the same way).

History (docs/histories.md). Every coordinator appends events to its event log
(`trainer/events-<id>.jsonl` in the run folder); a pump thread turns them into records in
`history.jsonl`, each batch in the coordinators' own time order:

- a checkpoint write is a client operation of the coordinator's integer process
  (`101` for c1, `102` for c2, ...; after an `info` a coordinator that writes again — only
  a canary does — continues under a fresh process id from 1001): `invoke` (f `checkpoint`, key = the head key, value =
  the step, `expected_version` = the head version it CASes on), then `ok` (`version` = the
  head's new version), `fail` (`error` cas-mismatch / not-sent; certainly not applied) or
  `info` (outcome unknown; the coordinator steps down and never writes again). Every record
  carries `step`, `request_id`, `lease_version` and `coordinator`.
- lease reads and writes (f `lease-read`, `lease-write`: take or renew, with the expected
  version, absent for a write that compares nothing, and the term), head reads (f
  `head-read`) and the takeover's head rewrite (f `resume`) are client operations too, each
  kind of a coordinator on its own process (`CHANNELS`: a coordinator runs several threads,
  a history process one operation at a time).
- lease acquisitions and losses, resumes (which checkpoint, which step, the head version
  it produced), skipped worker steps, retries, depositions, starts and ends are events of
  process `"trainer"`, f = the event's kind, value = the event.

`start` returns once a coordinator holds the lease (within 60 s), so the run's duration
and its fault schedule count from a running trainer. Before the final read, a coordinator
that held the lease when paused and was woken after a takeover is given (bounded) time to
exit on its own, so its step-down, or a canary's late write, is in the history.

The final read (process 100, f `read-checkpoint`) reads the head by a linearizable read
after every trainer process is stopped: step, head version, the SHA-256 of the
parameters and momentum, and the head's chain of earlier records (request id, version,
step, lease version of each), which checker/trainer.py uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import random
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from nemesis.platforms.tcp_proxy import ProxyMode, TcpProxy
from system.kv.client import ATTEMPT_TIMEOUT_S, KVClient, KVError
from system.kv.tls import TlsFiles
from system.trainer import certs
from system.trainer import checkpoint as codec
from system.trainer.checkpoint_store import head_key
from system.trainer.config import TrainConfig
from system.trainer.lease import lease_key
from system.trainer.run import TrainerRun
from workloads.base import RunContext, Workload, WorkloadError
from workloads.trainer_docker import DockerTrainerProcesses

log = logging.getLogger("nemesis")

MID_WRITE = "coordinator-mid-write"
ROLES = ("coordinator", "standby", "worker", MID_WRITE)
ARM_POINT = "before-head-cas"  # the pause point a mid-write fault arms (pause_points.py)
RENEW_POINT = "inside-lease-renewal"  # after the renewal's invoke, before its CAS
TAKE_POINT = "after-lease-take"  # a successor after its take, before it reads the head
# Where the nemesis times faults (`window_fault`): inside a checkpoint write, inside a lease
# renewal, during a takeover (the old holder lost, the successor not yet resumed).
WINDOWS = ("checkpoint-write", "lease-renewal", "takeover")
REACH_POINT_S = 5.0  # how long an armed coordinator is given to reach its next write
COMMIT_WAIT_S = 3.0  # reply-lost: how long the answer is held back waiting for the commit
READ_PROCESS = 100
PUMP_PERIOD_S = 0.1
START_TIMEOUT_S = 60.0  # from the processes' start to a coordinator holding the lease
# Events of the coordinator's log that become history events (the rest — per-step
# progress, rejected gradients — stay in the event logs only).
EVENT_KINDS = {"started", "lease-acquired", "lease-lost", "lease-observe-failed", "resume",
               "checkpoint-retry", "skip", "worker-back", "deposed", "done", "error",
               "job-finished", "paused-at", "holder-gone"}


def default_config(seed: int) -> TrainConfig:
    """Small enough that a step costs milliseconds on a loaded 2-core machine; steps far
    more than a run reaches, so training goes on for the whole run (the checker compares
    the final checkpoint with the fault-free run at the same step)."""
    return TrainConfig(dataset="breast_cancer", workers=2, steps=1_000_000, batch_size=16,
                       learning_rate=0.05, momentum=0.9, l2=1e-4, seed=seed,
                       checkpoint_every=20, job="nemesis")


# A coordinator runs several threads (checkpoint writer, lease renewer, main loop), and a
# history process has one operation in flight at a time: each kind of operation of one
# coordinator has its own process, `<channel base> + <coordinator number>` (c1: checkpoint
# writes 101, lease writes 2101, the takeover's head rewrite 3101, reads 4101).
CHANNELS = {"checkpoint": 100, "lease": 2100, "resume": 3100, "read": 4100}


def coordinator_process(cid: str, channel: str = "checkpoint") -> int:
    """c1-xxxx -> 101: a coordinator's integer process in the history (per channel)."""
    match = re.match(r"c(\d+)-", cid)
    return CHANNELS[channel] + (int(match.group(1)) if match else 99)


def make_trainer_tls(store_client: TlsFiles, workers: int, coordinator_hosts: list[str]
                     ) -> certs.TrainerTls:
    """--tls: the trainer's certificates (system/trainer/certs.py: a coordinator
    certificate every coordinator presents, one per worker, the run's own) from a CA of
    their own, in `trainer/` of the run's temporary certificate directory (never the run
    folder), and a copy of the store's client certificate, which every trainer process
    presents to the store (`--kv-cert-file ...`). The trainer CA's key is deleted once they
    are made: a restarted process reuses its name's certificate, so nothing else is signed,
    and on Docker this directory is what the trainer containers see."""
    directory = store_client.cert.parent / "trainer"
    made = certs.generate(directory, workers, coordinator_hosts=coordinator_hosts)
    (directory / "ca.key").unlink()
    kv = TlsFiles(directory / "kv-client.crt", directory / "kv-client.key", directory / "kv-ca.crt")
    for source, target in zip((store_client.cert, store_client.key, store_client.ca),
                              (kv.cert, kv.key, kv.ca), strict=True):
        shutil.copy2(source, target)  # the key keeps its 0600
    return certs.TrainerTls(directory=made.directory, kv=kv)


class _Run(TrainerRun):
    """TrainerRun whose coordinators reach the store through proxies the workload can cut;
    on the Docker platform (`containers`), whose processes are containers on the run's
    network, cut by iptables in their own namespace (workloads/trainer_docker.py)."""

    def __init__(self, *args: Any, nodes: dict[str, str],
                 containers: DockerTrainerProcesses | None = None, **kw: Any) -> None:
        super().__init__(*args, kv=dict(nodes), **kw)  # type: ignore[arg-type] - id -> address
        self.nodes = nodes
        self.containers = containers
        self.proxies: dict[str, list[TcpProxy]] = {}

    def spawn_process(self, name: str, args: list[str], log_path: Path,
                      extra_env: dict[str, str] | None = None) -> Any:
        if self.containers is not None:
            return self.containers.start(name, args, log_path, extra_env)
        return super().spawn_process(name, args, log_path, extra_env)

    def worker_kv(self) -> str:
        return self.containers.kv_text if self.containers is not None else super().worker_kv()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        if self.containers is None:
            return super().kill(name, sig)
        self.containers.kill(self.procs[name])

    def pause(self, name: str) -> None:
        if self.containers is None:
            return super().pause(name)
        self.containers.pause(self.procs[name])

    def resume(self, name: str) -> None:
        if self.containers is None:
            return super().resume(name)
        self.containers.resume(self.procs[name])

    def is_stopped(self, name: str) -> bool:
        """Whether the process is stopped (SIGSTOP): state T."""
        if self.containers is not None:
            return self.containers.is_stopped(self.procs[name])
        try:
            stat = Path(f"/proc/{self.procs[name].pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def withhold_replies_and_continue(self, cid: str) -> None:
        """`cid`, stopped at its pause point: drop the store's answers to it, continue it
        (local; on Docker `DockerTrainerProcesses.withhold_replies_when_fired`)."""
        self.set_store_link(cid, ProxyMode.DROP_REPLIES)
        self.resume(cid)

    def set_store_link(self, cid: str, mode: ProxyMode) -> None:
        """FORWARD, CUT (nothing either way) or DROP_REPLIES between `cid` and every node."""
        if self.containers is not None:
            self.containers.set_rules(self.procs[cid], mode.value)
            return
        for proxy in self.proxies.get(cid, []):
            proxy.set_mode(mode)

    def reset_store_connections(self, cid: str) -> str:
        """Close `cid`'s open connections to the store (what they carried is lost); says how."""
        if self.containers is not None:
            if self.containers.reset(self.procs[cid]):
                return "connections killed (ss -K)"
            # No socket killing in this kernel: keep the answers dropped past the client's
            # attempt timeout instead, which fails the attempt the same way.
            time.sleep(ATTEMPT_TIMEOUT_S + 0.2)
            return f"answers dropped {ATTEMPT_TIMEOUT_S + 0.2:g} s more (no ss -K here)"
        for proxy in self.proxies.get(cid, []):
            mode = proxy.mode
            proxy.set_mode(ProxyMode.CUT)  # closes every connection
            proxy.set_mode(mode)
        return "connections reset (proxies)"

    def close(self) -> None:
        if self.containers is not None:
            self.containers.close()
        super().close()

    def coordinator_kv(self, cid: str) -> str:
        if self.containers is not None:
            return self.containers.kv_text
        # By node id: a follower's hint must lead through this coordinator's proxy to the
        # leader, not to the leader's own address (which would bypass a cut).
        proxies = {node: TcpProxy(address) for node, address in self.nodes.items()}
        self.proxies[cid] = list(proxies.values())
        return ",".join(f"{node}={p.address}" for node, p in proxies.items())

    def arm_file(self, cid: str) -> Path:
        return self.run_dir / f"arm-{cid}"

    def coordinator_env_for(self, cid: str) -> dict[str, str]:
        # The pause point of the mid-write faults: inert until the harness arms the file.
        return {"TRAINER_PAUSE_ARM_FILE": str(self.arm_file(cid)), "MAO_ALLOW_UNSAFE": "1"}

    def close_proxies(self) -> None:
        for proxies in self.proxies.values():
            for proxy in proxies:
                with contextlib.suppress(Exception):
                    proxy.close()


class TrainerWorkload(Workload):
    name = "trainer"
    model = "trainer"

    def __init__(self, *, standbys: int = 1, lease_s: float = 2.0,
                 gradient_deadline_s: float = 5.0, unsafe: str | None = None,
                 config: TrainConfig | None = None, seed: int = 0,
                 system: Any = None) -> None:
        super().__init__()
        # The trainer keeps its state in our store (system/trainer): it runs on that system
        # only, and reaches it through the store's System (nemesis/systems/store.py).
        if system is None:
            from nemesis.systems.store import StoreSystem

            system = StoreSystem()
        if not hasattr(system, "kv_client_class"):
            raise ValueError(f"the trainer workload needs our store (--system store); "
                             f"it cannot run on {system.name}")
        self.system = system
        self.counts.note("depositions", 0)  # on the progress line from the start
        self.counts.note("skipped gradients", 0)
        if standbys < 1:
            raise ValueError("the trainer workload needs at least one standby coordinator")
        self.standbys, self.lease_s, self.gradient_deadline_s = standbys, lease_s, gradient_deadline_s
        self.unsafe = unsafe or ""
        self.config = config or default_config(seed)
        self.run: _Run | None = None
        self.harness_errors: list[str] = []
        self._lock = threading.RLock()  # TrainerRun's process table: supervisor vs nemesis
        self._stop = threading.Event()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._offsets: dict[Path, int] = {}
        # (coordinator, channel) -> index of its open invoke
        self._open: dict[tuple[str, str], int] = {}
        # (coordinator, channel) -> its history process now; after an `info` it retires and
        # the next operation on that channel gets a fresh process id.
        self._process: dict[tuple[str, str], int] = {}
        self._fresh = itertools.count(1001)
        self._rng = random.Random(0)
        self._ctx: RunContext | None = None
        self.paused: set[str] = set()
        self.down: set[str] = set()
        self.cut: set[str] = set()
        # Coordinators woken after a successor took their lease: what they do next (step
        # down, or a canary's write) must reach the history before the trainer is stopped.
        self._woken_deposed: set[str] = set()
        self._paused_holders: set[str] = set()  # paused while holding the lease

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "config": json.loads(self.config.to_json()),
                "standbys": self.standbys, "lease_s": self.lease_s,
                "gradient_deadline_s": self.gradient_deadline_s, "unsafe": self.unsafe or None}

    # ----- life ------------------------------------------------------------------------

    def start(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._rng = random.Random(f"trainer-targets:{ctx.seed}")
        run_dir = Path(ctx.history.path).parent / "trainer"
        run_dir.mkdir(parents=True, exist_ok=True)
        containers = None
        trainer_tls = None
        if getattr(ctx.platform, "name", "") == "docker":  # the processes run where the nodes do
            containers = DockerTrainerProcesses(ctx.platform, run_dir.resolve())
        if ctx.tls is not None:
            trainer_tls = make_trainer_tls(ctx.tls, self.config.workers,
                                           containers.coordinator_hosts() if containers else [])
            if containers is not None:
                containers.tls_dir = trainer_tls.directory
        self.run = _Run(self.config, standbys=self.standbys, nodes=dict(ctx.addresses),
                        containers=containers, run_dir=run_dir.resolve(), lease_s=self.lease_s,
                        gradient_deadline_s=self.gradient_deadline_s, tls=trainer_tls)
        if self.unsafe:
            self.run.coordinator_args = ["--unsafe", self.unsafe]
            self.run.coordinator_env = {"MAO_ALLOW_UNSAFE": "1"}
        with self._lock:
            self.run.start()
        for target, name in ((self._supervise, "trainer-supervisor"), (self._pump, "trainer-events")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._wait_running()

    def _wait_running(self) -> None:
        """Return once a coordinator holds the lease: a fault dealt before that (the processes
        still importing numpy and gRPC on a loaded machine) finds no coordinator to hurt, and
        a short run's schedule would be spent on nothing."""
        assert self.run is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.run.active_coordinator() is None:
            refused = self.run.config_error()
            if refused:
                raise WorkloadError(f"the trainer coordinator refused to start: {refused}")
            if time.monotonic() >= deadline:
                raise WorkloadError(
                    f"no trainer coordinator took the lease within {START_TIMEOUT_S:g} s of "
                    f"starting; the coordinators' logs: {self.run.run_dir}/c*.log")
            time.sleep(0.1)  # polling the lease record, bounded by the deadline

    def _supervise(self) -> None:
        assert self.run is not None
        while not self._stop.wait(0.2):
            with self._lock:
                try:
                    self.run.supervise()
                except Exception as exc:  # noqa: BLE001 - keep supervising; say why
                    self._error(f"supervise: {type(exc).__name__}: {exc}")

    def _error(self, text: str) -> None:
        log.warning("trainer workload: %s", text)
        if len(self.harness_errors) < 100:
            self.harness_errors.append(text)

    def join(self, timeout_s: float) -> bool:
        """Training goes on until the final read stops it; nothing to wait for here."""
        return True

    def stop_trainer(self) -> None:
        """SIGKILL every coordinator and worker (expected), then record their last events."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.run is not None:
            with self._lock:
                self.run.expected_exit.update(self.run.procs)
                self.run.close()  # SIGKILLs every process group; the run folder stays
                self.run.close_proxies()
            self._pump_once()

    def close(self) -> None:
        """Teardown path (also after a failure): nothing of ours may outlive the run."""
        if self.run is not None:
            with contextlib.suppress(Exception):
                self.stop_trainer()

    # ----- events -> history -----------------------------------------------------------

    def _pump(self) -> None:
        while not self._stop.wait(PUMP_PERIOD_S):
            try:
                self._pump_once()
            except Exception as exc:  # noqa: BLE001
                self._error(f"event pump: {type(exc).__name__}: {exc}")

    def _pump_once(self) -> None:
        assert self.run is not None and self._ctx is not None
        batch: list[dict] = []
        for path in sorted(self.run.run_dir.glob("events-*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next round
            self._offsets[path] = offset + end
            for line in chunk[:end].splitlines():
                if line.strip():
                    batch.append(json.loads(line))
        batch.sort(key=lambda e: e.get("time", 0.0))
        with self._lock:
            for event in batch:
                self._record(self._ctx, event)

    def _invoke(self, ctx: RunContext, cid: str, channel: str, f: str, key: str, value: Any,
                **fields: Any) -> None:
        slot = (cid, channel)
        if slot in self._open:  # cannot happen (one at a time per channel); keep it valid
            ctx.history.complete(self._open.pop(slot), "info", None, error="superseded invoke")
            self._process[slot] = next(self._fresh)
        process = self._process.setdefault(slot, coordinator_process(cid, channel))
        self._open[slot] = ctx.history.invoke(process, f, key, value, **fields)

    def _complete(self, ctx: RunContext, cid: str, channel: str, outcome: str, value: Any,
                  **fields: Any) -> bool:
        index = self._open.pop((cid, channel), None)
        if index is None:
            return False
        ctx.history.complete(index, outcome, value, **fields)
        if outcome == "info":
            self._process[(cid, channel)] = next(self._fresh)
        return True

    def _read(self, ctx: RunContext, cid: str, f: str, key: str, value: Any, **fields: Any) -> None:
        """A read, recorded as an operation that completed at once (its position in the
        history is when the coordinator had its answer)."""
        self._invoke(ctx, cid, "read", f, key, None, coordinator=cid)
        self._complete(ctx, cid, "read", "ok", value, coordinator=cid, **fields)

    def _record(self, ctx: RunContext, e: dict) -> None:
        history = ctx.history
        cid = e.get("coordinator_id", "")
        kind = e.get("kind", "")
        common = {"step": e.get("step"), "request_id": e.get("request_id") or None,
                  "lease_version": e.get("lease_version"), "coordinator": cid}
        key = head_key(self.config.job)
        lease = lease_key(self.config.job)
        if kind == "checkpoint-invoke":
            # A canary's blind write compares nothing: no expected version in the history.
            expected = e.get("version") if e.get("cas", True) else None
            self._invoke(ctx, cid, "checkpoint", "checkpoint", key, e.get("step"),
                         expected_version=expected, **common)
            return
        if kind in ("checkpoint-ok", "checkpoint-fail", "checkpoint-info"):
            outcome = kind.removeprefix("checkpoint-")
            extra: dict[str, Any] = dict(common)
            if outcome == "ok":
                extra["applied"] = True
            else:
                extra["error"] = e.get("outcome") or outcome
            if not self._complete(ctx, cid, "checkpoint", outcome, e.get("step"),
                                  version=e.get("version"), **extra):
                self._error(f"{cid}: {kind} of step {e.get('step')} without an invoke")
                return
            self.counts.add("checkpoint", outcome)
            return
        if kind == "lease-read":
            self._read(ctx, cid, "lease-read", lease, e.get("holder"), version=e.get("version"),
                       lease_version=e.get("lease_version"))
            return
        if kind == "head-read":
            self._read(ctx, cid, "head-read", key, e.get("step"), version=e.get("version"),
                       lease_version=e.get("lease_version"), request_id=e.get("request_id"))
            return
        if kind == "lease-write":
            phase = e.get("phase")
            fields = {"request_id": e.get("request_id"), "lease_version": e.get("lease_version"),
                      "coordinator": cid, "op": e.get("detail")}
            if phase == "invoke":
                self._invoke(ctx, cid, "lease", "lease-write", lease, e.get("lease_version"),
                             expected_version=e.get("expected_version"), **fields)
            elif phase == "ok":
                self._complete(ctx, cid, "lease", "ok", e.get("lease_version"),
                               version=e.get("version"), **fields)
            else:
                self._complete(ctx, cid, "lease", phase, e.get("lease_version"),
                               error=e.get("outcome") or phase, **fields)
            return
        if kind == "resume-invoke":
            self._invoke(ctx, cid, "resume", "resume", key, e.get("step"),
                         expected_version=e.get("expected_version"),
                         from_version=e.get("from_version"), from_step=e.get("from_step"), **common)
            return
        if kind == "resume":
            outcome = "ok" if e.get("outcome") == "ok" else "fail"
            if outcome == "fail" and e.get("error") == "indeterminate":
                outcome = "info"
            extra = {"version": e.get("version")} if outcome == "ok" else {"error": e.get("error") or "fail"}
            self._complete(ctx, cid, "resume", outcome, e.get("step"), **extra, **common)
        if kind in EVENT_KINDS:
            value = {k: v for k, v in e.items() if k not in ("kind",)}
            value["wall_time"] = value.pop("time", None)
            history.event("trainer", kind, value)
            if kind == "lease-lost":
                # A coordinator deposed: an event of the protocol, not a failed operation
                # (its refused lease write is already in the history as one).
                self.counts.note("depositions")
            elif kind == "skip":
                # A worker's gradient missing from a step: an event, not an operation that
                # succeeded (it was counted as `ok`); the step went on without it.
                self.counts.note("skipped gradients")
            elif kind in ("resume", "lease-acquired"):
                self.counts.add(kind, "ok" if e.get("outcome", "ok") in ("ok", "missing") else "fail")

    # ----- targets for the nemesis (ProcessTargets) -------------------------------------

    def target_roles(self) -> tuple[str, ...]:
        return ROLES

    def resolve(self, role: str) -> str | None:
        """The process a role names now (None if there is none to hurt). A mid-write role
        names `<coordinator>@<point>`: the fault is to land at that point."""
        if self.run is None:
            return None
        with self._lock:
            alive = [n for n, p in self.run.procs.items() if p.poll() is None and n not in self.down]
        coordinators = [n for n in alive if n.startswith("c")]
        if role in ("coordinator", "standby", MID_WRITE):
            active = self.run.active_coordinator()
            if role == "coordinator":
                return active if active in coordinators else None
            if role == MID_WRITE:
                live = self._live_active()
                return f"{live}@{ARM_POINT}" if live else None
            standbys = sorted(n for n in coordinators if n != active and n not in self.paused)
            return self._rng.choice(standbys) if standbys else None
        if role == "worker":
            workers = sorted(n for n in alive if n.startswith("w") and n not in self.paused)
            return self._rng.choice(workers) if workers else None
        raise ValueError(f"unknown trainer target role {role!r}; known: {', '.join(ROLES)}")

    # ----- faults inside a checkpoint write ----------------------------------------------

    def _stop_at_write(self, cid: str, wait_stopped: bool = True, point: str = ARM_POINT,
                       reach_s: float = REACH_POINT_S) -> int | None:
        """Arm `cid`'s pause point and wait until it has taken the arming (and, with
        `wait_stopped`, has stopped itself there): the step (or term) it stopped at, or None
        (disarmed) when it did not reach the point in time."""
        self._arm(cid, point)
        return self._await_arming(cid, reach_s, wait_stopped)

    def _arm(self, cid: str, point: str) -> None:
        assert self.run is not None
        arm = self.run.arm_file(cid)
        Path(f"{arm}.fired").unlink(missing_ok=True)
        staging = Path(f"{arm}.new")
        staging.write_text(point)
        staging.replace(arm)  # atomic: the coordinator never reads half a file

    def _disarm(self, cid: str) -> bool:
        """True when the arming was withdrawn before the coordinator took it."""
        assert self.run is not None
        arm = self.run.arm_file(cid)
        try:
            arm.replace(Path(f"{arm}.disarmed"))
            return True
        except FileNotFoundError:
            return False  # taken just now

    def _fired(self, cid: str) -> bool:
        assert self.run is not None
        return Path(f"{self.run.arm_file(cid)}.fired").exists()

    def _await_arming(self, cid: str, reach_s: float, wait_stopped: bool) -> int | None:
        assert self.run is not None
        arm = self.run.arm_file(cid)
        deadline = time.monotonic() + reach_s
        while time.monotonic() < deadline and not self._fired(cid):
            if self.run.procs[cid].poll() is not None or self._stop.is_set():
                break
            time.sleep(0.01)  # polling a file the coordinator renames; bounded above
        if not self._fired(cid) and self._disarm(cid):
            return None  # never taken: it will not stop
        step = int(Path(f"{arm}.step").read_text())  # written before the arming was taken
        if not wait_stopped:
            return step
        deadline = time.monotonic() + 2.0  # from the rename to its SIGSTOP: microseconds
        while time.monotonic() < deadline:
            if self.run.is_stopped(cid):
                return step
            if self.run.procs[cid].poll() is not None:
                return None
            time.sleep(0.005)
        return None

    # ----- faults timed into the trainer's windows ----------------------------------------

    def target_windows(self) -> tuple[str, ...]:
        return WINDOWS

    def window_fault(self, window: str, kind: str) -> dict[str, Any] | None:
        """Start a fault of `kind` (kill, pause or partition) timed into `window` (see the
        module docstring). Returns None when there is nothing to hurt now, else `processes`,
        `landed` (whether it fell inside the window), `detail` and `heal`."""
        if self.run is None or self._stop.is_set():
            return None
        if window == "takeover":
            return self._takeover_fault(kind)
        cid = self._live_active()
        if cid is None:
            return None
        if window == "checkpoint-write" and kind == "partition":
            value = self.lose_reply(cid)
            return {"processes": [value["process"]], "landed": value["landed"],
                    "at": value.get("step"), "detail": value["detail"], "heal": dict}
        point = ARM_POINT if window == "checkpoint-write" else RENEW_POINT
        # Even a kill waits for the stop: its `paused-at` event is then in the log, and the
        # history shows the fault inside the operation (checker/trainer_protocol.windows).
        at = self._stop_at_write(cid, wait_stopped=True, point=point)
        landed = at is not None
        where = f"at {point} ({'step' if point == ARM_POINT else 'term'} {at})" if landed else \
            f"{point} not reached within {REACH_POINT_S:g} s: wherever it was"
        return {"processes": [cid], "landed": landed, "at": at,
                "detail": f"{kind} {cid} {where}", "heal": self._hurt(cid, kind, stopped=landed,
                                                                       point=point if landed else "")}

    def _hurt(self, cid: str, kind: str, stopped: bool, point: str = "") -> Any:
        """Apply `kind` to `cid` (stopped at a pause point, or not); returns its heal."""
        assert self.run is not None
        if kind == "kill":
            with self._lock:
                self.run.expected_exit.add(cid)
                self.down.add(cid)
                self.paused.discard(cid)
                with contextlib.suppress(ProcessLookupError):  # it exited on its own just now
                    self.run.kill(cid)
            return lambda: {"replacement": self.restart_target(cid)}
        if kind == "pause":
            with self._lock:
                if not stopped:
                    self.run.pause(cid)
            record = self.run.lease()
            with self._lock:
                self.paused.add(cid)
                if record is not None and record.coordinator_id == cid:
                    self._paused_holders.add(cid)
            # Woken only after a standby took over (bounded), like a mid-write pause.
            name = f"{cid}@{point}" if point else cid
            return lambda: {"detail": self.resume_target(name) or ""}
        # partition: cut from every store node; a coordinator stopped at its point goes on,
        # so the operation it was about to send meets the cut.
        self.cut_from_store(cid)
        if stopped:
            with self._lock:
                self.run.resume(cid)

        def heal() -> dict[str, Any]:
            self.heal_from_store(cid)
            return {}
        return heal

    def _takeover_fault(self, kind: str) -> dict[str, Any] | None:
        """The old holder is lost (`kind` applied to it), then the successor is hurt the
        same way between taking the lease and resuming (stopped at `after-lease-take`)."""
        assert self.run is not None
        holder = self._live_active()
        if holder is None:
            return None
        with self._lock:
            standbys = sorted(n for n, p in self.run.procs.items()
                              if n.startswith("c") and n != holder and p.poll() is None
                              and n not in self.down and n not in self.paused)
        if not standbys:
            return None
        for cid in standbys:
            self._arm(cid, TAKE_POINT)
        heals = [self._hurt(holder, kind, stopped=False)]
        successor, term = None, None
        deadline = time.monotonic() + self._takeover_wait_s()
        while successor is None and time.monotonic() < deadline and not self._stop.is_set():
            successor = next((c for c in standbys if self._fired(c)), None)
            if successor is None:
                time.sleep(0.02)  # polling arm files, bounded by the deadline
        for cid in standbys:
            if cid != successor and not self._disarm(cid) and self._fired(cid):
                # Took an arming too (it cannot hold the lease as well): let it go on.
                with contextlib.suppress(Exception):
                    self._await_arming(cid, 0.0, wait_stopped=True)
                    self.run.resume(cid)
        if successor is not None:
            term = self._await_arming(successor, 0.0, wait_stopped=True)
        landed = term is not None
        if landed:
            assert successor is not None
            # No other coordinator can take over while both are hurt: a paused successor
            # is woken at the heal without waiting for one.
            heals.append(self._hurt(successor, kind, stopped=True))
            detail = (f"{kind} {holder} (the holder), then {kind} {successor} at {TAKE_POINT} "
                      f"(term {term}), before its resume")
        else:
            detail = (f"{kind} {holder} (the holder); no standby reached {TAKE_POINT} within "
                      f"{self._takeover_wait_s():g} s")

        def heal() -> dict[str, Any]:
            out: dict[str, Any] = {}
            for h in heals:
                out.update({k: v for k, v in h().items() if v})
            return out
        return {"processes": [holder] + ([successor] if landed else []), "landed": landed,
                "at": term, "detail": detail, "heal": heal}

    def _live_active(self) -> str | None:
        """The coordinator holding the lease, alive and not paused; during a takeover (the
        record still names one that lapsed and exited) wait for its successor, at most two
        leases: a fault meant for the active coordinator's write needs one."""
        assert self.run is not None
        deadline = time.monotonic() + 2 * self.lease_s + 1.0
        while not self._stop.is_set():
            active = self.run.active_coordinator()
            with self._lock:
                proc = self.run.procs.get(active or "")
                if (proc is not None and proc.poll() is None and active not in self.down
                        and active not in self.paused):
                    return active
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)  # polling the lease record, bounded by the deadline
        return None

    def _takeover_wait_s(self) -> float:
        return 4 * self.lease_s + 5.0

    def _wait_takeover(self, cid: str) -> bool:
        """Wait (bounded) until the lease record names a coordinator other than `cid`."""
        assert self.run is not None
        deadline = time.monotonic() + self._takeover_wait_s()
        while time.monotonic() < deadline and not self._stop.is_set():
            record = self.run.lease()
            if record is not None and (record.coordinator_id != cid or record.done):
                return True
            time.sleep(0.05)
        return False

    def lose_reply(self, cid: str) -> dict[str, Any]:
        """Partition `coordinator-reply-lost`: the answer to the active coordinator's next
        head CAS is lost after the store committed it (see the module docstring). `cid` is
        the one the nemesis resolved; if no write of its comes (it lapsed, a takeover is
        under way), the coordinator active by then is tried once. Returns what happened
        (`process`: the coordinator it landed on)."""
        assert self.run is not None
        value = self._lose_reply_once(cid)
        if not value["landed"]:
            successor = self._live_active()
            if successor is not None and successor != cid:
                value = self._lose_reply_once(successor)
        return value

    def _lose_reply_once(self, cid: str) -> dict[str, Any]:
        assert self.run is not None
        fired = Path(f"{self.run.arm_file(cid)}.fired")
        fired.unlink(missing_ok=True)
        helper, outcome = None, {"error": ""}
        if self.run.containers is not None:
            # On Docker the stop is awaited inside the container, by an exec started before
            # the arming, which then drops the answers and continues it (withhold_...).
            proc = self.run.procs[cid]
            helper = threading.Thread(target=lambda: outcome.update(
                error=self.run.containers.withhold_replies_when_fired(proc, fired, REACH_POINT_S + 2)),
                daemon=True)
            helper.start()
        step = self._stop_at_write(cid, wait_stopped=helper is None)
        if helper is not None:
            helper.join(timeout=REACH_POINT_S + 30)
        if step is None:
            return {"landed": False, "process": cid,
                    "detail": f"no checkpoint write of {cid} within {REACH_POINT_S:g} s"}
        if outcome["error"]:
            return {"landed": True, "process": cid, "step": step, "detail": outcome["error"]}
        request_id = f"{cid}:step-{step}"
        committed, reset = None, ""
        try:
            if helper is None:
                self.run.withhold_replies_and_continue(cid)
            deadline = time.monotonic() + COMMIT_WAIT_S
            while time.monotonic() < deadline:
                try:
                    got = self.run.kv.get(head_key(self.config.job))
                    if codec.decode_head(got.value)[0].request_id == request_id:
                        committed = got.version  # its write is the head: it committed
                        break
                except (KVError, codec.CheckpointError):
                    pass
                time.sleep(0.005)  # how late the reset may come after the commit
        finally:
            reset = self.run.reset_store_connections(cid)  # the answer withheld so far is gone
            self.run.set_store_link(cid, ProxyMode.FORWARD)
        return {"landed": True, "process": cid, "step": step, "committed_version": committed,
                "detail": (f"answer of {request_id}, committed at head version {committed}, "
                           f"dropped; {reset}" if committed else
                           f"{request_id} not committed within {COMMIT_WAIT_S:g} s; {reset}")}

    # ----- ProcessTargets --------------------------------------------------------------

    def kill_target(self, name: str) -> None:
        assert self.run is not None
        cid, _, point = name.partition("@")
        if point and cid in self.run.procs:
            self._stop_at_write(cid, wait_stopped=False)  # not reached: killed wherever it is
        with self._lock:
            self.run.expected_exit.add(cid)
            self.down.add(cid)
            self.paused.discard(cid)
            self.run.kill(cid)

    def restart_target(self, name: str) -> str:
        """Start a replacement for a killed process; returns what was started."""
        assert self.run is not None
        name = name.partition("@")[0]
        with self._lock:
            self.down.discard(name)
            if self._stop.is_set():
                return "trainer stopped"
            if name.startswith("w"):
                self.run.start_worker(int(name[1:]))
                return name
            return self.run.start_coordinator()

    def pause_target(self, name: str) -> None:
        assert self.run is not None
        cid, _, point = name.partition("@")
        if not (point and self._stop_at_write(cid) is not None):
            with self._lock:
                self.run.pause(cid)
        # Just stopped: the record still names it if it held the lease (workers hold none).
        record = self.run.lease() if cid.startswith("c") else None
        with self._lock:
            self.paused.add(cid)
            if record is not None and record.coordinator_id == cid:
                self._paused_holders.add(cid)

    def resume_target(self, name: str) -> str | None:
        """Continue a paused process; a coordinator paused inside its write is woken only
        after a standby took over (bounded). Returns a note when that takeover never came."""
        assert self.run is not None
        cid, _, point = name.partition("@")
        note = None
        if point and cid in self.paused and not self._wait_takeover(cid) and not self._stop.is_set():
            note = (f"no standby took the lease from {cid} within {self._takeover_wait_s():g} s; "
                    f"woken anyway ({self._coordinator_states()})")
            self._error(note)
        # Read outside the lock (a store call may take seconds), and only for a former holder.
        record = self.run.lease() if cid in self._paused_holders else None
        with self._lock:
            if cid in self.paused and self.run.procs[cid].poll() is None:
                self.run.resume(cid)
                # It held the lease when paused and another holds it now: it wakes deposed
                # (a paused standby wakes a standby, and stays one).
                if cid in self._paused_holders and record is not None and record.coordinator_id != cid:
                    self._woken_deposed.add(cid)  # final_reads lets it act before the stop
            self.paused.discard(cid)
            self._paused_holders.discard(cid)
        return note

    def _coordinator_states(self) -> str:
        """Each coordinator's state for a note: `c1 paused, c2 exited 3, c3 running`."""
        assert self.run is not None
        with self._lock:
            states = []
            for name, proc in sorted(self.run.procs.items()):
                if name.startswith("c"):
                    code = proc.poll()
                    state = ("paused" if name in self.paused else "running" if code is None
                             else f"exited {code}")
                    states.append(f"{name} {state}")
        record = self.run.lease()
        holder = f"; lease held by {record.coordinator_id}" if record is not None else ""
        return ", ".join(states) + holder

    def cut_from_store(self, name: str) -> None:
        assert self.run is not None
        self.run.set_store_link(name, ProxyMode.CUT)
        self.cut.add(name)

    def heal_from_store(self, name: str) -> None:
        assert self.run is not None
        self.run.set_store_link(name, ProxyMode.FORWARD)
        self.cut.discard(name)

    def heal_targets(self) -> list[str]:
        """Undo every process fault the nemesis may have left; returns what it did."""
        done = []
        for name in sorted(self.cut):
            self.heal_from_store(name)
            done.append(f"reconnected {name}")
        for name in sorted(self.paused):
            self.resume_target(name)
            done.append(f"resumed {name}")
        for name in sorted(self.down):
            done.append(f"replaced {name} by {self.restart_target(name)}")
        return done

    # ----- the end ---------------------------------------------------------------------

    def final_reads(self, ctx: RunContext, timeout_s: float) -> dict[str, Any]:
        """Stop the trainer, then read the checkpoint head (retried as new operations)."""
        self._let_woken_coordinators_exit()
        self.stop_trainer()
        for slot, index in list(self._open.items()):
            ctx.history.complete(index, "info", None, error="coordinator stopped with the write in flight")
            self._open.pop(slot)
        key = head_key(self.config.job)
        deadline = time.monotonic() + timeout_s
        client = self.system.kv_client_class()(list(ctx.addresses.values()), timeout_s=3.0,
                                               client_id="final-read", tls=ctx.tls)
        process = READ_PROCESS
        try:
            while True:
                index = ctx.history.invoke(process, "read-checkpoint", key, None,
                                           consistency="linearizable")
                try:
                    got = client.get(key)
                    meta, inline = codec.decode_head(got.value)
                    value = self._describe_head(client, meta, inline, got.version)
                    ctx.history.complete(index, "ok", value, version=got.version)
                    return {"checkpoint": {k: v for k, v in value.items() if k != "chain"}}
                except KVError as exc:
                    name = type(exc).__name__
                    if name == "NotFound":
                        ctx.history.complete(index, "ok", None, version=0)
                        return {"checkpoint": None}
                    ctx.history.complete(index, "fail", None, error=f"{name}: {str(exc)[:200]}")
                    if time.monotonic() >= deadline:
                        return {"checkpoint": None, "error": f"{name}: {str(exc)[:200]}"}
                    time.sleep(0.2)  # retry pacing, bounded by the deadline above
        finally:
            client.close()

    def _let_woken_coordinators_exit(self) -> None:
        """A coordinator woken by the final heal is still deciding what to do: stopping the
        trainer at once would cut off its step-down (or a broken one's late write) and the
        history would not show it. Wait, bounded, for each one to exit on its own."""
        assert self.run is not None
        # Its in-flight write gets max(5, 2 leases) to finish, then it exits.
        deadline = time.monotonic() + max(5.0, 2 * self.lease_s) + 3 * self.lease_s
        while time.monotonic() < deadline:
            with self._lock:
                waiting = [c for c in self._woken_deposed if self.run.procs[c].poll() is None]
            if not waiting:
                return
            time.sleep(0.1)  # polling process exits, bounded by the deadline
        self._error(f"woken deposed coordinator(s) {', '.join(sorted(waiting))} still running "
                    f"after the heal; stopped with the trainer")

    @staticmethod
    def _describe_head(client: KVClient, meta: codec.Metadata, inline: bytes | None,
                       version: int) -> dict[str, Any]:
        value: dict[str, Any] = {"step": meta.step, "request_id": meta.request_id,
                                 "lease_version": meta.lease_version,
                                 "coordinator": meta.coordinator_id, "kind": meta.kind,
                                 "checksum": meta.checksum, "done": meta.done}
        chain = [{k: e.get(k) for k in ("version", "request_id", "step", "lease_version",
                                        "coordinator_id", "kind")} for e in meta.history]
        chain.append({"version": version, "request_id": meta.request_id, "step": meta.step,
                      "lease_version": meta.lease_version, "coordinator_id": meta.coordinator_id,
                      "kind": meta.kind})
        value["chain"] = chain
        blob = inline
        if meta.chunks:
            blob = b"".join(client.get(k).value for k in meta.chunks)
        if blob:
            ckpt = codec.decode(blob, checksum=meta.checksum)
            value["params_sha256"] = params_digest(ckpt.params, ckpt.velocity)
        return value


def params_digest(params: Any, velocity: Any) -> str:
    """SHA-256 of the raw bytes of parameters then momentum (bit-for-bit comparison)."""
    h = hashlib.sha256()
    h.update(params.tobytes())
    h.update(velocity.tobytes())
    return "sha256:" + h.hexdigest()
