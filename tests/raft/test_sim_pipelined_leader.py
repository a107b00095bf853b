"""The simulator's shell in the real node's pipelined ordering (system/sim/shell.py).

A leader's APPENDs leave before its own fsync (docs/raft.md, "The leader writes its log in
parallel with replicating it"), and that fsync completes as a separate step of the
schedule. These tests name the window this opens: a follower answers while the leader's
own copy is still only in its page cache, and a power loss then takes that copy. The
store's canary `counts-unsynced-self` (system/kv/unsafe.py) counts that copy towards the
commit anyway; the safety monitor sees the "committed" entry lost. With the old order
(persist, then send: `pipeline=False`) the window does not exist and the canary passes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from checker import check_versioned_kv
from system.raft.messages import MessageType
from system.sim import swarm
from system.sim.invariants import Rule
from system.sim.simulation import Simulation
from system.sim.swarm import run_seed
from system.sim.unsafe import COUNTS_UNSYNCED_SELF
from system.sim.variant import SimVariant

MT = MessageType


def power_loss_in_the_window(variant: SimVariant | None, pipeline: bool = True) -> Simulation:
    """n1 leads n1-n3; n3 is cut off. A write goes to n1, whose APPEND reaches n2 (which
    fsyncs and answers) while n1's own fsync is pending; then n1 and n2 lose power. n3
    and the restarted n1, both without the entry, elect n3; n2 comes back; time passes."""
    sim = Simulation(node_count=3, seed=1, variant=variant, pipeline=pipeline)
    sim.campaign("n1")
    sim.settle()
    sim.partition(["n1", "n2"], ["n3"])
    sim.put("n1", "x", "a")
    assert bool(sim.persisting()) == pipeline  # the leader's fsync has not returned
    sim.deliver(type=MT.APPEND, src="n1", dst="n2")
    sim.deliver(type=MT.APPEND_RESPONSE, src="n2", dst="n1")
    sim.crash("n1", lose_unsynced=True)
    sim.crash("n2", lose_unsynced=True)
    sim.partition(["n1", "n3"], ["n2"])
    sim.restart("n1")
    sim.run_until(lambda: sim.leader() is not None, 500, "a leader", required=False)
    sim.heal()
    sim.restart("n2")
    sim.run(300)
    sim.finish()
    return sim


def test_the_leaders_appends_leave_before_its_fsync_and_a_power_loss_takes_its_copy() -> None:
    sim = power_loss_in_the_window(None)
    sent = next(i for i, line in enumerate(sim.trace) if "send" in line and "append n1->n2" in line
                and "entries[2..2]" in line)
    pending = next(i for i, line in enumerate(sim.trace) if "n1 fsync of 1 entries pending" in line
                   and i > sent)
    assert sent < pending
    assert not any("fsync done n1" in line for line in sim.trace[pending:pending + 6])
    leader = sim.leader()
    assert leader is not None and sim.core(leader).log.term(2) != 1  # the write's entry is gone
    assert sim.violations == []
    assert sim.check_linearizable(check_versioned_kv).valid is True


def test_the_leader_does_not_count_its_pending_copy() -> None:
    sim = Simulation(node_count=3, seed=1, pipeline=True)
    sim.campaign("n1")
    sim.settle()
    sim.partition(["n1", "n2"], ["n3"])
    write = sim.put("n1", "x", "a")
    sim.deliver(type=MT.APPEND, src="n1", dst="n2")
    sim.deliver(type=MT.APPEND_RESPONSE, src="n2", dst="n1")
    core = sim.core("n1")
    assert core.commit_index < core.log.last_index()  # one durable copy of three
    sim.finish_persist("n1")
    assert core.commit_index == core.log.last_index()  # now two
    sim.settle()
    assert write.ok


def test_the_canary_counting_its_unsynced_copy_loses_a_committed_entry() -> None:
    sim = power_loss_in_the_window(COUNTS_UNSYNCED_SELF)
    rules = {v.rule for v in sim.violations}
    assert Rule.STATE_MACHINE_SAFETY in rules, sim.violations
    # Nothing was acknowledged: the node acts on a commit only after its own fsync, so
    # the clients' history cannot show it; the monitor, which sees commit indexes, does.
    assert sim.check_linearizable(check_versioned_kv).valid is True


def test_persist_then_send_hides_the_canary() -> None:
    """Without the pipelined ordering the window does not exist: the canary passes."""
    sim = power_loss_in_the_window(COUNTS_UNSYNCED_SELF, pipeline=False)
    assert sim.violations == []


CAUGHT_SEED = 2309  # the first of 2301-2340 whose randomized run catches the canary


@pytest.mark.slow
def test_the_randomized_run_catches_the_canary_only_in_the_pipelined_ordering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    canary = run_seed(CAUGHT_SEED, COUNTS_UNSYNCED_SELF, record_trace=False,
                      check=check_versioned_kv)
    assert canary.swarm.pipeline
    assert Rule.LEADER_COMPLETENESS in {v.rule for v in canary.violations}, canary.violations
    safe = run_seed(CAUGHT_SEED, record_trace=False, check=check_versioned_kv)
    assert safe.ok and safe.linearizability == "valid", safe.violations
    # The same seed with the old order (persist, then send) for every Ready: not caught.
    drawn = swarm.draw_swarm
    monkeypatch.setattr(swarm, "draw_swarm", lambda seed: replace(drawn(seed), pipeline=False))
    old_order = run_seed(CAUGHT_SEED, COUNTS_UNSYNCED_SELF, record_trace=False,
                         check=check_versioned_kv)
    assert old_order.ok, old_order.violations


def test_a_commit_learned_before_the_replacing_entry_is_written_is_not_a_lost_entry() -> None:
    """Swarm seed 2223 (found while measuring the shell's rule watch): n3, deposed while
    its pipelined shell still wrote its own entries, replaces entry 41 of term 36 with the
    new leader's of term 37 and learns that 41 is committed before that Ready is written.
    Its written log still held term 36 there; the monitor took that for a committed entry
    lost. It now compares a committed index once the written log holds the core's entry."""
    result = run_seed(2223, record_trace=False, check=check_versioned_kv)
    assert result.swarm.pipeline and result.swarm.node_count == 3
    assert result.ok and result.linearizability == "valid", result.violations
