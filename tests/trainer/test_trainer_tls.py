"""The trainer with mutual TLS (issue 24).

A coordinator given certificates serves TLS and requires a certificate from its CA: a
plaintext caller, a caller without a certificate and one whose certificate another CA
signed are refused by the handshake, and an `admin` certificate (not a worker's) by the
coordinator itself; each refusal is one line on both sides (gRPC's "Handshake failed ..." or
the coordinator's "refused: ...", and the worker's "what to fix"), and the coordinator goes
on serving the workers it should. A whole run with TLS, store included, ends bit-for-bit
where the one-process loop does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from system.kv.tls import TlsFiles, grpc_channel_credentials
from system.trainer import certs
from system.trainer import worker as worker_module
from system.trainer.config import TrainConfig
from system.trainer.coordinator import Coordinator, CoordinatorOptions
from system.trainer.lease import LeaseRecord
from system.trainer.local import train_local
from system.trainer.procs import REPO_ROOT
from system.trainer.proto import trainer_pb2, trainer_pb2_grpc
from system.trainer.run import TrainerRun
from system.trainer.tensors import to_tensor
from system.trainer.worker import TrainStream

CONFIG = TrainConfig(dataset="breast_cancer", workers=1, steps=10, batch_size=8, job="tls")


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """This job's CA and certificates, and another CA's."""
    base = tmp_path_factory.mktemp("tls")
    return (certs.generate(base / "ours", workers=1).directory,
            certs.generate(base / "other", workers=1).directory)


@pytest.fixture
def coordinator(cas: tuple[Path, Path]):  # noqa: ANN201
    """A coordinator's gRPC server with TLS, standing by (its answers need no store)."""
    ours, _ = cas
    coord = Coordinator(CONFIG, CoordinatorOptions(
        coordinator_id="c-tls", kv_addresses=["127.0.0.1:1"],
        tls=TlsFiles.in_dir(ours, certs.COORDINATOR)))
    coord.server.start()
    try:
        yield coord
    finally:
        coord.server.stop(grace=None)
        coord.kv.close()


def push(channel: grpc.Channel) -> trainer_pb2.GradientReply:
    return trainer_pb2_grpc.ParameterServerStub(channel).PushGradient(
        trainer_pb2.GradientPush(job=CONFIG.job, worker=0, step=1, term=1,
                                 gradient=to_tensor(np.zeros(3))), timeout=10)


def channel_for(address: str, files: TlsFiles | None, ca: Path | None = None) -> grpc.Channel:
    if files is None and ca is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, grpc_channel_credentials(files, ca))


def wait_for_line(capfd: pytest.CaptureFixture[str], text: str, seen: list[str]) -> str:
    """The first line of this process's stderr containing `text` (gRPC's own server-side
    log is written from its threads, perhaps after the client's call has returned)."""
    deadline = time.monotonic() + 10
    while True:
        seen.extend(capfd.readouterr().err.splitlines())
        found = [line for line in seen if text in line]
        if found:
            return found[0]
        if time.monotonic() >= deadline:
            raise AssertionError(f"no line with {text!r} on stderr; saw {seen}")
        time.sleep(0.02)


def test_a_worker_with_this_ca_s_certificate_is_served(coordinator, cas) -> None:  # noqa: ANN001
    ours, _ = cas
    with channel_for(coordinator.address, TlsFiles.in_dir(ours, certs.worker_name(0))) as channel:
        reply = push(channel)
    assert not reply.accepted and reply.reason == "not-active"  # answered: standing by



def test_the_train_stream_serves_a_worker_and_refuses_an_admin_certificate(coordinator, cas, capfd) -> None:  # noqa: ANN001
    """The workers' path (worker.TrainStream) checks the caller as the unary push does."""
    ours, _ = cas
    request = trainer_pb2.StepRequest(push=trainer_pb2.GradientPush(
        job=CONFIG.job, worker=0, step=1, term=1, gradient=to_tensor(np.zeros(3))))
    capfd.readouterr()
    for name in (certs.worker_name(0), "admin"):
        with channel_for(coordinator.address, TlsFiles.in_dir(ours, name)) as channel:
            stream = TrainStream(trainer_pb2_grpc.ParameterServerStub(channel))
            try:
                if name == "admin":
                    with pytest.raises(grpc.RpcError) as refused:
                        stream.ask(request, 10)
                else:
                    assert stream.ask(request, 10).reason == "not-active"  # answered: standing by
            finally:
                stream.close()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert wait_for_line(capfd, "refused: a gradient push needs a client or node certificate", [])

@pytest.mark.parametrize("caller", ["plaintext", "no certificate", "another CA", "admin"])
def test_a_caller_that_is_not_a_worker_of_this_ca_is_refused_with_one_line_each_side(
        coordinator, cas, capfd, caller: str) -> None:  # noqa: ANN001
    ours, other = cas
    server_says = {
        "plaintext": "Handshake failed",  # gRPC's line: WRONG_VERSION_NUMBER
        "no certificate": "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        "another CA": "CERTIFICATE_VERIFY_FAILED",
        "admin": "refused: a gradient push needs a client or node certificate; "
                 "the caller's names admin 'admin'",
    }[caller]
    files = {
        "plaintext": None,
        "no certificate": None,
        # Trusts our CA (so it is not the worker refusing the coordinator), presents the
        # other CA's worker certificate.
        "another CA": TlsFiles(other / "worker-0.crt", other / "worker-0.key", ours / "ca.crt"),
        "admin": TlsFiles.in_dir(ours, "admin"),
    }[caller]
    ca = ours / "ca.crt" if caller == "no certificate" else None
    capfd.readouterr()
    with channel_for(coordinator.address, files, ca) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        push(channel)
    seen: list[str] = []
    assert wait_for_line(capfd, server_says, seen)
    if caller == "admin":
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert [line for line in seen if "refused" in line] == [f"warning: coordinator c-tls {server_says}"]
    # The worker's side: a line that says what to fix, not "Socket closed".
    line = certs.explain(refused.value, coordinator.address, uses_tls=files is not None or ca is not None)
    assert line is not None, refused.value.details()
    assert ("--cert-file" in line or "--trusted-ca-file" in line or "refused this worker" in line), line
    # And the coordinator goes on serving its workers.
    with channel_for(coordinator.address, TlsFiles.in_dir(ours, certs.worker_name(0))) as channel:
        assert push(channel).reason == "not-active"


class _Stop(Exception):
    pass


def test_a_plaintext_worker_says_once_what_to_fix(coordinator, monkeypatch, capsys) -> None:  # noqa: ANN001
    """The worker process's own line (printed once however often it retries)."""
    record = LeaseRecord(coordinator_id="c-tls", address=coordinator.address, term=1)
    monkeypatch.setattr(worker_module, "read_lease", lambda kv, job, **_: (record, 1))
    w = worker_module.Worker(CONFIG, 0, ["127.0.0.1:1"])
    failures = []

    def stop_after_three() -> None:
        failures.append(1)
        if len(failures) == 3:
            raise _Stop

    w._sleep_backoff = stop_after_three  # noqa: SLF001 - three failed calls, no waiting
    try:
        with pytest.raises(_Stop):
            w.run()
    finally:
        w.kv.close()
        if w._channel is not None:  # noqa: SLF001
            w._channel.close()  # noqa: SLF001
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: worker 0: the coordinator at {coordinator.address} closed the "
                     "connection before any call: if it uses TLS, give this worker "
                     "--cert-file, --key-file and --trusted-ca-file"]


@pytest.mark.integration
def test_a_run_with_tls_everywhere_refuses_intruders_and_ends_bit_for_bit(tmp_path: Path) -> None:
    """`run --tls`: a throw-away CA for the run's own store, coordinators and workers. Two
    intruding worker processes (with the store's certificate, so they find the coordinator
    in the lease record) are refused by the coordinator while the real workers are
    stopped: one plaintext, one presenting another CA's certificate. Each says once what
    to fix, the coordinator's log has gRPC's handshake line, and the run (a standby
    included) then ends exactly where the one-process loop does, and so where the
    plaintext runs of test_trainer_failover.py do. No timing: the real workers are
    SIGSTOPped, and the gradient deadline is far away, so no gradient is skipped meanwhile."""
    config = TrainConfig(dataset="breast_cancer", workers=2, steps=40, batch_size=16,
                         learning_rate=0.05, checkpoint_every=10, job="tls-run")
    expected = train_local(config)
    other = certs.generate(tmp_path / "other", workers=1).directory
    with TrainerRun(config, standbys=1, generate_tls=True, gradient_deadline_s=600) as run:
        run.start()
        ours = run.run_dir / "tls"
        assert (ours / "ca.crt").exists() and run.cluster.tls_dir == ours
        assert not (ours / "ca.key").exists(), "the throw-away CA key must not outlive the start"
        assert all("--cert-file" in proc.args for proc in run.procs.values())
        # A coordinator answers Status over TLS, to the run's own certificate.
        status = run.wait_until(run.status, 60, "a coordinator's Status over TLS")
        for worker in ("w0", "w1"):
            run.pause(worker)
        store = TlsFiles.in_dir(ours, certs.RUN).args("kv-")
        foreign = TlsFiles(other / "worker-0.crt", other / "worker-0.key", ours / "ca.crt")
        intruders = {"x-plaintext": store, "x-other-ca": [*foreign.args(), *store]}
        for name, flags in intruders.items():
            run.procs[name] = run.spawn_process(  # killed by run.close() with the rest
                name, ["worker", "--index", "0", "--config", config.to_json(),
                       "--kv", run.worker_kv(), *flags], run.run_dir / f"{name}.log")
        said = {
            "x-plaintext": "closed the connection before any call: if it uses TLS, give this "
                           "worker --cert-file, --key-file and --trusted-ca-file",
            "x-other-ca": "TLS handshake with",
        }

        def log(name: str) -> str:
            path = run.run_dir / f"{name}.log"
            return path.read_text(errors="replace") if path.exists() else ""

        for name, line in said.items():
            run.wait_until(lambda name=name, line=line: line in log(name), 60, f"{name}'s line")
        coordinator = status.coordinator_id
        run.wait_until(lambda: "WRONG_VERSION_NUMBER" in log(coordinator)  # plaintext
                       and "CERTIFICATE_VERIFY_FAILED" in log(coordinator), 60,  # another CA
                       "the coordinator's side of both refusals")
        for worker in ("w0", "w1"):
            run.resume(worker)
        latest = run.wait_finished(120)
        intruder_lines = {name: [x for x in log(name).splitlines() if x.startswith("error:")]
                          for name in intruders}
        workers_logs = log("w0") + log("w1")
    assert latest.checkpoint.step == 40
    assert latest.checkpoint.params.tobytes() == expected.params.tobytes()
    assert latest.checkpoint.velocity.tobytes() == expected.velocity.tobytes()
    assert all(len(lines) == 1 for lines in intruder_lines.values()), intruder_lines
    assert "error:" not in workers_logs and "Handshake failed" not in workers_logs, workers_logs[-2000:]


@pytest.mark.parametrize("args,message", [
    (["--cert-file", "x.crt"], "TLS needs all three files: missing --key-file --trusted-ca-file"),
    (["--tls", "--cert-file", "a", "--key-file", "b", "--trusted-ca-file", "c"],
     "--tls makes this run's certificates"),
    (["--cert-file", "/no/such.crt", "--key-file", "b", "--trusted-ca-file", "c",
      "--kv", "127.0.0.1:1"], "cannot read the certificate /no/such.crt"),
    (["--cert-file", "a", "--key-file", "b", "--trusted-ca-file", "c"], "--cert-file is for a store given with --kv"),
])
def test_run_s_tls_flags_wrong_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "system.trainer", "run", "--dataset",
                             "breast_cancer", *args], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.integration
def test_run_tls_against_a_tls_store_with_its_own_ca_then_inspect(tmp_path: Path) -> None:
    """`run --tls --kv ... --kv-cert-file ...`: the trainer's processes use the run's CA
    between themselves and the store's client certificate towards the store; `inspect`
    reads the history with that certificate."""
    from system.kv.local_cluster import LocalCluster

    with LocalCluster(3, tmp_path / "kv", tls_dir=tmp_path / "store-tls") as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=30)
        kv = ",".join(cluster.addresses)
        store = cluster.tls_files("client")

        def trainer(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "system.trainer", *args], cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=120)

        ran = trainer("run", "--tls", "--kv", kv, *store.args("kv-"), "--job", "tls-cli",
                      "--dataset", "breast_cancer", "--workers", "2", "--standbys", "0",
                      "--steps", "30", "--checkpoint-every", "10",
                      "--object-dir", str(tmp_path / "objects"))
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert "held-out accuracy" in ran.stdout
        shown = trainer("inspect", "--kv", kv, "--job", "tls-cli", *store.args())
        assert shown.returncode == 0, shown.stderr
        assert ":step-30" in shown.stdout and "done" in shown.stdout
        # Without the store's certificates: one line each (no gRPC log line above it).
        plaintext = trainer("inspect", "--kv", kv, "--job", "tls-cli")
        assert plaintext.returncode == 2
        lines = plaintext.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: cannot read job 'tls-cli' from {kv}: TLS"), lines
        assert "--trusted-ca-file" in lines[0], lines[0]
        other_ca = trainer("run", "--tls", "--kv", kv, "--job", "tls-cli-2",
                           "--dataset", "breast_cancer", "--workers", "1", "--steps", "5")
        assert other_ca.returncode == 2
        lines = other_ca.stderr.strip().splitlines()
        assert len(lines) == 1 and "is not signed by the CA" in lines[0], other_ca.stderr
        assert lines[0].endswith("--kv-cert-file, --kv-key-file, --kv-trusted-ca-file"), lines[0]
