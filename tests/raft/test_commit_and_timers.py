"""How a new commit index reaches the followers (`RaftConfig.eager_commit`), and which
messages restart a follower's election timer (Raft Figure 2).

Driven through test_core's `Pump`: nothing moves unless the test says so, so each test
names the exact messages it proves. Each rule is paired with a broken subclass that shows
the test can fail.
"""

from __future__ import annotations

from system.raft.core import MembershipChangeKind, RaftCore, Role
from system.raft.messages import Message, MessageType
from tests.raft.test_core import Pump

MT = MessageType


def settle_counting(pump: Pump) -> list[Message]:
    """`pump.settle()`, returning every message delivered meanwhile."""
    delivered: list[Message] = []
    deliver = pump.deliver

    def counting(messages):  # noqa: ANN001, ANN202
        messages = list(messages)
        delivered.extend(messages)
        deliver(messages)

    pump.deliver = counting  # type: ignore[method-assign]
    try:
        pump.settle()
    finally:
        pump.deliver = deliver  # type: ignore[method-assign]
    return delivered


def one_write(eager_commit: bool, core_class: type[RaftCore] = RaftCore):
    """A settled 3-node cluster, one write proposed and every message delivered (no tick):
    what was delivered, and the pump."""
    pump = Pump(eager_commit=eager_commit, core_class=core_class)
    leader = pump.elect("a")
    pump.tick(["a"])  # a heartbeat: everybody knows the NOOP is committed
    index, _ = leader.propose(b"x")
    return settle_counting(pump), pump, index


def shape(messages: list[Message]) -> list[tuple[str, str, str, int]]:
    return sorted((m.type.name, m.src, m.dst, len(m.entries)) for m in messages)


def applied(pump: Pump, node: str) -> list[int]:
    return [e.index for e in pump.applied[node]]


def test_lazily_a_write_costs_one_round_of_messages_and_the_leader_commits_it() -> None:
    delivered, pump, index = one_write(eager_commit=False)
    assert shape(delivered) == [
        ("APPEND", "a", "b", 1), ("APPEND", "a", "c", 1),
        ("APPEND_RESPONSE", "b", "a", 0), ("APPEND_RESPONSE", "c", "a", 0)]
    assert applied(pump, "a")[-1] == index  # committed and applied: the client may hear
    assert all(index not in applied(pump, f) for f in ("b", "c"))


def test_eagerly_the_leader_sends_the_commit_index_in_a_second_round() -> None:
    delivered, pump, index = one_write(eager_commit=True)
    assert [m for m in delivered if m.type is MT.APPEND and not m.entries] != []
    assert len(delivered) == 8
    assert all(applied(pump, n)[-1] == index for n in ("a", "b", "c"))


class HeartbeatsWithoutCommit(RaftCore):
    """Broken: heartbeats carry no commit index, so a lazy leader's followers only learn
    one from the next write's APPEND."""

    def broadcast_heartbeat(self) -> None:
        committed = self.log.committed
        self.log.committed = 0
        try:
            super().broadcast_heartbeat()
        finally:
            self.log.committed = committed


def followers_apply_within_one_heartbeat(core_class: type[RaftCore]) -> bool:
    _, pump, index = one_write(eager_commit=False, core_class=core_class)
    pump.tick(["a"])  # heartbeat_interval_ticks = 1
    return all(applied(pump, f)[-1] == index for f in ("b", "c"))


def test_lazily_followers_learn_the_commit_index_from_the_next_heartbeat() -> None:
    assert followers_apply_within_one_heartbeat(RaftCore)


def test_the_heartbeat_rule_is_what_the_previous_test_checks() -> None:
    assert not followers_apply_within_one_heartbeat(HeartbeatsWithoutCommit)


class StepsDownWithoutSendingTheCommit(RaftCore):
    """Broken: a leader that removed itself steps down without telling the others that
    the removal committed (it sends no more heartbeats that would)."""

    def broadcast_append(self, commit_now: bool = False) -> None:
        super().broadcast_append(commit_now=False)


def others_know_the_removal_committed(core_class: type[RaftCore]) -> bool:
    pump = Pump(eager_commit=False, core_class=core_class)
    leader = pump.elect("a")
    pump.tick(["a"])
    index, _ = leader.change_membership(MembershipChangeKind.REMOVE, "a")
    pump.settle()
    assert leader.role is Role.FOLLOWER  # stepped down once the removal committed
    return all(pump.nodes[n].commit_index >= index for n in ("b", "c"))


def test_a_leader_that_removed_itself_sends_the_commit_before_stepping_down() -> None:
    assert others_know_the_removal_committed(RaftCore)


def test_without_it_the_others_do_not_know_the_removal_committed() -> None:
    assert not others_know_the_removal_committed(StepsDownWithoutSendingTheCommit)


# ---------------------------------------------------------------------------------------
# Election timers: a refused candidate restarts nobody's timer
# ---------------------------------------------------------------------------------------


class RestartsTheTimerOnEveryNewTerm(RaftCore):
    """Broken (the core before the fix, and etcd without PreVote): any higher-term message
    restarts the election timer, a refused VOTE included."""

    def keep_election_timer(self, timer: tuple[int, int]) -> None:
        pass


def leader_after_a_stale_fast_candidate(core_class: type[RaftCore]) -> str | None:
    """PreVote and CheckQuorum off. c misses a committed write, then the leader a is
    lost. c's clock runs twice as fast as b's: c times out first every time and asks b,
    which refuses (c's log is behind). Only b can win (it needs c's vote, which c gives
    to a candidate of a higher term with a better log). Returns the leader, if any,
    after 30 election timeouts of b's."""
    pump = Pump(pre_vote=False, check_quorum=False, core_class=core_class)
    pump.elect("a")
    pump.isolated = {"c"}
    pump.nodes["a"].propose(b"c never sees this")
    pump.settle()
    assert pump.nodes["b"].commit_index == pump.nodes["a"].commit_index == 2
    pump.isolated = {"a"}
    b, c = pump.nodes["b"], pump.nodes["c"]
    for _ in range(30 * 2 * b.config.election_timeout_ticks):
        c.tick()
        pump.settle()
        c.tick()
        b.tick()
        pump.settle()
        for node in (b, c):
            if node.role is Role.LEADER:
                return node.id
    return None


def test_an_up_to_date_follower_still_times_out_while_a_stale_one_campaigns() -> None:
    assert leader_after_a_stale_fast_candidate(RaftCore) == "b"


def test_restarting_the_timer_on_a_refused_vote_leaves_the_cluster_without_a_leader() -> None:
    assert leader_after_a_stale_fast_candidate(RestartsTheTimerOnEveryNewTerm) is None
