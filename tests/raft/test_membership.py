"""Membership changes, one server at a time (thesis §4.1), with learners: named
interleavings in the simulator, each safety rule with the broken variant it catches.

A membership is a CONFIG log entry that takes effect on each node as soon as it is in its
log. A new server joins as a learner (receives the log, never votes), is promoted once
caught up, and a voter or learner is removed; a leader that removes itself keeps managing
the cluster until its removal is committed, then steps down.
"""

from __future__ import annotations

import contextlib

import pytest

from system.raft.core import MembershipChangeKind, MembershipChangeRefused, Role
from system.raft.messages import MessageType
from system.sim.invariants import Rule
from system.sim.simulation import Simulation, SimulationStuck
from system.sim.variant import SimVariant
from tests.raft import broken
from tests.raft.test_interleavings import common_problems, converge, read_back, rules

ADD = MembershipChangeKind.ADD_LEARNER
PROMOTE = MembershipChangeKind.PROMOTE
REMOVE = MembershipChangeKind.REMOVE
APPEND = MessageType.APPEND


def write(sim: Simulation, node: str, key: str, value: str, steps: int = 500):  # noqa: ANN201
    op = sim.put(node, key, value)
    sim.run_until(lambda: op.done, steps, f"put {key}={value}")
    return op


def test_a_learner_catches_up_without_voting_then_is_promoted_and_counts() -> None:
    sim = Simulation(3, seed=51, spare_nodes=1)
    sim.campaign("n1")
    for i in range(5):
        write(sim, "n1", "x", f"v{i}")
    sim.change_membership("n1", ADD, "n4")
    assert sim.core("n1").membership.learners == ("n4",)
    converge(sim)
    sim.settle()
    assert sim.nodes["n4"].applied_index == sim.nodes["n1"].applied_index
    assert sim.core("n4").role is Role.FOLLOWER
    sim.tick("n4", 200)  # a learner never campaigns
    assert not sim.pending(src="n4", type=(MessageType.PRE_VOTE, MessageType.VOTE))
    sim.change_membership("n1", PROMOTE, "n4")
    converge(sim)
    for node in sim.node_ids:
        assert sim.core(node).membership.voters == ("n1", "n2", "n3", "n4")
    # 4 voters: a majority is 3. With n2 and n3 down, n1 + n4 cannot commit ...
    sim.crash("n2")
    sim.crash("n3")
    stalled = sim.put("n1", "x", "needs-three")
    assert sim.run_until(lambda: stalled.done, 300, required=False) == -1
    # ... and with n3 back, n1 + n3 + n4 can: n4's acknowledgement counts.
    sim.restart("n3")
    sim.run_until(lambda: stalled.done, 2_000, "write committed by n1, n3, n4")
    assert stalled.ok
    assert common_problems(sim) == []


def test_promotion_waits_until_the_learner_has_caught_up() -> None:
    sim = Simulation(3, seed=52, spare_nodes=1)
    sim.campaign("n1")
    for i in range(5):
        write(sim, "n1", "x", f"v{i}")
    sim.cut("n1", "n4")
    sim.change_membership("n1", ADD, "n4", wait=False)
    sim.run_until(lambda: sim.core("n1").commit_index >= sim.core("n1").log.last_index(), 500)
    with pytest.raises(MembershipChangeRefused, match="not caught up"):
        sim.core("n1").change_membership(PROMOTE, "n4")
    sim.heal()
    sim.run_until(lambda: sim.core("n1").progress["n4"].match >= sim.core("n1").commit_index, 2_000)
    sim.change_membership("n1", PROMOTE, "n4")
    assert "n4" in sim.core("n1").membership.voters


def test_a_removed_voter_no_longer_counts_and_the_cluster_goes_on() -> None:
    sim = Simulation(3, seed=53)
    sim.campaign("n1")
    write(sim, "n1", "x", "before")
    sim.change_membership("n1", REMOVE, "n3")
    sim.settle()
    sim.crash("n3")  # {n1, n2}: both needed now, and enough
    write(sim, "n1", "x", "after")
    term = sim.core("n1").term
    sim.restart("n3")
    for _ in range(50):  # n3 never received its removal: it may try to campaign ...
        sim.tick()
        sim.settle()
    # ... but cannot disrupt the cluster (PreVote, and the voters' leader lease)
    assert sim.leader() == "n1" and sim.core("n1").term == term
    write(sim, "n1", "x", "still")
    assert common_problems(sim) == []


def test_a_leader_that_removes_itself_steps_down_once_the_removal_is_committed() -> None:
    sim = Simulation(3, seed=54)
    sim.campaign("n1")
    write(sim, "n1", "x", "v")
    term = sim.core("n1").term
    index, _ = sim.change_membership("n1", REMOVE, "n1", wait=False)
    assert sim.core("n1").role is Role.LEADER  # still managing the cluster ...
    assert sim.core("n1").membership.voters == ("n2", "n3")
    sim.run_until(lambda: sim.core("n1").role is not Role.LEADER, 500, "n1 steps down")
    assert sim.core("n1").commit_index >= index  # ... until its removal was committed
    sim.run_until(lambda: sim.leader() in ("n2", "n3"), 2_000, "a new leader among n2, n3")
    assert sim.core(sim.leader()).term > term
    write(sim, sim.leader(), "x", "without n1", steps=2_000)
    sim.tick("n1", 200)
    assert sim.core("n1").role is Role.FOLLOWER  # never campaigns again
    assert common_problems(sim) == []


def test_leader_transfer_before_removing_the_leader() -> None:
    """The operator's way of removing the leader: hand leadership over, then remove it
    from the new leader (what `python -m system.kv member remove` does)."""
    sim = Simulation(3, seed=55)
    sim.campaign("n1")
    write(sim, "n1", "x", "v")
    sim.core("n1").transfer_leadership("n2")
    sim.nodes["n1"].after_input()
    sim.run_until(lambda: sim.leader() == "n2" and sim.core("n2").commit_index
                  >= sim.core("n2").log.last_index(), 1_000, "n2 leads")
    sim.change_membership("n2", REMOVE, "n1")
    assert sim.core("n2").membership.voters == ("n2", "n3")
    write(sim, "n2", "x", "w")
    assert common_problems(sim) == []


def test_one_change_at_a_time_and_only_after_committing_in_term() -> None:
    sim = Simulation(3, seed=56, spare_nodes=2)
    sim.campaign("n1")
    sim.cut("n1", "n2")
    sim.cut("n1", "n3")
    sim.change_membership("n1", ADD, "n4", wait=False)
    with pytest.raises(MembershipChangeRefused, match="in progress"):
        sim.core("n1").change_membership(ADD, "n5")


# ---------------------------------------------------------------------------------------
# Two changes in flight: memberships two steps apart have disjoint majorities
# ---------------------------------------------------------------------------------------


def two_changes_in_flight(variant: SimVariant | None = None):  # noqa: ANN201
    """{n1,n2,n3} plus caught-up learners n4, n5. Cut off from n2 and n3, n1 promotes n4
    and then n5 at once: {n1,n4,n5} is a majority of {n1..n5}. n2 and n3, which never saw
    either change, are a majority of {n1,n2,n3} and elect n2. Two majorities that share
    nobody: the write n1 commits is lost."""
    sim = Simulation(3, seed=57, spare_nodes=2, variant=variant)
    sim.campaign("n1")
    write(sim, "n1", "x", "initial")
    sim.change_membership("n1", ADD, "n4")
    sim.change_membership("n1", ADD, "n5")
    converge(sim)
    sim.settle()
    sim.partition({"n1", "n4", "n5"}, {"n2", "n3"})
    refused = ""
    sim.change_membership("n1", PROMOTE, "n4", wait=False)
    try:
        sim.change_membership("n1", PROMOTE, "n5", wait=False)
    except MembershipChangeRefused as error:
        refused = str(error)
    lost = sim.put("n1", "x", "on n1 n4 n5")
    sim.run_until(lambda: lost.done, 300, required=False)
    sim.campaign("n2")  # n3's vote is a majority of {n1, n2, n3}
    overwrite = sim.put("n2", "x", "on n2 n3")
    sim.run_until(lambda: overwrite.done, 300, required=False)
    sim.heal()
    if not lost.done:
        sim.give_up(lost)
    if not overwrite.done:
        sim.give_up(overwrite)
    converge(sim)
    return sim, lost, refused


def test_the_leader_refuses_a_second_change_while_one_is_in_flight() -> None:
    sim, lost, refused = two_changes_in_flight()
    assert "in progress" in refused
    assert not lost.ok  # {n1, n4} is not a majority of {n1, n2, n3, n4}
    assert common_problems(sim) == []


def test_two_changes_in_flight_lose_an_acknowledged_write() -> None:
    sim, lost, refused = two_changes_in_flight(broken.ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT)
    assert refused == "" and lost.ok
    problems = common_problems(sim)
    assert Rule.LEADER_COMPLETENESS in rules(sim) or Rule.ACKNOWLEDGED_WRITE_LOST in rules(sim)
    assert problems


# ---------------------------------------------------------------------------------------
# A change before the leader committed an entry of its term (Ongaro's 2015 bug)
# ---------------------------------------------------------------------------------------


def change_before_committing_in_term(variant: SimVariant | None = None):  # noqa: ANN201
    """Ongaro's scenario (raft-dev, 2015) with learners. {n1..n4}, n5 a caught-up
    learner. n1 promotes n5: C_a = {n1..n5} reaches only n5, and n1 crashes. n2 is elected
    in term 2 by n3 and n4 (a majority of {n1..n4}) and at once appends C_b = remove n1 =
    {n2,n3,n4}; it reaches n3 only, and {n2, n3} commits it and a write under C_b. Then n1
    returns: C_a in its log, it is elected in term 3 by n4 (whose log is only of term 1)
    and n5, a majority of C_a -- and overwrites what n2 committed."""
    sim = Simulation(4, seed=58, variant=variant, spare_nodes=1)
    sim.campaign("n1")
    write(sim, "n1", "x", "initial")
    sim.change_membership("n1", ADD, "n5")
    converge(sim)
    sim.settle()
    sim.partition({"n1", "n5"}, {"n2", "n3", "n4"})
    sim.change_membership("n1", PROMOTE, "n5", wait=False)  # C_a reaches n5 only
    sim.settle()
    sim.crash("n1")
    sim.isolate("n5")
    sim.campaign("n2", wait_for_commit=False)
    sim.cut("n2", "n4")  # from now on n2 reaches only n3
    refused = ""
    try:
        sim.change_membership("n2", REMOVE, "n1", wait=False)  # C_b, before committing in term 2
    except MembershipChangeRefused as error:
        refused = str(error)
    lost = sim.put("n2", "x", "committed by n2 n3")
    sim.settle()  # no time passes: n2 leads with whatever majority its membership allows
    sim.crash("n2")
    sim.heal()
    sim.isolate("n3")
    sim.restart("n1")
    with contextlib.suppress(SimulationStuck):  # the real core may rightly lose here
        sim.campaign("n1", wait_for_commit=False, max_rounds=5)  # n4, n5: a majority of C_a
    sim.heal()
    sim.restart("n2")
    for op in (lost,):
        if not op.done:
            sim.give_up(op)
    converge(sim)
    return sim, lost, refused


def test_a_new_leader_commits_in_its_term_before_changing_membership() -> None:
    sim, lost, refused = change_before_committing_in_term()
    assert "has not yet committed" in refused
    assert common_problems(sim) == []


def test_changing_membership_before_committing_in_term_loses_a_write() -> None:
    sim, lost, refused = change_before_committing_in_term(
        broken.CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM)
    assert refused == "" and lost.ok
    assert common_problems(sim)


def test_membership_survives_restart_and_snapshot() -> None:
    sim = Simulation(3, seed=59, spare_nodes=1, compact_every_entries=3)
    sim.campaign("n1")
    sim.change_membership("n1", ADD, "n4")
    for i in range(8):
        write(sim, "n1", "x", f"v{i}")
    converge(sim)
    sim.change_membership("n1", PROMOTE, "n4")
    for i in range(8):
        write(sim, "n1", "y", f"v{i}")
    converge(sim)
    for node in sim.node_ids:
        sim.crash(node)
        sim.restart(node)
        assert sim.core(node).membership.voters == ("n1", "n2", "n3", "n4"), node
    sim.run_until(lambda: sim.leader() is not None, 3_000, "a leader after restarts")
    value, _ = read_back(sim, sim.leader(), "y")
    assert value == "v7"
    assert common_problems(sim) == []
