"""The core's read-only views of its windows (what the KV node's Status reports, and what
the nemesis aims leader faults at): a snapshot transfer from its first chunk to its end,
and a membership change from its CONFIG entry's append to its commit."""

from __future__ import annotations

from system.raft.core import MembershipChangeKind
from tests.raft.test_core import Pump, lagging_follower_pump

DATA = b"0123456789abcdefghijklmnopqrstuvwxy"  # 35 bytes: chunks of 10, 10, 10 and 5


def _step_one_at_a_time(pump: Pump, watch) -> list:  # noqa: ANN001
    """Deliver the queue one message at a time, noting `watch()` after each."""
    seen = []
    pump.flush_all()
    for _ in range(1000):
        if not pump.queue:
            return seen
        pump.deliver([pump.queue.pop(0)])
        pump.flush_all()
        seen.append(watch())
    raise AssertionError("the cluster did not settle")


def test_snapshot_transfers_show_each_acknowledged_chunk_until_the_follower_installs_it() -> None:
    pump = lagging_follower_pump(chunk_bytes=10, data=DATA)
    leader = pump.nodes["a"]
    assert leader.snapshot_transfers() == {}
    for node in pump.nodes.values():
        node.tick()
    seen = _step_one_at_a_time(pump, leader.snapshot_transfers)
    transfers = [s for s in seen if s]
    # From the first chunk out (offset 0) through each acknowledgement, to nothing once
    # the follower said it installed it.
    offsets = list(dict.fromkeys(t["c"] for t in transfers))
    assert offsets == [(6, 0, 35), (6, 10, 35), (6, 20, 35), (6, 30, 35)], offsets
    assert seen[-1] == {} and pump.installed["c"] == [DATA]
    assert all(pump.nodes[f].snapshot_transfers() == {} for f in ("b", "c"))


def test_config_index_is_above_the_commit_index_exactly_while_the_change_is_pending() -> None:
    pump = Pump()
    leader = pump.elect("a")
    assert leader.config_index == 0
    index, _ = leader.change_membership(MembershipChangeKind.REMOVE, "c")
    assert leader.config_index == index > leader.commit_index  # appended, not committed
    pending = _step_one_at_a_time(pump, lambda: leader.config_index > leader.commit_index)
    assert pending[0] is True and pending[-1] is False
    assert leader.commit_index >= index == leader.config_index
    assert pump.nodes["b"].config_index == index
