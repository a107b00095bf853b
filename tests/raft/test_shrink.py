"""Shrinking (system/sim/schedule.py, shrink.py): a recorded schedule replays the run it came
from; delta debugging finds a 1-minimal failing sub-list; a broken variant's failing seed
shrinks to a short schedule whose generated test fails on the variant and passes on the
real core. The generated tests themselves are in tests/raft/shrunk/."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from checker import check_versioned_kv
from nemesis.cli import main as nemesis_main
from nemesis.store import write_json
from system.sim.cli import main
from system.sim.invariants import Rule
from system.sim.schedule import Step, counts, play
from system.sim.shrink import broken_rules, ddmin, flatten, generated_test_source, shrink, units_of
from system.sim.simulation import Simulation
from system.sim.swarm import SwarmRun
from tests.raft import broken


def recorded(seed: int, variant=None) -> SwarmRun:  # noqa: ANN001
    run = SwarmRun(seed, variant, record_trace=False, check=check_versioned_kv)
    run.sim.schedule = []
    run.run()
    return run


def test_a_recorded_schedule_replays_the_run_it_came_from() -> None:
    run = recorded(1003)
    assert run.sim.schedule and not run.sim.violations
    replay = Simulation(**run.sim.settings, record_trace=False)
    applied = play(replay, run.sim.schedule)
    assert all(applied)
    assert [e.line() for e in replay.history] == [e.line() for e in run.sim.history]
    assert replay.monitor.max_committed == run.sim.monitor.max_committed


def test_ddmin_finds_a_one_minimal_failing_subset() -> None:
    steps = [Step("tick", ((f"n{i}",),)) for i in range(40)]
    needed = {steps[3].args, steps[29].args}

    def fails(units: list[list[Step]]) -> bool:
        return needed <= {s.args for s in flatten(units, steps)}

    units, minimal = ddmin(units_of(steps), fails, time.process_time() + 30)
    assert minimal and {s.args for s in flatten(units, steps)} == needed


def test_ddmin_keeps_a_client_operation_whole() -> None:
    steps = [Step("invoke", (1, "put", "k", "v", None, 1, "w1", False, True)),
             Step("tick", (("n1",),)), Step("submit", (1, "n1")), Step("give_up", (1,))]
    assert [len(u) for u in units_of(steps)] == [3, 1]


def test_skips_pre_vote_shrinks_and_its_test_fails_only_on_the_variant() -> None:
    run = recorded(0, broken.SKIPS_PRE_VOTE)
    result = shrink(run.sim.settings, broken.SKIPS_PRE_VOTE, list(run.sim.schedule),
                    run.sim.violations[0].rule, check=check_versioned_kv)
    assert result.verified and result.minimal, result.notes
    assert len(result.steps) < len(result.original)


@pytest.mark.slow
def test_votes_twice_shrinks_to_a_short_schedule_that_fails_only_on_the_variant() -> None:
    run = recorded(0, broken.VOTES_TWICE)
    assert run.sim.violations[0].rule is Rule.ELECTION_SAFETY
    result = shrink(run.sim.settings, broken.VOTES_TWICE, list(run.sim.schedule),
                    Rule.ELECTION_SAFETY, check=check_versioned_kv)
    assert result.verified, result.notes
    assert counts(result.steps)["steps"] <= 40 < len(result.original)
    # The generated test's own checks, done here on the shrunk schedule:
    on_variant = Simulation(**result.settings, variant=broken.VOTES_TWICE)
    play(on_variant, result.steps)
    assert Rule.ELECTION_SAFETY in broken_rules(on_variant, check_versioned_kv)
    on_real_core = Simulation(**result.settings)
    play(on_real_core, result.steps)
    assert broken_rules(on_real_core, check_versioned_kv) == set()
    source = generated_test_source(result, "votes_twice_seed_0", "tests.raft.broken:VOTES_TWICE",
                                   "python -m system.sim --seed 0")
    compile(source, "generated", "exec")
    assert "r.deliver('vote'" in source and "def test_votes_twice_seed_0_keeps" in source


def test_shrink_flags_are_refused_without_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--shrink"], check=check_versioned_kv)
    assert exit_info.value.code == 2
    assert "--shrink needs --seed N" in capsys.readouterr().err


def test_a_passing_seed_has_nothing_to_shrink(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "1003", "--shrink"], check=check_versioned_kv) == 1
    assert "nothing to shrink" in capsys.readouterr().out


def test_nemesis_shrink_refuses_a_run_of_a_real_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json(tmp_path / "test.json", {"config": {"platform": "local"}})
    assert nemesis_main(["shrink", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only runs made with --platform sim" in err


def test_nemesis_shrink_refuses_a_run_that_restored_disk_copies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json(tmp_path / "test.json",
               {"config": {"platform": "sim", "faults": ["kill", "restore-majority"]}})
    assert nemesis_main(["shrink", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--faults restore-majority" in err and "reproduce" in err


@pytest.mark.slow
def test_nemesis_shrink_turns_a_canary_run_into_a_test(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    assert nemesis_main(["run", "--platform", "sim", "--faults", "partition,kill",
                         "--interval", "2", "--nodes", "3", "--rate", "50", "--duration", "10",
                         "--seed", "1", "--unsafe", "ack-before-commit",
                         "--store", str(store)]) == 1
    out = tmp_path / "test_generated.py"
    assert nemesis_main(["shrink", str(store / "latest"), "--test-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "minimal schedule:" in text and out.exists()
    assert "from system.sim.unsafe import ACK_BEFORE_COMMIT" in out.read_text()
