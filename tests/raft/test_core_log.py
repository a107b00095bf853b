"""Unit tests of the core's building blocks: the in-memory log and per-follower progress."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from system.raft.log import RaftLog
from system.raft.progress import Progress, ProgressState
from system.raft.read_only import ReadIndexQueue, ReadState, decode_round, encode_round
from system.raft.types import Entry, SnapshotMeta


def log_of(*terms: int, snapshot: SnapshotMeta | None = None, committed: int = 0) -> RaftLog:
    start = snapshot.index + 1 if snapshot else 1
    return RaftLog(snapshot, tuple(Entry(t, start + k) for k, t in enumerate(terms)), committed)


def test_indexes_and_terms_across_the_snapshot_point() -> None:
    log = log_of(3, 3, 4, snapshot=SnapshotMeta(10, 2, ("a",)), committed=11)
    assert (log.first_index(), log.last_index(), log.last_term()) == (11, 13, 4)
    assert [log.term(i) for i in (9, 10, 11, 13, 14)] == [None, 2, 3, 4, None]
    assert [e.index for e in log.slice(12, 14)] == [12, 13]
    with pytest.raises(AssertionError):
        log.slice(10, 12)  # reaches into the snapshot


def test_up_to_date_compares_last_term_then_last_index() -> None:
    log = log_of(1, 2, 2)
    assert log.is_up_to_date(1, 3)  # higher last term wins even if shorter
    assert log.is_up_to_date(3, 2) and log.is_up_to_date(4, 2)
    assert not log.is_up_to_date(2, 2)
    assert not log.is_up_to_date(10, 1)


def test_find_conflict_finds_the_first_new_or_different_entry() -> None:
    log = log_of(1, 1, 2, 2)
    assert log.find_conflict((Entry(1, 1), Entry(1, 2))) == 0  # all present
    assert log.find_conflict((Entry(2, 4), Entry(2, 5))) == 5  # 4 present, 5 new
    assert log.find_conflict((Entry(1, 2), Entry(3, 3))) == 3  # 3 differs
    assert log.find_conflict(()) == 0


def test_find_conflict_by_term_skips_a_whole_term() -> None:
    log = log_of(1, 1, 4, 4, 4, 5, 5)
    assert log.find_conflict_by_term(7, 3) == 2  # every entry above 2 has a term > 3
    assert log.find_conflict_by_term(7, 5) == 7
    assert log.find_conflict_by_term(99, 4) == 5  # capped at the last index
    assert log.find_conflict_by_term(7, 0) == 0


def test_append_truncates_a_conflicting_suffix_and_marks_it_unstable() -> None:
    log = log_of(1, 1, 2, 2)
    log.stable_to(4)
    assert not log.has_unstable()
    log.append([Entry(3, 3)])
    assert [(e.index, e.term) for e in log.entries] == [(1, 1), (2, 1), (3, 3)]
    assert [e.index for e in log.unstable_entries()] == [3]


def test_committed_entries_are_never_truncated_and_commit_never_decreases() -> None:
    log = log_of(1, 1, 1, committed=2)
    with pytest.raises(AssertionError, match="committed"):
        log.append([Entry(2, 2)])
    assert not log.commit_to(1) and log.committed == 2
    with pytest.raises(AssertionError, match="beyond last index"):
        log.commit_to(9)


def test_applying_and_applied_stay_below_commit() -> None:
    log = log_of(1, 1, 1, committed=2)
    assert [e.index for e in log.next_committed()] == [1, 2]
    log.mark_applying(2)
    assert log.next_committed() == [] and log.applied == 0
    log.applied_to(2)
    assert log.applied == 2
    with pytest.raises(AssertionError, match="backwards"):
        log.mark_applying(1)


def test_compact_and_restore() -> None:
    log = log_of(1, 1, 2, 2, committed=3)
    log.compact(3)
    assert (log.snapshot_index, log.snapshot_term, log.last_index()) == (3, 2, 4)
    log.restore(SnapshotMeta(9, 3, ("a",)))
    assert (log.committed, log.last_index(), log.entries) == (9, 9, [])
    assert log.unstable_from == 10


def test_restored_log_must_be_contiguous_with_non_decreasing_terms() -> None:
    with pytest.raises(ValueError, match="not contiguous"):
        RaftLog(None, (Entry(2, 1), Entry(1, 2)))
    with pytest.raises(ValueError, match="not contiguous"):
        RaftLog(SnapshotMeta(5, 1, ("a",)), (Entry(1, 7),))


def test_progress_replicate_window_and_acknowledgement() -> None:
    progress = Progress(next_index=5, max_inflight=2)
    progress.maybe_update(4)
    progress.become_replicate()
    progress.sent_entries(6)
    assert not progress.is_paused()
    progress.sent_entries(8)
    assert progress.is_paused() and progress.next == 9
    assert progress.maybe_update(6) and not progress.is_paused()
    assert not progress.maybe_update(5)  # stale acknowledgement changes nothing
    assert progress.match == 6


def test_progress_probe_waits_for_an_answer_and_backs_off_to_the_hint() -> None:
    progress = Progress(next_index=11, max_inflight=8)
    progress.sent_entries(12)
    assert progress.state is ProgressState.PROBE and progress.is_paused()
    assert not progress.maybe_decrease_to(rejected=7, hint=3)  # not our probe's answer
    assert progress.maybe_decrease_to(rejected=10, hint=3)
    assert (progress.next, progress.is_paused()) == (4, False)


def test_progress_snapshot_state_sends_no_entries_until_done() -> None:
    progress = Progress(next_index=3, max_inflight=8)
    progress.become_snapshot(20)
    assert progress.is_paused()
    progress.maybe_update(20)
    progress.become_probe()
    assert (progress.state, progress.next) == (ProgressState.PROBE, 21)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(1, 4)), max_size=40))
def test_log_matches_a_plain_list_model_under_appends_commits_and_compactions(ops) -> None:
    """Whatever sequence of appends (with truncation above the commit index), commits and
    compactions, the log agrees with a plain list of (index, term) and its unstable
    suffix holds every entry changed since it was last handed out."""
    log = RaftLog()
    model: list[int] = []  # model[i] = term of index i + 1 (including compacted entries)
    persisted: dict[int, int] = {}  # what a shell would have stored
    for op, a, b in ops:
        if op == 0:  # append b entries after index max(committed, last - a)
            start = max(log.committed, log.snapshot_index, log.last_index() - a) + 1
            term = max([model[start - 2]] if start > 1 else [1]) + (a % 2)
            new = [Entry(term, start + k) for k in range(b)]
            log.append(new)
            del model[start - 1 :]
            model.extend(term for _ in new)
        elif op == 1:
            log.commit_to(min(log.last_index(), log.committed + a))
        elif op == 2:
            target = min(log.committed, log.snapshot_index + a)
            if target > log.snapshot_index:
                log.compact(target)
        else:  # hand out unstable entries, as ready() does
            unstable = log.unstable_entries()
            if unstable:  # the Ready rule: drop the stored suffix, then append
                first = unstable[0].index
                persisted = {i: t for i, t in persisted.items() if i < first}
                persisted.update((e.index, e.term) for e in unstable)
            log.stable_to(log.last_index())
        assert log.last_index() == len(model)
        assert log.snapshot_index <= log.committed <= log.last_index()
        for index in range(log.snapshot_index + 1, log.last_index() + 1):
            assert log.term(index) == model[index - 1]
        for index, term in persisted.items():
            if index > log.snapshot_index and index < log.unstable_from:
                assert model[index - 1] == term, "a changed entry was not marked unstable"


def test_read_index_queue_releases_a_round_and_every_earlier_one_in_order() -> None:
    reads = ReadIndexQueue()
    first = reads.start_round([b"r1", b"r2"], commit_index=5)
    second = reads.start_round([b"r3"], commit_index=7)
    assert decode_round(encode_round(second)) == second
    assert reads.latest_round_context() == encode_round(second)
    assert reads.acknowledge(second, "b") == {"b"}
    assert reads.release_through(second) == [
        ReadState(b"r1", 5),
        ReadState(b"r2", 5),
        ReadState(b"r3", 7),
    ]
    assert reads.acknowledge(first, "c") is None  # already released
    assert not reads and reads.latest_round_context() == b""


def test_read_index_queue_abandons_pending_and_queued_reads() -> None:
    reads = ReadIndexQueue()
    reads.wait_for_barrier(b"early")
    reads.start_round([b"r1"], commit_index=3)
    assert reads.abandon() == [b"r1", b"early"]
    assert not reads and reads.acks == {}
    assert reads.start_round([b"r2"], commit_index=4) == 2  # round ids never repeat
