"""A worker process: owns one shard, computes the gradient of its next batch, pushes it.

Best effort and stateless beyond its shard: the batch of a step is a function of
(seed, worker, step), so a restarted worker, or one that follows a new coordinator back to
an older step, computes exactly the gradient it would have computed the first time.
It finds the coordinator in the lease record, keeps one Train stream to it (one message
each way per step), remembers the highest term it has seen
and ignores any coordinator with a lower one (a deposed coordinator cannot lead it back).
Failures cost a bounded backoff (20 ms doubling to 500 ms), never a retry storm.
Exit 0 when the coordinator says the run is finished (or the lease record says done).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import grpc

from system.kv.client import KVClient, KVError
from system.kv.tls import TlsFiles, grpc_channel_credentials, open_channel
from system.trainer import certs
from system.trainer.config import TrainConfig
from system.trainer.coordinator import GRPC_OPTIONS
from system.trainer.lease import read_lease
from system.trainer.local import WorkerShard
from system.trainer.proto import trainer_pb2, trainer_pb2_grpc
from system.trainer.tensors import from_tensor, to_tensor

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.02, 0.5
# A call long-polls the coordinator for at most WAIT_S, so a live one answers within it plus
# its work; RPC_TIMEOUT_S bounds how long a worker keeps waiting on a coordinator that was
# paused (a GC pause, a stopped VM: its connection stays open and nothing fails) before it
# reads the lease record again. With a 5 s timeout the successor sat idle for 2.2-2.4 s
# after its takeover, waiting for the workers to give up on the old one.
WAIT_S = 1.0
RPC_TIMEOUT_S = WAIT_S + 1.0
# After a coordinator went silent (a call timed out), a lease record that still names it
# is read again for up to SILENT_WAIT_S before it is called again: a paused coordinator's
# lease lapses about when the worker gives up on it, and calling it again at once cost
# another RPC_TIMEOUT_S after the successor had taken over (SIGSTOP -> the successor's first
# step: 4.1 s median at load 8-26). A coordinator that was only slow is called again then.
SILENT_WAIT_S = 1.0


class TrainStream:
    """A worker's Train stream to one coordinator: `ask` sends one message and returns its
    answer, or raises grpc.RpcError. An answer not in within `timeout_s` cancels the
    stream (a paused coordinator keeps its connection open and nothing fails): a watchdog
    thread, which wakes about once per timeout, not once per message."""

    def __init__(self, stub: trainer_pb2_grpc.ParameterServerStub) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = stub.Train(iter(self._requests.get, None))
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self.timed_out = False  # the watchdog cancelled it: no answer within the timeout
        threading.Thread(target=self._watch, daemon=True).start()

    def ask(self, request: trainer_pb2.StepRequest, timeout_s: float) -> trainer_pb2.GradientReply:
        with self._cond:
            self._deadline = time.monotonic() + timeout_s
        self._requests.put(request)
        try:
            return next(self._call)
        except StopIteration:  # the coordinator ended the stream (it is stopping)
            self._call.cancel()
            raise self._call from None  # a finished call is the RpcError of its status
        finally:
            with self._cond:
                self._deadline = None

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if self._deadline is not None and now >= self._deadline:
                    self.timed_out = True
                    self._call.cancel()  # the blocked `ask` raises CANCELLED
                    return
                # Asleep at most 1 s: a deadline set meanwhile is always further ahead.
                self._cond.wait(1.0 if self._deadline is None else self._deadline - now)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._requests.put(None)
        self._call.cancel()


@dataclass
class WorkerStats:
    pushed: int = 0
    rejected: int = 0
    lookups: int = 0


class Worker:
    def __init__(self, config: TrainConfig, worker: int,
                 kv_addresses: list[str] | dict[str, str], *, tls: TlsFiles | None = None,
                 kv_tls: TlsFiles | None = None) -> None:
        self.config, self.worker = config, worker
        self.shard = WorkerShard(config, worker)
        self.kv = KVClient(kv_addresses, timeout_s=2.0, client_id=f"worker-{worker}", tls=kv_tls)
        # With TLS: this worker's certificate, and the coordinator's is checked to name the
        # host of the address in the lease record.
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None
        self._refusals = certs.OnceEach()
        self.max_term = 0
        self.stats = WorkerStats()
        self._channel: grpc.Channel | None = None
        self._stream: TrainStream | None = None
        self._address = ""
        self._term = 0  # the lease term of the coordinator at self._address
        self._silent: tuple[str, int, float] | None = None  # address, term, until (monotonic)
        self._backoff_s = BACKOFF_MIN_S

    def _sleep_backoff(self) -> None:
        time.sleep(self._backoff_s)  # bounded backoff between failed attempts
        self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)

    def _lookup(self) -> bool | None:
        """Connect to the coordinator named in the lease record. None: the job is done."""
        self.stats.lookups += 1
        try:
            record, _ = read_lease(self.kv, self.config.job)
        except KVError:
            return False
        if record is None:
            return False
        if record.done and record.term >= self.max_term:
            return None
        if self._silent is not None:
            address, term, until = self._silent
            if (record.address, record.term) == (address, term) and time.monotonic() < until:
                return False  # still the one that went silent: read the lease again first
            self._silent = None
        if record.address != self._address or self._channel is None:
            if self._channel is not None:
                self._channel.close()
            self._channel = open_channel(record.address, self._credentials, GRPC_OPTIONS)
            self._address = record.address
        self._term = record.term
        # A failed call drops the stream, not the address: when the lease still names the
        # same coordinator (paused, slow, restarting on its port) the stream is opened again
        # on the same channel (gRPC reconnects it). Before, the address check alone decided,
        # so the stub stayed None and the run loop's assertion crashed the worker (16-35
        # times a run).
        self._stream = TrainStream(trainer_pb2_grpc.ParameterServerStub(self._channel))
        return True

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _failed(self, error: grpc.RpcError) -> None:
        """A failed call: look the coordinator up again after a backoff. A TLS refusal is
        one line in this worker's log (once), saying what to fix."""
        line = certs.explain(error, self._address, uses_tls=self._credentials is not None)
        if line is not None:
            self._refusals.print(f"worker {self.worker}: {line}")
        if self._stream is not None and self._stream.timed_out:
            self._silent = (self._address, self._term, time.monotonic() + SILENT_WAIT_S)
        self._drop_stream()
        self._sleep_backoff()

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self._drop_stream()

    def _run(self) -> int:
        after_step = 0
        reply: trainer_pb2.ParametersReply | None = None  # next parameters, if a push brought them
        while True:
            if self._stream is None:
                found = self._lookup()
                if found is None:
                    return 0
                if not found:
                    self._sleep_backoff()
                    continue
            assert self._stream is not None
            if reply is None:
                try:
                    reply = self._stream.ask(trainer_pb2.StepRequest(pull=trainer_pb2.ParametersRequest(
                        job=self.config.job, worker=self.worker, after_step=after_step,
                        term=self.max_term, wait_s=WAIT_S)), RPC_TIMEOUT_S).next
                except grpc.RpcError as exc:
                    self._failed(exc)
                    continue
            current, reply = reply, None
            if not current.serving or current.term < self.max_term:
                self._drop_stream()  # not (or no longer) the coordinator: look it up again
                self._sleep_backoff()
                continue
            if current.term > self.max_term:
                self.max_term, after_step = current.term, 0
            if current.done:
                return 0
            if current.step <= after_step or not current.params.data:
                continue  # long-poll ended with nothing new
            params = from_tensor(current.params)
            grad, rows = self.shard.gradient(params, current.step)
            try:
                pushed = self._stream.ask(trainer_pb2.StepRequest(push=trainer_pb2.GradientPush(
                    job=self.config.job, worker=self.worker, step=current.step, term=current.term,
                    gradient=to_tensor(grad), rows=rows, wait_s=WAIT_S)), RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                self._failed(exc)
                continue
            self._backoff_s = BACKOFF_MIN_S
            after_step = current.step
            if pushed.accepted:
                self.stats.pushed += 1
                if pushed.HasField("next"):
                    reply = pushed.next
            else:
                self.stats.rejected += 1
