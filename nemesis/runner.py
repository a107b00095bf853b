"""One run of the main job: start a cluster, drive it under faults, heal, read back, check.

    platform.start -> wait for a leader -> workload + nemesis until the deadline
    -> stop clients -> heal everything -> wait for a leader -> final reads
    -> collect logs -> check the history -> results.json, summary, exit code

Whatever happens — a check failure, a harness bug, Ctrl-C, SIGTERM — the platform is torn
down in `finally` and open operations are recorded as `info`, so the history stays a valid
record of what was seen.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from histories.write import HistoryWriter
from nemesis import check, report, rollback, safety_reports, windows
from nemesis.faults import (
    FILE_FAULT_SNAPSHOT_ENTRIES,
    FILE_FAULTS,
    LAZY_DISK_FAULTS,
    REORDER_APPEND_ENTRIES,
    Nemesis,
)
from nemesis.platforms.base import ClusterConfig, Platform, PlatformError
from nemesis.progress import Progress
from nemesis.store import new_run_dir, source_version, write_json
from nemesis.systems import DEFAULT as DEFAULT_SYSTEM
from nemesis.systems import get_system
from nemesis.systems.base import System
from nemesis.tls_run import RunTls
from system.raft.unsafe import VARIANTS as CORE_VARIANTS
from workloads.base import ClientGate, ProcessTargets, RunContext, Workload, WorkloadError
from workloads.kv import DEFAULT_MIX, KVWorkload, format_mix

log = logging.getLogger("nemesis")

LEADER_TIMEOUT_S = 60.0  # first start on a loaded machine: processes import gRPC, elect
RECOVERY_TIMEOUT_S = 30.0  # after the heal: a leader must serve again within this
FINAL_READ_TIMEOUT_S = 30.0
# The replica reads after them (workloads/replicas.py): every node's turn together.
REPLICA_READ_TIMEOUT_S = 60.0
HEAL_WAIT_S = 60.0  # tear down: how long a heal in progress may take to finish and record its end


class HarnessError(Exception):
    """The harness could not do its job; the message is the one line a person reads."""


@dataclass
class RunConfig:
    argv: list[str]
    platform: str
    platform_reason: str
    faults: list[str]
    duration_s: float
    interval_s: float
    nodes: int
    workload: str
    seed: int
    store: Path
    concurrency: int
    rate: float
    op_timeout_s: float
    read_consistency: str
    unsafe: str | None
    check_budget_s: float
    node_args: list[str] = field(default_factory=list)
    junit: Path | None = None  # --junit FILE: JUnit XML for CI (nemesis/report)
    faults_all: bool = False  # --faults all: `faults` is its expansion, dealt from a deck
    mix: dict[str, int] | None = None  # --mix: the kv workload's operation weights (None: default)
    # False: no report.html (`explore` writes it only for failing runs: the plots cost
    # about as much CPU as a short simulated run)
    write_report: bool = True
    # --tls: every node port mutual TLS, certificates from a CA made for this run alone
    # (nemesis/tls_run.py; its keys never enter the run folder)
    tls: bool = False
    # --system: what runs on the nodes (nemesis/systems/; docs/systems.md)
    system: str = DEFAULT_SYSTEM
    # --check-wall-budget-s: wall-clock seconds for the whole check (None: CPU budget only)
    check_wall_budget_s: float | None = None
    # --platform ssh: the hosts (nemesis/platforms/ssh_hosts.py) and how their keys are checked
    ssh_hosts: list | None = None
    hosts_file: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False

    def reproduce(self) -> str:
        faults = "all" if self.faults_all else ",".join(self.faults)
        parts = ["python -m nemesis run", f"--faults {faults}",
                 f"--duration {self.duration_s:g}", f"--interval {self.interval_s:g}",
                 f"--nodes {self.nodes}", f"--workload {self.workload}",
                 f"--platform {self.platform}", f"--seed {self.seed}"]
        if self.hosts_file is not None:
            parts.append(f"--hosts {self.hosts_file}")
            if self.known_hosts is not None:
                parts.append(f"--known-hosts {self.known_hosts}")
            if self.accept_new_host_keys:
                parts.append("--accept-new-host-keys")
        if self.system != DEFAULT_SYSTEM:
            parts.append(f"--system {self.system}")
        if self.workload == "kv":  # the trainer's clients are its workers: no rate, no concurrency
            parts += [f"--concurrency {self.concurrency}", f"--rate {self.rate:g}"]
        if self.op_timeout_s != 3.0:  # the flag's default
            parts.append(f"--op-timeout {self.op_timeout_s:g}")
        if self.read_consistency != "linearizable":
            parts.append(f"--read-consistency {self.read_consistency}")
        if self.workload == "kv":
            parts.append(f"--mix {format_mix(self.mix or DEFAULT_MIX)}")
        if self.tls:
            parts.append("--tls")
        if self.unsafe:
            # A canary runs only with the environment's permission: the line must carry it.
            parts.insert(0, f"{_allow_env(self.system)}=1")
            parts.append(f"--unsafe {self.unsafe}")
        return " ".join(parts)


def _allow_env(system: str) -> str:
    return get_system(system).unsafe_allow_env() or "MAO_ALLOW_UNSAFE"


def prepare_platform(config: RunConfig) -> dict[str, Any]:
    """What the platform needs made before a run can start, as keyword arguments of
    `make_platform`: on Docker the node image (a first build takes minutes). Done before the
    run folder exists, so the folder is named by when the run starts, and a build that
    fails leaves no folder behind (PlatformError)."""
    if config.platform != "docker":
        return {}
    from nemesis.platforms.image import ensure_image

    return {"image": ensure_image()}


def make_platform(config: RunConfig, run_id: str, run_dir: Path, image: str | None = None,
                  tls: RunTls | None = None, system: System | None = None) -> Platform:
    system = system if system is not None else get_system(config.system)
    env: dict[str, str] = {}
    node_args = list(config.node_args)
    if config.unsafe and config.unsafe in system.canaries():
        node_args += ["--unsafe", config.unsafe]
        env[system.unsafe_allow_env() or "MAO_ALLOW_UNSAFE"] = "1"
    if any(f in FILE_FAULTS for f in config.faults):
        node_args += system.file_fault_args(FILE_FAULT_SNAPSHOT_ENTRIES, node_args)
    # Leader faults aimed at snapshot transfers need transfers that happen, and last.
    if system.status_windows:
        node_args += windows.node_args(config.faults, config.workload, config.platform, node_args)
        node_args += rollback.node_args(config.faults, node_args)
        if "reorder" in config.faults and "--max-append-entries" not in node_args:
            node_args += ["--max-append-entries", str(REORDER_APPEND_ENTRIES)]
    # lose-unsynced needs every node's data on a layer that holds writes until fsync, and
    # slow-disk that layer's fsync.
    cluster = ClusterConfig(nodes=config.nodes, run_id=run_id, work_dir=run_dir,
                            node_args=tuple(node_args), env=env,
                            lazy_disk=bool(LAZY_DISK_FAULTS & set(config.faults)), tls=tls, system=system)
    if config.platform == "docker":
        from nemesis.platforms.docker import DockerPlatform

        return DockerPlatform(cluster, image=image)
    if config.platform == "ssh":
        from nemesis.platforms.ssh import SshPlatform

        return SshPlatform(cluster, config.ssh_hosts or [], known_hosts=config.known_hosts,
                           accept_new=config.accept_new_host_keys)
    from nemesis.platforms.local import LocalPlatform

    return LocalPlatform(cluster)


def check_platform(faults: list[str], platform: Platform) -> None:
    """HarnessError (one line, before any node starts) when `platform` cannot run a fault."""
    for fault in sorted(LAZY_DISK_FAULTS & set(faults)):
        if not platform.supports_power_loss():
            what = ("lose unsynced writes" if fault == "lose-unsynced" else
                    "slow its fsync (the lazy disk)")
            raise HarnessError(f"--faults {fault} needs nodes on a disk that can {what}; "
                               f"the {platform.name} platform has none")
    if any(f in FILE_FAULTS for f in faults) and not platform.supports_file_faults():
        raise HarnessError(f"--faults {','.join(f for f in faults if f in FILE_FAULTS)} needs "
                           f"a platform that can damage a stopped node's files and a system "
                           f"that names them; the {platform.name} platform running "
                           f"{platform.system.name} cannot")
    if "member" in faults and not platform.supports_membership():
        raise HarnessError(f"--faults member needs membership changes; the "
                           f"{platform.system.name} system on the {platform.name} platform "
                           f"has none")


def make_workload(config: RunConfig, system: System | None = None) -> Workload:
    system = system if system is not None else get_system(config.system)
    if config.workload == "kv":
        client_unsafe = config.unsafe if config.unsafe in system.client_canaries() else None
        return KVWorkload(concurrency=config.concurrency, rate=config.rate,
                          op_timeout_s=config.op_timeout_s,
                          read_consistency=config.read_consistency, mix=config.mix,
                          client_unsafe=client_unsafe,
                          # --unsafe is the permission, as make_platform gives it to nodes.
                          unsafe_environ={_allow_env(config.system): "1"},
                          system=system)
    if config.workload == "trainer":
        from workloads.trainer import TrainerWorkload

        trainer_unsafe = (config.unsafe if config.unsafe and config.unsafe not in system.canaries()
                          and config.unsafe not in system.client_canaries() else None)
        return TrainerWorkload(unsafe=trainer_unsafe, seed=config.seed, system=system)
    raise HarnessError(f"unknown workload {config.workload!r}")


def not_read_back(platform: Platform, nemesis: Nemesis) -> dict[str, str]:
    """The nodes the replica reads skip, and why: down at the end (a node that refused its
    data and was not rejoined), or not a member (after member changes, as the leader
    sees the membership). A node that is neither is read back on its own."""
    skipped = {n: "down at the end" for n in platform.node_ids if not platform.is_running(n)}
    if not platform.supports_membership() or not (
            "member" in nemesis.faults or nemesis.refused or nemesis.rejoining):
        return skipped
    try:
        voters, learners = platform.membership()
    except Exception as exc:  # every node is then read: a non-member's reads just fail
        log.warning("membership unknown for the replica reads: %s", exc)
        return skipped
    for node in platform.node_ids:
        if node not in voters | learners:
            skipped.setdefault(node, "not a member at the end")
    return skipped


def wait_for_leader(platform: Platform, timeout_s: float, stop: threading.Event | None = None
                    ) -> str | None:
    """A node that leads, or None after `timeout_s` (or once `stop` is set)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = platform.leader()
        if leader is not None:
            return leader
        if stop is not None and stop.is_set():
            return None
        time.sleep(0.1)
    return None


def wait_for_start(platform: Platform, timeout_s: float, logs: Path) -> str:
    """The leader of a freshly started cluster once every node is up and confirmed. A node
    that exits meanwhile ends the wait at once (nothing restarts it, so waiting out the
    deadline would only hide what it printed); HarnessError either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        exited = {n: code for n in platform.node_ids
                  if (code := platform.exit_code(n)) is not None}
        if exited:
            node_id, code = next(iter(exited.items()))
            reason = platform.exit_reason(node_id) or "it printed nothing"
            raise HarnessError(f"node {node_id} exited with code {code} while the cluster was "
                               f"starting: {reason}; nodes: {platform.describe()}; logs in {logs}")
        leader = platform.ready()
        if leader is not None:
            return leader
        if time.monotonic() >= deadline:
            raise HarnessError(f"no leader with every node up and confirmed within "
                               f"{timeout_s:g} s of starting the cluster; "
                               f"nodes: {platform.describe()}; logs in {logs}")
        time.sleep(0.1)


class _Terminate(BaseException):
    """SIGTERM or Ctrl-C, turned into an exception so `finally` blocks tear the cluster down."""


class _Signals:
    """The first SIGINT/SIGTERM interrupts the run; later ones are ignored (with a note)
    so that they cannot break off the teardown half-way and leave nodes behind."""

    def __init__(self) -> None:
        self.interrupted = False
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.interrupted:
            with contextlib.suppress(OSError):
                print("\nstill tearing the cluster down; please wait", file=sys.stderr,
                      flush=True)
            return
        self.interrupted = True
        raise _Terminate()

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self.previous.clear()

    def __exit__(self, *exc: object) -> None:
        self.restore()


class _Output:
    """The run's console: if it goes away (a closed pipe, a terminal that hung up) the run
    must still finish and tear its cluster down, so writes after that are dropped."""

    def __init__(self, stream) -> None:  # noqa: ANN001 - a text stream
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except (BrokenPipeError, OSError) as exc:
                self.broken = True
                log.warning("console output lost (%s); the run goes on", exc)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (BrokenPipeError, OSError):
                self.broken = True

    def isatty(self) -> bool:
        return not self.broken and hasattr(self.stream, "isatty") and self.stream.isatty()


def run(config: RunConfig, out=None) -> int:  # noqa: ANN001 - a text stream
    """The whole run; returns the exit code (0 valid, 1 invalid, 2 unknown, 3 harness error)."""
    # sys.stdout at call time, not at import time (a test's captured stream may be gone).
    out = _Output(out if out is not None else sys.stdout)
    try:
        prepared = prepare_platform(config)
    except PlatformError as exc:
        _print(out, f"harness error: {config.platform} platform: {exc} (no run was started, "
                    f"no run folder made)")
        return check.EXIT_HARNESS
    except KeyboardInterrupt:
        _print(out, "\ninterrupted while preparing the platform; no run was started, no run "
                    "folder made")
        return check.EXIT_HARNESS
    except Exception as exc:  # the engine's own errors (docker.errors.APIError): never exit 1
        _print(out, f"harness error: {config.platform} platform: preparing it failed: "
                    f"{type(exc).__name__}: {exc} (no run was started, no run folder made)")
        return check.EXIT_HARNESS
    # Named now, with the platform ready: not by the time a first image build began.
    run_dir = new_run_dir(config.store, config.workload)
    run_id = f"{config.workload}-{run_dir.name}-{config.seed}"
    handler = logging.FileHandler(run_dir / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # Made before the signal handlers, removed after everything else, whatever ends the run.
    tls = RunTls(run_id) if config.tls else None
    try:
        with _Signals() as signals:
            return _run(config, run_dir, run_id, out, signals, prepared, tls)
    finally:
        if tls is not None:
            tls.close()
        root.removeHandler(handler)
        handler.close()


def _teardown(ctx: RunContext | None, nemesis: Nemesis | None, workload: Workload,
              history: HistoryWriter, nemesis_events, platform: Platform | None,  # noqa: ANN001
              config: RunConfig, run_info: dict[str, Any]) -> None:
    """Stop clients and the nemesis, close the history, collect logs, tear the platform
    down. Each step runs even if an earlier one failed: the platform's close() above all."""
    steps = []
    if ctx is not None:
        steps.append(("stop clients", ctx.stop.set))
    if nemesis is not None:
        steps.append(("stop the nemesis", lambda: _stop_nemesis(nemesis)))
    if ctx is not None:
        steps.append(("join clients", lambda: workload.join(timeout_s=config.op_timeout_s + 5)))

    def close_history() -> None:
        for index in history.in_flight():
            history.complete(index, "info", None, error="run ended with the operation in flight")
        history.close()

    if hasattr(workload, "close"):
        steps.append(("stop the workload's processes", workload.close))
    steps += [("close the history", close_history), ("close nemesis.jsonl", nemesis_events.close)]
    if platform is not None:
        steps += [("collect node logs", platform.collect_logs), ("tear down", platform.close)]
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            log.warning("teardown: %s failed: %s", what, exc)
            run_info.setdefault("teardown_errors", []).append(f"{what}: {exc}")
    if nemesis is not None:
        run_info["nemesis_errors"] = list(nemesis.errors)
        run_info["faults"] = dict(nemesis.counts)
    run_info["client_errors"] = list(getattr(workload, "harness_errors", []))[:20]


def _stop_nemesis(nemesis: Nemesis, first_wait_s: float = 5.0) -> None:
    """Stop the schedule and let a heal in progress finish and record its end, so an
    interrupted run's history does not end on a fault that never healed (a Docker heal is
    several `docker exec`s: it outlived the 5 s this waited before, 2 runs of 2)."""
    nemesis.stop(timeout_s=first_wait_s)
    if nemesis.busy():
        log.warning("waiting up to %g s for the nemesis to finish the heal in progress",
                    HEAL_WAIT_S)
        nemesis.stop(timeout_s=HEAL_WAIT_S)
        if nemesis.busy():
            log.warning("the nemesis was still healing after %g s; the tear down goes on",
                        HEAL_WAIT_S)


def print_line(out, text: str) -> None:  # noqa: ANN001
    print(text, file=out, flush=True)


_print = print_line


def system_info(config: RunConfig, system: System | None = None) -> dict[str, str]:
    """{"name", "version"} of the system under test, for test.json, results.json, the
    report and JUnit."""
    system = system if system is not None else get_system(config.system)
    return {"name": system.name, "version": system.version()}


def test_map(config: RunConfig, run_id: str, workload: Workload,
             system: System | None = None) -> dict[str, Any]:
    """What test.json holds: the run as data, written before anything starts."""
    return {"argv": config.argv, "reproduce": config.reproduce(), "run_id": run_id,
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
            "system": system_info(config, system),
            "workload": workload.describe(), "source_version": source_version(),
            "python": sys.version.split()[0], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _run(config: RunConfig, run_dir: Path, run_id: str, out,  # noqa: ANN001, C901
         signals: _Signals, prepared: dict[str, Any], tls: RunTls | None = None) -> int:
    system = get_system(config.system)
    workload = make_workload(config)
    test = test_map(config, run_id, workload, system)
    _print(out, f"run folder: {run_dir}")
    if config.unsafe:
        who = ("every node runs a Raft core" if config.unsafe in CORE_VARIANTS
               else "every node runs" if config.unsafe in system.canaries()
               else "every client runs" if config.unsafe in system.client_canaries()
               else "every trainer coordinator runs")
        _print(out, f"canary: {who} deliberately broken (--unsafe {config.unsafe})")
    if config.platform == "sim":
        from nemesis.sim_runner import run_sim

        return run_sim(config, run_dir, run_id, out, test)
    write_json(run_dir / "test.json", test)
    run_info: dict[str, Any] = {"run_id": run_id, "platform": config.platform,
                                "system": test["system"],
                                "crashed_nodes": [], "nemesis_errors": [], "harness_error": None}
    nemesis_events = (run_dir / "nemesis.jsonl").open("a", encoding="utf-8")
    history = HistoryWriter(run_dir / "history.jsonl")

    def record(f: str, value: dict[str, Any]) -> None:
        if history.closed:
            # Only a heal that outlived the tear down's wait gets here (Ctrl-C during a slow
            # heal): say what the history misses rather than raise from the nemesis thread.
            log.warning("the history was already closed: nemesis %s %s not recorded", f,
                        value.get("description", ""))
            return
        index = history.event("nemesis", f, value)
        import json

        nemesis_events.write(json.dumps({"index": index, "wall_time": time.time(), "f": f,
                                         **value}, default=str) + "\n")
        nemesis_events.flush()
        log.info("nemesis %s %s", f, value.get("description", ""))

    platform: Platform | None = None
    nemesis: Nemesis | None = None
    ctx: RunContext | None = None
    try:
        platform = make_platform(config, run_id, run_dir, **prepared, tls=tls)
        check_platform(config.faults, platform)
        _print(out, f"starting {config.nodes} {system.name} nodes on {config.platform}"
                    f"{' with mutual TLS' if tls is not None else ''} ...")
        platform.start()
        if tls is not None:  # the certificate only: what the nodes presented can be checked
            shutil.copyfile(tls.ca, run_dir / "ca.crt")
            run_info["tls"] = {"ca_certificate": "ca.crt", "client": platform.client_tls.cert.name}
        leader = wait_for_start(platform, LEADER_TIMEOUT_S, run_dir / "nodes")
        _print(out, f"leader {leader}; running the {config.workload} workload for "
                    f"{config.duration_s:g} s with faults {','.join(config.faults)} "
                    f"(seed {config.seed})")
        started = time.monotonic()
        deadline = started + config.duration_s
        ctx = RunContext(addresses=platform.client_addresses, history=history, seed=config.seed,
                         platform=platform, deadline=deadline, tls=platform.client_tls,
                         system=system)
        nemesis = Nemesis(platform, config.faults, seed=config.seed,
                          interval_s=config.interval_s, record=record,
                          targets=workload if isinstance(workload, ProcessTargets) else None,
                          clients=workload if isinstance(workload, ClientGate) else None)
        nemesis.deal_kinds = config.faults_all
        run_info["crashed_nodes"] = nemesis.crashes  # the same list, filled as they are found
        if {"election", "rollback", "restore-majority"} & set(config.faults):
            run_info["elections"] = nemesis.election_counts
        if system.status_windows and windows.aims_at_windows(config.faults, config.workload,
                                                              config.platform):
            run_info["windows"] = windows.Windows.attach(nemesis).counts
        workload.start(ctx)
        # The duration counts from a running workload (the trainer's containers take seconds
        # to start on a loaded engine, which ate the faults of a short run).
        started = time.monotonic()
        deadline = ctx.deadline = started + config.duration_s
        nemesis.start(deadline)
        progress = Progress(out, config.duration_s)
        while time.monotonic() < deadline:
            ctx.stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            for node, code_ in nemesis.look_for_crashes():
                _print(out, f"\n{node} exited with code {code_} on its own (the run will "
                            f"be INVALID: nodes-stay-up); see {run_dir / 'nodes'}")
            progress.update(time.monotonic() - started, workload.counts.totals(),
                            nemesis.describe_active(), workload.counts.notes())
        progress.done(time.monotonic() - started, workload.counts.totals(),
                      workload.counts.notes())
        ctx.stop.set()
        nemesis.stop()
        if not workload.join(timeout_s=config.op_timeout_s * 3 + 10):
            log.warning("some client threads did not finish their last operation in time")
        _print(out, "healing every fault ...")
        nemesis.heal_everything()
        leader = wait_for_leader(platform, RECOVERY_TIMEOUT_S)
        run_info["recovered_leader"] = leader
        if leader is None:
            _print(out, f"warning: no leader {RECOVERY_TIMEOUT_S:g} s after the heal "
                        f"({platform.describe()}); final reads may fail")
        _print(out, "final reads ...")
        run_info["final_reads"] = workload.final_reads(ctx, FINAL_READ_TIMEOUT_S)
        replica_reads = workload.replica_reads(ctx, not_read_back(platform, nemesis),
                                               REPLICA_READ_TIMEOUT_S,
                                               say=lambda line: _print(out, line))
        if replica_reads is not None:
            run_info["replica_reads"] = replica_reads
        nemesis.look_for_crashes()  # a node that stopped during the heal or the final reads
        platform.collect_logs()  # again at the teardown, for the last lines
        safety_reports.record_all(safety_reports.scan(run_dir / "nodes"), record)
    except (HarnessError, WorkloadError) as exc:
        run_info["harness_error"] = str(exc)
        _print(out, f"harness error: {exc}")
    except PlatformError as exc:
        run_info["harness_error"] = f"{config.platform} platform: {exc}"
        _print(out, f"harness error: {config.platform} platform: {exc}")
    except (KeyboardInterrupt, _Terminate):
        run_info["harness_error"] = "interrupted"
        _print(out, "\ninterrupted: tearing the cluster down ...")
    except Exception as exc:  # a harness bug must never read as "invalid" (exit 1)
        log.exception("harness failure")
        run_info["harness_error"] = f"{type(exc).__name__}: {exc}"
        _print(out, f"harness error: {type(exc).__name__}: {exc} (traceback in "
                    f"{run_dir / 'harness.log'})")
    finally:
        signals.interrupted = True  # from here on a signal cannot break the teardown off
        _teardown(ctx, nemesis, workload, history, nemesis_events, platform, config, run_info)
        write_json(run_dir / "results.json", run_info)
    # The cluster is gone: Ctrl-C may now stop the check itself.
    signals.restore()
    return finish_run(config, run_dir, run_info, out)


def finish_run(config: RunConfig, run_dir: Path, run_info: dict[str, Any], out) -> int:  # noqa: ANN001
    """After the cluster is gone: check the history, write the report, print the verdict;
    returns the exit code. Shared by every platform, the simulator's included."""
    if run_info.get("harness_error"):
        _print(out, f"run folder (partial): {run_dir}")
        _print(out, report.after_run(run_dir, config.junit))  # nemesis/report; never raises
        return check.EXIT_HARNESS
    _print(out, "checking the history ...")
    try:
        results = check.check_run(run_dir, budget_s=config.check_budget_s,
                                  wall_budget_s=config.check_wall_budget_s)
    except KeyboardInterrupt:
        _print(out, f"interrupted during the check; the run is stored, re-check it with: "
                    f"python -m nemesis check {run_dir}")
        return check.EXIT_HARNESS
    report_line = (report.after_run(run_dir, config.junit)  # nemesis/report; never raises
                   if config.write_report else "report: not written (python -m nemesis report)")
    for line in check.summary_lines(results):
        _print(out, line)
    if run_info.get("windows"):  # leader faults aimed at the store's windows
        _print(out, "windows: " + "; ".join(
            f"{kind} aimed {c['aimed']}, landed inside {c['landed']}, not seen {c['not_seen']}"
            for kind, c in sorted(run_info["windows"].items())))
    if run_info.get("elections"):  # faults aimed at elections (elections.py, rollback.py)
        _print(out, "elections: " + "; ".join(
            f"{shape} aimed {c['aimed']}, landed inside {c['landed']}"
            for shape, c in sorted(run_info["elections"].items())))
    if run_info["nemesis_errors"]:
        _print(out, f"nemesis errors ({len(run_info['nemesis_errors'])}): "
                    f"{run_info['nemesis_errors'][0]}")
    if run_info.get("client_errors"):
        # The workload's own notes (a trainer fault whose takeover never came, a client
        # error): they say why a fault may have tested less than it was meant to.
        _print(out, f"workload notes ({len(run_info['client_errors'])}): "
                    f"{run_info['client_errors'][0]}")
    verdict = results["valid"]
    word = check.WORDS[verdict]
    reason = {True: ("no acknowledged checkpoint was lost, every resume started from the latest, "
                     "no deposed coordinator wrote, no request id applied twice, one "
                     "coordinator per lease term, every head write a CAS on what its writer "
                     "read, no store node stopped on its own"
                     if config.workload == "trainer" else
                     "the history is linearizable, no acknowledged write was lost, every "
                     "replica that caught up agrees, every stale read returned a state the key "
                     "had, every replayed request got its first answer, no node stopped "
                     "on its own or reported a broken rule"),
              False: "the history shows a violation (see above and report.html)",
              "unknown": "the check could not decide (a budget ran out, or nothing was recorded)"}
    _print(out, f"{word}: {reason[verdict]}. Run folder: {run_dir}")
    _print(out, f"reproduce: {config.reproduce()}")
    _print(out, report_line)
    return check.exit_code(verdict)
