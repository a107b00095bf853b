"""The member fault's aimed shapes (nemesis/member_shapes.py) against an in-memory platform
that keeps the store's membership rule (one change at a time, after the leader committed
in its term), or breaks it: what each shape cuts, sends and records, and that its heal
leaves every node a voter with every link healed."""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from nemesis import member_shapes, partitions
from nemesis.faults import Nemesis
from system.kv.member_client import (
    MembershipRefused,
    MembershipTimeout,
    MembershipUnavailable,
)
from tests.nemesis.test_nemesis_schedule import FakePlatform

IN_PROGRESS = "a membership change is in progress (log entry 9, not yet committed)"
EARLY = "this leader has not yet committed an entry of its term; retry in a moment"


def _majority(part: set[str], of: set[str]) -> bool:
    return len(part & of) > len(of) // 2


@pytest.mark.parametrize("voters", [3, 4, 5, 6, 7])
def test_two_in_flight_sizes_make_the_leaders_side_a_majority_only_after_the_last_removal(
        voters: int) -> None:
    side, removals = member_shapes.side_sizes(voters)
    assert removals <= voters - side  # all removed from the other side
    for removed in range(removals):  # the first change alone never commits on the side
        assert side <= (voters - removed) // 2
    assert side > (voters - removals) // 2  # the last membership's majority is the side
    assert voters - side > voters // 2  # while the other side holds the old one's


@pytest.mark.parametrize("voters", [4, 6, 8])
def test_halves_give_the_two_changes_disjoint_majorities(voters: int) -> None:
    import random

    names = [f"n{i}" for i in range(1, voters + 1)]
    for old, new, stale in itertools.permutations(names[:4], 3):
        mine, theirs = member_shapes.halves(names, old, new, stale, random.Random(1))
        assert set(mine) | set(theirs) == set(names) and not set(mine) & set(theirs)
        assert old in mine and {new, stale} <= set(theirs)
        assert _majority(set(mine), set(names) - {stale})  # the old leader's pending change
        assert _majority(set(theirs), set(names) - {old})  # the new leader's change


class RulePlatform(FakePlatform):
    """A leader (`lead`) that takes changes one at a time (`broken`: several); a change in
    flight while the leader's side is cut off never commits. Cutting the leader off makes
    `successor` lead, in a fresh term (`committed_in_term` False until `first_commit`)."""

    def __init__(self, nodes: int, *, broken: bool = False) -> None:
        super().__init__(nodes)
        self.broken = broken
        self.lead = "n1"
        self.successor = "n2"
        self.term_committed = True
        self.pending: list[str] = []
        self.sent: list[str] = []
        self.lock = threading.Lock()

    def leader(self) -> str | None:
        if self.lead == "n1" and any(src == "n1" for src, _ in self.cut_set) and \
                all(("n1", n) in self.cut_set for n in self.node_ids if n != "n1"):
            self.lead, self.term_committed = self.successor, False
        return self.lead

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        lead = self.leader()
        config = 10 if self.pending and self.cut_set else 9  # the heal truncates it
        return SimpleNamespace(role="leader" if node_id == lead else "follower",
                               leader_id=lead, term=1, commit_index=9, config_index=config,
                               voters=sorted(self.voters), learners=sorted(self.learners),
                               vote_withheld=False)

    def change_membership_at(self, node: str, action: str, node_id: str, *,
                             timeout_s: float = 10.0) -> None:
        with self.lock:
            self.sent.append(f"{action} {node_id} at {node}")
            if node != self.leader():
                raise MembershipUnavailable(f"{node} is not the leader")
            if node != "n1":  # a new leader, with a majority
                if not self.term_committed and not self.broken:
                    self.term_committed = True  # the next attempt finds it committed
                    raise MembershipRefused(EARLY)
                self.voters.discard(node_id)
                return
            if self.pending and not self.broken:
                raise MembershipRefused(IN_PROGRESS)
            self.pending.append(node_id)
            if len(self.pending) > 1:  # the last membership's majority is on the leader's side
                self.voters -= set(self.pending)
                return
        raise MembershipTimeout(f"{action} {node_id}: no answer (its majority is across the cut)")


def _nemesis(platform: RulePlatform) -> tuple[Nemesis, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["member"], seed=3, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    return nemesis, events


def _changes(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return sorted((v for f, v in events if f == "member-change"), key=lambda v: v["description"])


def test_two_in_flight_cuts_the_leaders_minority_off_and_the_safe_leader_refuses_the_second() -> None:
    platform = RulePlatform(5)
    nemesis, events = _nemesis(platform)
    fault = member_shapes.MemberShapes(nemesis).begin("two-in-flight")
    start = events[0][1]
    side = [n for n in start["graph"] if "n1" in (n, *start["graph"][n])]
    assert len(side) == 2 and "n1" in side
    assert all(n not in side for n in start["removing"]) and len(start["removing"]) == 2
    assert platform.cut_set == set(partitions.cuts(partitions.components(
        [side, [n for n in platform.node_ids if n not in side]])))
    nemesis._end(fault)
    outcomes = {v["node"]: v for v in _changes(events)}
    first, second = start["removing"]
    assert outcomes[second]["outcome"] == "refused" and IN_PROGRESS in outcomes[second]["description"]
    assert outcomes[first]["outcome"] == "unanswered"
    assert events[-1][0] == "rejoin-member" and events[-1][1]["kept"] == start["removing"]
    assert not platform.cut_set and platform.voters == set(platform.node_ids)
    assert not [c for c in platform.calls if c.startswith(("kill", "wipe"))]


def test_two_in_flight_against_a_leader_that_takes_both_rejoins_the_removed_nodes() -> None:
    platform = RulePlatform(5, broken=True)
    nemesis, events = _nemesis(platform)
    fault = member_shapes.MemberShapes(nemesis).begin("two-in-flight")
    removing = events[0][1]["removing"]
    nemesis._end(fault)
    assert "committed" in {v["outcome"] for v in _changes(events)}
    assert events[-1][1]["rejoined"] == removing
    for node in removing:  # removed while running on the old membership: a new incarnation
        assert platform.calls.index(f"kill {node}") < platform.calls.index(f"wipe {node}") \
            < platform.calls.index(f"add {node}") < platform.calls.index(f"promote {node}")
    assert not platform.cut_set and platform.voters == set(platform.node_ids)


def test_change_at_new_leader_is_refused_then_made_once_the_new_leader_committed() -> None:
    platform = RulePlatform(5)
    nemesis, events = _nemesis(platform)
    fault = member_shapes.MemberShapes(nemesis).begin("change-at-new-leader")
    start = events[0][1]
    assert start["leader"] == "n1" and start["new_leader"] == "n2" and start["stale_change"] is None
    nemesis._end(fault)
    lines = [v["description"] for v in _changes(events)]
    assert any("remove n1 at n2: refused" in line and EARLY in line for line in lines), lines
    assert any("remove n1 at leader: committed on retry" in line for line in lines), lines
    assert events[-1][1]["rejoined"] == ["n1"]
    assert not platform.cut_set and platform.voters == set(platform.node_ids)


def test_change_at_new_leader_with_an_even_membership_regroups_into_disjoint_majorities() -> None:
    platform = RulePlatform(4, broken=True)
    nemesis, events = _nemesis(platform)
    fault = member_shapes.MemberShapes(nemesis).begin("change-at-new-leader")
    start = events[0][1]
    stale = start["stale_change"]
    assert stale not in (None, "n1")
    assert "remove " + stale + " at n1" in platform.sent
    if stale != "n2":
        mine = sorted(start["graph"]["n1"] + ["n1"])
        assert len(mine) == 2 and stale not in mine and "n2" not in mine
    nemesis._end(fault)
    assert not platform.cut_set and platform.voters == set(platform.node_ids)


@pytest.mark.parametrize("unsafe", [None, "allows-two-membership-changes-in-flight"])
def test_two_in_flight_on_the_simulator_appends_at_once_and_the_real_core_refuses_the_second(
        tmp_path, unsafe: str | None) -> None:
    from nemesis.platforms.base import ClusterConfig
    from nemesis.platforms.sim import SimPlatform
    from nemesis.sim_runner import variant_for_run

    platform = SimPlatform(ClusterConfig(nodes=5, run_id="t", work_dir=tmp_path), seed=4,
                           variant=variant_for_run(unsafe))
    for _ in range(500):
        if platform.ready():
            break
        platform.advance()
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["member"], seed=4, interval_s=2.0,
                      record=lambda f, v: events.append((f, v)))
    # Nothing here is wiped: change-at-new-leader asks once, where a safe core refuses.
    assert nemesis.member_shapes == ("two-in-flight", "change-at-new-leader")
    fault = nemesis._begin("member")
    first, second = [v for f, v in events if f == "member-change"]
    assert first["outcome"] == "appended"
    if unsafe:
        assert second["outcome"] == "appended"
    else:
        assert second["outcome"] == "refused" and "in progress" in second["description"]
    for _ in range(100):  # the fault held: the other side elects a leader of a later term
        platform.advance()
    nemesis._end(fault)
    assert events[-1][1]["kept"] == [first["node"], second["node"]]
    assert not nemesis.errors and not platform.sim.network.cut_links


class DeposedLeaderPlatform(RulePlatform):
    """Just after the heal, the leader still answers a few times with a membership that
    never committed (`stale_node` removed, its CONFIG entry pending) — as a deposed leader
    on the wrong side of the cut does until it hears the later term."""

    stale_node = ""
    stale_answers = 3

    def _stale(self) -> bool:
        return bool(self.stale_node) and not self.cut_set and self.stale_answers > 0

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        st = super().status(node_id, timeout_s)
        if self._stale() and node_id == self.lead:
            self.stale_answers -= 1
            return SimpleNamespace(**{**vars(st), "config_index": 10,
                                      "voters": sorted(self.voters - {self.stale_node})})
        return st

    def membership(self, *, timeout_s: float = 10.0) -> tuple[set[str], set[str]]:
        if self._stale():
            return set(self.voters) - {self.stale_node}, set(self.learners)
        return super().membership(timeout_s=timeout_s)


def test_the_heal_never_wipes_a_voter_on_a_deposed_leaders_uncommitted_membership() -> None:
    platform = DeposedLeaderPlatform(5)
    nemesis, events = _nemesis(platform)
    fault = member_shapes.MemberShapes(nemesis).begin("two-in-flight")
    platform.stale_node = events[0][1]["removing"][0]  # its removal never committed
    nemesis._end(fault)
    assert f"wipe {platform.stale_node}" not in platform.calls, platform.calls
    assert platform.stale_node in events[-1][1]["kept"]
