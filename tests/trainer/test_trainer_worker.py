"""A worker whose coordinator stops answering while the lease still names it keeps working.

Before the fix a failed call dropped the stub but kept the address, the next lease lookup
found the same address and made no new stub, and the run loop's assertion crashed the
worker: 16-35 crashes a harness run, hidden by restarts that outlasted the gradient
deadline on a loaded machine (skipped steps, parameters no longer bit-for-bit)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from system.trainer import worker as worker_module
from system.trainer.config import TrainConfig
from system.trainer.lease import LeaseRecord
from system.trainer.proto import trainer_pb2, trainer_pb2_grpc

CONFIG = TrainConfig(dataset="breast_cancer", workers=1, steps=10, batch_size=8, job="w")


class _FlakyCoordinator(trainer_pb2_grpc.ParameterServerServicer):
    """Fails the first Train stream (a coordinator that stopped answering), then says the
    job is done."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def Train(self, requests, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        for request in requests:
            if first:
                context.abort(grpc.StatusCode.UNAVAILABLE, "coordinator not answering")
            yield trainer_pb2.GradientReply(next=trainer_pb2.ParametersReply(
                job=request.pull.job, term=1, serving=True, done=True))


def test_a_worker_reconnects_to_the_same_coordinator_after_a_failed_call(monkeypatch) -> None:  # noqa: ANN001
    servicer = _FlakyCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trainer_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        record = LeaseRecord(coordinator_id="c1", address=f"127.0.0.1:{port}", term=1)
        monkeypatch.setattr(worker_module, "read_lease", lambda kv, job, **_: (record, 1))
        monkeypatch.setattr(worker_module, "BACKOFF_MIN_S", 0.0)
        w = worker_module.Worker(CONFIG, 0, ["127.0.0.1:1"])
        w._backoff_s = 0.0  # noqa: SLF001 - no waiting in the test
        try:
            assert w.run() == 0  # raised AssertionError before the fix
        finally:
            w.kv.close()
            if w._channel is not None:  # noqa: SLF001
                w._channel.close()  # noqa: SLF001
        assert servicer.calls == 2 and w.stats.lookups == 2
    finally:
        server.stop(grace=None)



class _SilentCoordinator(trainer_pb2_grpc.ParameterServerServicer):
    """A paused coordinator: its stream opens and nothing ever comes back."""

    def __init__(self) -> None:
        self.calls = 0

    def Train(self, requests, context):  # noqa: ANN001, ANN201, N802 - gRPC's names
        self.calls += 1
        gone = threading.Event()
        context.add_callback(gone.set)
        gone.wait(30)  # until the worker cancels the stream
        return iter(())


def _serve(servicer: trainer_pb2_grpc.ParameterServerServicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trainer_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_worker_reads_the_lease_again_before_calling_a_silent_coordinator_again(monkeypatch) -> None:  # noqa: ANN001
    """A call that timed out marks its coordinator silent: while the lease still names it
    the worker reads the lease again (here the successor's record on the next read) instead
    of calling it again and waiting out another timeout (SIGSTOP failover took 4.1 s)."""
    silent, done = _SilentCoordinator(), _FlakyCoordinator()
    done.calls = 1  # answers "done" at once
    (s1, a1), (s2, a2) = _serve(silent), _serve(done)
    try:
        records = [LeaseRecord(coordinator_id="c1", address=a1, term=1),
                   LeaseRecord(coordinator_id="c1", address=a1, term=1),
                   LeaseRecord(coordinator_id="c2", address=a2, term=2)]
        lookups = iter(records + records[-1:] * 20)
        monkeypatch.setattr(worker_module, "read_lease", lambda kv, job, **_: (next(lookups), 1))
        monkeypatch.setattr(worker_module, "RPC_TIMEOUT_S", 0.5)
        w = worker_module.Worker(CONFIG, 0, ["127.0.0.1:1"])
        try:
            assert w.run() == 0
        finally:
            w.kv.close()
            if w._channel is not None:  # noqa: SLF001
                w._channel.close()  # noqa: SLF001
        assert silent.calls == 1, "the silent coordinator was called again while the lease named it"
        assert done.calls == 2
    finally:
        s1.stop(grace=None)
        s2.stop(grace=None)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
