"""The start of a run: a node that exits while the cluster starts ends the wait at once,
and the error carries what the node printed (CI once waited 60 s on a node that had exited
2 at start-up and said only `n2=exited(2)`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nemesis.platforms.base import ClusterConfig
from nemesis.platforms.local import LocalPlatform
from nemesis.runner import HarnessError, wait_for_start


class StartingPlatform:
    """n2 exits (code 2, with a refusal on its stderr) after `exit_after` polls; no leader
    is ever ready."""

    def __init__(self, exit_after: int) -> None:
        self.node_ids = ["n1", "n2", "n3"]
        self.exit_after = exit_after
        self.polls = 0

    def exit_code(self, node_id: str) -> int | None:
        return 2 if node_id == "n2" and self.polls >= self.exit_after else None

    def exit_reason(self, node_id: str) -> str:
        return "error: node n2 refuses to start: cannot listen on 127.0.0.1:1: the port is in use"

    def ready(self) -> str | None:
        self.polls += 1
        return None

    def describe(self) -> str:
        return "n1=follower, n2=exited(2), n3=follower"


def test_a_node_that_exits_while_the_cluster_starts_ends_the_wait_with_its_reason() -> None:
    platform = StartingPlatform(exit_after=3)
    with pytest.raises(HarnessError) as caught:
        wait_for_start(platform, timeout_s=3600, logs=Path("/run/nodes"))  # type: ignore[arg-type]
    assert platform.polls == 3  # not one poll after the exit
    message = str(caught.value)
    assert message.startswith("node n2 exited with code 2 while the cluster was starting: "
                              "error: node n2 refuses to start: cannot listen on 127.0.0.1:1")
    assert "logs in /run/nodes" in message


def test_a_cluster_with_no_leader_is_reported_at_the_deadline() -> None:
    platform = StartingPlatform(exit_after=10**9)
    with pytest.raises(HarnessError, match="no leader with every node up and confirmed within 0.3 s"):
        wait_for_start(platform, timeout_s=0.3, logs=Path("/run/nodes"))  # type: ignore[arg-type]


@pytest.mark.integration
def test_a_local_node_refused_its_port_is_named_with_what_it_printed(tmp_path: Path) -> None:
    platform = LocalPlatform(ClusterConfig(nodes=3, run_id="start-test", work_dir=tmp_path))
    try:
        host, port = platform.client_addresses["n2"].split(":")
        with socket.socket() as taken:  # someone else listens on n2's port
            taken.bind((host, int(port)))
            taken.listen()
            platform.start()
            with pytest.raises(HarnessError) as caught:
                wait_for_start(platform, timeout_s=60, logs=tmp_path / "nodes")
    finally:
        platform.close()
    message = str(caught.value)
    assert message.startswith("node n2 exited with code 2 while the cluster was starting: "
                              f"error: node n2 refuses to start: cannot listen on {host}:{port}: "
                              "the port is in use"), message
    assert "n2=exited(2) [error: node n2 refuses to start" in message
