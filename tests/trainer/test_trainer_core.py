"""The coordinator's decisions without sockets: CoordinatorCore and LeaseTimer driven by numbers."""

from __future__ import annotations

import numpy as np

import system.trainer  # noqa: F401
from system.trainer import data, local
from system.trainer.config import TrainConfig
from system.trainer.coordinator_core import CoordinatorCore
from system.trainer.lease import LeaseTimer

CONFIG = TrainConfig(dataset="breast_cancer", workers=3, steps=10, batch_size=8, checkpoint_every=4)


def make_core(term: int = 7, step: int = 0) -> tuple[CoordinatorCore, list[local.WorkerShard]]:
    ds = data.load(CONFIG)
    shards = [local.WorkerShard(CONFIG, w, ds) for w in range(CONFIG.workers)]
    core = CoordinatorCore(CONFIG, "c1", term, local.initial_state(CONFIG, ds), step, 1,
                           [s.rows for s in shards], gradient_deadline_s=2.0)
    return core, shards


def push_all(core: CoordinatorCore, shards: list[local.WorkerShard], now: float = 0.0,
             skip: tuple[int, ...] = ()) -> None:
    for s in shards:
        if s.worker not in skip:
            g, n = s.gradient(core.state.params, core.open_step)
            assert core.on_gradient(s.worker, core.open_step, core.term, g, n, now) == ""


def test_core_reproduces_the_single_process_loop_bit_for_bit() -> None:
    core, shards = make_core()
    while not core.done:
        push_all(core, shards)
        assert core.ready_to_close(0.0)
        core.close_step()
    expected = local.train_local(CONFIG)
    assert core.state.params.tobytes() == expected.params.tobytes()


def test_gradient_of_another_term_or_step_is_rejected() -> None:
    core, shards = make_core(term=7)
    g, n = shards[0].gradient(core.state.params, 1)
    assert core.on_gradient(0, 1, 6, g, n, 0.0) == "other-term"
    assert core.on_gradient(0, 2, 7, g, n, 0.0) == "future-step"
    assert core.on_gradient(0, 1, 7, g, n, 0.0) == ""
    assert core.on_gradient(0, 1, 7, g, n, 0.0) == "duplicate"
    push_all(core, shards[1:])
    core.close_step()
    assert core.on_gradient(0, 1, 7, g, n, 0.0) == "stale-step"
    assert [e.outcome for e in core.take_events() if e.kind == "reject"] == [
        "other-term", "future-step", "duplicate", "stale-step"]


def test_missing_worker_is_skipped_after_the_deadline_and_not_waited_for_again() -> None:
    core, shards = make_core()
    push_all(core, shards, now=10.0, skip=(1,))
    assert not core.ready_to_close(11.9)  # deadline counts from the first gradient
    assert core.ready_to_close(12.0)
    core.close_step()
    skips = [e for e in core.take_events() if e.kind == "skip"]
    assert [(e.step, e.worker) for e in skips] == [(1, 1)] and core.skipped_total == 1
    push_all(core, shards, now=20.0, skip=(1,))
    assert core.ready_to_close(20.0)  # worker 1 is a suspect now
    core.close_step()
    core.on_worker_seen(1)  # it came back: wait for it again
    push_all(core, shards, now=30.0, skip=(1,))
    assert not core.ready_to_close(30.5)


def test_no_gradient_at_all_never_closes_a_step() -> None:
    core, _ = make_core()
    assert not core.ready_to_close(1e9)


def test_checkpoint_every_k_steps_and_at_the_end_one_in_flight() -> None:
    core, shards = make_core()
    due = []
    while not core.done:
        push_all(core, shards)
        core.close_step()
        if core.checkpoint_due():
            plan = core.plan_checkpoint()
            assert plan.request_id == f"c1:step-{core.step}"
            assert plan.expected_version == core.head_version
            core.on_checkpoint_committed(core.head_version + 1)
            due.append(core.step)
    assert due == [4, 8, 10] and core.finished
    assert core.in_flight is None


def test_cas_mismatch_steps_down_forever() -> None:
    core, shards = make_core()
    for _ in range(4):
        push_all(core, shards)
        core.close_step()
    core.plan_checkpoint()
    core.on_checkpoint_mismatch(current_version=9)
    assert core.deposed and not core.checkpoint_due()
    g, n = shards[0].gradient(core.state.params, core.open_step)
    assert core.on_gradient(0, core.open_step, core.term, g, n, 0.0) == "not-active"
    kinds = [e.kind for e in core.take_events()]
    assert kinds[-3:] == ["checkpoint-fail", "deposed", "reject"]


def test_checkpoint_carries_cursors_config_hash_and_a_copy_of_the_parameters() -> None:
    core, shards = make_core()
    for _ in range(4):
        push_all(core, shards)
        core.close_step()
    plan = core.plan_checkpoint()
    assert plan.checkpoint.config_hash == CONFIG.config_hash()
    assert plan.checkpoint.cursors == [data.data_cursor(4, s.rows, 8) for s in shards]
    core.state.params += 1
    assert not np.array_equal(plan.checkpoint.params, core.state.params)


def test_lease_timer_holder_gives_up_before_a_standby_may_take_over() -> None:
    holder, standby = LeaseTimer(lease_s=2.0), LeaseTimer(lease_s=2.0)
    holder.on_renewed(sent_at=100.0)
    standby.observe(version=5, now=100.1)  # saw the renewal after it was sent
    assert holder.valid(101.5) and not holder.valid(101.6)
    assert not standby.lapsed(102.0) and standby.lapsed(102.1)
    standby.observe(version=6, now=102.05)  # a renewal resets the standby's clock
    assert not standby.lapsed(103.0)
    assert LeaseTimer(1.0, seen_version=0).lapsed(0.0)  # no lease key yet: take it at once


def test_a_renewal_sent_when_due_has_most_of_the_lease_to_be_answered() -> None:
    """The renewal budget (issues 22, 25): sent RENEW_FRACTION of the lease after the last
    one, a renewal still has 0.7 of the lease before the holder stops trusting it. With 0.4
    (issue 22) and then 0.5 of it (issue 25: a 0.94 s renewal left the next 0.26 s) leases
    lapsed under load with no fault."""
    holder = LeaseTimer(lease_s=2.0)
    holder.on_renewed(sent_at=100.0)
    assert not holder.renew_due(100.19) and holder.renew_due(100.2)
    assert holder.valid(100.2 + 1.39)  # a renewal sent when due, answered 1.39 s later
    assert holder.valid(100.94 + 0.65)  # after a 0.94 s renewal, the next still has 0.66 s


def test_decision_and_math_modules_are_pure() -> None:
    """No sockets, clocks, threads or global randomness where the decisions are made."""
    from pathlib import Path

    from tests.test_purity import forbidden_uses

    root = Path(system.trainer.__file__).parent
    for name in ("config", "data", "model", "local", "coordinator_core", "checkpoint"):
        assert forbidden_uses((root / f"{name}.py").read_text()) == [], name


def test_unsafe_canary_needs_both_opt_ins(monkeypatch) -> None:  # noqa: ANN001
    import pytest

    from system.trainer.unsafe import UnsafeRefused, check_unsafe

    monkeypatch.delenv("MAO_ALLOW_UNSAFE", raising=False)
    assert check_unsafe("") == ""
    with pytest.raises(UnsafeRefused, match="needs MAO_ALLOW_UNSAFE=1"):
        check_unsafe("no-fencing")
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    assert check_unsafe("no-fencing") == "no-fencing"
    with pytest.raises(UnsafeRefused, match="unknown unsafe mode"):
        check_unsafe("no-dedup")
