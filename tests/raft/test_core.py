"""Unit tests of the Raft core, one rule of the paper per test.

They drive single `RaftCore`s, or a few of them through the tiny hand-written `Pump`
below (not the simulator): every message is visible, so each test names the exact
exchange it proves. Each safety rule's test is paired with a broken variant of the core,
made here by subclassing one overridable method, to show the test can fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest

from system.raft.core import (
    TRANSFER_CONTEXT,
    NotLeader,
    ProposalDropped,
    RaftConfig,
    RaftCore,
    ReadState,
    Ready,
    Role,
)
from system.raft.messages import Message, MessageType
from system.raft.progress import ProgressState
from system.raft.types import Entry, EntryKind, HardState, PersistentState, SnapshotMeta

MT = MessageType
IDS = ("a", "b", "c")


# ---------------------------------------------------------------------------------------
# A minimal shell: storage that follows the Ready contract, and a message pump
# ---------------------------------------------------------------------------------------


class Storage:
    """Durable state of one node, updated exactly as the Ready contract says."""

    def __init__(self) -> None:
        self.hard_state = HardState()
        self.snapshot: SnapshotMeta | None = None
        self.snapshot_data = b""
        self.entries: list[Entry] = []

    def persist(self, ready: Ready) -> None:
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state
        if ready.snapshot is not None:
            self.snapshot = ready.snapshot
            self.snapshot_data = ready.snapshot_data
            self.entries = [e for e in self.entries if e.index > ready.snapshot.index]
        if ready.entries:
            first = ready.entries[0].index
            self.entries = [e for e in self.entries if e.index < first]
            self.entries.extend(ready.entries)

    def persistent_state(self) -> PersistentState:
        return PersistentState(
            self.hard_state, self.snapshot, self.snapshot_data, tuple(self.entries)
        )


class Pump:
    """Cores plus a FIFO network the test controls: nothing moves unless asked."""

    def __init__(self, ids: tuple[str, ...] = IDS, seed: int = 0, core_class=RaftCore, **cfg):
        self.ids = ids
        self.cfg = cfg
        self.seed = seed
        self.core_class = core_class
        self.storage = {i: Storage() for i in ids}
        self.nodes: dict[str, RaftCore] = {
            i: core_class(RaftConfig(i, ids, **cfg), random.Random(seed * 100 + n))
            for n, i in enumerate(ids)
        }
        self.queue: list[Message] = []
        self.applied: dict[str, list[Entry]] = {i: [] for i in ids}
        self.read_states: dict[str, list[ReadState]] = {i: [] for i in ids}
        self.dropped_reads: dict[str, list[bytes]] = {i: [] for i in ids}
        self.installed: dict[str, list[bytes]] = {i: [] for i in ids}
        self.readies: dict[str, list[Ready]] = {i: [] for i in ids}
        self.isolated: set[str] = set()

    def flush(self, node_id: str) -> list[Message]:
        """Carry out every Ready of one node; queue its messages and return them."""
        node = self.nodes[node_id]
        sent: list[Message] = []
        while node.has_ready():
            ready = node.ready()
            self.readies[node_id].append(ready)
            self.storage[node_id].persist(ready)
            sent.extend(ready.messages)
            if ready.snapshot is not None:
                self.installed[node_id].append(ready.snapshot_data)
            self.applied[node_id].extend(ready.committed_entries)
            self.read_states[node_id].extend(ready.read_states)
            self.dropped_reads[node_id].extend(ready.dropped_reads)
            node.advance(ready)
        self.queue.extend(sent)
        return sent

    def flush_all(self) -> None:
        for i in self.ids:
            self.flush(i)

    def take(self, predicate: Callable[[Message], bool]) -> list[Message]:
        taken = [m for m in self.queue if predicate(m)]
        self.queue = [m for m in self.queue if not predicate(m)]
        return taken

    def deliver(self, messages: Iterable[Message]) -> None:
        for m in messages:
            if m.src in self.isolated or m.dst in self.isolated:
                continue
            self.nodes[m.dst].step(m)

    def settle(self, max_rounds: int = 1000) -> None:
        """Flush and deliver until nothing is left (dropping isolated nodes' traffic)."""
        for _ in range(max_rounds):
            self.flush_all()
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            self.deliver(batch)
        raise AssertionError("the cluster did not settle")

    def tick(self, node_ids: Iterable[str] | None = None, times: int = 1) -> None:
        for _ in range(times):
            for i in node_ids or self.ids:
                self.nodes[i].tick()
            self.settle()

    def elect(self, node_id: str) -> RaftCore:
        """Make `node_id` campaign now (as if its timer fired) and run the election."""
        node = self.nodes[node_id]
        for _ in range(node.randomized_election_timeout):
            node.tick()
        self.settle()
        assert node.role is Role.LEADER, f"{node_id} did not win: {node}"
        return node

    def restart(self, node_id: str, core_class=None) -> RaftCore:
        state = self.storage[node_id].persistent_state()
        cls = core_class or self.core_class
        node = cls(RaftConfig(node_id, self.ids, **self.cfg), random.Random(self.seed + 7), state)
        self.nodes[node_id] = node
        return node


def message(type_: MessageType, src: str, dst: str, term: int, **fields) -> Message:
    return Message(type_, src, dst, term, **fields)


def ready_messages(node: RaftCore) -> list[Message]:
    return list(node.ready().messages) if node.has_ready() else []


def entries(*terms: int, start: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(t, start + k, b"e%d" % (start + k)) for k, t in enumerate(terms))


def restored(term: int, log_terms: tuple[int, ...], commit: int = 0, vote=None) -> PersistentState:
    return PersistentState(HardState(term, vote, commit), None, b"", entries(*log_terms))


def core(node_id: str = "a", ids=IDS, seed: int = 0, restore=None, cls=RaftCore, **cfg):
    return cls(RaftConfig(node_id, ids, **cfg), random.Random(seed), restore)


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"node_id": "", "voters": ("a",)}, "node_id"),
        ({"node_id": "z", "voters": IDS}, "not among voters"),
        ({"node_id": "a", "voters": ()}, "voters must be"),
        ({"node_id": "a", "voters": ["a", "b"]}, "voters must be"),
        ({"node_id": "a", "voters": ("a", "a", "b")}, "duplicates"),
        ({"node_id": "a", "voters": IDS, "election_timeout_ticks": 0}, "election_timeout_ticks"),
        (
            {
                "node_id": "a",
                "voters": IDS,
                "election_timeout_ticks": 3,
                "heartbeat_interval_ticks": 3,
            },
            "smaller than election_timeout_ticks",
        ),
        ({"node_id": "a", "voters": IDS, "max_append_entries": 0}, "max_append_entries"),
        ({"node_id": "a", "voters": IDS, "max_append_bytes": -1}, "max_append_bytes"),
        ({"node_id": "a", "voters": IDS, "max_inflight_appends": True}, "max_inflight_appends"),
        ({"node_id": "a", "voters": IDS, "snapshot_chunk_bytes": 1.5}, "snapshot_chunk_bytes"),
        ({"node_id": "a", "voters": IDS, "pre_vote": "yes"}, "pre_vote"),
    ],
)
def test_config_rejects_bad_values_with_a_message_naming_the_field(kwargs, complaint) -> None:
    with pytest.raises(ValueError, match=complaint):
        RaftConfig(**kwargs)


def test_core_requires_an_injected_random_generator() -> None:
    with pytest.raises(TypeError, match="random.Random"):
        RaftCore(RaftConfig("a", IDS), rng=None)  # type: ignore[arg-type]


def test_restore_rejects_inconsistent_durable_state() -> None:
    gap = PersistentState(HardState(2, None, 0), None, b"", (Entry(1, 1), Entry(1, 3)))
    with pytest.raises(ValueError, match="not contiguous"):
        core(restore=gap)
    beyond = PersistentState(HardState(2, None, 5), None, b"", (Entry(1, 1),))
    with pytest.raises(ValueError, match="commit index 5"):
        core(restore=beyond)


# ---------------------------------------------------------------------------------------
# Elections (Raft §5.2, §5.4.1; thesis §9.6 PreVote, §6.2 CheckQuorum)
# ---------------------------------------------------------------------------------------


def test_election_timeout_is_randomized_in_t_to_2t_from_the_injected_rng() -> None:
    timeouts = set()
    for seed in range(50):
        node = core(seed=seed, election_timeout_ticks=10)
        assert 10 <= node.randomized_election_timeout < 20
        timeouts.add(node.randomized_election_timeout)
    assert len(timeouts) > 3, "timeouts are not randomized"
    same = [core(seed=7).randomized_election_timeout for _ in range(3)]
    assert len(set(same)) == 1, "the same seed must give the same timeout"


def test_follower_campaigns_exactly_when_its_randomized_timeout_expires() -> None:
    node = core(seed=3, pre_vote=False)
    for _ in range(node.randomized_election_timeout - 1):
        node.tick()
    assert node.role is Role.FOLLOWER and not ready_messages(node)
    node.tick()
    assert node.role is Role.CANDIDATE and node.term == 1 and node.vote == "a"
    sent = ready_messages(node)
    assert {(m.type, m.dst, m.term) for m in sent} == {(MT.VOTE, "b", 1), (MT.VOTE, "c", 1)}


def test_a_single_node_cluster_elects_itself_and_commits_its_noop() -> None:
    pump = Pump(ids=("a",))
    node = pump.elect("a")
    assert node.term == 1 and node.commit_index == 1
    assert [e.kind for e in pump.applied["a"]] == [EntryKind.NOOP]
    index, term = node.propose(b"x")
    pump.settle()
    assert (index, term) == (2, 1) and pump.applied["a"][-1].data == b"x"


def test_new_leader_appends_a_noop_of_its_term_and_commits_it() -> None:
    pump = Pump()
    leader = pump.elect("a")
    last = leader.log_entries()[-1]
    assert (last.kind, last.term, last.index) == (EntryKind.NOOP, leader.term, 1)
    for i in IDS:
        assert [(e.kind, e.term) for e in pump.applied[i]] == [(EntryKind.NOOP, leader.term)]
    assert {n.leader_id for n in pump.nodes.values()} == {"a"}


class VotesForAnyLog(RaftCore):
    """Broken: drops the election restriction (Raft §5.4.1)."""

    def log_is_up_to_date(self, last_index: int, last_term: int) -> bool:
        return True


def grants_to_a_candidate_with_an_older_log(cls) -> bool:
    voter = core("a", cls=cls, restore=restored(2, (1, 2)))
    voter.step(message(MT.VOTE, "b", "a", 3, index=5, log_term=1))
    (reply,) = ready_messages(voter)
    return not reply.reject


def test_the_election_restriction_is_what_refuses_an_older_log() -> None:
    assert grants_to_a_candidate_with_an_older_log(RaftCore) is False
    assert grants_to_a_candidate_with_an_older_log(VotesForAnyLog) is True


def test_vote_refused_to_a_candidate_whose_log_is_less_up_to_date() -> None:
    # Raft §5.4.1: our last entry has term 2; the candidate's last term is 1.
    voter = core("a", restore=restored(2, (1, 2)))
    voter.step(message(MT.VOTE, "b", "a", 3, index=5, log_term=1))
    (reply,) = ready_messages(voter)
    assert reply.type is MT.VOTE_RESPONSE and reply.reject and voter.vote is None
    # Same last term but a shorter log: also refused.
    voter.step(message(MT.VOTE, "b", "a", 3, index=1, log_term=2))
    (reply,) = ready_messages(voter)
    assert reply.reject
    # At least as up to date: granted.
    voter.step(message(MT.VOTE, "b", "a", 3, index=2, log_term=2))
    (reply,) = ready_messages(voter)
    assert not reply.reject and voter.vote == "b"


class GrantsEveryVote(RaftCore):
    """Broken: forgets that a node votes at most once per term (Raft §5.2)."""

    def may_grant_vote(self, m: Message) -> bool:
        return self.log_is_up_to_date(m.index, m.log_term)

    # The core also asserts the invariant where it records a vote; the broken variant
    # skips that too, to show the test (not only the assertion) catches the bug.
    def record_vote(self, candidate: str) -> None:
        self._vote = candidate


def votes_granted(voter: RaftCore, requests: list[Message]) -> list[str]:
    granted = []
    for request in requests:
        voter.step(request)
        for m in ready_messages(voter):
            if m.type is MT.VOTE_RESPONSE and not m.reject:
                granted.append(m.dst)
    return granted


def test_a_node_votes_at_most_once_per_term() -> None:
    requests = [message(MT.VOTE, c, "a", 1, index=0, log_term=0) for c in ("b", "c", "b")]
    # A repeated request from the same candidate is granted again (idempotent), never c.
    assert votes_granted(core("a"), requests) == ["b", "b"]


def test_vote_once_rule_is_what_the_previous_test_checks() -> None:
    requests = [message(MT.VOTE, c, "a", 1, index=0, log_term=0) for c in ("b", "c")]
    assert votes_granted(core("a", cls=GrantsEveryVote), requests) == ["b", "c"]


def test_the_vote_is_persisted_before_the_grant_is_sent_and_survives_restart() -> None:
    pump = Pump(pre_vote=False)
    voter = pump.nodes["a"]
    voter.step(message(MT.VOTE, "b", "a", 1, index=0, log_term=0))
    ready = voter.ready()
    grant = [m for m in ready.messages if m.type is MT.VOTE_RESPONSE]
    assert grant and not grant[0].reject
    # The grant leaves in the same Ready as the hard state recording it, with fsync:
    # the shell persists before it sends (Raft Figure 2).
    assert ready.hard_state == HardState(1, "b", 0) and ready.must_sync
    pump.storage["a"].persist(ready)
    voter.advance(ready)
    # Crash and restart: the vote comes back from disk; c cannot get a vote in term 1.
    restarted = pump.restart("a")
    assert (restarted.term, restarted.vote) == (1, "b")
    assert votes_granted(restarted, [message(MT.VOTE, "c", "a", 1, index=0, log_term=0)]) == []


def test_prevote_does_not_bump_the_term_of_anyone() -> None:
    pump = Pump()
    candidate = pump.nodes["a"]
    pump.isolated = {"b", "c"}  # nobody answers: the election can never be won
    for _ in range(5 * candidate.randomized_election_timeout):
        pump.tick(["a"])
    assert candidate.term == 0 and candidate.role is Role.PRE_CANDIDATE
    # The PreVote itself proposes term 1 but changes no voter's term or vote.
    pump.isolated = set()
    for _ in range(candidate.randomized_election_timeout):
        candidate.tick()
    sent = pump.flush("a")
    assert {(m.type, m.term) for m in sent} == {(MT.PRE_VOTE, 1)}
    pump.take(lambda m: True)
    pump.deliver(sent)
    assert [(pump.nodes[i].term, pump.nodes[i].vote) for i in ("b", "c")] == [(0, None)] * 2
    answers = pump.flush("b") + pump.flush("c")
    assert {(m.type, m.term, m.reject) for m in answers} == {(MT.PRE_VOTE_RESPONSE, 1, False)}
    pump.take(lambda m: True)
    pump.deliver(answers)
    assert candidate.role is Role.CANDIDATE and candidate.term == 1  # only now


def test_a_stale_prevote_grant_from_an_earlier_round_is_not_counted() -> None:
    node = core("a", restore=restored(1, ()))  # term 1
    for _ in range(node.randomized_election_timeout):
        node.tick()
    assert node.role is Role.PRE_CANDIDATE  # asking for term 2
    node.step(message(MT.PRE_VOTE_RESPONSE, "b", "a", 1))  # a grant for term 1, delayed
    assert node.role is Role.PRE_CANDIDATE and node.term == 1
    node.step(message(MT.PRE_VOTE_RESPONSE, "b", "a", 2))  # a grant for this round
    assert node.role is Role.CANDIDATE and node.term == 2


def test_prevote_lets_a_rejoining_node_not_disrupt_a_healthy_leader() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    for _ in range(60):
        pump.tick()  # c keeps failing its PreVote; a and b keep exchanging heartbeats
    assert pump.nodes["c"].term == leader.term  # its term did not run away
    pump.isolated = set()
    pump.tick(times=3)
    assert leader.role is Role.LEADER and leader.term == 1
    assert pump.nodes["c"].leader_id == "a"


class PreVoteGrantedLikeAVote(RaftCore):
    """Broken: grants a PreVote whenever it would grant a vote at that term, even while
    it still hears from a leader (drops the thesis §9.6 check)."""

    def heard_from_leader_recently(self) -> bool:
        return False


def leader_after_a_node_rejoins(cls) -> tuple[str | None, int]:
    # Without CheckQuorum, so only the PreVote rule protects the leader.
    pump = Pump(core_class=cls, check_quorum=False)
    pump.elect("a")
    pump.isolated = {"c"}
    pump.tick(times=45)  # c times out (PreVotes go nowhere) while a and b keep going
    pump.isolated = set()
    rejoining = pump.nodes["c"]
    for _ in range(rejoining.randomized_election_timeout):  # its next PreVote round gets through
        pump.tick(["c"])
    pump.tick(times=3)
    leaders = [i for i, n in pump.nodes.items() if n.role is Role.LEADER]
    return (leaders[0] if leaders else None), max(n.term for n in pump.nodes.values())


def test_prevote_is_refused_by_nodes_that_hear_from_a_leader() -> None:
    assert leader_after_a_node_rejoins(RaftCore) == ("a", 1)


def test_prevote_without_the_leader_check_lets_a_rejoining_node_disrupt() -> None:
    assert leader_after_a_node_rejoins(PreVoteGrantedLikeAVote) == ("c", 2)


def test_followers_within_their_leader_lease_ignore_higher_term_votes() -> None:
    pump = Pump(pre_vote=False)
    leader = pump.elect("a")
    follower = pump.nodes["b"]
    follower.step(message(MT.VOTE, "c", "b", 9, index=99, log_term=9))
    assert follower.term == leader.term and not ready_messages(follower)
    # ...but not a vote of a campaign the leader itself asked for (leader transfer).
    follower.step(message(MT.VOTE, "c", "b", 9, index=99, log_term=9, context=TRANSFER_CONTEXT))
    assert follower.term == 9 and follower.vote == "c"


def test_check_quorum_leader_steps_down_without_a_majority() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"b", "c"}
    ticks = 0
    while leader.role is Role.LEADER and ticks < 100:
        pump.tick(["a"])
        ticks += 1
    assert leader.role is Role.FOLLOWER and leader.leader_id is None
    # It stays within two election timeouts (one to notice, one to decide).
    assert ticks <= 2 * leader.config.election_timeout_ticks


def test_check_quorum_leader_keeps_leading_with_a_majority() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    pump.tick(times=50)
    assert leader.role is Role.LEADER


def test_a_stale_leader_learns_the_new_term_from_the_answer_to_its_append() -> None:
    follower = core("b", restore=restored(5, ()))
    follower.step(message(MT.APPEND, "a", "b", 3, index=0, log_term=0))
    (reply,) = ready_messages(follower)
    assert (reply.type, reply.term) == (MT.APPEND_RESPONSE, 5)
    old_leader = core("a", restore=restored(3, ()))
    old_leader.step(reply)
    assert old_leader.term == 5 and old_leader.role is Role.FOLLOWER


# ---------------------------------------------------------------------------------------
# Commitment (Raft §5.3, §5.4.2 Figure 8)
# ---------------------------------------------------------------------------------------


class CommitsByCountingAnyTerm(RaftCore):
    """Broken: commits an earlier term's entry by counting replicas (Figure 8's bug)."""

    def may_commit_at(self, index: int) -> bool:
        return True


def figure8_commit_after_old_entry_reaches_a_majority(cls) -> int:
    """a and b hold an index-2 entry of term 2 that c lacks; a becomes leader of term 4.
    Once b acknowledges index 2 (a majority holds it), what has a committed?"""
    leader = core("a", cls=cls, restore=restored(3, (1, 2), commit=1), pre_vote=False)
    for _ in range(leader.randomized_election_timeout):
        leader.tick()
    leader.ready()
    leader.step(message(MT.VOTE_RESPONSE, "b", "a", 4))
    assert leader.role is Role.LEADER and leader.log_entries()[-1].term == 4
    leader.ready()
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 4, index=2))
    return leader.commit_index


def test_figure8_an_old_term_entry_on_a_majority_is_not_committed_by_counting() -> None:
    assert figure8_commit_after_old_entry_reaches_a_majority(RaftCore) == 1


def test_figure8_the_broken_variant_commits_it() -> None:
    assert figure8_commit_after_old_entry_reaches_a_majority(CommitsByCountingAnyTerm) == 2


def test_figure8_old_entries_commit_once_a_current_term_entry_reaches_a_majority() -> None:
    leader = core("a", restore=restored(3, (1, 2), commit=1), pre_vote=False)
    for _ in range(leader.randomized_election_timeout):
        leader.tick()
    leader.step(message(MT.VOTE_RESPONSE, "b", "a", 4))
    first = leader.ready()
    leader.advance(first)  # the leader's own NOOP is durable (thesis §10.2.1)
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 4, index=3))  # holds the NOOP too
    assert leader.commit_index == 3
    ready = leader.ready()
    applied = [e.index for r in (first, ready) for e in r.committed_entries]
    assert applied == [1, 2, 3]  # 1: re-applied after restart


def test_followers_never_apply_beyond_what_the_leader_says_is_committed() -> None:
    pump = Pump()
    leader = pump.elect("a")
    leader.propose(b"x")
    pump.flush("a")
    appends = pump.take(lambda m: m.type is MT.APPEND)
    pump.deliver(appends)  # followers store index 2 but learn no commit for it yet
    for i in ("b", "c"):
        pump.flush(i)
        assert [e.index for e in pump.applied[i]] == [1]
    pump.settle()
    pump.tick()
    assert all([e.index for e in pump.applied[i]] == [1, 2] for i in IDS)


class AppliesUncommittedEntries(RaftCore):
    """Broken: hands out every entry it stores for applying, committed or not (so the
    shell would acknowledge writes a new leader may still overwrite)."""

    def entries_to_apply(self) -> list[Entry]:
        return self.log.slice(self.log.applying + 1, self.log.last_index() + 1)


def applied_by_a_follower_before_the_leader_commits(cls) -> list[int]:
    follower = core("b", cls=cls)
    follower.step(message(MT.APPEND, "a", "b", 1, index=0, log_term=0, entries=entries(1, 1)))
    return [e.index for e in follower.ready().committed_entries]


def test_only_committed_entries_are_handed_out_for_applying() -> None:
    assert applied_by_a_follower_before_the_leader_commits(RaftCore) == []


def test_applying_uncommitted_entries_is_caught_by_the_core_invariant_check() -> None:
    with pytest.raises(AssertionError, match="only committed entries may be applied"):
        applied_by_a_follower_before_the_leader_commits(AppliesUncommittedEntries)


def test_an_append_acknowledgement_leaves_with_the_entries_it_acknowledges() -> None:
    follower = core("b")
    follower.step(message(MT.APPEND, "a", "b", 1, index=0, log_term=0, entries=entries(1, 1)))
    ready = follower.ready()
    (ack,) = ready.messages
    assert (ack.type, ack.index, ack.reject) == (MT.APPEND_RESPONSE, 2, False)
    assert [e.index for e in ready.entries] == [1, 2] and ready.must_sync


def test_a_commit_only_change_needs_no_fsync_and_an_unchanged_hard_state_is_not_sent() -> None:
    follower = core("b")
    follower.step(message(MT.APPEND, "a", "b", 1, index=0, log_term=0, entries=entries(1)))
    first = follower.ready()
    follower.advance(first)
    assert first.must_sync and first.hard_state == HardState(1, None, 0)
    follower.step(message(MT.HEARTBEAT, "a", "b", 1, commit=1))
    second = follower.ready()
    assert second.hard_state == HardState(1, None, 1) and not second.must_sync
    assert [e.index for e in second.committed_entries] == [1]
    follower.advance(second)
    follower.step(message(MT.HEARTBEAT, "a", "b", 1, commit=1))
    third = follower.ready()
    assert third.hard_state is None and not third.must_sync and len(third.messages) == 1


# ---------------------------------------------------------------------------------------
# Log replication: back-tracking, batching, pipelining
# ---------------------------------------------------------------------------------------


def leader_with_log(log_terms: tuple[int, ...], term: int, cls=RaftCore, **cfg) -> RaftCore:
    """A leader of `term` whose log is `log_terms` (plus its NOOP), followers unknown."""
    leader = core("a", cls=cls, restore=restored(term - 1, log_terms), pre_vote=False, **cfg)
    for _ in range(leader.randomized_election_timeout):
        leader.tick()
    leader.ready()
    leader.step(message(MT.VOTE_RESPONSE, "b", "a", term))
    assert leader.role is Role.LEADER and leader.term == term
    return leader


def round_trips_to_find_the_match(leader: RaftCore, follower: RaftCore) -> int:
    trips = 0
    while trips < 500:
        out = [m for m in ready_messages(leader) if m.dst == follower.id and m.type is MT.APPEND]
        if not out:
            break
        trips += 1
        for m in out:
            follower.step(m)
        replies = ready_messages(follower)
        for r in replies:
            leader.step(r)
        if all(not r.reject for r in replies):
            break
    return trips


def diverged_pair(cls) -> tuple[RaftCore, RaftCore]:
    common = (1,) * 5
    leader = leader_with_log(common + (3,) * 50 + (5,) * 50, term=6, cls=cls)
    follower = core("b", restore=restored(5, common + (2,) * 50 + (4,) * 60), cls=cls)
    return leader, follower


def test_conflicting_follower_is_found_in_a_few_round_trips_not_one_per_entry() -> None:
    # Both logs share 5 entries of term 1, then diverge for 100 entries: the leader's are
    # of terms 3 and 5, the follower's of terms 2 and 4 (leaderships the other never saw).
    leader, follower = diverged_pair(RaftCore)
    trips = round_trips_to_find_the_match(leader, follower)
    assert trips <= 3, f"took {trips} round trips"
    assert leader.progress["b"].match == leader.log.last_index()
    assert [e.term for e in follower.log_entries()] == [e.term for e in leader.log_entries()]


class BacksOffOneEntryAtATime(RaftCore):
    """Slow (not unsafe): the naive back-off of the paper's Figure 2, one index per
    rejected APPEND, instead of skipping a term at a time."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log.find_conflict_by_term = lambda index, term: min(index, self.log.last_index())


def test_without_the_term_hint_the_same_conflict_takes_one_round_trip_per_entry() -> None:
    leader, follower = diverged_pair(BacksOffOneEntryAtATime)
    assert round_trips_to_find_the_match(leader, follower) >= 100
    assert [e.term for e in follower.log_entries()] == [e.term for e in leader.log_entries()]


def test_follower_with_a_short_log_is_probed_from_its_end() -> None:
    leader = leader_with_log((1,) * 50, term=2)
    follower = core("b", restore=restored(1, (1,) * 3))
    assert round_trips_to_find_the_match(leader, follower) <= 2
    assert follower.log.last_index() == leader.log.last_index()


def test_appends_are_batched_within_max_append_entries() -> None:
    pump = Pump(max_append_entries=10)
    leader = pump.elect("a")
    for _ in range(95):
        leader.propose(b"x" * 100)
    sent = pump.flush("a")
    appends = [m for m in sent if m.type is MT.APPEND and m.dst == "b"]
    assert appends and all(1 <= len(m.entries) <= 10 for m in appends)
    pump.settle()
    assert all(n.commit_index == 96 for n in pump.nodes.values())
    batched = [m for r in pump.readies["a"] for m in r.messages if m.type is MT.APPEND]
    assert max(len(m.entries) for m in batched) == 10


def test_appends_are_batched_within_max_append_bytes_but_always_carry_one_entry() -> None:
    pump = Pump(max_append_bytes=250)
    leader = pump.elect("a")
    for _ in range(7):
        leader.propose(b"x" * 100)
    leader.propose(b"y" * 1000)  # larger than the limit on its own
    pump.settle()
    appends = [m for r in pump.readies["a"] for m in r.messages if m.type is MT.APPEND]
    sizes = [(sum(len(e.data) for e in m.entries), len(m.entries)) for m in appends if m.entries]
    assert max(count for _, count in sizes) == 2
    assert all(size <= 250 or count == 1 for size, count in sizes)
    assert (1000, 1) in sizes
    assert all(n.commit_index == 9 for n in pump.nodes.values())


def test_inflight_appends_per_follower_are_bounded_then_resume_on_acknowledgement() -> None:
    pump = Pump(max_inflight_appends=3)
    leader = pump.elect("a")
    pump.tick()
    assert leader.progress["b"].state is ProgressState.REPLICATE
    unacknowledged = []
    for _ in range(10):
        leader.propose(b"x")
        pump.flush("a")  # one Ready per proposal: no batching to hide the window
        unacknowledged += pump.take(lambda m: m.dst == "b" and m.type is MT.APPEND)
    assert len(unacknowledged) == 3, "a 4th APPEND went out before any acknowledgement"
    assert [len(m.entries) for m in unacknowledged] == [1, 1, 1]
    # One acknowledgement frees the window: everything still unsent goes in one APPEND.
    pump.deliver(unacknowledged[:1])
    pump.flush("b")
    pump.deliver(pump.take(lambda m: m.src == "b"))
    more = [m for m in pump.flush("a") if m.dst == "b" and m.type is MT.APPEND and m.entries]
    assert len(more) == 1 and len(more[0].entries) == 7


def test_a_lost_probe_is_resent_after_a_heartbeat_response() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    leader.propose(b"x")
    pump.settle()
    assert leader.progress["c"].match == 1  # the NOOP only
    pump.isolated = set()
    pump.tick(times=2)
    assert pump.nodes["c"].commit_index == 2 and leader.progress["c"].match == 2


# ---------------------------------------------------------------------------------------
# ReadIndex (thesis §6.4)
# ---------------------------------------------------------------------------------------


def test_read_index_on_a_follower_raises_not_leader_with_the_leader_hint() -> None:
    pump = Pump()
    pump.elect("a")
    with pytest.raises(NotLeader) as raised:
        pump.nodes["b"].read_index(b"r1")
    assert raised.value.leader_id == "a"
    with pytest.raises(NotLeader):
        pump.nodes["b"].propose(b"x")


def test_read_index_waits_until_the_leader_committed_an_entry_of_its_term() -> None:
    pump = Pump()
    leader = pump.nodes["a"]
    for _ in range(leader.randomized_election_timeout):
        leader.tick()
    pump.flush("a")
    pump.deliver(pump.take(lambda m: True))  # PreVotes
    pump.flush_all()
    pump.deliver(pump.take(lambda m: True))  # PreVote grants -> campaign
    pump.flush("a")
    pump.deliver(pump.take(lambda m: True))  # votes
    pump.flush_all()
    pump.deliver(pump.take(lambda m: True))  # vote grants -> leader
    assert leader.role is Role.LEADER and leader.commit_index == 0
    leader.read_index(b"r1")
    # Heartbeat acknowledgements alone must not confirm it: the NOOP is not committed.
    leader.tick()
    pump.flush("a")
    heartbeats = pump.take(lambda m: m.type is MT.HEARTBEAT)
    appends = pump.take(lambda m: True)
    pump.deliver(heartbeats)
    pump.flush_all()
    pump.deliver(pump.take(lambda m: True))
    pump.flush("a")
    assert pump.read_states["a"] == []
    pump.deliver(appends)  # now the NOOP commits
    pump.settle()
    assert pump.read_states["a"] == [ReadState(b"r1", 1)]


class ReadIndexBeforeOwnTermCommit(RaftCore):
    """Broken: serves ReadIndex before the leader committed an entry of its term, when
    its commit index may still be behind the previous leader's."""

    def read_barrier_open(self) -> bool:
        return True


def read_states_before_the_noop_commits(cls) -> list[ReadState]:
    """A new leader whose NOOP is not yet committed gets a read; its heartbeat round is
    acknowledged by everyone, but the APPENDs carrying the NOOP are held back."""
    pump = Pump(core_class=cls, pre_vote=False)
    leader = pump.nodes["a"]
    for _ in range(leader.randomized_election_timeout):
        leader.tick()
    pump.flush("a")
    pump.deliver(pump.take(lambda m: True))  # votes
    pump.flush_all()
    pump.deliver(pump.take(lambda m: True))  # grants: a leads, NOOP appended
    assert leader.role is Role.LEADER
    pump.flush("a")
    pump.take(lambda m: m.type is MT.APPEND)  # the NOOP never arrives
    leader.read_index(b"r")
    for _ in range(3):
        leader.tick()
        pump.flush("a")
        pump.take(lambda m: m.type is MT.APPEND)
        pump.deliver(pump.take(lambda m: True))
        pump.flush_all()
        pump.take(lambda m: m.type is MT.APPEND_RESPONSE)
        pump.deliver(pump.take(lambda m: True))
        pump.flush("a")
    return pump.read_states["a"]


def test_read_index_barrier_holds_reads_until_an_own_term_entry_commits() -> None:
    assert read_states_before_the_noop_commits(RaftCore) == []


def test_read_index_barrier_broken_serves_at_a_possibly_stale_commit_index() -> None:
    assert read_states_before_the_noop_commits(ReadIndexBeforeOwnTermCommit) == [ReadState(b"r", 0)]


def test_read_index_is_confirmed_by_a_majority_for_a_round_started_after_the_request() -> None:
    pump = Pump(ids=("a", "b", "c", "d", "e"))
    leader = pump.elect("a")
    pump.tick()
    leader.read_index(b"r1")
    heartbeats = [m for m in pump.flush("a") if m.type is MT.HEARTBEAT]
    assert len(heartbeats) == 4 and len({m.context for m in heartbeats}) == 1
    pump.take(lambda m: True)
    pump.deliver(heartbeats[:1])  # one follower + the leader: 2 of 5, not a majority
    pump.flush("b")
    pump.deliver(pump.take(lambda m: True))
    pump.flush("a")
    assert pump.read_states["a"] == []
    pump.deliver(heartbeats[1:2])  # 3 of 5
    pump.flush("c")
    pump.deliver(pump.take(lambda m: True))
    pump.flush("a")
    assert pump.read_states["a"] == [ReadState(b"r1", leader.commit_index)]


def test_read_index_is_not_confirmed_by_answers_to_an_earlier_round() -> None:
    pump = Pump()
    leader = pump.elect("a")
    leader.read_index(b"first")
    first_round = [m for m in pump.flush("a") if m.type is MT.HEARTBEAT]
    pump.take(lambda m: True)
    pump.deliver(first_round)
    old_answers = []
    for i in ("b", "c"):
        old_answers += pump.flush(i)
    pump.take(lambda m: True)
    leader.read_index(b"second")  # after the first round's heartbeats were sent
    pump.flush("a")
    pump.take(lambda m: True)
    pump.deliver(old_answers)
    pump.flush("a")
    assert pump.read_states["a"] == [ReadState(b"first", leader.commit_index)]


class ReadIndexWithoutHeartbeatRound(RaftCore):
    """Broken: answers a read from local state as soon as it is asked (no quorum)."""

    def read_round_confirmed(self, acks) -> bool:
        return True


def partitioned_leader_read_states(cls) -> list[ReadState]:
    pump = Pump(core_class=cls)
    leader = pump.elect("a")
    pump.isolated = {"a"}  # the leader does not know it is cut off yet
    leader.read_index(b"r")
    pump.settle()
    return pump.read_states["a"]


def test_a_partitioned_leader_never_confirms_a_read() -> None:
    assert partitioned_leader_read_states(RaftCore) == []


def test_a_partitioned_leader_confirms_reads_when_the_quorum_check_is_broken() -> None:
    assert partitioned_leader_read_states(ReadIndexWithoutHeartbeatRound) != []


def test_pending_reads_are_dropped_when_leadership_is_lost() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"a"}
    leader.read_index(b"r1")
    leader.read_index(b"r2")
    for _ in range(3 * leader.config.election_timeout_ticks):
        pump.tick(["a"])
    assert leader.role is Role.FOLLOWER
    assert pump.dropped_reads["a"] == [b"r1", b"r2"] and pump.read_states["a"] == []


# ---------------------------------------------------------------------------------------
# Snapshots and chunked InstallSnapshot (Raft §7)
# ---------------------------------------------------------------------------------------


def lagging_follower_pump(chunk_bytes: int = 10, data: bytes = b"S" * 35) -> Pump:
    """a leads; c is cut off while a commits 5 entries and compacts them into `data`."""
    pump = Pump(snapshot_chunk_bytes=chunk_bytes)
    leader = pump.elect("a")
    pump.isolated = {"c"}
    for k in range(5):
        leader.propose(b"w%d" % k)
    pump.settle()
    assert leader.applied_index == 6
    leader.compact(6, data)
    assert leader.snapshot_meta == SnapshotMeta(6, 1, IDS) and leader.log_entries() == ()
    pump.isolated = set()
    return pump


def test_compact_drops_the_log_prefix_rejects_unapplied_and_ignores_older_indexes() -> None:
    pump = Pump()
    leader = pump.elect("a")
    for k in range(3):
        leader.propose(b"%d" % k)
    pump.settle()
    with pytest.raises(ValueError, match="only 4 is applied"):
        leader.compact(5, b"s")
    leader.compact(3, b"s")
    assert [e.index for e in leader.log_entries()] == [4]
    leader.compact(2, b"older")  # already compacted further: nothing to do
    assert leader.snapshot_meta.index == 3 and leader.log.snapshot_index == 3


def test_lagging_follower_gets_the_snapshot_in_chunks_and_then_takes_part_in_commits() -> None:
    pump = lagging_follower_pump(chunk_bytes=10, data=b"0123456789abcdefghijklmnopqrstuvwxy")
    pump.tick()  # heartbeat -> response -> leader finds c's next entry compacted
    chunks = [m for r in pump.readies["a"] for m in r.messages if m.type is MT.SNAPSHOT]
    assert [(m.offset, len(m.data), m.done) for m in chunks] == [
        (0, 10, False),
        (10, 10, False),
        (20, 10, False),
        (30, 5, True),
    ]
    follower = pump.nodes["c"]
    assert pump.installed["c"] == [b"0123456789abcdefghijklmnopqrstuvwxy"]
    assert follower.snapshot_meta == SnapshotMeta(6, 1, IDS)
    assert follower.commit_index == 6 and follower.applied_index == 6
    assert pump.storage["c"].snapshot == SnapshotMeta(6, 1, IDS)
    leader = pump.nodes["a"]
    assert leader.progress["c"].state is ProgressState.REPLICATE
    pump.isolated = {"b"}  # now a commit needs c
    leader.propose(b"after")
    pump.settle()
    assert leader.commit_index == 7 and pump.applied["c"][-1].data == b"after"


def snapshot_chunk(meta: SnapshotMeta, offset: int, data: bytes, done: bool = False) -> Message:
    return message(
        MT.SNAPSHOT,
        "a",
        "c",
        1,
        index=meta.index,
        snapshot=meta,
        offset=offset,
        data=data,
        done=done,
    )


def test_snapshot_chunks_out_of_order_are_answered_with_the_offset_expected_next() -> None:
    follower = core("c", snapshot_chunk_bytes=4)
    meta = SnapshotMeta(6, 1, IDS)
    follower.step(snapshot_chunk(meta, 0, b"abcd"))
    follower.step(snapshot_chunk(meta, 8, b"ijkl", done=True))  # a gap: 4..8 not here yet
    follower.step(snapshot_chunk(meta, 0, b"abcd"))  # a duplicate changes nothing
    replies = ready_messages(follower)
    assert [(m.offset, m.reject, m.done) for m in replies] == [
        (4, False, False),
        (4, True, False),
        (4, False, False),
    ]
    follower.step(snapshot_chunk(meta, 4, b"efgh"))
    follower.step(snapshot_chunk(meta, 8, b"ijkl", done=True))
    ready = follower.ready()
    assert ready.snapshot == meta and ready.snapshot_data == b"abcdefghijkl"
    assert [(m.offset, m.done, m.index) for m in ready.messages] == [(8, False, 6), (0, True, 6)]


def test_snapshot_assembly_restarts_for_a_chunk_of_another_snapshot() -> None:
    follower = core("c", snapshot_chunk_bytes=4)
    old, new = SnapshotMeta(6, 1, IDS), SnapshotMeta(9, 1, IDS)
    follower.step(snapshot_chunk(old, 0, b"abcd"))
    follower.step(snapshot_chunk(new, 4, b"WXYZ"))  # the leader moved on: start over
    (_, reply) = ready_messages(follower)
    assert (reply.reject, reply.offset, reply.snapshot) == (True, 0, new)
    follower.step(snapshot_chunk(new, 0, b"STUV"))  # replaces the partial old one
    follower.step(snapshot_chunk(new, 4, b"WXYZ", done=True))
    ready = follower.ready()
    assert ready.snapshot == new and ready.snapshot_data == b"STUVWXYZ"


def test_a_lost_snapshot_chunk_is_resent_after_the_transfer_goes_quiet() -> None:
    pump = lagging_follower_pump(chunk_bytes=10)
    leader = pump.nodes["a"]
    leader.tick()  # heartbeat -> c answers -> probe -> the leader finds c's entries compacted
    lost: list[Message] = []
    for _ in range(10):
        pump.flush_all()
        lost = pump.take(lambda m: m.type is MT.SNAPSHOT)
        if lost:
            break
        pump.deliver(pump.take(lambda m: True))
    assert [m.offset for m in lost] == [0]
    assert leader.progress["c"].state is ProgressState.SNAPSHOT
    quiet = 0
    while not pump.installed["c"] and quiet < 3 * leader.config.election_timeout_ticks:
        pump.tick()
        quiet += 1
    assert pump.installed["c"] == [b"S" * 35]
    assert quiet >= leader.snapshot_resend_ticks()  # not resent on every heartbeat answer


def test_a_snapshot_older_than_the_commit_index_is_acknowledged_without_install() -> None:
    follower = core("c", restore=restored(1, (1,) * 8, commit=8))
    meta = SnapshotMeta(6, 1, IDS)
    follower.step(message(MT.SNAPSHOT, "a", "c", 1, index=6, snapshot=meta, data=b"x", done=True))
    ready = follower.ready()
    assert ready.snapshot is None
    (reply,) = ready.messages
    assert reply.done and reply.index == 8
    assert len(follower.log_entries()) == 8


def test_restart_rebuilds_from_snapshot_plus_log_and_reapplies_committed_entries() -> None:
    state = PersistentState(
        HardState(3, "b", 9),
        SnapshotMeta(6, 2, IDS),
        b"snap",
        entries(2, 3, 3, 3, start=7),
    )
    node = core("a", restore=state)
    assert (node.term, node.vote, node.commit_index, node.applied_index) == (3, "b", 9, 6)
    assert node.snapshot_meta == SnapshotMeta(6, 2, IDS)
    assert [e.index for e in node.log_entries()] == [7, 8, 9, 10]
    ready = node.ready()
    assert [e.index for e in ready.committed_entries] == [7, 8, 9]
    assert ready.entries == () and ready.hard_state is None and not ready.must_sync
    node.advance(ready)
    assert node.applied_index == 9 and not node.has_ready()


def test_restart_skips_stored_entries_the_snapshot_covers() -> None:
    state = PersistentState(
        HardState(2, None, 6), SnapshotMeta(6, 2, IDS), b"s", entries(2, 2, 2, start=5)
    )
    node = core("a", restore=state)
    assert [e.index for e in node.log_entries()] == [7] and node.commit_index == 6


def test_a_snapshot_is_emitted_only_when_the_log_lacks_its_last_entry() -> None:
    meta = SnapshotMeta(3, 1, IDS)
    holds_it = core("c", restore=restored(1, (1, 1, 1, 1)))
    holds_it.step(message(MT.SNAPSHOT, "a", "c", 1, index=3, snapshot=meta, data=b"s", done=True))
    ready = holds_it.ready()
    assert ready.snapshot is None and holds_it.commit_index == 3
    assert [e.index for e in holds_it.log_entries()] == [1, 2, 3, 4]
    diverged = core("c", restore=restored(2, (1, 2, 2, 2)))  # its entry 3 has term 2, not 1
    diverged.step(message(MT.SNAPSHOT, "a", "c", 2, index=3, snapshot=meta, data=b"s", done=True))
    ready = diverged.ready()
    assert ready.snapshot == meta and diverged.log_entries() == ()


def test_restarted_leader_can_send_its_restored_snapshot() -> None:
    pump = lagging_follower_pump()
    pump.storage["a"].snapshot = pump.nodes["a"].snapshot_meta
    pump.storage["a"].snapshot_data = b"S" * 35
    pump.storage["a"].entries = [e for e in pump.storage["a"].entries if e.index > 6]
    restarted = pump.restart("a")
    assert restarted.snapshot_meta == SnapshotMeta(6, 1, IDS)
    assert restarted.log_entries() == () and restarted.commit_index == 6
    pump.isolated = {"b"}  # a must win again (c's log is behind), then catch c up
    for _ in range(100):
        pump.tick(["a", "c"])
        if restarted.role is Role.LEADER:
            break
    assert restarted.role is Role.LEADER
    pump.tick(["a", "c"], times=3)
    assert pump.installed["c"] == [b"S" * 35]
    assert pump.nodes["c"].commit_index == restarted.commit_index == 7  # 7: a's new NOOP


# ---------------------------------------------------------------------------------------
# Leader transfer (thesis §3.10)
# ---------------------------------------------------------------------------------------


def test_leader_transfer_catches_the_target_up_then_it_wins_without_prevote() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    leader.propose(b"x")
    pump.settle()
    pump.isolated = set()
    leader.transfer_leadership("c")
    with pytest.raises(ProposalDropped, match="transferred to c"):
        leader.propose(b"y")
    sent = pump.flush("a")
    assert [m.type for m in sent if m.dst == "c"] == [MT.APPEND]  # catch up first
    assert not any(m.type is MT.TIMEOUT_NOW for m in sent)
    pump.settle()
    target = pump.nodes["c"]
    assert target.role is Role.LEADER and target.term == 2
    kinds = {m.type for r in pump.readies["c"] for m in r.messages}
    assert MT.PRE_VOTE not in kinds and MT.VOTE in kinds
    assert leader.role is Role.FOLLOWER and leader.leader_id == "c"


def test_leader_transfer_is_aborted_after_an_election_timeout() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    leader.transfer_leadership("c")
    pump.tick(["a", "b"], times=leader.config.election_timeout_ticks)
    assert leader.role is Role.LEADER and leader.lead_transferee is None
    assert leader.propose(b"z")[0] == 2


def test_leader_transfer_to_itself_abandons_a_transfer_in_progress() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated = {"c"}
    leader.transfer_leadership("c")
    with pytest.raises(ProposalDropped):
        leader.propose(b"x")
    leader.transfer_leadership("a")
    assert leader.lead_transferee is None and leader.propose(b"x")[0] == 2


def test_leader_transfer_input_errors() -> None:
    pump = Pump()
    leader = pump.elect("a")
    with pytest.raises(ValueError, match="not a voter"):
        leader.transfer_leadership("zz")
    with pytest.raises(NotLeader):
        pump.nodes["b"].transfer_leadership("c")


# ---------------------------------------------------------------------------------------
# Robustness against bad or stale input
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        message(MT.APPEND, "", "a", 1),  # no sender
        message(MT.APPEND, "b", "zz", 1),  # addressed elsewhere
        message(MT.APPEND, "a", "a", 1),  # from itself
        message(MT.VOTE, "b", "a", -1),  # negative term
        message(MT.APPEND, "b", "a", 1, index=0, entries=(Entry(1, 5),)),  # gap
        message(MT.APPEND, "b", "a", 1, index=0, entries=(Entry(9, 1),)),  # future term
        message(MT.HEARTBEAT, "b", "a", 1, entries=(Entry(1, 1),)),  # entries on a heartbeat
        message(MT.SNAPSHOT, "b", "a", 1),  # snapshot without metadata
        Message("append", "b", "a", 1),  # type: ignore[arg-type]  # not a MessageType
        message(MT.HEARTBEAT, "b", "a", "1"),  # a term that is not an int
        message(MT.HEARTBEAT, "b", "a", 0),  # a leader at term 0
        message(MT.APPEND, "b", "a", 1, index=0, entries=(Entry(0, 1),)),  # entry of term 0
    ],
)
def test_malformed_or_misaddressed_messages_are_ignored(bad: Message) -> None:
    node = core("a")
    node.step(bad)
    assert (node.term, node.role, node.ignored_message_count) == (0, Role.FOLLOWER, 1)
    assert node.last_ignored_reason and not ready_messages(node)


def test_a_leader_outside_our_membership_is_followed() -> None:
    """Thesis §4.1: a server accepts AppendEntries from a leader that is not in its
    latest membership (one added after the end of its log), or it could never catch up."""
    node = core("a")
    node.step(message(MT.HEARTBEAT, "zz", "a", 1))
    assert (node.term, node.leader_id, node.ignored_message_count) == (1, "zz", 0)


def test_stale_term_messages_are_ignored() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.tick()
    before = (leader.term, leader.commit_index, leader.progress["b"].match)
    for stale in (
        message(MT.APPEND_RESPONSE, "b", "a", 0, index=99),
        message(MT.VOTE_RESPONSE, "b", "a", 0),
        message(MT.HEARTBEAT_RESPONSE, "b", "a", 0, context=b"\x00" * 8),
        message(MT.SNAPSHOT_RESPONSE, "b", "a", 0, done=True, index=50),
    ):
        leader.step(stale)
    assert (leader.term, leader.commit_index, leader.progress["b"].match) == before
    assert leader.role is Role.LEADER


def test_random_garbage_messages_never_crash_a_node() -> None:
    rng = random.Random(42)
    pump = Pump()
    pump.elect("a")
    types = list(MT)
    for _ in range(3000):
        target = rng.choice(IDS)
        src = rng.choice([i for i in IDS if i != target])
        start = rng.randrange(0, 6)
        garbage = Message(
            rng.choice(types),
            src,
            target,
            rng.randrange(0, 4),
            log_term=rng.randrange(0, 4),
            index=start,
            entries=tuple(
                Entry(rng.randrange(1, 4), start + 1 + k) for k in range(rng.randrange(0, 3))
            ),
            commit=rng.randrange(0, 8),
            reject=rng.random() < 0.3,
            reject_hint=rng.randrange(0, 8),
            reject_term=rng.randrange(0, 4),
            context=rng.choice([b"", b"\x00" * 7 + b"\x01", b"junk"]),
            snapshot=rng.choice([None, SnapshotMeta(rng.randrange(0, 8), 1, IDS)]),
            offset=rng.randrange(0, 20),
            data=b"d" * rng.randrange(0, 5),
            done=rng.random() < 0.5,
        )
        pump.nodes[target].step(garbage)
        pump.flush_all()
        pump.queue.clear()
