"""`python -m system.kv cluster` prints the nodes and the leader, and leaves no process behind:
not after SIGTERM (graceful), and not even after SIGKILL of the command itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemesis.platforms.local_cluster import REPO_ROOT

pytestmark = pytest.mark.integration


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _wait_for(condition, timeout_s: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _start_cluster_command(data_dir: Path) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "system.kv", "cluster", "--nodes", "3", "--base-port", "0",
         "--data-dir", str(data_dir)],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # the command prints the leader within seconds
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("leader: n"):
            return proc, lines
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"cluster command printed no leader: {lines}")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_cluster_command_stops_every_node_on_sigterm_or_ctrl_c(tmp_path, stop_signal) -> None:
    data_dir = tmp_path / "data"
    proc, lines = _start_cluster_command(data_dir)
    try:
        assert sum(1 for line in lines if line.startswith(("n1 ", "n2 ", "n3 "))) == 3
        assert len(_processes_mentioning(str(data_dir))) == 4  # the command and 3 nodes
        proc.send_signal(stop_signal)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "all nodes stopped" in out
        assert _processes_mentioning(str(data_dir)) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_nodes_die_with_a_killed_cluster_command(tmp_path) -> None:
    data_dir = tmp_path / "data"
    proc, _ = _start_cluster_command(data_dir)
    try:
        proc.kill()  # SIGKILL: no finally block runs in the command
        proc.wait(timeout=10)
        _wait_for(lambda: _processes_mentioning(str(data_dir)) == [], 10,
                  "the nodes to die with their parent")
    finally:
        for pid in _processes_mentioning(str(data_dir)):
            os.kill(pid, signal.SIGKILL)
