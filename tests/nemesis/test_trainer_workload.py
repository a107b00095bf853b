"""`python -m nemesis run --workload trainer` on the local platform, end to end: a short run
under kill faults is valid (the model bit-for-bit the fault-free one), a trainer canary is
caught by the property it breaks, and no trainer process outlives the harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _trainer_processes(harness_pid: int) -> set[int]:
    """Processes the harness's TrainerRun started (they carry its pid in their environment)."""
    marker = f"TRAINER_PARENT_PID={harness_pid}\0".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes() + b"\0":
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _run(tmp_path: Path, *args: str, timeout_s: float = 150, platform: str = "local"
         ) -> tuple[int, str, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "nemesis", "run", "--platform", platform,
                             "--workload", "trainer", "--nodes", "3",
                             "--store", str(tmp_path / "store"), *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _trainer_processes(proc.pid), "trainer processes outlived the harness"
    results = json.loads(((tmp_path / "store" / "latest").resolve() / "results.json").read_text())
    return proc.returncode, out, results


def _docker() -> tuple[bool, str]:
    from nemesis.platforms import docker_status

    return docker_status()


@pytest.mark.parametrize("platform", ["local", pytest.param("docker", marks=pytest.mark.skipif(
    not _docker()[0], reason=f"needs a Docker engine ({_docker()[1]})"))])
def test_a_short_trainer_run_under_kill_faults_is_valid_and_hits_every_window(tmp_path: Path, platform: str) -> None:
    code, out, results = _run(tmp_path, "--faults", "kill", "--duration", "30", "--interval", "4",
                              "--seed", "3", platform=platform, timeout_s=400)
    assert code == 0, out
    assert results["properties"] == {"durable": True, "resume": True, "fencing": True,
                                     "request-ids": True, "lease": True, "head-cas": True,
                                     "resume-after-lease": True, "unique-request-ids": True,
                                     "reference": True}, out
    if platform == "local":
        # The first three faults go to the three windows (a miss is tried again): the
        # history shows a coordinator stopped inside each (checker/trainer_protocol.windows).
        windows = results["trainer_summary"]["counts"]["windows"]
        assert min(windows.values()) >= 1, (windows, out)
    assert results["trainer_summary"]["counts"]["checkpoints"]["ok"] > 0
    # Docker applies a kill and its heal (a new container) in seconds, not milliseconds: on
    # a loaded engine a 20 s run fits one (the active coordinator's, which leads each round).
    assert results["faults"].get("kill", 0) >= (1 if platform == "docker" else 2), out
    history = (tmp_path / "store" / "latest" / "history.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["f"] for line in history]
    assert {"checkpoint", "lease-acquired", "resume", "read-checkpoint", "kill"} <= set(kinds)
    # The schedule starts with a running trainer: the first fault finds a lease holder.
    assert kinds.index("lease-acquired") < kinds.index("kill"), kinds[:20]
    if platform == "docker":
        # The coordinators ran in containers on the run's network, and none outlived it.
        started = [json.loads(line)["value"] for line in history if '"f":"started"' in line]
        assert started and all(not s["detail"].startswith("127.0.0.1") for s in started), started
        run_id = json.loads(((tmp_path / "store" / "latest") / "test.json").read_text())["run_id"]
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=mao.run={run_id}"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
        assert left.split() == []


def test_the_write_after_lease_loss_canary_is_caught_by_fencing(tmp_path: Path) -> None:
    # Each round of pauses starts with the active coordinator, held 4 s past a 2 s lease.
    code, out, results = _run(tmp_path, "--faults", "pause", "--duration", "16", "--interval", "4",
                              "--seed", "5", "--unsafe", "write-after-lease-loss")
    assert code == 1, out
    assert results["properties"]["fencing"] is False, out
    kinds = {a["kind"] for a in results["trainer-fencing"]["anomalies"]}
    assert "write-after-fence" in kinds


@pytest.mark.parametrize("canary,faults,seed,prop,kind", [
    # seed 5 deals coordinator-mid-write second: paused at its head CAS, woken after the takeover
    ("no-fencing", "pause", "5", "fencing", "write-after-fence"),
    # seed 3 deals coordinator-reply-lost second: the committed write's answer lost, retried
    ("no-request-id", "partition", "3", "request-ids", "failed-write-applied"),
])
@pytest.mark.parametrize("safe", [False, True], ids=["canary", "safe"])
def test_the_faults_inside_a_checkpoint_write_catch_their_canary_and_pass_the_safe_trainer(
        tmp_path: Path, canary: str, faults: str, seed: str, prop: str, kind: str, safe: bool) -> None:
    code, out, results = _run(tmp_path, "--faults", faults, "--duration", "20", "--interval", "4",
                              "--seed", seed, *([] if safe else ["--unsafe", canary]))
    history = (tmp_path / "store" / "latest" / "history.jsonl").read_text().splitlines()
    landed = [json.loads(line) for line in history if '"paused-at"' in line]
    assert landed, f"no fault landed inside a checkpoint write\n{out}"
    if safe:
        assert code == 0, out
        return
    # On a miss, what the landed fault's coordinator recorded from the pause on (its write,
    # its retries, their outcome): what a person needs to tell a harness gap from a race.
    paused = history.index(next(line for line in history if '"paused-at"' in line))
    cid = landed[0]["value"]["coordinator_id"]
    after = "\n".join(line[:400] for line in history[paused:paused + 400] if cid in line)[:12000]
    assert code == 1, f"{out}\n{cid} from its pause on:\n{after}"
    assert results["properties"][prop] is False, out
    assert kind in {a["kind"] for a in results[f"trainer-{prop}"]["anomalies"]}, out
    # The run folder reads back: check, report and show name the broken property.
    run_dir = (tmp_path / "store" / "latest").resolve()
    for command, code_wanted, says in (("check", 1, prop), ("report", 0, "report.html"),
                                       ("show", 0, prop)):
        again = subprocess.run([sys.executable, "-m", "nemesis", command, str(run_dir)],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert again.returncode == code_wanted, (command, again.stdout, again.stderr)
        assert says in again.stdout, (command, again.stdout)
    report = (run_dir / "report.html").read_text()
    assert "Broken trainer properties" in report and kind in report
    assert "every coordinator ran the deliberately broken" in report


def test_a_trainer_canary_needs_the_trainer_workload(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "nemesis", "run", "--platform", "local",
                           "--unsafe", "no-request-id", "--store", str(tmp_path / "store")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        "error: --unsafe no-request-id is a trainer canary; it needs --workload trainer"]
