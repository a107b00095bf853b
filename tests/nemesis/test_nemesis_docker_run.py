"""The main job on the Docker platform: a short faulted run is valid and leaves nothing
behind; Ctrl-C tears everything down; `--platform docker` without an engine is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemesis.platforms.docker import docker_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
AVAILABLE, REASON = docker_available()
needs_docker = pytest.mark.skipif(not AVAILABLE, reason=f"needs a Docker engine ({REASON})")


def _labelled(run_id: str) -> set[str]:
    """Everything carrying the run's label: containers, networks, volumes. (Other runs may
    be going on beside the test: only this run's count.)"""
    found = set()
    label = f"label=mao.run={run_id}"
    for kind in ("container", "network", "volume"):
        cmd = ["docker", kind, "ls", "-q", "--filter", label]
        if kind == "container":
            cmd = ["docker", "ps", "-aq", "--filter", label]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        found |= {f"{kind}:{line}" for line in out.split()}
    return found


def _nemesis(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nemesis", "run", "--store",
                             str(tmp_path / "store"), *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


@needs_docker
def test_short_docker_run_is_valid_and_leaves_nothing(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "docker", "--nodes", "3", "--duration", "20",
                    "--interval", "4", "--faults", "partition,kill", "--seed", "4")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert out.splitlines()[0].startswith("platform: docker (asked for with --platform docker; "
                                          "Docker engine")
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["platform"] == "docker"
    assert sum(results["faults"].values()) >= 2
    assert (run_dir / "nodes" / "n1.log").stat().st_size > 0
    run_id = json.loads((run_dir / "test.json").read_text())["run_id"]
    assert run_id and _labelled(run_id) == set()


@needs_docker
def test_ctrl_c_on_docker_removes_containers_network_and_volumes(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "docker", "--nodes", "3", "--duration", "300",
                    "--faults", "partition", "--interval", "2")
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    while "running the kv workload" not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
    run_id = json.loads(((tmp_path / "store" / "latest").resolve() / "test.json").read_text())["run_id"]
    assert len(_labelled(run_id)) == 3 + 1 + 3, "3 containers, the network, 3 volumes"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert _labelled(run_id) == set()


def test_docker_platform_without_an_engine_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "docker", "--duration", "30",
                    env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --platform docker cannot start: "), out
    assert not (tmp_path / "store").exists()


@needs_docker
def test_clean_leaves_a_live_run_alone_and_removes_it_when_named(tmp_path: Path) -> None:
    from nemesis.platforms import docker as docker_platform
    from nemesis.platforms.base import ClusterConfig

    run_id = f"cleantest-{os.getpid()}"
    platform = docker_platform.DockerPlatform(
        ClusterConfig(nodes=1, run_id=run_id, work_dir=tmp_path))
    try:
        platform.start()
        assert len(_labelled(run_id)) == 3  # container, network, volume
        # This process owns the run and is alive: a blanket clean must not touch it.
        removed = docker_platform.clean()
        assert not [r for r in removed if run_id in r]
        assert len(_labelled(run_id)) == 3
        removed = docker_platform.clean(run_id)
        assert len([r for r in removed if run_id in r]) == 3
        assert _labelled(run_id) == set()
    finally:
        platform.close()


@needs_docker
def test_member_fault_on_docker_wipes_the_volume_and_rejoins(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--platform", "docker", "--nodes", "3", "--duration", "20",
                    "--interval", "4", "--faults", "member", "--seed", "5")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    # The round leads with two-in-flight (nemesis/member_shapes.py): the safe leader refuses
    # the second removal; every node a shape removed rejoins as a new incarnation.
    starts = [e for e in events if e["f"] == "remove-member"]
    assert starts[0]["shape"] == "two-in-flight", starts[0]
    assert any("a membership change is in progress" in e["description"]
               for e in events if e["f"] == "member-change"), events
    rejoined = []
    for e in events:
        if e["f"] == "rejoin-member":
            rejoined += e["rejoined"] if isinstance(e["rejoined"], list) else [e["rejoined"]]
    for node in set(rejoined):
        log = (run_dir / "nodes" / f"{node}.log").read_text().splitlines()
        assert len({json.loads(line)["member_id"] for line in log
                    if "identity confirmed" in line}) >= 2, node
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["crashed_nodes"] == []
    run_id = json.loads((run_dir / "test.json").read_text())["run_id"]
    assert _labelled(run_id) == set()
