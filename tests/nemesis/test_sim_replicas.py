"""The end-of-run replica reads on the simulator, end to end (workloads/replicas.py,
nemesis/sim_runner.py, checker/replicas.py): a node whose state machine holds a value the
cluster never agreed on is caught by them, and was not by the final linearizable reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemesis import sim_runner
from nemesis.cli import main
from system.sim.state_machine import ReadResult

ARGS = ["--faults", "none", "--duration", "3", "--nodes", "3", "--seed", "4107"]


def _plant_a_diverged_follower(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """After the final reads, one follower's state machine answers one key with a value and
    version no client wrote: what a node that applied an entry the others overwrote holds."""
    planted: list[str] = []
    original = sim_runner.SimClients.replica_reads

    def replica_reads(self, run, timeout_s, out):  # noqa: ANN001, ANN202
        leader = self.platform.leader()
        node = next(n for n in self.platform.node_ids if n != leader)
        key = self.pool.touched[0]
        shell = self.sim.nodes[node]
        honest = shell.replica.read

        def read(k: str) -> ReadResult:
            return ReadResult("planted", 99) if k == key else honest(k)

        shell.replica.read = read
        planted.extend([node, key])
        return original(self, run, timeout_s, out)

    monkeypatch.setattr(sim_runner.SimClients, "replica_reads", replica_reads)
    return planted


def test_a_diverged_follower_is_caught_by_the_replica_reads_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted = _plant_a_diverged_follower(monkeypatch)
    code = main(["run", "--platform", "sim", "--store", str(tmp_path / "store"), *ARGS])
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert code == 1 and results["verdict"] == "INVALID"
    # The client reads and the final linearizable reads saw nothing wrong ...
    assert results["linearizable"]["valid"] is True and results["lost_writes"]["valid"] is True
    # ... the replica reads did, and name the node, the key and both answers.
    node, key = planted
    [anomaly] = results["replicas_agree"]["anomalies"][:1]
    assert anomaly["kind"] == "replica-diverged" and anomaly["key"] == key
    assert anomaly["text"].startswith(f"node {node} answered 'planted' version 99 at applied index")
    assert results["replica_reads"]["nodes"][node]["differs"], results["replica_reads"]
    # The harness took a fresh linearizable read when the node differed: it agrees with
    # the first, so the difference is the node's, not a late write's.
    assert results["replicas_agree"]["counts"]["moved"] == 0


def test_the_same_run_without_the_plant_is_valid(tmp_path: Path) -> None:
    code = main(["run", "--platform", "sim", "--store", str(tmp_path / "store"), *ARGS])
    results = json.loads(((tmp_path / "store" / "latest").resolve() / "results.json").read_text())
    assert code == 0, results["verdict"]
    counts = results["replicas_agree"]["counts"]
    assert counts["replica_reads"] == counts["agree"] == 3 * results["replica_reads"]["keys"]
