"""Raft's Figure 2 receiver rules, each tested directly on one core and each paired with a
broken variant (a subclass in tests/raft/broken.py that breaks exactly that rule) that the
test catches.

Why here: these rules used to be exercised only through whole scenarios and randomized
runs, and a deliberately broken core that violated one of them could escape both (issue
12, point 0). Each test feeds one core the exact message the rule is about.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from system.raft.core import CampaignKind, RaftConfig, RaftCore, Role
from system.raft.messages import Message, MessageType
from system.raft.types import Entry, HardState, PersistentState
from tests.raft.broken import (
    AcceptsAppendsFromOlderTerms,
    CommitsPastVerifiedEntries,
    CountsVotesFromOlderTerms,
    IgnoresHigherTermAnswers,
    TruncatesWithoutAConflict,
)

MT = MessageType
IDS = ("a", "b", "c")


def core(node_id: str, cls: type[RaftCore], term: int, log_terms: tuple[int, ...] = (),
         **cfg: object) -> RaftCore:
    log = tuple(Entry(t, i, b"e%d" % i) for i, t in enumerate(log_terms, 1))
    restored = PersistentState(HardState(term, None, 0), None, b"", log)
    return cls(RaftConfig(node_id, IDS, pre_vote=False, **cfg), random.Random(1), restored)


def replies(node: RaftCore) -> list[Message]:
    return list(node.ready().messages) if node.has_ready() else []


# -- 1. A candidate counts only votes of its own term (§5.2, Figure 2 "RequestVote RPC") ----


def candidate_after_a_stale_grant(cls: type[RaftCore]) -> Role:
    candidate = core("a", cls, term=2)
    candidate.campaign(CampaignKind.ELECTION)  # term 3
    assert (candidate.role, candidate.term) == (Role.CANDIDATE, 3)
    replies(candidate)
    candidate.step(Message(MT.VOTE_RESPONSE, "b", "a", 2))  # b granted a's term-2 request
    return candidate.role


@pytest.mark.parametrize(("cls", "role"), [(RaftCore, Role.CANDIDATE),
                                           (CountsVotesFromOlderTerms, Role.LEADER)])
def test_a_candidate_ignores_a_vote_granted_in_an_older_term(cls, role) -> None:  # noqa: ANN001
    assert candidate_after_a_stale_grant(cls) is role


# -- 2. A follower rejects an append from an older term (Figure 2 "AppendEntries" 1) --------


def follower_after_a_stale_append(cls: type[RaftCore]) -> tuple[int, int]:
    follower = core("b", cls, term=5)
    follower.step(Message(MT.APPEND, "a", "b", 4, index=0, log_term=0,
                          entries=(Entry(4, 1, b"stale"),), commit=1))
    (reply,) = replies(follower)
    return len(follower.log_entries()), reply.term


@pytest.mark.parametrize(("cls", "outcome"), [(RaftCore, (0, 5)),
                                              (AcceptsAppendsFromOlderTerms, (1, 5))])
def test_a_follower_rejects_an_append_from_an_older_term(cls, outcome) -> None:  # noqa: ANN001
    assert follower_after_a_stale_append(cls) == outcome


# -- 3. Commit = min(leaderCommit, index of last new entry) (Figure 2 "AppendEntries" 5) ----


def commit_after_a_short_append(cls: type[RaftCore]) -> int:
    # b holds five entries of term 1; only the first two are verified by the term-2 leader,
    # whose own log differs after index 2 and which has committed up to 4.
    follower = core("b", cls, term=2, log_terms=(1, 1, 1, 1, 1))
    follower.step(Message(MT.APPEND, "a", "b", 2, index=2, log_term=1, commit=4))
    return follower.commit_index


@pytest.mark.parametrize(("cls", "commit"), [(RaftCore, 2), (CommitsPastVerifiedEntries, 4)])
def test_a_follower_commits_only_what_the_append_verified(cls, commit) -> None:  # noqa: ANN001
    assert commit_after_a_short_append(cls) == commit


# -- 4. Truncate only on a real conflict (Figure 2 "AppendEntries" 3 and 4) -------------------


def log_after_a_delayed_shorter_append(cls: type[RaftCore]) -> int:
    follower = core("b", cls, term=2)
    longer = Message(MT.APPEND, "a", "b", 2, index=0, log_term=0, entries=(
        Entry(2, 1, b"x"), Entry(2, 2, b"y"), Entry(2, 3, b"z")))
    shorter = replace(longer, entries=longer.entries[:1])  # sent first, arrives last
    follower.step(longer)
    follower.step(shorter)
    return len(follower.log_entries())


@pytest.mark.parametrize(("cls", "length"), [(RaftCore, 3), (TruncatesWithoutAConflict, 1)])
def test_an_append_whose_entries_all_match_truncates_nothing(cls, length) -> None:  # noqa: ANN001
    assert log_after_a_delayed_shorter_append(cls) == length


# -- 5. Any higher term seen turns a leader into a follower (Figure 2 "All servers") ---------


def leader_after_a_higher_term_answer(cls: type[RaftCore]) -> tuple[Role, int]:
    leader = core("a", cls, term=2)
    leader.campaign(CampaignKind.ELECTION)  # term 3
    leader.step(Message(MT.VOTE_RESPONSE, "b", "a", 3))
    assert leader.role is Role.LEADER
    replies(leader)
    leader.step(Message(MT.APPEND_RESPONSE, "c", "a", 5, index=0))
    return leader.role, leader.term


@pytest.mark.parametrize(("cls", "outcome"), [(RaftCore, (Role.FOLLOWER, 5)),
                                              (IgnoresHigherTermAnswers, (Role.LEADER, 3))])
def test_a_leader_steps_down_on_an_answer_from_a_higher_term(cls, outcome) -> None:  # noqa: ANN001
    assert leader_after_a_higher_term_answer(cls) == outcome
