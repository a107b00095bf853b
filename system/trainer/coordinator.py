"""The coordinator process: a thin gRPC and store shell around CoordinatorCore.

Life of a coordinator: serve (answering "not serving") while standing by; watch the lease
key; when it lapses, take it (its version becomes the term); read the latest checkpoint
with a linearizable read, verify checksum and config hash, and rewrite the head record
by CAS so that any older coordinator's next checkpoint write fails (the fence); then
train: close steps as the core says, write checkpoints in a background thread (at most
one in flight), renew the lease in another. It exits 0 when the run is finished (final
checkpoint committed and the lease record marked done), 3 when deposed (it never writes
again), 2 on a configuration error (one line on stderr).

Threads: gRPC handlers, the main loop, the checkpoint writer and the lease renewer all
touch the core only under `self.cond`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from system.kv.client import CasMismatch, KVClient, KVError
from system.kv.tls import TlsError, TlsFiles, grpc_server_credentials
from system.trainer import certs, data, local, model, pause_points
from system.trainer import checkpoint as codec
from system.trainer.checkpoint_store import CheckpointStore, Latest, StopWriting
from system.trainer.config import ConfigError, TrainConfig
from system.trainer.coordinator_core import CoordinatorCore
from system.trainer.lease import LeaseKeeper, LeaseRecord
from system.trainer.liveness import HolderWatch, WatchListener
from system.trainer.object_store import ObjectStoreError, open_object_store
from system.trainer.proto import trainer_pb2, trainer_pb2_grpc
from system.trainer.tensors import from_tensor, to_tensor
from system.trainer.unsafe import check_unsafe

EXIT_DONE, EXIT_CONFIG, EXIT_DEPOSED = 0, 2, 3
GRPC_OPTIONS = [("grpc.max_send_message_length", 512 * 1024 * 1024),
                ("grpc.max_receive_message_length", 512 * 1024 * 1024)]


@dataclass
class CoordinatorOptions:
    coordinator_id: str
    kv_addresses: list[str] | dict[str, str]  # a mapping: node id -> address (hints by id)
    listen: str = "127.0.0.1:0"
    checkpoint_store: str = "inline"  # inline | object | <dir> | s3://bucket/prefix
    object_dir: str = ""  # default directory for "object"
    chunk_bytes: int = 4 * 1024 * 1024
    lease_s: float = 2.0
    gradient_deadline_s: float = 5.0
    eval_every_s: float = 1.0
    event_log: str = ""  # JSON-lines file of the core's events ("" = none)
    done_grace_s: float = 3.0  # keep answering "done" this long so workers see it
    unsafe: str = ""  # a test canary from unsafe.py (refused without MAO_ALLOW_UNSAFE=1)
    tls: TlsFiles | None = None  # serve TLS with this certificate, worker certificates required
    kv_tls: TlsFiles | None = None  # the store client's certificate


class Servicer(trainer_pb2_grpc.ParameterServerServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    def _check_caller(self, context, what: str) -> None:  # noqa: ANN001 - grpc.ServicerContext
        """With TLS, a caller whose certificate is not a worker's (an admin's) is refused:
        one line here (once per caller and call), PERMISSION_DENIED with the reason there."""
        if self.c.options.tls is None:
            return
        why = certs.check_caller(context, what)
        if why is not None:
            self.c.refusals.print(f"coordinator {self.c.options.coordinator_id} refused: {why}",
                                  prefix="warning: ")
            context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

    def GetParameters(self, request, context):  # noqa: N802, ANN001, ANN201
        self._check_caller(context, "a parameter pull")
        return self._pull(request)

    def _parameters(self, after_step: int, term: int, wait_s: float) -> trainer_pb2.ParametersReply:
        """Long-poll (caller holds the lock): answer once the open step is past
        `after_step`, the caller's term is not ours, the run finished, or `wait_s` passed."""
        c = self.c
        deadline = time.monotonic() + min(max(wait_s, 0.0), 5.0)
        while True:
            core = c.core
            if core is None or not c.active or core.finished or term != core.term or core.deposed:
                break
            if core.open_step > after_step and not core.done:
                break  # a new step to work on (while done, wait for "finished")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            c.cond.wait(remaining)
        serving = core is not None and c.active and not core.deposed and c.lease.valid()
        reply = trainer_pb2.ParametersReply(job=c.config.job, coordinator_id=c.options.coordinator_id,
                                            serving=serving)
        if serving:
            assert core is not None
            reply.step, reply.term, reply.done = core.open_step, core.term, core.finished
            if not core.done:
                reply.params.CopyFrom(to_tensor(core.state.params))
        return reply

    def PushGradient(self, request, context):  # noqa: N802, ANN001, ANN201
        self._check_caller(context, "a gradient push")
        return self._push(request)

    def Train(self, requests, context):  # noqa: N802, ANN001, ANN201
        """A worker's stream: one message each way per step (a push, answered once the step
        has closed with the next parameters), and a pull after each (re)connect. Against a
        unary call per step it saves gRPC's per-call work (the call's set-up, its hand-off
        to a pool thread, metadata, status), about a third of the coordinator's CPU a step."""
        self._check_caller(context, "a gradient push")
        for request in requests:
            if request.HasField("push"):
                yield self._push(request.push)
            else:
                yield trainer_pb2.GradientReply(next=self._pull(request.pull))

    def _pull(self, request) -> trainer_pb2.ParametersReply:  # noqa: ANN001 - ParametersRequest
        with self.c.cond:
            core = self.c.core
            if core is not None and self.c.active:
                core.on_worker_seen(request.worker)
                if core.events:
                    self.c.main_wake.notify()  # a worker-back event for the log
            return self._parameters(request.after_step, request.term, request.wait_s)

    def _push(self, request) -> trainer_pb2.GradientReply:  # noqa: ANN001 - GradientPush
        c = self.c
        grad = from_tensor(request.gradient)
        with c.cond:
            core = c.core
            if core is None or not c.active:
                return trainer_pb2.GradientReply(accepted=False, reason="not-active")
            reason = core.on_gradient(request.worker, request.step, request.term, grad,
                                      request.rows, time.monotonic())
            if reason:
                c.main_wake.notify()  # a reject event for the log
            else:
                c.close_if_complete()
            reply = trainer_pb2.GradientReply(accepted=not reason, reason=reason,
                                              step=core.open_step, term=core.term)
            if not reason and request.wait_s > 0:
                # One round trip per step instead of two: wait for the step to close here.
                reply.next.CopyFrom(self._parameters(request.step, request.term, request.wait_s))
            return reply

    def Status(self, request, context):  # noqa: N802, ANN001, ANN201
        return self.c.status()


class Coordinator:
    def __init__(self, config: TrainConfig, options: CoordinatorOptions,
                 on_event: Callable[[dict], None] | None = None) -> None:
        self.config, self.options, self.on_event = config, options, on_event
        # One lock, two conditions: gRPC handlers wait on `cond` for the next step; the main
        # loop waits on `main_wake`, which a handler notifies only when the main loop has
        # work (a checkpoint, events, a step it must close), not at every step.
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self.main_wake = threading.Condition(lock)
        self.core: CoordinatorCore | None = None
        self.active = False
        self.error = ""
        self.loss = float("nan")
        self.accuracy = float("nan")
        self.head_meta: codec.Metadata | None = None
        self.refusals = certs.OnceEach()
        self.kv = KVClient(options.kv_addresses, timeout_s=max(1.0, options.lease_s),
                           client_id=options.coordinator_id, tls=options.kv_tls)
        # A worker's Train stream holds a pool thread while open (a reconnecting worker's
        # old stream until gRPC ends it): two per worker, and room for the unary calls.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * config.workers + 8),
                                  options=GRPC_OPTIONS)
        trainer_pb2_grpc.add_ParameterServerServicer_to_server(Servicer(self), self.server)
        if options.tls is not None:
            # Mutual TLS: a caller without a certificate from our CA never gets a call in
            # (gRPC's own line on this side: "Handshake failed with error ...").
            try:
                credentials = grpc_server_credentials(options.tls, require_client_auth=True)
            except TlsError as exc:
                raise ConfigError(str(exc)) from None
            port = self.server.add_secure_port(options.listen, credentials)
        else:
            port = self.server.add_insecure_port(options.listen)
        if port == 0:
            raise ConfigError(f"cannot listen on {options.listen}")
        self.address = f"{options.listen.rsplit(':', 1)[0]}:{port}"
        # Closes when this process ends: a standby watching it takes over at once after a
        # kill instead of after the lease's lapse (liveness.py).
        try:
            self.watch_listener = WatchListener(options.listen.rsplit(":", 1)[0])
        except OSError as exc:
            raise ConfigError(f"cannot listen on {options.listen.rsplit(':', 1)[0]} "
                              f"(liveness port): {exc.strerror or exc}") from None
        self._emit_lock = threading.Lock()  # events come from several threads
        self._event_file = None
        self.unsafe = check_unsafe(options.unsafe)
        # Request ids are global in the store, so each names its coordinator.
        self.rid_prefix = f"{options.coordinator_id}:"
        if self.unsafe == "shared-request-ids":
            from system.trainer.unsafe import shared_request_id_prefix
            self.rid_prefix = shared_request_id_prefix()
        self.lease = LeaseKeeper(self.kv, config.job, options.coordinator_id, self.address, options.lease_s,
                                 on_event=self._emit, rid_prefix=self.rid_prefix, unsafe=self.unsafe,
                                 watch=self.watch_listener.address)
        objects = None
        mode = "inline"
        if options.checkpoint_store != "inline":
            mode = "object"
            try:
                objects = open_object_store(options.checkpoint_store, Path(options.object_dir or "."),
                                            on_retry=self._object_store_retry)
            except OSError as exc:
                raise ConfigError(f"cannot use the object store {options.checkpoint_store}: {exc}") from None
        self.store = CheckpointStore(self.kv, config.job, mode, objects=objects,
                                     chunk_bytes=options.chunk_bytes, keep_trying=self._may_write,
                                     on_attempt=self._on_attempt, unsafe=self.unsafe,
                                     on_read=lambda read: self._emit({"kind": "head-read", **read}))
        self._event_file = open(options.event_log, "a") if options.event_log else None  # noqa: SIM115
        self._writer: threading.Thread | None = None

    # ----- events ----------------------------------------------------------------------

    def _emit(self, record: dict) -> None:
        with self._emit_lock:
            record = {"time": time.time(), "coordinator_id": self.options.coordinator_id, **record}
            if self._event_file and not self._event_file.closed:  # a thread may outlive run()
                self._event_file.write(json.dumps(record) + "\n")
                self._event_file.flush()
            if self.on_event:
                self.on_event(record)

    def _drain(self) -> None:
        if self.core is not None:
            for event in self.core.take_events():
                record = event.to_dict()
                if record["kind"] == "checkpoint-invoke" and not self.store.compares_head():
                    record["cas"] = False  # the write will not compare `version`: say so
                self._emit(record)

    def _object_store_retry(self, line: str) -> None:
        """An object store outage being retried: a line in the log and an event."""
        print(f"warning: {line}", file=sys.stderr, flush=True)
        self._emit({"kind": "object-store-retry", "detail": line})

    def _on_attempt(self, request_id: str, outcome: str) -> None:
        self._emit({"kind": "checkpoint-retry", "request_id": request_id, "outcome": outcome})

    def _may_write(self) -> bool:
        return self.lease.valid() and self.core is not None and not self.core.deposed

    # ----- life ------------------------------------------------------------------------

    def run(self) -> int:
        self.server.start()
        self._emit({"kind": "started", "detail": self.address})
        # A pause point that stops this process says so first (the history shows where).
        pause_points.on_pause = lambda point, step: self._emit(
            {"kind": "paused-at", "step": step, "detail": point})
        try:
            self._probe_object_store()
            dataset = data.load(self.config)
            n_rows = data.n_train_rows(self.config)
            self.shard_rows = [hi - lo for lo, hi in (data.shard_bounds(n_rows, self.config.workers, w)
                                                      for w in range(self.config.workers))]
            early = None
            if self.unsafe == "stale-resume":
                from system.trainer.unsafe import read_head_early
                early = read_head_early(self)
            if not self.stand_by():
                return EXIT_DONE
            if not self.resume(dataset, early):
                return EXIT_DONE
            return self.train(dataset)
        except (ConfigError, codec.CheckpointError, ObjectStoreError) as exc:
            # ObjectStoreError here: an outage outlasted its retries, or the store refused
            # (access, bucket); either way one line and exit 2, not a restart loop.
            self.error = str(exc)
            self._emit({"kind": "error", "detail": str(exc)})
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        finally:
            self.server.stop(grace=0.2)
            self.watch_listener.close()
            self.kv.close()
            if self._event_file:
                with self._emit_lock:
                    self._event_file.close()

    def _probe_object_store(self) -> None:
        """A misconfigured object store (no bucket, no credentials, unwritable directory)
        is a one-line configuration error at start, not a failed checkpoint later."""
        objects = self.store.objects
        if objects is None:
            return
        probe = f"probe {self.options.coordinator_id}".encode()
        name = codec.blob_checksum(probe)
        try:
            objects.put(name, probe)
            objects.get(name)
            objects.delete(name)
        except ObjectStoreError as exc:  # refused, or an outage that outlasted its retries
            text = str(exc)
            raise ConfigError(text if text.startswith("object store") else
                              f"cannot use the object store {objects.url}: {text}") from None
        except OSError as exc:
            first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            raise ConfigError(f"cannot use the object store {objects.url}: {first}") from None

    def stand_by(self) -> bool:
        """Wait until we hold the lease (True) or the job is finished (False): take it when
        it lapses, or as soon as the holder's process ends (its watch connection closes)."""
        poll_s = max(0.05, self.options.lease_s / 10)
        watch = HolderWatch()
        try:
            while True:
                full_period = False  # after a refused early take or a store error
                try:
                    record = self.lease.observe()
                    if record is not None and record.done:
                        self._emit({"kind": "job-finished", "detail": "lease record says done"})
                        return False
                    if self.lease.try_acquire():
                        return self._acquired()
                    if record is not None and record.coordinator_id != self.options.coordinator_id:
                        watch.follow(record.coordinator_id, record.term, record.watch)
                    if self._holder_gone(record, watch):
                        full_period = True
                        if self.lease.try_acquire(holder_gone=True):
                            return self._acquired()
                except KVError as exc:
                    self._emit({"kind": "lease-observe-failed", "detail": str(exc)})
                    full_period = True
                # The standby's polling period, cut short when the holder's process ends
                # (never twice in a row: no spinning on the store).
                if full_period:
                    time.sleep(poll_s)
                else:
                    watch.gone(poll_s)
        finally:
            watch.drop()

    def _holder_gone(self, record: LeaseRecord | None, watch: HolderWatch) -> bool:
        """The holder named by the record just read is the one whose process was seen to
        end: an early take is due (on that record's version)."""
        if record is None or not watch.gone(0) or watch.key != (record.coordinator_id, record.term):
            return False
        self._emit({"kind": "holder-gone", "lease_version": record.term,
                    "detail": f"{record.coordinator_id}: its liveness connection closed"})
        return True

    def _acquired(self) -> bool:
        self._emit({"kind": "lease-acquired", "lease_version": self.lease.term,
                    "version": self.lease.version, "outcome": "ok"})
        # Test-only: the harness may stop the process here, between taking the
        # lease and resuming (the takeover window; inert unless armed).
        pause_points.reach("after-lease-take", self.lease.term)
        return True

    def resume(self, dataset: data.Dataset, early: Latest | None = None) -> bool:
        """Load the latest checkpoint and fence older coordinators. False: already finished."""
        term = self.lease.term
        try:
            latest = self.store.read_latest(self.config.config_hash())
        except KVError as exc:
            self._emit({"kind": "resume", "outcome": "fail", "lease_version": term,
                        "detail": f"head read: {type(exc).__name__}"})
            raise SystemExit(EXIT_DEPOSED) from None
        # The version read is the one the fence CASes on (no checkpoint yet: whatever head
        # there is, a predecessor's empty takeover record).
        head_expected = latest.version if latest else self.store.head_version
        if self.store.head_lease_version > term:
            # Written under a newer lease: another coordinator took over while this one sat
            # between its take and here (paused). Rewriting it would fence the newer holder
            # with an older term; step down instead (the CAS covers a move after the read).
            self._emit({"kind": "resume", "outcome": "fail", "lease_version": term,
                        "detail": f"head written under newer lease {self.store.head_lease_version}"})
            raise SystemExit(EXIT_DEPOSED)
        if self.unsafe == "stale-resume":
            from system.trainer.unsafe import stale_source
            latest = stale_source(early, latest)
        state = local.initial_state(self.config, dataset)
        step = 0
        if latest is not None:
            state = model.SGDState(latest.checkpoint.params, latest.checkpoint.velocity)
            step = latest.checkpoint.step
            expected = [data.data_cursor(step, r, self.config.batch_size) for r in self.shard_rows]
            if [tuple(c) for c in latest.checkpoint.cursors] != expected:
                raise codec.CheckpointError("checkpoint data cursors do not match its step")
        rid = f"{self.rid_prefix}resume-{step}"
        meta = codec.Metadata(step=step, mode=self.store.mode, size=0, checksum="",
                              config_hash=self.config.config_hash(),
                              coordinator_id=self.options.coordinator_id,
                              lease_version=term, request_id=rid, kind="resume")
        source = {"from_version": latest.version if latest else 0, "from_step": step,
                  "expected_version": head_expected, "request_id": rid, "lease_version": term}
        self._emit({"kind": "resume-invoke", "step": step, **source})
        try:
            # No checkpoint yet: CAS on whatever head there is (a predecessor's empty
            # takeover record), so a coordinator killed before its first checkpoint does not
            # leave a head no successor can resume from.
            version = self.store.rewrite_head(latest, head_expected, meta)
        except (CasMismatch, StopWriting, KVError) as exc:
            self._emit({"kind": "resume", "step": step, "outcome": "fail", "detail": str(exc),
                        "error": "cas-mismatch" if isinstance(exc, CasMismatch) else "indeterminate",
                        **source})
            raise SystemExit(EXIT_DEPOSED) from None
        self.head_meta = meta
        self._emit({"kind": "resume", "step": step, "version": version, "outcome": "ok",
                    "from_request_id": latest.meta.request_id if latest else "", **source})
        collected = self.store.collect_orphans(meta)  # fenced predecessors' unreferenced blobs
        if collected:
            self._emit({"kind": "collected", "lease_version": self.lease.term,
                        "detail": " ".join(collected)})
        with self.cond:
            self.core = CoordinatorCore(self.config, self.options.coordinator_id, self.lease.term,
                                        state, step, version, self.shard_rows,
                                        self.options.gradient_deadline_s, rid_prefix=self.rid_prefix)
            self.core.checkpointed_step = self.core.planned_step = step
            self.active = True
            self.cond.notify_all()
        if latest is not None and latest.checkpoint.done:
            self._finish()
            return False
        return True

    def _wake(self) -> None:
        """Wake every waiter (caller holds the lock): handlers and the main loop."""
        self.cond.notify_all()
        self.main_wake.notify()

    def close_if_complete(self) -> None:
        """Close the open step inline, in the thread of the gradient that completed it (the
        caller holds the lock): the handlers waiting for the next step are woken directly,
        and the main loop only when it has work — a checkpoint now due, events to write,
        the end. A step the main loop must decide stays to it: a lapsed lease (step down,
        never close) and a checkpoint due but not planned yet (planned from exactly the
        step it names, before the next step closes)."""
        core = self.core
        assert core is not None
        if not core.ready_to_close(time.monotonic()):
            return
        if core.checkpoint_due() or not self.lease.valid():
            self.main_wake.notify()
            return
        core.close_step()
        self.cond.notify_all()
        if core.events or core.checkpoint_due() or core.done:
            self.main_wake.notify()

    def train(self, dataset: data.Dataset) -> int:
        core = self.core
        assert core is not None
        renewer = threading.Thread(target=self._renew_loop, daemon=True)
        renewer.start()
        last_eval_at = 0.0
        while True:
            with self.cond:
                while True:
                    # The lease first: a coordinator that wakes from a pause must not even
                    # close a step (let alone checkpoint it) on a lease that has lapsed.
                    if not core.deposed and not core.finished and not self.lease.valid():
                        core.step_down("lease lapsed")
                    now = time.monotonic()
                    # Steps usually close inline (close_if_complete); this loop closes those
                    # that end at the gradient deadline, and wakes for checkpoints, events
                    # and the evaluation.
                    if (core.deposed or core.ready_to_close(now) or core.checkpoint_due()
                            or (core.done and core.in_flight is None) or core.events
                            or now - last_eval_at >= self.options.eval_every_s):
                        break
                    self.main_wake.wait(0.05)
                if core.deposed:
                    self.active = False
                    self.cond.notify_all()
                else:
                    if not core.checkpoint_due() and core.ready_to_close(time.monotonic()):
                        core.close_step()
                        self.cond.notify_all()
                    # Evaluate by time, not steps: the held-out set may be large (synthetic:
                    # 250,000 rows) and the progress line needs it at most once a second.
                    evaluate = time.monotonic() - last_eval_at >= self.options.eval_every_s or core.done
                    if evaluate:
                        last_eval_at = time.monotonic()
                    params = core.state.params.copy() if evaluate else None
                    self._drain()
            if core.deposed:
                # A write still in flight gets its outcome recorded (ok / fail / info)
                # before the process exits: the history must not end on a bare invoke.
                if self._writer is not None:
                    self._writer.join(timeout=max(5.0, 2 * self.options.lease_s))
                    if self._writer.is_alive():
                        self._write_outlived_deposition(core)
                with self.cond:
                    self._drain()
                if self.unsafe == "write-after-lease-loss":
                    from system.trainer.unsafe import write_after_lease_loss
                    write_after_lease_loss(self)
                return EXIT_DEPOSED
            if params is not None:
                self.loss = model.loss(params, dataset.x_test, dataset.y_test, self.config.l2)
                self.accuracy = model.accuracy(params, dataset.x_test, dataset.y_test)
            self._maybe_checkpoint()
            with self.cond:
                if core.finished:
                    break
        self._finish()
        return EXIT_DONE

    def _maybe_checkpoint(self) -> None:
        core = self.core
        assert core is not None
        with self.cond:
            if not core.checkpoint_due():
                return
        if self._writer is not None:
            self._writer.join()  # at most one in flight: wait for the previous one
        with self.cond:
            if core.deposed:
                return
            plan = core.plan_checkpoint()
            self._drain()
        self._writer = threading.Thread(target=self._write, args=(plan,), daemon=True)
        self._writer.start()
        if core.done:
            self._writer.join()

    def _write(self, plan) -> None:  # noqa: ANN001 - CheckpointPlan
        core = self.core
        assert core is not None
        blob = codec.encode(plan.checkpoint)
        meta = codec.Metadata(step=plan.checkpoint.step, mode=self.store.mode, size=0, checksum="",
                              config_hash=plan.checkpoint.config_hash,
                              coordinator_id=self.options.coordinator_id,
                              lease_version=core.term, request_id=plan.request_id,
                              done=plan.checkpoint.done)
        if not self._may_write():
            with self.cond:
                core.on_checkpoint_abandoned("lease no longer valid before the write")
                self._drain()
                self._wake()
            return
        try:
            version = self.store.write(blob, meta, plan.expected_version, self.head_meta,
                                       plan.expected_version)
        except CasMismatch as exc:
            with self.cond:
                if core.in_flight is not plan:
                    return  # settled as unknown when the deposed process gave up waiting
                core.on_checkpoint_mismatch(exc.current_version)
                self._drain()
                self._wake()
            return
        except Exception as exc:  # noqa: BLE001 - StopWriting, KVError, object store, disk
            # Conservative: any other failure may have left the head written or not; this
            # coordinator stops (a fresh standby retries from the committed state).
            with self.cond:
                if core.in_flight is not plan:
                    return
                core.on_checkpoint_unknown(f"{type(exc).__name__}: {exc}")
                self._drain()
                self._wake()
            return
        with self.cond:
            if core.in_flight is not plan:
                return
            self.head_meta = meta
            core.on_checkpoint_committed(version)
            self._drain()
            self._wake()

    def _write_outlived_deposition(self, core: CoordinatorCore) -> None:
        """The write in flight did not end within the wait: say where it is stuck (for the
        person reading the log) and record its outcome as unknown, since the process now
        exits with the write perhaps sent."""
        frame = sys._current_frames().get(self._writer.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
        print(f"warning: coordinator {self.options.coordinator_id} deposed with its checkpoint "
              f"write still running; exiting without its outcome. The writer was at:\n{stack}",
              file=sys.stderr, flush=True)
        with self.cond:
            if core.in_flight is not None:
                core.on_checkpoint_unknown("write still running when the deposed coordinator exited")

    def _renew_loop(self) -> None:
        """Renew the lease, independent of the training work: this thread never waits for
        `self.cond` (held while a step closes, parameters are serialized for a worker,
        events are drained) except to record a loss. Before, it took the lock every 0.1 s
        just to read two flags, so a renewal waited behind whatever held it."""
        core = self.core
        assert core is not None
        while True:
            # Plain reads of two flags other threads set under the lock: a stale read costs
            # one more renewal at most, which the lock never prevented either (a flag can be
            # set just after a locked read).
            if core.deposed or core.finished:
                return
            if self.lease.timer.renew_due(time.monotonic()):
                try:
                    ok = self.lease.renew()
                except KVError:
                    ok = self.lease.valid()
                if not ok:
                    with self.cond:
                        self._emit({"kind": "lease-lost", "lease_version": core.term, "outcome": "fail"})
                        core.step_down("lease lost")
                        self.cond.notify_all()
                    return
            time.sleep(self.options.lease_s / 40)  # polls renew_due; a late poll eats the renewal's budget

    def _finish(self) -> None:
        """Mark the job done in the lease record, then keep answering 'done' briefly."""
        with self.cond:
            core = self.core
        ok = self.lease.renew(done=True)
        self._emit({"kind": "done", "step": core.step if core else 0,
                    "outcome": "ok" if ok else "fail", "lease_version": self.lease.term})
        end = time.monotonic() + self.options.done_grace_s
        with self.cond:
            while time.monotonic() < end:
                self.cond.wait(end - time.monotonic())

    def status(self) -> trainer_pb2.StatusReply:
        with self.cond:
            core = self.core
            reply = trainer_pb2.StatusReply(coordinator_id=self.options.coordinator_id,
                                            active=self.active and core is not None and not core.deposed,
                                            loss=self.loss, accuracy=self.accuracy, error=self.error)
            if core is not None:
                reply.term, reply.step = core.term, core.step
                reply.last_checkpoint_step = max(core.checkpointed_step, 0)
                reply.last_checkpoint_version = core.head_version
                reply.skipped_gradients, reply.done = core.skipped_total, core.finished
            return reply

