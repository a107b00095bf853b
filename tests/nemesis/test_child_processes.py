"""Nodes die with the harness, and only with it (system/child_processes.py)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from nemesis.platforms.local_cluster import LocalCluster

pytestmark = pytest.mark.integration


def test_a_node_started_from_a_thread_outlives_that_thread(tmp_path: Path) -> None:
    """The nemesis restarts nodes from its own thread, which ends before the run does.
    PR_SET_PDEATHSIG fires when the forking *thread* ends: every node a fault restarted
    was SIGKILLed at once at the end of the schedule, unseen."""
    with LocalCluster(1, tmp_path) as cluster:
        def restart_and_wait_until_up() -> None:
            cluster.start_node("n1")
            # Up and serving: the node has asked for its death signal by now.
            cluster.wait_until(lambda: cluster.status("n1"), 30, "n1 to answer")

        thread = threading.Thread(target=restart_and_wait_until_up)
        thread.start()
        thread.join()
        with pytest.raises(subprocess.TimeoutExpired):
            cluster.processes["n1"].wait(timeout=3)  # still running: nothing killed it
        assert cluster.status("n1") is not None
