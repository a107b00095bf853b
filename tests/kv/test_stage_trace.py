"""The stage trace's hops and the timeline kv_stages.py builds from them: the figures in
docs/benchmarks.md are only as right as this merge."""

from __future__ import annotations

from benchmarks.kv_stages import TIMELINE, timeline
from system.kv.stage_trace import StageTrace
from system.raft.messages import Message, MessageType
from system.raft.types import Entry


def _hops(*events: tuple[str, int, int]) -> dict:
    return {"hops": [list(e) for e in events]}


def _put(t0: int, index: int, follower_answers_at: int, leader_fsync_at: int,
         ) -> tuple[list, list]:
    """One put's events on the leader and on one follower, times in microseconds."""
    us = 1000
    leader = [("taken", index, t0), ("append-write", index, t0 + 20 * us),
              ("persisted", index, t0 + leader_fsync_at * us),
              ("answer-received", index, t0 + (follower_answers_at + 300) * us),
              ("committed", index, t0 + (follower_answers_at + 350) * us)]
    follower = [("append-received", index, t0 + 300 * us), ("taken", index, t0 + 350 * us),
                ("persisted", index, t0 + 700 * us),
                ("answer-write", index, t0 + follower_answers_at * us)]
    return leader, follower


def test_the_timeline_follows_each_put_through_the_follower_that_answered_first() -> None:
    leader, fast, slow = [], [], []
    for n in range(1, 4):
        t0 = n * 10_000_000
        lead, follower = _put(t0, n, follower_answers_at=800, leader_fsync_at=600)
        leader += lead
        fast += follower
        slow += [("append-received", n, t0 + 5_000_000)]  # never answers in time
    line = timeline([_hops(*leader), _hops(*slow), _hops(*fast)], leader=0)
    assert line["puts"] == 3
    at = line["median_us"]
    assert [at[name] for _, name, _ in TIMELINE] == [20, 300, 350, 700, 800, 1100, 1150]
    assert at["leader persisted"] == 600


def test_a_put_whose_answer_never_came_is_left_out() -> None:
    lead, follower = _put(1_000_000, 1, follower_answers_at=800, leader_fsync_at=600)
    lead = [e for e in lead if e[0] not in ("answer-received", "committed")]
    assert timeline([_hops(*lead), _hops(*follower)], leader=0)["puts"] == 0


def test_hops_name_appends_with_entries_and_accepted_answers_only(tmp_path) -> None:
    trace = StageTrace(tmp_path, "n1")
    append = Message(type=MessageType.APPEND, src="n1", dst="n2", term=1,
                     entries=(Entry(term=1, index=7, data=b"x"),))
    heartbeat = Message(type=MessageType.APPEND, src="n1", dst="n2", term=1)
    accepted = Message(type=MessageType.APPEND_RESPONSE, src="n2", dst="n1", term=1, index=7)
    rejected = Message(type=MessageType.APPEND_RESPONSE, src="n2", dst="n1", term=1,
                       index=3, reject=True)
    trace.hops_sent([append, heartbeat, accepted, rejected])
    trace.hops_received([append, accepted])
    names = [(name, index) for name, index, _ in trace.summary()["hops"]]
    assert names == [("append-write", 7), ("answer-write", 7), ("append-received", 7),
                     ("answer-received", 7)]
