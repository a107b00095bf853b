"""Receiver rules of the Raft paper's Figure 2, each tested directly on one core, each
beside a variant of the core that breaks exactly that rule (tests/raft/broken.py, where
the randomized scans use them too) and the same scenario showing the broken variant fails
the assertion.

These rules escaped the randomized simulation in an outside review: each needs a message
kept alive across a term change or a reordering the swarm rarely produces, so the named
scenario is what shows them.
"""

from __future__ import annotations

from system.raft.core import RaftCore, Role
from system.raft.messages import Message, MessageType
from system.raft.types import Entry
from tests.raft.broken import (
    AcceptsAppendsFromOlderTerms,
    CommitsPastVerifiedEntries,
    CountsVotesFromOlderTerms,
    IgnoresHigherTermAnswers,
    TruncatesWithoutAConflict,
)
from tests.raft.test_core import core, message, ready_messages, restored

MT = MessageType


def _campaign(node: RaftCore) -> None:
    """Let the node's election timer fire once."""
    for _ in range(node.randomized_election_timeout):
        node.tick()
    if node.has_ready():
        node.ready()  # its vote requests: the test delivers answers by hand


# ----- a candidate ignores an answer from an older term (Figure 2, "all servers") --------


def candidate_after_a_stale_grant(cls: type[RaftCore]) -> Role:
    """`a` campaigns for term 4, times out, campaigns for term 5; then b's grant for
    term 4 arrives, late. One vote of three: b voted in term 4, not 5."""
    a = core("a", cls=cls, restore=restored(3, (1,)), pre_vote=False)
    _campaign(a)
    assert (a.role, a.term) == (Role.CANDIDATE, 4)
    _campaign(a)
    assert (a.role, a.term) == (Role.CANDIDATE, 5)
    a.step(message(MT.VOTE_RESPONSE, "b", "a", 4))
    return a.role


def test_a_candidate_does_not_count_a_vote_granted_in_an_older_term() -> None:
    assert candidate_after_a_stale_grant(RaftCore) is Role.CANDIDATE


def test_broken_counting_old_votes_elects_a_leader_without_a_majority() -> None:
    assert candidate_after_a_stale_grant(CountsVotesFromOlderTerms) is Role.LEADER


# ----- a follower rejects an append from an older term (AppendEntries rule 1) ------------


def follower_after_a_stale_append(cls: type[RaftCore]) -> tuple[tuple[int, ...], str | None, Message]:
    """b is at term 5 with an entry of term 5 at index 2 (from the current leader c).
    The deposed leader a of term 3, back from a partition, sends its own entry 2."""
    b = core("b", cls=cls, restore=restored(5, (1, 5), commit=1))
    b.step(message(MT.HEARTBEAT, "c", "b", 5, commit=1))
    ready_messages(b)
    b.step(message(MT.APPEND, "a", "b", 3, index=1, log_term=1,
                   entries=(Entry(3, 2, b"stale"),), commit=1))
    (reply,) = ready_messages(b)
    return tuple(e.term for e in b.log_entries()), b.leader_id, reply


def test_a_follower_rejects_an_append_from_an_older_term_and_keeps_its_log() -> None:
    terms, leader, reply = follower_after_a_stale_append(RaftCore)
    assert terms == (1, 5) and leader == "c"
    assert (reply.type, reply.term) == (MT.APPEND_RESPONSE, 5)  # tells a it is deposed


def test_broken_accepting_old_appends_overwrites_the_current_leaders_entry() -> None:
    terms, leader, _ = follower_after_a_stale_append(AcceptsAppendsFromOlderTerms)
    assert terms == (1, 3) and leader == "a"


# ----- commit = min(leaderCommit, index of last new entry) (AppendEntries rule 5) --------


def follower_commit_after_a_short_append(cls: type[RaftCore]) -> tuple[int, tuple[int, ...]]:
    """b holds entries 3 and 4 of term 2 that never committed; the leader a of term 3
    has other entries there and has committed to 4. Its first append to b verifies only
    index 1 (probing backwards): b must not take its own entries 3-4 as committed."""
    b = core("b", cls=cls, restore=restored(2, (1, 1, 2, 2), commit=1))
    b.step(message(MT.APPEND, "a", "b", 3, index=1, log_term=1, entries=(), commit=4))
    ready_messages(b)
    return b.commit_index, tuple(e.term for e in b.log_entries())


def test_a_follower_commits_no_further_than_what_the_append_verified() -> None:
    commit, terms = follower_commit_after_a_short_append(RaftCore)
    assert commit == 1 and terms == (1, 1, 2, 2)


def test_broken_commit_past_the_verified_prefix_commits_entries_the_leader_lacks() -> None:
    commit, _ = follower_commit_after_a_short_append(CommitsPastVerifiedEntries)
    assert commit == 4


# ----- truncate only on a real conflict (AppendEntries rule 3) ---------------------------


def follower_log_after_a_reordered_append(cls: type[RaftCore]) -> tuple[int, list[int]]:
    """b acknowledged entries 1-4 of the leader a's term 2; then an older append of the
    same term (entries 1-2), delayed in the network, arrives. Nothing conflicts: b's log
    must still end at 4, since a counts b's acknowledgement of 4 towards a majority."""
    b = core("b", cls=cls, restore=restored(2, ()))
    b.step(message(MT.APPEND, "a", "b", 2, index=0, log_term=0,
                   entries=tuple(Entry(2, i, b"x") for i in range(1, 5)), commit=0))
    acks = [m.index for m in ready_messages(b)]
    b.step(message(MT.APPEND, "a", "b", 2, index=0, log_term=0,
                   entries=(Entry(2, 1, b"x"), Entry(2, 2, b"x")), commit=0))
    acks += [m.index for m in ready_messages(b)]
    return b.log_entries()[-1].index, acks


def test_an_append_without_a_conflict_truncates_nothing() -> None:
    last, acks = follower_log_after_a_reordered_append(RaftCore)
    assert last == 4 and acks[0] == 4


def test_broken_truncation_drops_an_entry_the_follower_acknowledged() -> None:
    last, acks = follower_log_after_a_reordered_append(TruncatesWithoutAConflict)
    assert acks[0] == 4 and last == 2


# ----- a leader steps down on an answer from a higher term (Figure 2, "all servers") ----


def leader_after_a_higher_term_answer(cls: type[RaftCore], answer: MessageType) -> tuple[Role, int]:
    a = core("a", cls=cls, restore=restored(3, (1,), commit=1), pre_vote=False)
    _campaign(a)
    a.step(message(MT.VOTE_RESPONSE, "b", "a", 4))
    assert a.role is Role.LEADER
    ready_messages(a)
    a.step(message(answer, "c", "a", 7, reject=True, index=1))
    return a.role, a.term


def test_a_leader_steps_down_on_an_answer_from_a_higher_term() -> None:
    for answer in (MT.APPEND_RESPONSE, MT.HEARTBEAT_RESPONSE):
        assert leader_after_a_higher_term_answer(RaftCore, answer) == (Role.FOLLOWER, 7)


def test_broken_leader_ignoring_higher_terms_keeps_leading_a_dead_term() -> None:
    for answer in (MT.APPEND_RESPONSE, MT.HEARTBEAT_RESPONSE):
        assert leader_after_a_higher_term_answer(IgnoresHigherTermAnswers, answer) == (
            Role.LEADER, 4)
