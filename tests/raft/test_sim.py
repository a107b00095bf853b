"""The simulator's own machinery: determinism, fake disk and network, crash/restart,
clients and their history, the safety monitor, the register and the linearizability
check. The Raft scenarios themselves live in test_interleavings.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checker import check_linearizable, check_versioned_kv
from checker.models import versioned_kv
from histories.read import read_history
from system.kv.state_machine import KVStateMachine
from system.raft.core import RaftCore, Role
from system.raft.messages import MessageType
from system.raft.types import Entry, EntryKind, HardState, SnapshotMeta
from system.sim.cli import main, write_history
from system.sim.clients import OpStatus
from system.sim.disk import FakeDisk
from system.sim.history import (
    EventType,
    Function,
    HistoryEvent,
    to_records,
)
from system.sim.invariants import Rule, SafetyMonitor
from system.sim.simulation import Simulation
from system.sim.state_machine import CorruptSnapshot, Replica, encode_write
from system.sim.swarm import SwarmRun, draw_swarm, run_seed
from system.sim.variant import SimVariant

ROOT = Path(__file__).resolve().parents[2]
APPEND = MessageType.APPEND


def scripted_run(seed: int) -> Simulation:
    sim = Simulation(3, seed=seed, compact_every_entries=3)
    sim.campaign("n1")
    for i in range(4):
        write = sim.put("n1", "x", f"v{i}")
        sim.run_until(lambda write=write: write.done, 300)
    sim.crash("n2")
    sim.run(50)
    sim.restart("n2")
    sim.run(100)
    return sim


# -- determinism --------------------------------------------------------------------------


def test_same_seed_same_trace_hash_and_different_seeds_differ() -> None:
    """Everything comes from the seed: two runs of a seed do the same thing in the same
    order (equal trace hashes); another seed makes different choices."""
    assert scripted_run(3).trace_hash() == scripted_run(3).trace_hash()
    assert scripted_run(3).trace_hash() != scripted_run(4).trace_hash()
    first, again, other = (run_seed(seed, check=check_versioned_kv) for seed in (17, 17, 18))
    assert first.trace_hash == again.trace_hash
    assert first.trace_hash != other.trace_hash
    assert first.steps == again.steps and first.faults == again.faults


def test_trace_hash_does_not_depend_on_the_process_hash_seed() -> None:
    """String hashing is randomized per process; the simulator must not iterate anything
    whose order depends on it. Two fresh interpreters with different PYTHONHASHSEED
    print the hash this process computes."""
    code = ("from checker import check_versioned_kv; from system.sim.swarm import run_seed; "
            "print(run_seed(23, check=check_versioned_kv).trace_hash)")
    hashes = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
            text=True, timeout=120, check=True,
        )
        hashes.add(done.stdout.strip())
    assert hashes == {run_seed(23, check=check_versioned_kv).trace_hash}


def test_each_seed_draws_its_own_fault_rates() -> None:
    """Swarm testing: fault rates and settings vary from seed to seed."""
    swarms = [draw_swarm(seed) for seed in range(40)]
    assert len({s.drop_probability for s in swarms}) > 10
    assert {s.node_count for s in swarms} == {3, 5}
    assert any(s.crash_probability == 0 for s in swarms)
    assert any(s.crash_probability > 0 for s in swarms)
    assert draw_swarm(5) == draw_swarm(5)


def test_swarm_varies_the_core_configuration_and_holds_messages_across_terms() -> None:
    swarms = [draw_swarm(seed) for seed in range(40)]
    assert {(s.pre_vote, s.check_quorum) for s in swarms} == {
        (True, True), (True, False), (False, True), (False, False)}
    assert {s.eager_commit for s in swarms} == {True, False}
    assert any(s.hold_probability == 0 for s in swarms)
    held = next(seed for seed, s in enumerate(swarms) if s.hold_probability > 0.01)
    result = run_seed(held, record_trace=False, check=check_versioned_kv)
    assert result.ok and result.faults.get("hold across terms", 0) > 0


class CampaignsOnlyAsAVoterInEffect(RaftCore):
    """Broken (the core before the fix): a server removed by a configuration that is not
    yet committed never campaigns, though its log may be the one no other can beat."""

    def may_campaign(self) -> bool:
        return self.is_voter()


def test_a_server_removed_by_an_uncommitted_configuration_still_campaigns() -> None:
    """docs/raft-bugs-found.md, 3 (thesis §4.1, Figure 4.6): PreVote and CheckQuorum
    off, the most up-to-date log is a server's whose last, uncommitted configuration
    removes it. It must still campaign, or no leader is ever elected. Found on seed 134;
    the election-timer fix (bug 4) changed that seed's run, and 2050 is the first seed
    (of 0-2050) on which the old rule fails again."""
    seed = 2050
    swarm = draw_swarm(seed)
    assert not swarm.pre_vote and not swarm.check_quorum and swarm.membership_probability
    assert run_seed(seed, record_trace=False, check=check_versioned_kv).ok
    broken = SimVariant(name="campaigns-only-as-voter", core_class=CampaignsOnlyAsAVoterInEffect)
    result = run_seed(seed, variant=broken, record_trace=False, check=check_versioned_kv)
    assert not result.ok and any(v.rule is Rule.LIVENESS for v in result.violations)


# -- fake disk -----------------------------------------------------------------------------


def entries(*terms: int, start: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(term, start + i) for i, term in enumerate(terms))


def test_process_crash_keeps_written_data_but_power_loss_keeps_only_synced_data() -> None:
    disk = FakeDisk()
    disk.append(entries(1, 1))
    disk.write_hard_state(HardState(1, "n1", 0))
    disk.sync()
    disk.append(entries(1, start=3))
    disk.write_hard_state(HardState(1, "n1", 2))  # not synced
    kept = FakeDisk()
    kept.current, kept.durable = disk.current.copy(), disk.durable.copy()
    kept.crash(lose_unsynced=False)
    assert [e.index for e in kept.load().entries] == [1, 2, 3]
    assert kept.load().hard_state.commit == 2
    disk.crash(lose_unsynced=True)
    assert [e.index for e in disk.load().entries] == [1, 2]
    assert disk.load().hard_state == HardState(1, "n1", 0)


def test_disk_append_drops_the_stored_suffix_it_overwrites() -> None:
    disk = FakeDisk()
    disk.append(entries(1, 1, 1))
    disk.append(entries(2, start=2))
    assert [(e.index, e.term) for e in disk.load().entries] == [(1, 1), (2, 2)]
    with pytest.raises(ValueError, match="after last index"):
        disk.append(entries(2, start=5))


def test_disk_installed_snapshot_replaces_every_stored_entry() -> None:
    disk = FakeDisk()
    disk.append(entries(1, 1, 1))
    disk.install_snapshot(SnapshotMeta(5, 2, ("n1",)), b"state")
    state = disk.load()
    assert state.entries == () and state.snapshot == SnapshotMeta(5, 2, ("n1",))
    disk.append(entries(2, start=6))
    assert [e.index for e in disk.load().entries] == [6]


# -- network, nodes, clients ----------------------------------------------------------------


def test_deliver_drop_duplicate_by_predicate_and_a_clear_error_when_none_matches() -> None:
    sim = Simulation(3, seed=1)
    sim.campaign("n1")
    sim.settle()
    write = sim.put("n1", "x", "a")
    assert len(sim.pending(type=APPEND, src="n1")) == 2
    assert sim.duplicate(type=APPEND, dst="n2") == 1
    delivered = sim.deliver(type=APPEND, src="n1", dst="n2")
    assert delivered.entries[0].data and delivered.dst == "n2"
    sim.deliver(type=APPEND, dst="n2")  # the duplicate changes nothing
    assert sim.drop(type=APPEND, dst="n3") == 1
    with pytest.raises(LookupError, match="no message in flight matches"):
        sim.deliver(type=APPEND, dst="n3")
    sim.run_until(lambda: write.done, 100)
    assert write.ok and write.result_version == 1


def test_partition_loses_messages_in_flight_and_later_ones_until_healed() -> None:
    sim = Simulation(3, seed=2)
    sim.campaign("n1")
    sim.settle()
    sim.put("n1", "x", "a")
    sim.partition(["n1"], ["n2", "n3"])
    assert sim.pending(src="n1") == []
    sim.tick("n1")  # heartbeats to the other side are lost at once
    assert sim.pending(src="n1") == []
    assert any("lost (link cut)" in line for line in sim.trace)
    sim.heal()
    sim.tick("n1")
    assert len(sim.pending(type=MessageType.HEARTBEAT, src="n1")) == 2


def test_one_way_cut_loses_only_one_direction() -> None:
    sim = Simulation(3, seed=2)
    sim.campaign("n1")
    sim.settle()
    sim.cut("n1", "n2", both_ways=False)
    sim.tick("n1")
    assert [f.message.dst for f in sim.pending(type=MessageType.HEARTBEAT)] == ["n3"]
    sim.tick("n2")
    sim.tick("n3")
    sim.cut("n2", "n1", both_ways=False)
    assert sim.network.is_cut("n2", "n1") and not sim.network.is_cut("n3", "n1")


def test_held_messages_wait_until_released_or_delivered_by_name() -> None:
    sim = Simulation(3, seed=3)
    sim.campaign("n1")
    sim.settle()
    write = sim.put("n1", "x", "a")
    held = sim.hold(type=APPEND)
    assert len(held) == 2
    assert sim.settle() == 0  # the default schedule skips them
    assert not write.done and len(sim.pending(type=APPEND)) == 2
    sim.release(type=APPEND)
    sim.settle()
    assert write.ok


def test_crash_loses_volatile_state_and_restart_rebuilds_from_disk() -> None:
    sim = Simulation(3, seed=4, compact_every_entries=2)
    sim.campaign("n1")
    for i in range(5):
        write = sim.put("n1", "x", f"v{i}")
        sim.run_until(lambda write=write: write.done, 200)
    sim.settle()
    sim.tick()
    sim.settle()
    before = sim.replica("n2").digest()
    sim.crash("n2")
    with pytest.raises(LookupError, match="crashed"):
        sim.core("n2")
    sim.tick("n1")
    sim.settle()  # heartbeats to n2 are lost while it is down
    assert any("lost (destination down)" in line for line in sim.trace)
    sim.restart("n2")
    assert sim.replica("n2").digest() == before
    assert sim.core("n2").role is Role.FOLLOWER
    with pytest.raises(ValueError, match="is running"):
        sim.restart("n2")


def test_client_outcomes_ok_fail_info_and_stale_reads_say_so() -> None:
    sim = Simulation(3, seed=5)
    sim.campaign("n1")
    refused = sim.put("n2", "x", "a")  # a follower refuses before proposing: certain
    assert refused.status is OpStatus.FAIL and "not leader (leader: n1)" in refused.error
    lost = sim.put("n1", "x", "b")
    sim.crash("n1")  # proposed, then the node died: the client cannot know
    assert not lost.done
    sim.give_up(lost)
    assert lost.status is OpStatus.INFO
    sim.restart("n1")
    sim.campaign("n2")
    stale = sim.get("n3", "x", stale=True)
    assert stale.ok and sim.history[-1].stale and sim.history[-1].type is EventType.OK
    down = sim.put("n1", "x", "c")
    sim.crash("n3")
    down_read = sim.get("n3", "x")
    assert down_read.status is OpStatus.FAIL and "down" in down_read.error
    assert down.status is OpStatus.FAIL  # n1 is not the leader any more
    kinds = [e.type for e in sim.history]
    assert kinds.count(EventType.INVOKE) == len(sim.ops)


def test_a_process_has_one_operation_at_a_time() -> None:
    sim = Simulation(3, seed=6)
    sim.campaign("n1")
    sim.put("n1", "x", "a", process=9)
    with pytest.raises(ValueError, match="already has an open operation"):
        sim.put("n1", "x", "b", process=9)


# -- safety monitor ----------------------------------------------------------------------


def test_monitor_reports_two_leaders_in_one_term() -> None:
    monitor = SafetyMonitor(("a", "b", "c"), pre_vote=True)
    monitor.observe("a", "leader", 3, 0, 0)
    monitor.observe("b", "leader", 3, 0, 0)
    assert [v.rule for v in monitor.violations] == [Rule.ELECTION_SAFETY]


def test_monitor_reports_logs_that_share_an_entry_but_not_the_prefix() -> None:
    monitor = SafetyMonitor(("a", "b"), pre_vote=False)
    monitor.persisted_entries("a", (Entry(1, 1, b"x"), Entry(2, 2)))
    monitor.persisted_entries("b", (Entry(1, 1, b"y"), Entry(2, 2)))
    assert Rule.LOG_MATCHING in {v.rule for v in monitor.violations}


def test_monitor_reports_a_committed_entry_replaced_and_a_commit_going_back() -> None:
    monitor = SafetyMonitor(("a", "b", "c"), pre_vote=False)
    monitor.persisted_entries("a", (Entry(1, 1, b"x"),))
    monitor.observe("a", "follower", 1, 1, 1)
    monitor.persisted_entries("b", (Entry(2, 1, b"y"),))
    monitor.observe("b", "follower", 2, 1, 1)
    monitor.observe("a", "follower", 1, 0, 1)
    assert {v.rule for v in monitor.violations} == {
        Rule.STATE_MACHINE_SAFETY, Rule.COMMIT_MONOTONIC
    }


def test_monitor_reports_an_acknowledged_write_overwritten() -> None:
    monitor = SafetyMonitor(("a", "b", "c"), pre_vote=False)
    monitor.acknowledged_write(4, 2, "req")
    monitor.persisted_entries("a", entries(1, 1, 1, 3))
    monitor.applied_entry("a", Entry(3, 4), None)
    assert [v.rule for v in monitor.violations] == [Rule.ACKNOWLEDGED_WRITE_LOST]


def test_monitor_checks_every_snapshot_term_against_the_committed_log() -> None:
    """A snapshot whose (index, term) names no entry any node persisted used to be taken on
    trust; now its term is compared with the committed entry's, at once or on commit."""
    monitor = SafetyMonitor(("a", "b", "c"), pre_vote=False)
    monitor.persisted_entries("a", entries(1, 2))
    monitor.observe("a", "follower", 2, 2, 2)  # index 2 committed at term 2
    monitor.persisted_snapshot("b", SnapshotMeta(2, 5, ("a", "b", "c")))  # no such entry
    assert [v.rule for v in monitor.violations] == [Rule.SNAPSHOT]
    later = SafetyMonitor(("a", "b", "c"), pre_vote=False)
    later.persisted_snapshot("b", SnapshotMeta(2, 5, ("a", "b", "c")))  # not committed yet
    assert later.violations == []
    later.persisted_entries("a", entries(1, 2))
    later.observe("a", "follower", 2, 2, 2)
    assert [v.rule for v in later.violations] == [Rule.SNAPSHOT]
    fine = SafetyMonitor(("a", "b", "c"), pre_vote=False)
    fine.persisted_snapshot("b", SnapshotMeta(2, 2, ("a", "b", "c")))
    fine.persisted_entries("a", entries(1, 2))
    fine.observe("a", "follower", 2, 2, 2)
    assert fine.violations == []


def test_monitor_reports_a_campaign_without_a_pre_vote_majority() -> None:
    monitor = SafetyMonitor(("a", "b", "c"), pre_vote=True)
    monitor.observe("a", "candidate", 1, 0, 0)
    assert [v.rule for v in monitor.violations] == [Rule.PRE_VOTE]


# -- the replicated state machine (the store's own) ----------------------------------------


def entry_of(index: int, request_id: str, value: str, expected: int | None = None) -> Entry:
    return Entry(1, index, encode_write(request_id, "x", value, expected))


def test_replica_put_cas_and_a_duplicate_request_returns_the_first_result() -> None:
    replica = Replica(KVStateMachine())
    first = replica.apply(entry_of(1, "r1", "a"))
    assert (first.ok, first.version) == (True, 1)
    mismatch = replica.apply(entry_of(2, "r2", "b", 0))
    assert mismatch.cas_mismatch and mismatch.version == 1
    swapped = replica.apply(entry_of(3, "r3", "c", 1))
    assert (swapped.ok, swapped.version) == (True, 2) and replica.read("x").value == "c"
    again = replica.apply(entry_of(4, "r1", "a"))
    assert again == first and replica.read("x").version == 2
    assert replica.apply(Entry(1, 5, b"", EntryKind.NOOP)) is None
    assert replica.applied_index == 5


def test_replica_refuses_bad_commands_without_changing_state() -> None:
    replica = Replica(KVStateMachine())
    replica.apply(entry_of(1, "r1", "a"))
    before = replica.read("x")
    for index, data in enumerate((b"\xff", b"[1]", encode_write("r1", "x", "other", None)), 2):
        result = replica.apply(Entry(1, index, data))
        assert not result.ok and not result.cas_mismatch and result.error.startswith("rejected:")
    assert replica.read("x") == before


def test_replica_snapshot_round_trips_and_corruption_is_detected() -> None:
    replica = Replica(KVStateMachine())
    replica.apply(entry_of(1, "r1", "a"))
    data = replica.snapshot()
    copy = Replica.restore(KVStateMachine, data)
    assert copy.digest() == replica.digest() and copy.result_of("r1") is not None
    for bad in (data[:-3], data[:20] + b"0" + data[21:], data + data, b""):
        with pytest.raises(CorruptSnapshot):
            Replica.restore(KVStateMachine, bad)


# -- linearizability (the project's checker on the sim's history) -------------------------


def history(*rows: tuple) -> list[HistoryEvent]:
    """rows: (type, process, f, value, version[, stale[, expected_version, applied]])"""
    events = []
    for index, row in enumerate(rows):
        kind, process, f, value, version, *rest = row
        stale = bool(rest and rest[0])
        expected = rest[1] if len(rest) > 1 else None
        applied = rest[2] if len(rest) > 2 else None
        events.append(HistoryEvent(
            index, EventType(kind), process, Function(f), "x", value, version,
            expected_version=expected, stale=stale, applied=applied,
            error="version mismatch: ..." if applied is False else "",
        ))
    return events


def verdict_of(events: list[HistoryEvent]):  # noqa: ANN201
    """What Simulation.check_linearizable(check_versioned_kv) says of `events`."""
    sim = Simulation(3, seed=0)
    sim.history = events
    return sim.check_linearizable(check_versioned_kv)


def test_a_read_after_a_completed_write_must_see_it() -> None:
    ok = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                 ("invoke", 2, "get", None, None), ("ok", 2, "get", "a", 1))
    assert verdict_of(ok).valid is True
    stale = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                    ("invoke", 2, "get", None, None), ("ok", 2, "get", None, 0))
    verdict = verdict_of(stale)
    assert verdict.valid is False and "get('x') -> absent" in verdict.explanation
    marked = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                     ("invoke", 2, "get", None, None, True), ("ok", 2, "get", None, 0, True))
    assert verdict_of(marked).valid is True  # a stale read may be old


def test_an_info_write_may_take_effect_later_or_never() -> None:
    later = history(("invoke", 1, "put", "a", None), ("info", 1, "put", None, None),
                    ("invoke", 2, "get", None, None), ("ok", 2, "get", None, 0),
                    ("invoke", 3, "get", None, None), ("ok", 3, "get", "a", 1))
    assert verdict_of(later).valid is True
    before_invoke = history(("invoke", 2, "get", None, None), ("ok", 2, "get", "a", 1),
                            ("invoke", 1, "put", "a", None), ("info", 1, "put", None, None))
    assert verdict_of(before_invoke).valid is False


def test_a_cas_mismatch_is_information_about_the_version_then() -> None:
    """A CAS answered "expected 0, found 1" says the key was at version 1 at some instant
    of the CAS's interval: before the only write began, it cannot be."""
    after = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                    ("invoke", 2, "cas", "b", None, False, 0),
                    ("fail", 2, "cas", "b", 1, False, 0, False))
    assert verdict_of(after).valid is True
    before = history(("invoke", 2, "cas", "b", None, False, 0),
                     ("fail", 2, "cas", "b", 1, False, 0, False),
                     ("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1))
    verdict = verdict_of(before)
    assert verdict.valid is False and "mismatch, at v1" in verdict.explanation
    # The same failure without the mismatch mark is only "did not happen": no constraint.
    refused = history(("invoke", 2, "cas", "b", None, False, 0),
                      ("fail", 2, "cas", "b", None, False, 0),
                      ("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1))
    assert verdict_of(refused).valid is True


def test_the_checker_reports_unknown_when_its_budget_runs_out_never_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exhausted budget (wall clock, the only non-deterministic input) reads "unknown",
    with the checker's note, for a history that is valid and one that is not."""
    import checker.linearizability

    monkeypatch.setattr(checker.linearizability, "_CHECK_EVERY", 1)  # check the clock each step
    valid = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                    ("invoke", 2, "get", None, None), ("ok", 2, "get", "a", 1))
    invalid = history(("invoke", 1, "put", "a", None), ("ok", 1, "put", "a", 1),
                      ("invoke", 2, "get", None, None), ("ok", 2, "get", None, 0))
    for events in (valid, invalid):
        sim = Simulation(3, seed=0)
        sim.history = events
        verdict = sim.check_linearizable(check_versioned_kv, budget_s=0.0)
        assert verdict.valid == "unknown" and "time budget ran out" in verdict.explanation


def test_the_simulators_unread_unknown_writes_are_decided_by_the_checkers_model() -> None:
    """The rule that unread unknown-outcome writes share one value lives in the checker's
    versioned-kv model now (tests/checker/test_checker_unread_values.py); the simulator's
    histories still need it: seed 583 has 41 unknown writes nobody read."""
    needs_it = history(("invoke", 1, "put", "a", None), ("info", 1, "put", None, None),
                       ("invoke", 2, "put", "b", None), ("info", 2, "put", None, None),
                       ("invoke", 3, "get", None, None), ("ok", 3, "get", "a", 2))
    assert verdict_of(needs_it).valid is True
    wrong = history(("invoke", 1, "put", "a", None), ("info", 1, "put", None, None),
                    ("invoke", 3, "get", None, None), ("ok", 3, "get", "a", 2))
    assert verdict_of(wrong).valid is False  # one unknown write cannot make version 2
    run = SwarmRun(583, record_trace=False, check=check_versioned_kv)
    assert run.run().linearizability == "valid"
    verdict = run.sim.check_linearizable(check_versioned_kv)
    assert verdict.valid is True and max(k.explored for k in verdict.result.keys) < 10_000


def test_a_cas_mismatch_in_the_simulator_is_recorded_with_the_current_version() -> None:
    sim = Simulation(3, seed=11)
    sim.campaign("n1")
    first = sim.put("n1", "x", "a")
    sim.run_until(lambda: first.done, 500)
    cas = sim.cas("n1", "x", 0, "b")
    sim.run_until(lambda: cas.done, 500)
    assert cas.status is OpStatus.FAIL and cas.applied is False
    done = sim.history[-1]
    assert (done.type, done.version, done.applied) == (EventType.FAIL, 1, False)
    record = to_records(sim.history)[-1]
    assert (record.type.value, record.error, record.version) == ("fail", "cas-mismatch", 1)
    assert dict(record.extra)["detail"].startswith("version mismatch")
    assert sim.check_linearizable(check_versioned_kv).valid is True


def test_converted_history_round_trips_through_the_jsonl_writer_and_reader(
    tmp_path: Path,
) -> None:
    """to_records gives records the stable format accepts (docs/histories.md): written
    with HistoryWriter, read back strictly, the checker's verdict is the same."""
    run = SwarmRun(1003, check=check_versioned_kv)
    result = run.run()
    assert result.ok and result.linearizability == "valid"
    path = tmp_path / "history.jsonl"
    write_history(run.sim.history, path)
    records = read_history(path)
    assert [r.to_json() for r in records] == [
        r.to_json() | {"time": dict(r.extra)["step"]} for r in to_records(run.sim.history)
    ]
    assert {r.consistency for r in records if r.f == "get" and r.type.value == "invoke"} <= {
        "linearizable", "stale"}
    assert check_linearizable(records, versioned_kv()).valid is True


# -- command line -----------------------------------------------------------------------


def test_cli_runs_seeds_and_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--start-seed", "40"], check=check_versioned_kv) == 0
    out = capsys.readouterr().out
    assert "[3/3] seeds run, 0 failed" in out
    for row in ("seeds run", "client ops ok", "client ops info", "entries committed",
                "faults: ", "violations"):
        assert row in out


def test_cli_failing_seed_prints_the_line_that_replays_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    variant = "tests.raft.broken:SKIPS_PRE_VOTE"
    assert main(["--seed", "0", "--variant", variant], check=check_versioned_kv) == 1
    out = capsys.readouterr().out
    assert f"python -m system.sim --seed 0 --variant {variant}" in out
    assert "pre-vote before raising the term" in out


def test_the_command_decides_linearizability_with_the_projects_checker() -> None:
    """`python -m system.sim` as documented: its entry point hands the checker in (the
    library under system/ never imports it), and a seed whose history is not linearizable
    fails on that verdict."""
    done = subprocess.run(
        [sys.executable, "-m", "system.sim", "--seed", "0",
         "--variant", "tests.raft.broken:IGNORES_REQUEST_IDS"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "linearizability: key 'k1': not linearizable" in done.stdout


def test_cli_rejects_a_variant_that_is_not_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--seed", "0", "--variant", "tests.raft.broken:ALL"], check=check_versioned_kv)
    assert stop.value.code == 2
    assert "is not a SimVariant" in capsys.readouterr().err


def test_cli_writes_a_failing_seeds_history_for_the_checker_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """--history-out: the failing seed's history.jsonl, which `python -m checker check`
    reads and finds invalid too (exit 1), with the HTML timeline."""
    from checker.cli import main as checker_main

    variant = "tests.raft.broken:IGNORES_REQUEST_IDS"
    assert main(["--seed", "0", "--variant", variant, "--history-out", str(tmp_path)],
                check=check_versioned_kv) == 1
    path = tmp_path / "seed-0" / "history.jsonl"
    assert f"python -m checker check {path} --model versioned-kv" in capsys.readouterr().out
    html = tmp_path / "out.html"
    assert checker_main(["check", str(path), "--model", "versioned-kv", "--html", str(html)]) == 1
    assert "not linearizable" in capsys.readouterr().out and html.stat().st_size > 0
