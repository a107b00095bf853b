"""The leader writes its log in parallel with replicating it (Raft thesis §10.2.1).

`Ready.messages_before_persist` lets a shell send a leader's APPENDs before its own fsync.
That is safe only because the leader counts its own copy of an entry towards a commit
quorum once the shell has reported it durable (`advance`), never merely because the
entry is in its memory. These tests name that exchange, and a broken variant that counts
its whole in-memory log shows the rule matters: it declares committed an entry that only
one follower holds durably, and a crash that loses the leader's unsynced write then lets
another leader overwrite it.
"""

from __future__ import annotations

from system.raft.core import RaftCore, Ready, Role
from system.raft.messages import MessageType
from tests.raft.broken import CountsUnsyncedOwnEntries
from tests.raft.test_core import Pump

MT = MessageType


def leader_sends_before_its_fsync_and_crashes(core_class: type[RaftCore]) -> tuple[int, int, int]:
    """a leads b and c; c is cut off. A write is proposed on a, whose shell sends the
    APPEND to b before persisting, b persists and acknowledges, and a crashes before its
    own fsync, losing the entry. Returns (index of the write, a's commit index just
    before the crash, the term of the entry the cluster later commits at that index)."""
    pump = Pump(core_class=core_class)
    leader = pump.elect("a")
    pump.isolated.add("c")
    index, _ = leader.propose(b"write")
    ready = leader.ready()  # taken, NOT persisted: the shell's fsync is still running
    assert ready.entries and ready.entries[-1].index == index
    early = [m for m in ready.messages_before_persist if m.dst == "b"]
    assert [m.type for m in early] == [MT.APPEND]
    pump.deliver(early)
    answers = pump.flush("b")  # b persists the entry, then acknowledges it
    pump.queue.clear()
    pump.deliver([m for m in answers if m.dst == "a"])
    commit_before_crash = leader.commit_index

    # a crashes before its fsync: the entry never reached its disk.
    pump.restart("a")
    pump.isolated = {"b"}
    pump.queue.clear()
    new_leader = pump.elect("c")  # a (restarted) and c have the same log: c wins
    assert new_leader.role is Role.LEADER
    pump.settle()
    term_at_index = new_leader.log.term(index)
    assert new_leader.commit_index >= index
    return index, commit_before_crash, term_at_index or 0


def test_a_leader_does_not_count_its_own_entry_before_the_shell_made_it_durable() -> None:
    index, commit_before_crash, _ = leader_sends_before_its_fsync_and_crashes(RaftCore)
    # Only b holds the entry durably: one of three is not a majority.
    assert commit_before_crash < index


def test_the_broken_leader_counting_unsynced_entries_declares_a_lost_write_committed() -> None:
    index, commit_before_crash, term_at_index = leader_sends_before_its_fsync_and_crashes(
        CountsUnsyncedOwnEntries
    )
    assert commit_before_crash >= index  # it told the world the write was committed ...
    # ... and the cluster then committed a different entry (c's NOOP) at that index.
    assert term_at_index > 1


def test_the_entry_commits_once_the_leader_reports_it_durable() -> None:
    pump = Pump()
    leader = pump.elect("a")
    pump.isolated.add("c")
    index, term = leader.propose(b"write")
    ready = leader.ready()
    pump.deliver([m for m in ready.messages_before_persist if m.dst == "b"])
    pump.deliver([m for m in pump.flush("b") if m.dst == "a"])
    pump.queue.clear()
    assert leader.commit_index < index
    pump.storage["a"].persist(ready)  # the fsync finishes after b's answer arrived
    leader.advance(ready)
    assert leader.durable_index == index and leader.commit_index == index
    follow_up = leader.ready()
    assert [(e.index, e.term) for e in follow_up.committed_entries] == [(index, term)]


def test_votes_and_responses_wait_for_persistence_only_leader_replication_goes_early() -> None:
    pump = Pump()
    pump.elect("a")
    pump.nodes["a"].propose(b"x")
    pump.settle()
    readies: list[Ready] = [r for rs in pump.readies.values() for r in rs]
    early = [m for r in readies for m in r.messages_before_persist]
    late = [m for r in readies for m in r.messages_after_persist]
    assert {m.type for m in early} <= {MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT}
    assert MT.APPEND in {m.type for m in early}
    assert {MT.VOTE, MT.VOTE_RESPONSE, MT.APPEND_RESPONSE} <= {m.type for m in late}
    for r in readies:
        assert sorted(map(id, r.messages)) == sorted(
            map(id, r.messages_before_persist + r.messages_after_persist)
        )


def test_the_store_canary_counts_unsynced_self_is_this_broken_rule() -> None:
    """`--unsafe counts-unsynced-self` (system/kv/unsafe.py) runs a core that breaks
    exactly this rule: the same exchange declares the lost write committed."""
    from system.kv.unsafe import unsafe_mode

    mode = unsafe_mode("counts-unsynced-self", {"MAO_ALLOW_UNSAFE": "1"})
    assert mode is not None
    index, commit_before_crash, term_at_index = leader_sends_before_its_fsync_and_crashes(
        mode.core_class
    )
    assert commit_before_crash >= index
    assert term_at_index > 1
