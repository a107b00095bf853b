"""The `restore-majority` fault (nemesis/restore_majority.py): its steps, in order, against
a scripted cluster; that it restores nothing unless the run can be judged afterwards; and,
slow, the real store under it: valid, its witnesses having reported the divergence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemesis import restore_majority
from nemesis.faults import Nemesis
from tests.nemesis.test_nemesis_schedule import FakePlatform

REPO = Path(__file__).resolve().parents[2]


class Gate:
    """A workload's ClientGate that writes what happens to the platform's log."""

    def __init__(self, log: list[str], *, drains: bool = True) -> None:
        self.log, self.drains, self.held = log, drains, False

    def hold_clients(self, timeout_s: float) -> bool:
        self.held = True
        self.log.append("hold clients")
        return self.drains

    def release_clients(self) -> None:
        self.held = False
        self.log.append("release clients")


class RestorePlatform(FakePlatform):
    """A cluster in numbers: n1 leads term 1, every node has applied index 100. A write
    through the leader appends an entry that every running node it reaches commits. A
    restored node has the index and term of its copy; once every restored node runs again,
    the lowest one leads the next term and commits one entry of its own.
    `term_moves_at_save`: the term moves while that node's copy is made."""

    def __init__(self, nodes: int = 3, *, term_moves_at_save: int | None = None) -> None:
        super().__init__(nodes)
        self.log: list[str] = []
        self.term = {n: 1 for n in self.node_ids}
        self.last = {n: 100 for n in self.node_ids}
        self.role = {n: "follower" for n in self.node_ids}
        self.role["n1"] = "leader"
        self.saved: dict[str, tuple[int, int]] = {}
        self.restored: set[str] = set()
        self.term_moves_at_save = term_moves_at_save
        self.marker_writes = 0

    @property
    def system(self):  # noqa: ANN201 - the store's kv_client, scripted
        return SimpleNamespace(kv_client=self._client, single_membership_changes=True)

    def leader(self) -> str | None:
        leaders = [n for n in self.node_ids if self.role[n] == "leader" and n not in self.down]
        return max(leaders, key=lambda n: self.term[n]) if leaders else None

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        if node_id in self.down:
            return None
        last = self.last[node_id]
        return SimpleNamespace(role=self.role[node_id], term=self.term[node_id], leader_id="",
                               commit_index=last, applied_index=last, last_index=last)

    def _client(self, addresses: dict[str, str], **_: Any):  # noqa: ANN202
        leader = next(iter(addresses))
        platform = self

        class Client:
            def put(self, key: str, value: bytes) -> None:
                assert key == restore_majority.MARKER_KEY
                platform.marker_writes += 1
                platform.log.append(f"write {key}")
                platform.last[leader] += 1
                for n in platform.node_ids:
                    if n != leader and n not in platform.down and (leader, n) not in platform.cut_set:
                        platform.last[n] = platform.last[leader]

            def close(self) -> None: ...

        return Client()

    def kill(self, node_id: str) -> None:
        super().kill(node_id)
        self.log.append(f"kill {node_id}")

    def kill_nodes(self, node_ids: list[str]) -> None:
        for n in node_ids:
            self.kill(n)

    def start_node(self, node_id: str) -> None:
        super().start_node(node_id)
        self.log.append(f"start {node_id}")
        if self.restored and self.restored <= set(self.node_ids) - self.down:
            first = min(self.restored)
            new_term = max(self.term[n] for n in self.restored) + 1
            for n in self.restored:
                self.term[n], self.role[n] = new_term, "follower"
                self.last[n] += 1
            self.role[first] = "leader"

    def wait_started(self, node_id: str, timeout_s: float) -> int | None:
        return None

    def save_data(self, node_id: str) -> None:
        assert node_id in self.down, "copied while running"
        assert self.down == {node_id}, "copied while another node was down"
        self.log.append(f"save {node_id}")
        if node_id == f"n{self.term_moves_at_save}":
            for n in self.node_ids:
                self.term[n] += 1
        self.saved[node_id] = (self.last[node_id], self.term[node_id])

    def restore_data(self, node_id: str) -> None:
        assert node_id in self.down and node_id in self.saved
        self.log.append(f"restore {node_id}")
        self.last[node_id], self.term[node_id] = self.saved[node_id]
        self.restored.add(node_id)

    def cut(self, src: str, dst: str) -> None:
        super().cut(src, dst)
        self.log.append(f"cut {src}->{dst}")


def _fault(platform: RestorePlatform, gate: Gate | None) -> tuple[Any, Nemesis, list]:
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["restore-majority"], seed=3, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)), clients=gate)
    return restore_majority.restore_majority(nemesis), nemesis, events


@pytest.mark.parametrize("nodes", [3, 5])
def test_a_majority_restarts_on_copies_made_while_the_clients_were_held(nodes: int) -> None:
    platform = RestorePlatform(nodes)
    gate = Gate(platform.log)
    fault, nemesis, events = _fault(platform, gate)
    assert fault is not None
    f, start = events[-1]
    assert f == "restore-majority" and start["landed"] is True, start["landed_evidence"]
    window = start["window"]
    restored, witnesses = window["restored"], window["witnesses"]
    assert len(restored) == nodes // 2 + 1 and "n1" in witnesses and "n1" not in restored
    assert window["new_leader"] in restored and window["new_term"] > window["term"]
    assert window["first_marker"] == 101 and window["markers"] == restore_majority.MARKERS
    log = platform.log
    hold, release = log.index("hold clients"), log.index("release clients")
    # Nothing a client sees is written between the copies and the restore: held first,
    # let go only once the restored majority leads.
    assert hold < min(log.index(f"save {n}") for n in restored)
    assert max(log.index(f"restore {n}") for n in restored) < release
    assert release > max(i for i, line in enumerate(log) if line.startswith("start "))
    # The copies, then the nemesis's own writes, then the witnesses cut off, then restored.
    writes = [i for i, line in enumerate(log) if line.startswith("write ")]
    assert len(writes) == restore_majority.MARKERS
    cuts = [i for i, line in enumerate(log) if line.startswith("cut ")]
    assert max(log.index(f"save {n}") for n in restored) < writes[0]
    assert writes[-1] < cuts[0] < min(log.index(f"restore {n}") for n in restored)
    assert platform.cut_set == {(a, b) for a in platform.node_ids for b in platform.node_ids
                                if a != b and (a in witnesses) != (b in witnesses)}
    assert not gate.held
    nemesis.end(fault)
    assert not platform.cut_set and not platform.down
    assert events[-1][0] == "heal-partition"
    assert nemesis.election_counts == {"restore-majority": {"aimed": 1, "landed": 1}}


def test_nothing_is_restored_when_the_term_moved_during_the_copies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored node might then lead again in the writes' own term, and logs that differ
    under equal terms are beyond any store's notice: the fault must not go on."""
    monkeypatch.setattr(restore_majority, "COMMIT_TIMEOUT_S", 0.2)
    platform = RestorePlatform(3, term_moves_at_save=2)
    fault, nemesis, events = _fault(platform, Gate(platform.log))
    assert fault is None
    f, skip = events[-1]
    assert f == "nemesis-skip" and "term" in skip["description"], skip
    assert not any(line.startswith(("restore ", "cut ")) for line in platform.log)
    assert platform.log[-1] == "release clients"
    assert nemesis.election_counts == {}


def test_clients_that_do_not_drain_or_cannot_be_held_stop_the_fault_before_any_copy() -> None:
    platform = RestorePlatform(3)
    fault, _, events = _fault(platform, Gate(platform.log, drains=False))
    assert fault is None and "in flight" in events[-1][1]["description"]
    assert platform.log == ["hold clients", "release clients"]
    platform = RestorePlatform(3)
    fault, _, events = _fault(platform, None)
    assert fault is None and "cannot hold its clients" in events[-1][1]["description"]
    assert platform.log == []


def _run(tmp_path: Path, seed: int, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "nemesis", "run", "--platform", "local", "--faults",
         "restore-majority", "--duration", "24", "--interval", "4", "--seed", str(seed),
         "--store", str(tmp_path / "store"), *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "MAO_ALLOW_UNSAFE": "1"})
    return proc, (tmp_path / "store" / "latest").resolve()


@pytest.mark.integration
@pytest.mark.slow
def test_the_real_store_notices_the_diverged_logs_and_stays_valid(tmp_path: Path) -> None:
    """Every landed strike leaves witnesses whose committed log the cluster lost: each
    reports it (excused: the fault destroyed durable state) and is repaired, and the run is
    valid. (The same run with `answers-below-commit-as-match` is INVALID by the rule
    watch's `committed-conflict-unnoticed`: 5 of 5 seeds in docs/variants.md; not run here,
    its broken leader's endless probing makes it a 100 s run.)"""
    proc = subprocess.run(
        [sys.executable, "-m", "nemesis", "run", "--platform", "local", "--faults",
         "restore-majority", "--duration", "24", "--interval", "4", "--seed", "6101",
         "--store", str(tmp_path / "store")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    landed = [e for e in events if e["f"] == "restore-majority" and e["landed"]]
    assert landed, events
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True
    reports = results["safety_reports"]
    assert reports["counts"]["safety_reports"] >= 1, reports  # the witnesses said so


# ----- on the simulator (SimPlatform.aim_restore_majority) ----------------------------------


def _sim_restore(tmp_path: Path, unsafe: str | None = None) -> tuple[Any, dict[str, Any]]:
    from tests.nemesis.test_sim_election import _advance_until
    from tests.nemesis.test_sim_hold import _ready_platform

    platform = _ready_platform(tmp_path, nodes=5, unsafe=unsafe)
    leader = platform.leader()
    followers = [n for n in platform.node_ids if n != leader]
    restored, witnesses = followers[:3], [leader, followers[3]]
    platform.aim_restore_majority(leader, restored, witnesses, 5, restore_majority.MARKER_KEY)
    assert platform.clients_held
    assert _advance_until(platform, lambda: platform.restore_aim["phase"] == "done")
    aim = platform.restore_aim
    assert aim["landed"] is True, aim["why"]
    assert not platform.clients_held  # let go once the restored majority leads
    assert aim["new_leader"] in restored and aim["new_term"] > aim["term"]
    assert platform.end_restore_aim() is aim and not platform.sim.network.cut_links
    for _ in range(500):  # the witnesses meet the new leader
        platform.advance()
    return platform, aim


def test_on_the_simulator_the_witnesses_report_their_diverged_logs_and_are_repaired(
        tmp_path: Path) -> None:
    from tests.nemesis.test_sim_election import _rules

    platform, aim = _sim_restore(tmp_path)
    assert _rules(platform) == {"committed-log-diverged"}
    # Each witness said its committed log diverged, and the new leader that it was told.
    reporters = {node for node, _, _ in platform.sim.safety_reports}
    assert reporters == {*aim["witnesses"], aim["new_leader"]}
    leader = platform.leader()
    applied = {n: platform.sim.core(n).log.applied for n in platform.node_ids}
    assert all(a >= aim["first_marker"] for a in applied.values()), applied  # repaired
    assert leader in aim["restored"]


def test_on_the_simulator_a_follower_that_answers_a_diverged_log_as_a_match_is_named(
        tmp_path: Path) -> None:
    from tests.nemesis.test_sim_election import _rules

    platform, _ = _sim_restore(tmp_path, unsafe="answers-below-commit-as-match")
    assert "committed-conflict-unnoticed" in _rules(platform)
