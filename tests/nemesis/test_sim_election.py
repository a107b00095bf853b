"""The `election` fault on the simulator: its deposed-leader, late-grant and vote-then-restart
shapes, timed by the cores' state each tick (nemesis/platforms/sim.py). What the network does with the safe
core, and that the broken core each shape aims at is named by the rule watch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemesis import elections
from nemesis.faults import Nemesis
from system.raft.core import Role
from tests.nemesis.test_sim_hold import _ready_platform

TICKS = 2000  # 40 simulated seconds: many election timeouts


def _advance_until(platform: Any, done: Any, ticks: int = TICKS) -> bool:
    for _ in range(ticks):
        if done():
            return True
        platform.advance()
    return done()


def _rules(platform: Any) -> set[str]:
    return {rule for _, rule, _ in platform.sim.safety_reports}


def test_a_deposed_leader_is_resumed_among_its_successors_followers_and_steps_down(
        tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5)
    leader = platform.leader()
    term = platform.depose(leader)
    assert leader in platform.paused
    assert _advance_until(platform, lambda: platform.deposed_by is not None)
    successor, new_term = platform.deposed_by
    assert successor != leader and new_term > term and leader not in platform.paused
    cut = platform.sim.network.cut_links
    assert cut == {(leader, successor), (successor, leader)}
    # Cut from the successor, it learns the new term from the followers' answers alone.
    assert _advance_until(platform, lambda: platform.sim.core(leader).term >= new_term, 200)
    assert platform.sim.core(leader).role is not Role.LEADER
    assert not platform.sim.safety_reports
    assert platform.end_depose() == (successor, new_term)


def test_a_leader_deaf_to_higher_term_answers_is_named_when_deposed(tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5, unsafe="ignores-higher-term-answers")
    platform.depose(platform.leader())
    assert _advance_until(platform, lambda: "higher-term-ignored" in _rules(platform))


@pytest.mark.parametrize("seed", [3, 4])
def test_a_trapped_grant_reaches_its_candidate_in_a_later_term_and_the_safe_core_ignores_it(
        tmp_path: Path, seed: int) -> None:
    platform = _ready_platform(tmp_path, nodes=5, seed=seed)
    leader = platform.leader()
    platform.trap_late_grant()
    platform.kill(leader)
    assert _advance_until(platform, lambda: platform.grant_trap["fired"])
    trap = platform.end_grant_trap()
    assert trap["grants"] >= 1 and trap["candidate"] != leader
    assert _advance_until(platform, lambda: platform.leader() is not None)
    assert not platform.sim.safety_reports


def test_a_candidate_counting_an_older_terms_grant_is_named(tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5, unsafe="counts-votes-from-older-terms")
    platform.trap_late_grant()
    platform.kill(platform.leader())
    assert _advance_until(platform, lambda: platform.grant_trap["fired"])
    assert _advance_until(platform, lambda: "leader-without-majority-of-votes" in _rules(platform))


@pytest.mark.parametrize("seed", [3, 4])
def test_voters_restarted_between_two_candidates_of_one_term_refuse_the_second(
        tmp_path: Path, seed: int) -> None:
    platform = _ready_platform(tmp_path, nodes=5, seed=seed)
    leader = platform.leader()
    platform.trap_vote_restart()
    platform.kill(leader)
    assert _advance_until(platform, lambda: platform.vote_trap["fired"])
    trap = platform.vote_trap
    assert trap["first"] != trap["second"] and leader not in (trap["first"], trap["second"])
    assert len(trap["voters"]) == 2 and trap["restarted"] == trap["granted"]
    assert sorted(trap["restarted"]) == trap["voters"]
    # The restarted voters kept their votes: only the first candidate leads the term.
    assert _advance_until(platform, lambda: platform.leader() is not None, 200)
    assert platform.end_vote_trap() is trap and not platform.held_flights
    for _ in range(200):
        platform.advance()
    assert not platform.sim.safety_reports and not platform.sim.violations


def test_a_core_that_forgets_its_vote_on_restart_elects_two_leaders_of_one_term(
        tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5, unsafe="forgets-vote-on-restart")
    platform.trap_vote_restart()
    platform.kill(platform.leader())
    assert _advance_until(platform, lambda: platform.vote_trap["fired"])
    # Two leaders of one term (the simulator's monitor sees both; in a run the history
    # shows it: the two accept writes over each other).
    assert _advance_until(platform, lambda: any(
        "two leaders in term" in v.line() for v in platform.sim.violations), 200)


def test_the_sim_election_fault_records_whether_each_shape_landed(tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5)
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["election"], seed=1, interval_s=1.0,
                      record=lambda f, v: events.append((f, v)))
    for shape in elections.SIM_SHAPES:
        assert _advance_until(platform, lambda: platform.ready() is not None)
        fault = nemesis.begin_next()
        assert fault is not None and events[-1][1]["shape"] == shape
        for _ in range(500):
            platform.advance()
        nemesis.end(fault)
        assert events[-1][0] == "restart" and events[-1][1]["landed"] is True, events[-1]
    assert nemesis.election_counts == {s: {"aimed": 1, "landed": 1} for s in elections.SIM_SHAPES}
    assert not platform.paused and not platform.sim.network.cut_links
    assert not platform.held_flights and platform.grant_trap is None
    assert _advance_until(platform, lambda: platform.ready() is not None)
    assert not platform.sim.safety_reports
