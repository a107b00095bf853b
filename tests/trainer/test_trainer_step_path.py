"""The step path: a step closes inline in the handler of the gradient that completes it
(Coordinator.close_if_complete), except where the main loop must decide — a lapsed lease
(step down, never close) and a checkpoint due but not planned yet (the next step must wait
for it, or that checkpoint is lost). The first two tests drive the rule without sockets; the
last is a real run whose every scheduled checkpoint must be written."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import system.trainer  # noqa: F401
from system.trainer import data, local
from system.trainer.config import TrainConfig
from system.trainer.coordinator import Coordinator
from system.trainer.coordinator_core import CoordinatorCore
from system.trainer.run import TrainerRun

CONFIG = TrainConfig(dataset="breast_cancer", workers=2, steps=10, batch_size=8, checkpoint_every=2)


def shell(lease_valid: bool, step: int = 0) -> tuple[SimpleNamespace, list[local.WorkerShard]]:
    """What close_if_complete touches of a Coordinator: the core, the lease, two
    conditions over one lock."""
    ds = data.load(CONFIG)
    shards = [local.WorkerShard(CONFIG, w, ds) for w in range(CONFIG.workers)]
    core = CoordinatorCore(CONFIG, "c1", 3, local.initial_state(CONFIG, ds), step, 1,
                           [s.rows for s in shards])
    core.checkpointed_step = core.planned_step = step
    lock = threading.RLock()
    fake = SimpleNamespace(core=core, lease=SimpleNamespace(valid=lambda: lease_valid),
                           cond=threading.Condition(lock), main_wake=threading.Condition(lock))
    return fake, shards


def push_all(fake: SimpleNamespace, shards: list[local.WorkerShard]) -> None:
    core = fake.core
    for s in shards:
        grad, rows = s.gradient(core.state.params, core.open_step)
        assert core.on_gradient(s.worker, core.open_step, core.term, grad, rows, 0.0) == ""
    with fake.cond:
        Coordinator.close_if_complete(fake)  # type: ignore[arg-type]


def test_the_last_gradient_closes_the_step_inline_unless_the_lease_has_lapsed() -> None:
    fake, shards = shell(lease_valid=True)
    push_all(fake, shards)
    assert fake.core.step == 1
    fake, shards = shell(lease_valid=False)
    push_all(fake, shards)
    assert fake.core.step == 0, "a step closed on a lapsed lease"


def test_a_step_waits_inline_for_the_checkpoint_due_before_it() -> None:
    fake, shards = shell(lease_valid=True, step=1)
    push_all(fake, shards)
    assert fake.core.step == 2 and fake.core.checkpoint_due()
    push_all(fake, shards)  # step 3's gradients: the checkpoint of step 2 is not planned yet
    assert fake.core.step == 2, "a step closed before the checkpoint due before it was planned"
    fake.core.plan_checkpoint()
    with fake.cond:
        Coordinator.close_if_complete(fake)  # type: ignore[arg-type]
    assert fake.core.step == 3


@pytest.mark.integration
def test_every_scheduled_checkpoint_is_written_while_steps_close_inline(kv_cluster, job) -> None:
    config = TrainConfig(dataset="digits", workers=2, steps=120, batch_size=16, learning_rate=0.05,
                         checkpoint_every=10, job=job)
    expected = local.train_local(config)
    with TrainerRun(config, standbys=0, kv=kv_cluster.addresses, lease_s=5.0) as run:
        run.start()
        latest = run.wait_finished(300)
        events = run.events()
    invoked = [e["step"] for e in events if e["kind"] == "checkpoint-invoke"]
    assert invoked == list(range(10, 121, 10)), invoked
    assert latest.checkpoint.params.tobytes() == expected.params.tobytes()
