"""A whole training job on this machine: the store (own local cluster or --kv), the
coordinators (one active, the rest standbys) and the workers, as child processes.

`TrainerRun` is what the CLI's `run` command and the tests use: start, observe (lease
record, coordinator Status, event logs), fault (SIGKILL / SIGSTOP a coordinator or a
worker), wait for conditions with deadlines, read the final checkpoint, and close —
which SIGKILLs every process group it started, including on failure.

A coordinator or worker that dies without being asked to is restarted (a coordinator
under a new id, as a standby: its old id is retired with its lease term).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from system.kv.client import KVClient, KVError
from system.kv.tls import grpc_channel_credentials, open_channel
from system.trainer import certs, data
from system.trainer import checkpoint as codec
from system.trainer.checkpoint_store import CheckpointStore, Latest
from system.trainer.config import ConfigError, TrainConfig
from system.trainer.lease import LeaseRecord, read_lease
from system.trainer.object_store import open_object_store
from system.trainer.procs import kill_group, spawn
from system.trainer.proto import trainer_pb2, trainer_pb2_grpc

T = TypeVar("T")
STORE_NODES = ["n1", "n2", "n3"]  # the ids of the store `run` starts without --kv



class PolledProcess:
    """The part of subprocess.Popen that TrainerRun uses, for a process it can only poll (a
    container, a process on another host): `wait` polls until an exit or the deadline.
    Subclasses give `name`, `returncode`, `poll` and `_poll_sooner` (drop a cached state)."""

    name: str
    returncode: int | None

    def poll(self) -> int | None:
        raise NotImplementedError

    def _poll_sooner(self) -> None:
        """The next poll asks again instead of answering from a cache."""

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600)
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.name, timeout or 0)
            self._poll_sooner()
            time.sleep(0.05)  # polling for the exit, bounded by the deadline
        assert self.returncode is not None
        return self.returncode


class RunTimeout(AssertionError):
    pass


def _kill_all(procs: dict[str, subprocess.Popen]) -> None:
    for proc in list(procs.values()):
        kill_group(proc)


class TrainerRun:
    def __init__(self, config: TrainConfig, *, standbys: int = 1, kv: list[str] | None = None,
                 checkpoint_store: str = "inline", run_dir: Path | None = None,
                 lease_s: float = 2.0, gradient_deadline_s: float = 5.0,
                 chunk_bytes: int = 4 * 1024 * 1024, restart: bool = True,
                 object_dir: Path | None = None,
                 first_coordinator_env: dict[str, str] | None = None,
                 first_coordinator_args: list[str] | None = None,
                 tls: certs.TrainerTls | None = None, generate_tls: bool = False) -> None:
        config.validate()
        n_rows = data.n_train_rows(config)
        data.shard_bounds(n_rows, config.workers, 0)  # ConfigError if too many workers
        self.config, self.standbys, self.checkpoint_store = config, standbys, checkpoint_store
        self.lease_s, self.gradient_deadline_s, self.chunk_bytes = lease_s, gradient_deadline_s, chunk_bytes
        self.restart = restart
        self._own_dir = run_dir is None
        self.run_dir = Path(tempfile.mkdtemp(prefix="trainer-run-")) if run_dir is None else run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Object-mode blobs must outlive the run directory (a later run resumes from them).
        self.object_dir = object_dir if object_dir is not None else self.run_dir / "objects"
        self.first_coordinator_env = first_coordinator_env  # tests: pause points for c1 only
        self.first_coordinator_args = first_coordinator_args or []  # tests: canaries for c1 only
        self.coordinator_args: list[str] = []  # every coordinator (the nemesis: canaries)
        self.coordinator_env: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self._finalizer = weakref.finalize(self, _kill_all, self.procs)
        self.expected_exit: set[str] = set()
        self.cluster = None
        self.kv_addresses = kv
        self._coordinator_count = 0
        self.run_token = uuid.uuid4().hex[:6]
        self.started_at = 0.0
        # TLS: the certificates given, or (generate_tls, `run --tls`) a throw-away CA made
        # in the run directory at start, for this run's processes and its own store.
        self.tls = tls
        self.generate_tls = generate_tls
        self._status_credentials = None

    # ----- starting --------------------------------------------------------------------

    def start(self) -> None:
        if self.generate_tls:
            kv = self.tls.kv if self.tls is not None else None  # a --kv store's own CA
            self.tls = certs.generate(self.run_dir / "tls", self.config.workers,
                                      STORE_NODES if self.kv_addresses is None else [])
            if kv is not None:
                self.tls = certs.TrainerTls(directory=self.tls.directory, kv=kv)
        if self.tls is not None:
            self._status_credentials = grpc_channel_credentials(self.tls.files(certs.RUN))
        if self.kv_addresses is None:
            from system.kv.local_cluster import LocalCluster

            # With --tls the store's nodes get their certificates from this run's CA
            # (LocalCluster uses a directory that holds one), so every process trusts one CA.
            self.cluster = LocalCluster(3, self.run_dir / "kv",
                                        tls_dir=self.tls.directory if self.generate_tls else None)
            self.cluster.start()
            self.cluster.wait_for_leader(timeout_s=30)
            self.kv_addresses = self.cluster.addresses
        if self.generate_tls:
            # Every certificate of the run exists now: the throw-away CA's key would only
            # let whoever reads the run directory mint more.
            (self.tls.directory / "ca.key").unlink(missing_ok=True)
        self.kv = KVClient(self.kv_addresses, timeout_s=5.0, client_id="trainer-run",
                           tls=self.tls.kv_files(certs.RUN) if self.tls is not None else None)
        try:
            read_lease(self.kv, self.config.job, consistency="stale", timeout_s=2.0)
        except KVError as exc:
            first = str(exc).splitlines()[0][:400]
            if "TLS" in first and self.generate_tls and self.kv_addresses is not None:
                # The trainer's own CA is not the store's: the flags that name the store's.
                first += ("; a store with its own CA: --kv-cert-file, --kv-key-file, "
                          "--kv-trusted-ca-file")
            raise ConfigError(f"cannot reach the store at {self.worker_kv()}: {first}") from None
        self.started_at = time.monotonic()
        for _ in range(1 + self.standbys):
            self.start_coordinator()
        for worker in range(self.config.workers):
            self.start_worker(worker)

    def start_coordinator(self) -> str:
        self._coordinator_count += 1
        # Request ids are unique across the whole store, and a coordinator's ids start with
        # its id: a per-run token keeps two runs (or jobs) in one store from colliding.
        cid = f"c{self._coordinator_count}-{self.run_token}"
        self.procs[cid] = self.spawn_process(
            cid, ["coordinator", "--id", cid, "--config", self.config.to_json(),
             "--kv", self.coordinator_kv(cid), "--checkpoint-store", self.checkpoint_store,
             "--object-dir", str(self.object_dir), "--lease-s", str(self.lease_s),
             "--gradient-deadline-s", str(self.gradient_deadline_s),
             "--chunk-bytes", str(self.chunk_bytes),
             "--event-log", str(self.run_dir / f"events-{cid}.jsonl"),
             *(self.first_coordinator_args if self._coordinator_count == 1 else []),
             *self.coordinator_args, *self.tls_args(certs.COORDINATOR)],
            self.run_dir / f"{cid}.log",
            {**(self.first_coordinator_env or {} if self._coordinator_count == 1 else {}),
             **self.coordinator_env, **self.coordinator_env_for(cid)} or None)
        return cid

    def spawn_process(self, name: str, args: list[str], log_path: Path,
                      extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `python -m system.trainer ARGS` as child process `name` (the nemesis workload
        overrides this to run it in a container on --platform docker)."""
        return spawn(args, log_path, extra_env)

    def coordinator_env_for(self, cid: str) -> dict[str, str]:
        """Environment of coordinator `cid` alone (the nemesis workload: its pause-point
        arm file)."""
        return {}

    def worker_kv(self) -> str:
        """The store addresses workers are given, as `--kv` text (`n1=addr,...` when
        TrainerRun was given a mapping node id -> address)."""
        if isinstance(self.kv_addresses, dict):
            return ",".join(f"{node}={address}" for node, address in self.kv_addresses.items())
        return ",".join(self.kv_addresses or [])

    def coordinator_kv(self, cid: str) -> str:
        """The store addresses coordinator `cid` is given, as `--kv` text (the nemesis
        workload overrides this with `n1=proxy,...` to put a proxy it can cut between each
        coordinator and each node)."""
        return ",".join(self.kv_addresses or [])

    def tls_args(self, name: str) -> list[str]:
        """The certificate flags of trainer process `name` (none without TLS)."""
        return self.tls.args(name) if self.tls is not None else []

    def start_worker(self, worker: int) -> None:
        name = f"w{worker}"
        self.procs[name] = self.spawn_process(
            name, ["worker", "--index", str(worker), "--config", self.config.to_json(),
                   "--kv", self.worker_kv(), *self.tls_args(certs.worker_name(worker))],
            self.run_dir / f"{name}.log")
        self.expected_exit.discard(name)

    # ----- observing -------------------------------------------------------------------

    def lease(self) -> LeaseRecord | None:
        try:
            return read_lease(self.kv, self.config.job)[0]
        except KVError:
            return None

    def active_coordinator(self) -> str | None:
        record = self.lease()
        return record.coordinator_id if record is not None and not record.done else None

    def status(self, address: str | None = None) -> trainer_pb2.StatusReply | None:
        if address is None:
            record = self.lease()
            if record is None:
                return None
            address = record.address
        try:
            with open_channel(address, self._status_credentials) as channel:
                return trainer_pb2_grpc.ParameterServerStub(channel).Status(
                    trainer_pb2.StatusRequest(), timeout=1.0)
        except grpc.RpcError:
            return None

    def events(self, cid: str | None = None) -> list[dict]:
        out = []
        for path in sorted(self.run_dir.glob(f"events-{cid or '*'}.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out

    def config_error(self) -> str | None:
        """The one-line error of a coordinator that refused the configuration, or of a
        worker that could not use its certificate (exit 2)."""
        for name, proc in self.procs.items():
            if proc.poll() == 2:
                lines = (self.run_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
                errors = [line for line in lines if line.startswith("error: ")]
                return (errors[-1] if errors else lines[-1] if lines else "exit 2").removeprefix("error: ")
        return None

    def finished(self) -> bool:
        record = self.lease()
        return record is not None and record.done

    def wait_until(self, condition: Callable[[], T | None], timeout_s: float, what: str,
                   poll_s: float = 0.05) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            self.supervise()
            value = condition()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise RunTimeout(f"timed out after {timeout_s:g}s waiting for {what}; "
                                 f"run dir {self.run_dir}")
            time.sleep(poll_s)

    def supervise(self) -> None:
        """Replace a worker or coordinator that exited without being asked to."""
        if not self.restart:
            return
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or name in self.expected_exit:
                continue
            self.expected_exit.add(name)
            if name.startswith("w") and code not in (0, 2):  # 2: its files are unusable
                self.start_worker(int(name[1:]))
            elif name.startswith("c") and code not in (0, 2):
                # A deposed coordinator (3) is retired for good, but the job still wants a
                # standby: start a fresh one under a new id (and so new request ids).
                self.start_coordinator()

    # ----- faults ----------------------------------------------------------------------

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """SIGKILL `name`'s process group (a later supervise() starts a replacement unless
        the exit was expected)."""
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)

    def pause(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGCONT)

    # ----- results ---------------------------------------------------------------------

    def checkpoint_store_reader(self) -> CheckpointStore:
        objects = None
        mode = "inline"
        if self.checkpoint_store != "inline":
            mode = "object"
            objects = open_object_store(self.checkpoint_store, self.object_dir)
        return CheckpointStore(self.kv, self.config.job, mode, objects=objects)

    def latest_checkpoint(self) -> Latest | None:
        return self.checkpoint_store_reader().read_latest(self.config.config_hash())

    def wait_finished(self, timeout_s: float) -> Latest:
        self.wait_until(self.finished, timeout_s, "the run to finish")
        latest = self.latest_checkpoint()
        if latest is None or not latest.checkpoint.done:
            raise codec.CheckpointError("run finished but no final checkpoint found")
        return latest

    def close(self) -> None:
        _kill_all(self.procs)
        if hasattr(self, "kv"):
            self.kv.close()
        if self.cluster is not None:
            self.cluster.close()
        if self._own_dir and not os.environ.get("TRAINER_KEEP_RUN_DIR"):
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> TrainerRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
