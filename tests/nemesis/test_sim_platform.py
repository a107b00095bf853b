"""`python -m nemesis run --platform sim`: the main job on the simulator, in simulated time.

The same seed gives the same history byte for byte; the safe store is valid under every
fault; each store canary is caught (the simulator's variant of the store, as `--unsafe`
breaks a real node); the run folder is the one the real platforms write."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from nemesis.cli import main

FAULTED = ["--faults", "partition,kill,pause,packet", "--interval", "2", "--nodes", "5",
           "--rate", "100"]


def _run(tmp_path: Path, *args: str, store: str = "store") -> tuple[int, Path]:
    code = main(["run", "--platform", "sim", "--store", str(tmp_path / store), *args])
    return code, (tmp_path / store / "latest").resolve()


def test_same_seed_same_history_byte_for_byte_and_a_valid_complete_run_folder(
        tmp_path: Path) -> None:
    code, first = _run(tmp_path, *FAULTED, "--duration", "16", "--seed", "15", store="a")
    assert code == 0
    again, second = _run(tmp_path, *FAULTED, "--duration", "16", "--seed", "15", store="b")
    assert again == 0
    assert (first / "history.jsonl").read_bytes() == (second / "history.jsonl").read_bytes()
    assert (first / "nemesis.jsonl").read_bytes() == (second / "nemesis.jsonl").read_bytes()
    for name in ("test.json", "history.jsonl", "nemesis.jsonl", "results.json", "report.html",
                 "nodes/sim-trace.log"):
        assert (first / name).exists(), name
    records = [json.loads(line) for line in (first / "history.jsonl").read_text().splitlines()]
    faults = {r["value"]["fault"] for r in records if r["process"] == "nemesis"}
    assert {"partition", "kill", "pause", "packet"} <= faults, faults
    results = json.loads((first / "results.json").read_text())
    assert results["valid"] is True and results["platform"] == "sim"
    assert results["sim"]["monitor_violations"] == []
    assert results["final_reads"]["unread"] == []
    # Every node was read back on its own at the end, and agreed (checker/replicas.py).
    replicas = results["replica_reads"]
    assert sorted(replicas["nodes"]) == ["n1", "n2", "n3", "n4", "n5"], replicas
    assert all(n["agree"] == n["keys"] > 0 for n in replicas["nodes"].values()), replicas
    agree = results["replicas_agree"]
    assert agree["valid"] is True and agree["counts"]["replica_reads"] >= 5 * replicas["keys"]
    _, other = _run(tmp_path, *FAULTED, "--duration", "16", "--seed", "16", store="c")
    assert (other / "history.jsonl").read_bytes() != (first / "history.jsonl").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("canary", ["ack-before-commit", "stale-read",
                                    "cas-skips-check-when-absent", "delete-keeps-version"])
def test_every_store_canary_is_caught_on_the_simulator(tmp_path: Path, canary: str) -> None:
    out = io.StringIO()
    from nemesis.runner import RunConfig, run

    config = RunConfig(argv=[], platform="sim", platform_reason="test",
                       faults=["partition", "kill", "pause", "packet"], duration_s=40,
                       interval_s=2, nodes=5, workload="kv", seed=4, store=tmp_path / "store",
                       concurrency=10, rate=100, op_timeout_s=3, read_consistency="linearizable",
                       unsafe=canary, check_budget_s=30)
    assert run(config, out=out) == 1, out.getvalue()
    assert "INVALID" in out.getvalue()


# Canaries that need a write (or a read) in flight when its leader stops: a retried write
# applied twice (no-dedup, and the client library's client-new-request-id), a deposed
# leader answering a read from its own state (reads-without-quorum-check). Faults used to
# land only at tick boundaries, where every request had been answered, and no seed caught
# the first two (this test fails for them with tick-boundary faults); a fault now lands
# mid-tick, on a write in flight (nemesis/sim_runner.py). reads-without-quorum-check is
# caught in this run either way (checked at seeds 4 and 3106-3110: 5/5 mid-tick).
IN_FLIGHT_CANARIES = ["no-dedup", "client-new-request-id", "reads-without-quorum-check"]
IN_FLIGHT_RUN = ["--faults", "pause,kill", "--duration", "30", "--interval", "3", "--seed", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("canary", IN_FLIGHT_CANARIES)
def test_a_canary_that_needs_a_request_in_flight_at_the_fault_is_caught_on_the_simulator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary: str) -> None:
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    code, run = _run(tmp_path, *IN_FLIGHT_RUN, "--unsafe", canary)
    assert code == 1, json.loads((run / "results.json").read_text())


@pytest.mark.slow
def test_the_safe_store_is_valid_in_the_in_flight_canaries_run(tmp_path: Path) -> None:
    code, run = _run(tmp_path, *IN_FLIGHT_RUN)
    assert code == 0, json.loads((run / "results.json").read_text())


@pytest.mark.parametrize("canary", ["cas-skips-check-when-absent", "delete-keeps-version"])
def test_the_mix_catches_a_version_rule_canary_without_faults_and_the_safe_store_passes(
        tmp_path: Path, canary: str) -> None:
    """The old mix (get, put, cas against the version seen; no delete) passed both; the
    mix's deletes and wrong expected versions must show them, with no fault needed."""
    args = ["--faults", "none", "--duration", "10", "--seed", "2201"]
    code, run = _run(tmp_path, *args, "--unsafe", canary, store="canary")
    results = json.loads((run / "results.json").read_text())
    assert code == 1, results["linearizable"]
    assert results["linearizable"]["valid"] is False
    assert _run(tmp_path, *args, store="safe")[0] == 0


def test_the_trainer_workload_is_refused_on_the_simulator(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--platform", "sim", "--workload", "trainer", "--unsafe", "bogus",
              "--store", str(tmp_path / "store")])
    assert exit_info.value.code == 3
    assert main(["run", "--platform", "sim", "--workload", "trainer",
                 "--store", str(tmp_path / "store")]) == 3
    assert "runs the kv workload only" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


# Broken Raft cores (system/raft/unsafe.py) that a harness run catches at this seed and
# faults, each with the real core valid in the same run (benchmarks/core_variants.py has
# the whole matrix). votes-twice: two candidates of one term both win at the first
# election, and each acknowledges writes the other's log never gets. (reads-without-quorum-
# check is caught with the in-flight canaries above.)
CORE_VARIANT_RUNS = [
    ("votes-twice", ["--faults", "none", "--duration", "6"]),
    # The member fault's two-in-flight (nemesis/member_shapes.py): the safe leader refuses
    # the second change; the broken one commits it on its side of the cut.
    ("allows-two-membership-changes-in-flight",
     ["--faults", "member", "--duration", "8", "--interval", "2"]),
    # A restart that skips the committed entries after its snapshot: the node's state
    # machine refuses the gap and the node stops itself, which only nodes-stay-up judges.
    ("restores-snapshot-only",
     ["--faults", "partition,kill", "--duration", "20", "--interval", "2"], "nodes_stay_up"),
    # A follower that takes a deposed leader's APPEND (hold: stale-leader) is repaired
    # before any read; only the nodes' committed-log-diverged reports show it.
    ("accepts-appends-from-older-terms",
     ["--faults", "hold", "--duration", "8", "--interval", "2"], "safety_reports"),
    # Rules no answer shows, named by the node shell's RuleWatch (system/raft/watch.py): a
    # leader counting its own unsynced entry toward a commit, and (reorder: a shorter APPEND
    # delivered after a longer one) a follower cutting its log without a conflict.
    ("counts-unsynced-self",
     ["--faults", "partition,kill", "--duration", "8", "--interval", "2"], "safety_reports"),
    ("truncates-without-a-conflict",
     ["--faults", "reorder", "--duration", "8", "--interval", "2"], "safety_reports"),
    # The member fault's change-at-new-leader (the run's second member fault): the new
    # leader asked to remove its isolated predecessor before it committed in its term; the
    # safe one refuses, the broken one appends the change, and the watch names it.
    ("changes-membership-before-committing-in-term",
     ["--faults", "member", "--duration", "12", "--interval", "2"], "safety_reports"),
]


@pytest.mark.parametrize("variant, args, check", [
    (v, a, rest[0] if rest else None) for v, a, *rest in CORE_VARIANT_RUNS])
def test_a_broken_raft_core_is_caught_and_the_real_core_is_valid_in_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str, args: list[str],
        check: str | None) -> None:
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    fixed = [*args, "--seed", "2401", "--nodes", "5"]
    code, broken = _run(tmp_path, *fixed, "--unsafe", variant, store="broken")
    results = json.loads((broken / "results.json").read_text())
    assert code == 1 and results["verdict"] == "INVALID", results
    if check is not None:  # caught by that check, with the history's answers all valid
        assert results[check]["valid"] is False, results[check]
        assert results["linearizable"]["valid"] is True
    safe_code, safe = _run(tmp_path, *fixed, store="safe")
    assert safe_code == 0, json.loads((safe / "results.json").read_text())


def test_the_ack_before_commit_shell_survives_a_leader_fsync_that_returns_after_the_commit(
        tmp_path: Path) -> None:
    # Found by `nemesis explore` (seed 3013): with the leader's fsync in the background, an
    # entry can commit and apply before that fsync returns; the canary's shell then looked
    # up an answer it had not computed (KeyError) and the run ended as a harness error.
    code, run = _run(tmp_path, "--faults", "pause,kill-all", "--duration", "10",
                     "--interval", "2", "--nodes", "3", "--concurrency", "10", "--rate", "50",
                     "--seed", "3013", "--unsafe", "ack-before-commit")
    assert code in (0, 1), (run / "harness.log").read_text()[-2000:]
