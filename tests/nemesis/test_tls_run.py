"""`python -m nemesis run --tls` (issue 24): a faulted run with mutual TLS on every node port
is valid, on the local platform and on Docker; the nodes run with the TLS flags and refuse
plaintext; the run's CA lives outside the run folder and is gone when the run ends (a
normal end, Ctrl-C, a failed start, or `clean` after the harness was SIGKILLed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nemesis.platforms.docker import docker_available
from nemesis.platforms.local import RUN_ENV_VAR
from nemesis.tls_run import TEMP_PREFIX, RunTls
from system.kv.status_probe import StatusProbe
from system.kv.tls import TlsFiles

REPO = Path(__file__).resolve().parents[2]
TLS_FLAGS = ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file",
             "--peer-key-file", "--peer-trusted-ca-file", "--client-cert-auth")
DOCKER, DOCKER_REASON = docker_available()


def _nemesis(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nemesis", "run", "--store",
                             str(tmp_path / "store"), *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def _wait(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stdout.read()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _stop(proc: subprocess.Popen) -> None:
    """After a failed assertion: SIGTERM lets the harness tear its cluster and its
    certificate directory down (SIGKILL would leave them to `clean`)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _run_id(tmp_path: Path) -> str | None:
    try:
        test = (tmp_path / "store" / "latest").resolve() / "test.json"
        return json.loads(test.read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return None


def _ca_dirs(run_id: str) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{run_id}-*"))


def _node_commands(run_id: str) -> dict[str, list[str]]:
    """node id -> command line of the run's live `system.kv serve` processes."""
    marker = f"{RUN_ENV_VAR}={run_id}\0".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes() + b"\0":
                continue
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "serve" in argv and "--id" in argv:
            found[argv[argv.index("--id") + 1]] = argv
    return found


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _no_private_key_in(run_dir: Path) -> None:
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert path.suffix != ".key", path
            assert b"PRIVATE KEY" not in path.read_bytes(), path


@pytest.mark.integration
@pytest.mark.slow
def test_local_tls_run_is_valid_and_keeps_its_keys_out_of_the_run_folder(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "local", "--tls", "--nodes", "3", "--duration", "15",
                    "--interval", "3", "--faults", "partition,kill", "--seed", "24")
    try:
        run_id = _wait(lambda: _run_id(tmp_path), 60, "test.json", proc)
        commands = _wait(lambda: (c if len(c := _node_commands(run_id)) == 3 else None), 60,
                         "three nodes", proc)
        (ca_dir,) = _ca_dirs(run_id)
        run_dir = (tmp_path / "store" / "latest").resolve()
        assert not ca_dir.is_relative_to(run_dir)
        assert (ca_dir / "ca.key").stat().st_mode & 0o077 == 0
        for node_id, argv in commands.items():
            assert all(flag in argv for flag in TLS_FLAGS), argv
            assert _flag(argv, "--cert-file") == str(ca_dir / f"{node_id}.crt")
            assert _flag(argv, "--peer-key-file") == str(ca_dir / f"{node_id}.key")
            assert _flag(argv, "--trusted-ca-file") == str(ca_dir / "ca.crt")
        # The ports are TLS: a plaintext probe gets nothing, the run's client certificate
        # an answer (a node killed by the nemesis meanwhile is waited out).
        address = _flag(commands["n2"], "--listen")
        plain, secure = StatusProbe(), StatusProbe(tls=TlsFiles.in_dir(ca_dir, "client"))
        try:
            _wait(lambda: secure.status(address, 1.0), 30, "a TLS Status answer from n2", proc)
            assert plain.status(address, 1.0) is None
        finally:
            plain.close()
            secure.close()
        out, _ = proc.communicate(timeout=240)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out
    assert "with mutual TLS" in out and " --tls" in out  # the reproduce line keeps it
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and sum(results["faults"].values()) >= 2
    assert results["tls"]["ca_certificate"] == "ca.crt"
    assert json.loads((run_dir / "test.json").read_text())["config"]["tls"] is True
    assert b"BEGIN CERTIFICATE" in (run_dir / "ca.crt").read_bytes()
    assert "mutual TLS on every node port" in (run_dir / "report.html").read_text()
    _no_private_key_in(run_dir)
    assert _ca_dirs(run_id) == []


@pytest.mark.integration
@pytest.mark.slow
def test_ctrl_c_removes_the_runs_certificate_directory(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "local", "--tls", "--nodes", "3", "--duration", "120",
                    "--faults", "none", "--seed", "25")
    try:
        run_id = _wait(lambda: _run_id(tmp_path), 60, "test.json", proc)
        _wait(lambda: len(_node_commands(run_id)) == 3, 60, "three nodes", proc)
        assert len(_ca_dirs(run_id)) == 1
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 3 and "interrupted" in out, out
    assert _ca_dirs(run_id) == []
    assert _node_commands(run_id) == {}
    _no_private_key_in((tmp_path / "store" / "latest").resolve())


def test_a_run_that_fails_to_start_removes_its_certificate_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from nemesis import runner
    from nemesis.platforms.base import PlatformError

    made: list[Path] = []

    def broken_platform(config, run_id, run_dir, image=None, tls=None):  # noqa: ANN001, ANN202
        made.append(tls.directory)
        tls.generate({"n1": []})  # as a platform does before its nodes start
        raise PlatformError("the engine went away")

    monkeypatch.setattr(runner, "make_platform", broken_platform)
    config = runner.RunConfig(
        argv=["test"], platform="local", platform_reason="test", faults=["none"],
        duration_s=1.0, interval_s=1.0, nodes=1, workload="kv", seed=1, store=tmp_path / "store",
        concurrency=1, rate=10.0, op_timeout_s=1.0, read_consistency="linearizable",
        unsafe=None, check_budget_s=5.0, tls=True)
    assert runner.run(config, out=io.StringIO()) == 3
    assert len(made) == 1 and (made[0].name.startswith(TEMP_PREFIX))
    assert not made[0].exists()
    _no_private_key_in((tmp_path / "store" / "latest").resolve())


def test_clean_removes_the_certificates_of_a_killed_harness(tmp_path: Path) -> None:
    from nemesis.platforms import local

    # Scoped to this test's run ids: a bare `clean` on a shared machine would also sweep
    # what other runs left.
    orphan = RunTls("kv-orphan-tls-test")
    try:
        assert (orphan.directory / "harness.pid").read_text() == str(os.getpid())
        removed = local.clean("kv-orphan-tls-test")
        assert f"directory {orphan.directory}" in removed
        assert not orphan.directory.exists()
    finally:
        orphan.close()


def _trainer_commands(ca_dir: Path) -> dict[str, list[str]]:
    """`system.trainer` processes started with the run's certificates, by --cert-file's name."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if "system.trainer" in argv and "--cert-file" in argv:
            cert = Path(_flag(argv, "--cert-file"))
            if cert.is_relative_to(ca_dir):
                found[cert.stem] = argv
    return found


@pytest.mark.integration
@pytest.mark.slow
def test_local_trainer_tls_run_is_valid(tmp_path: Path) -> None:
    """The trainer's coordinators and workers present their own certificates to each
    other (a CA of the trainer's) and the run's client certificate to the store."""
    proc = _nemesis(tmp_path, "--platform", "local", "--tls", "--workload", "trainer",
                    "--nodes", "3", "--duration", "20", "--interval", "5", "--faults", "kill",
                    "--seed", "27")
    try:
        run_id = _wait(lambda: _run_id(tmp_path), 60, "test.json", proc)
        (ca_dir,) = _wait(lambda: _ca_dirs(run_id), 60, "the CA directory", proc)
        trainer = _wait(lambda: (c if {"coordinator", "worker-0"} <= set(c := _trainer_commands(ca_dir))
                                 else None), 120, "a coordinator and a worker with TLS", proc)
        for name, argv in trainer.items():
            assert _flag(argv, "--trusted-ca-file") == str(ca_dir / "trainer" / "ca.crt")
            assert _flag(argv, "--key-file") == str(ca_dir / "trainer" / f"{name}.key")
            assert _flag(argv, "--kv-cert-file") == str(ca_dir / "trainer" / "kv-client.crt")
            assert _flag(argv, "--kv-trusted-ca-file") == str(ca_dir / "trainer" / "kv-ca.crt")
        assert not (ca_dir / "trainer" / "ca.key").exists()
        out, _ = proc.communicate(timeout=300)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert json.loads((run_dir / "results.json").read_text())["valid"] is True
    _no_private_key_in(run_dir)
    assert _ca_dirs(run_id) == []


def test_tls_is_refused_on_the_simulator_in_one_line(tmp_path: Path) -> None:
    for args, expected in ((["--platform", "sim"], "--tls needs real nodes"),):
        result = subprocess.run(
            [sys.executable, "-m", "nemesis", "run", "--tls", "--store", str(tmp_path / "store"),
             "--duration", "5", *args], cwd=tmp_path, capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert result.returncode == 3, result
        assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
        assert not (tmp_path / "store").exists()


def _docker_args(run_id: str) -> dict[str, list[str]]:
    out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=mao.run={run_id}",
                          "--filter", "label=mao.kind=node"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    found = {}
    for container in out:
        inspected = json.loads(subprocess.run(["docker", "inspect", container], capture_output=True,
                                              text=True, timeout=60, check=True).stdout)[0]
        argv = inspected["Args"]
        if "--id" in argv:
            found[argv[argv.index("--id") + 1]] = argv
    return found


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not DOCKER, reason=f"needs a Docker engine ({DOCKER_REASON})")
def test_docker_tls_run_is_valid_and_keeps_its_keys_out_of_the_run_folder(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "docker", "--tls", "--nodes", "3", "--duration", "20",
                    "--interval", "4", "--faults", "partition,kill", "--seed", "26")
    try:
        run_id = _wait(lambda: _run_id(tmp_path), 600, "test.json (the image may build)", proc)
        commands = _wait(lambda: (c if len(c := _docker_args(run_id)) == 3 else None), 120,
                         "three node containers", proc)
        for node_id, argv in commands.items():
            assert all(flag in argv for flag in TLS_FLAGS), argv
            assert _flag(argv, "--cert-file") == f"/etc/mao-tls/{node_id}.crt"
        assert len(_ca_dirs(run_id)) == 1
        out, _ = proc.communicate(timeout=600)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["platform"] == "docker"
    assert sum(results["faults"].values()) >= 2
    _no_private_key_in(run_dir)
    assert _ca_dirs(run_id) == []


@pytest.mark.integration
def test_membership_steps_present_the_admin_certificate(tmp_path: Path) -> None:
    """The nemesis's member fault goes through `Platform.change_membership`: with --tls it
    must present the admin certificate, which a node demands (the client's is refused)."""
    from nemesis.platforms.base import ClusterConfig
    from nemesis.platforms.local import LocalPlatform
    from system.kv import member_client

    tls = RunTls("kv-membership-tls-test")
    platform = LocalPlatform(ClusterConfig(nodes=3, run_id="kv-membership-tls-test",
                                           work_dir=tmp_path, tls=tls))
    try:
        platform.start()
        _wait(platform.ready, 60, "a leader with every node up and confirmed")
        with pytest.raises(member_client.MembershipDenied, match="admin"):
            member_client.change(list(platform.client_addresses.values()), "remove", "n3",
                                 tls=platform.client_tls, timeout_s=20)
        platform.change_membership("remove", "n3", timeout_s=30)
        assert platform.membership()[0] == {"n1", "n2"}
    finally:
        platform.close()
        tls.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not DOCKER, reason=f"needs a Docker engine ({DOCKER_REASON})")
def test_docker_trainer_tls_run_is_valid(tmp_path: Path) -> None:
    """Trainer containers read their certificates from the run's temporary directory
    (bind-mounted read-only); a coordinator's certificate names its address on the run's
    network, which the workers check."""
    proc = _nemesis(tmp_path, "--platform", "docker", "--tls", "--workload", "trainer",
                    "--nodes", "3", "--duration", "25", "--interval", "6", "--faults", "kill",
                    "--seed", "28")
    try:
        run_id = _wait(lambda: _run_id(tmp_path), 600, "test.json (the image may build)", proc)
        (ca_dir,) = _wait(lambda: _ca_dirs(run_id), 60, "the CA directory", proc)

        def trainer_args() -> list[list[str]]:
            ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=mao.run={run_id}",
                                  "--filter", "label=mao.kind=trainer"], capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
            return [json.loads(subprocess.run(["docker", "inspect", i], capture_output=True,
                                              text=True, timeout=60).stdout or "[{}]")[0].get("Args", [])
                    for i in ids]

        args = _wait(lambda: [a for a in trainer_args() if "--cert-file" in a], 180,
                     "trainer containers", proc)
        for argv in args:
            assert Path(_flag(argv, "--cert-file")).is_relative_to(ca_dir / "trainer")
            assert _flag(argv, "--kv-cert-file") == str(ca_dir / "trainer" / "kv-client.crt")
        out, _ = proc.communicate(timeout=600)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert json.loads((run_dir / "results.json").read_text())["valid"] is True
    _no_private_key_in(run_dir)
    assert _ca_dirs(run_id) == []
