"""A follower whose COMMITTED log conflicts with the leader's, on single cores driven by
hand (docs/raft.md, "A follower whose committed log diverged"). The named interleaving
that builds it in a cluster is in test_interleavings.py; these pin down each piece:
what the follower answers, what it refuses, what the leader reports and sends."""

from __future__ import annotations

from system.raft.core import (
    DIVERGED_PREFIX,
    TRANSFER_CONTEXT,
    RaftCore,
    Role,
    decode_diverged,
    encode_verify,
)
from system.raft.messages import Message, MessageType
from system.raft.types import Entry, SnapshotMeta
from tests.raft.broken import AnswersBelowCommitAsMatch
from tests.raft.test_core import core, leader_with_log, message, ready_messages, restored

MT = MessageType


def diverged_follower(cls: type[RaftCore] = RaftCore) -> tuple[RaftCore, RaftCore, list[Message]]:
    """Leader a of term 4 holds (1, 1, 3) + its NOOP; follower b committed (1, 1, 2, 2):
    their entries at index 3, committed on b, differ. a's first APPEND reaches b (below
    b's commit index: the shortcut's case)."""
    leader = leader_with_log((1, 1, 3), term=4)
    follower = core("b", cls=cls, restore=restored(3, (1, 1, 2, 2), commit=4))
    ready = leader.ready()
    leader.advance(ready)
    (append,) = [m for m in ready.messages if m.dst == "b" and m.type is MT.APPEND]
    assert (append.index, append.log_term) == (3, 3)
    follower.step(append)
    return leader, follower, ready_messages_and_errors(follower)


def ready_messages_and_errors(node: RaftCore) -> list[Message]:
    ready = node.ready()
    node.advance(ready)
    node.last_ready = ready  # type: ignore[attr-defined]
    return list(ready.messages)


def test_the_follower_refuses_reports_itself_and_stops_voting_durably() -> None:
    _, follower, replies = diverged_follower()
    ready = follower.last_ready  # type: ignore[attr-defined]
    (reply,) = replies
    assert reply.reject and decode_diverged(reply.context) == (3, 4)
    assert ready.errors and "diverged from leader a's at index 3 (term 2 here, 3 at the leader)" \
        in ready.errors[0] and "commit index 4" in ready.errors[0]
    assert ready.hard_state is not None and ready.hard_state.catch_up_to == 5 and ready.must_sync
    assert follower.log_diverged and follower.commit_index == 4
    # Time brings no campaign, and a candidate with a better log gets no vote.
    for _ in range(100):
        follower.tick()
    assert follower.role is Role.FOLLOWER
    assert not [m for m in ready_messages(follower) if m.type in (MT.PRE_VOTE, MT.VOTE)]
    # (A transfer's VOTE, so that no leader lease is why it is refused.)
    follower.step(message(MT.VOTE, "c", "b", 9, index=10, log_term=8, context=TRANSFER_CONTEXT))
    (answer,) = ready_messages(follower)
    assert answer.reject
    # Heartbeats teach it no commit index; APPENDs and snapshots at or below its commit
    # index get the same refusal.
    follower.step(message(MT.HEARTBEAT, "a", "b", 9, commit=4))
    follower.step(message(MT.APPEND, "a", "b", 9, index=1, log_term=1, commit=4))
    follower.step(message(MT.SNAPSHOT, "a", "b", 9, index=2, snapshot=SnapshotMeta(2, 1, ("a", "b", "c")),
                          done=True))
    answers = [m for m in ready_messages(follower) if m.type is not MT.HEARTBEAT_RESPONSE]
    assert [m.context.startswith(DIVERGED_PREFIX) for m in answers] == [True, True]


def test_the_broken_follower_answers_as_a_match_and_reports_nothing() -> None:
    _, follower, replies = diverged_follower(AnswersBelowCommitAsMatch)
    (reply,) = replies
    assert not reply.reject and reply.index == 4  # "I match up to my commit index"
    assert not follower.last_ready.errors and not follower.log_diverged  # type: ignore[attr-defined]


def test_the_leader_reports_once_counts_it_for_nothing_and_only_probes_on_heartbeats() -> None:
    leader, _, replies = diverged_follower()
    for reply in replies:
        leader.step(reply)
    ready = leader.ready()
    assert len(ready.errors) == 1
    assert "follower b's committed log diverged from ours at index 3 (its commit index 4, ours" \
        in ready.errors[0]
    progress = leader.progress["b"]
    assert progress.match == 0 and progress.diverged == (3, 4)
    assert not [m for m in ready.messages if m.dst == "b" and m.type is MT.APPEND]
    # A heartbeat answer opens one probe, marked with a nonce; b still says "diverged":
    # no second error.
    leader.step(message(MT.HEARTBEAT_RESPONSE, "b", "a", 4))
    (probe,) = [m for m in ready_messages(leader) if m.dst == "b" and m.type is MT.APPEND]
    assert probe.context == encode_verify(progress.verify_nonce)
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 4, index=3, reject=True,
                        context=replies[0].context))
    assert not leader.ready().errors


def test_a_replaced_follower_is_streamed_to_again_and_stale_answers_claim_nothing() -> None:
    leader, _, replies = diverged_follower()
    for reply in replies:
        leader.step(reply)
    leader.ready()
    last = leader.log.last_index()
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 4, index=2))  # sent before: stale
    assert leader.progress["b"].match == 0
    leader.step(message(MT.HEARTBEAT_RESPONSE, "b", "a", 4))
    (probe,) = [m for m in ready_messages(leader) if m.dst == "b" and m.type is MT.APPEND]
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 4, index=last, context=probe.context))
    progress = leader.progress["b"]
    assert progress.diverged == () and progress.match == last


def test_an_answer_claiming_a_match_beyond_the_leaders_log_is_reported() -> None:
    leader = leader_with_log((1, 1), term=3)
    leader.ready()
    leader.step(message(MT.APPEND_RESPONSE, "b", "a", 3, index=7))
    (error,) = leader.ready().errors
    assert "follower b's committed log diverged from ours at index 4 (its commit index 7" in error
    assert leader.progress["b"].match == 0


def test_below_its_commit_a_follower_claims_no_more_than_the_append_showed() -> None:
    follower = core("b", restore=restored(1, (1, 1, 1, 1), commit=4))
    follower.step(message(MT.APPEND, "a", "b", 2, index=1, log_term=1,
                          entries=(Entry(1, 2, b"e2"),), commit=4))
    (reply,) = ready_messages(follower)
    assert not reply.reject and reply.index == 2


def test_the_leader_asks_for_a_snapshot_beyond_the_followers_commit_and_sends_it() -> None:
    leader, _, replies = diverged_follower()
    for reply in replies:
        leader.step(reply)
    leader.advance(leader.ready())
    assert leader.repair_snapshot_wanted() == 4  # b's commit index
    leader.propose(b"x")  # index 5
    leader.advance(leader.ready())
    leader.step(message(MT.APPEND_RESPONSE, "c", "a", 4, index=5))
    while leader.has_ready():
        leader.advance(leader.ready())
    assert leader.applied_index == 5
    leader.compact(5, b"state at 5")
    assert leader.repair_snapshot_wanted() == 0
    leader.step(message(MT.HEARTBEAT_RESPONSE, "b", "a", 4))
    (chunk,) = [m for m in ready_messages(leader) if m.dst == "b"]
    assert chunk.type is MT.SNAPSHOT and chunk.snapshot.index == 5 and chunk.done


def test_a_diverged_follower_installs_a_snapshot_beyond_its_commit_and_votes_again() -> None:
    _, follower, _ = diverged_follower()
    meta = SnapshotMeta(5, 4, ("a", "b", "c"))
    follower.step(message(MT.SNAPSHOT, "a", "b", 4, index=5, snapshot=meta, data=b"state",
                          done=True))
    ready = follower.ready()
    assert ready.snapshot == meta and ready.snapshot_data == b"state"
    assert any("replaced by leader a's snapshot at index 5" in w for w in ready.warnings)
    (answer,) = ready.messages
    assert answer.done and answer.index == 5
    follower.advance(ready)
    assert not follower.log_diverged and not follower.lost_entries_forbid_vote()
    assert follower.commit_index == follower.applied_index == 5 and follower.log_entries() == ()
