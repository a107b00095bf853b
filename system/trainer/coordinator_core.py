"""The coordinator's decisions, as one pure object (no sockets, clocks or threads).

Theory of operation. The coordinator runs synchronous data-parallel SGD. `step` counts
the updates applied; the *open* step is step + 1, the one whose gradients it collects.
- A gradient is accepted only if it is for the open step, carries this coordinator's
  term (its lease version) and comes from a known worker not yet counted this step.
  Anything else is rejected with a reason (another step, another term, duplicate).
- The step closes when every expected worker has pushed, or when `gradient_deadline_s`
  has passed since the step's first gradient: the missing workers are skipped for that
  step (each skip is an event) and become *suspects*, not waited for again until they
  show up (pull parameters or push). The deadline starts at the first gradient so that a
  step nobody has started yet (startup, failover) never skips anyone.
- Closing adds the gradients in ascending worker id (model.sum_in_worker_order) and
  applies one momentum step: the same inputs give the same bits in any process.
- A checkpoint is due after every `checkpoint_every` steps and after the last step. At
  most one is in flight; the shell writes it and reports the outcome. A CAS mismatch or a
  lost lease deposes the coordinator for good: it accepts nothing and never checkpoints
  again.

Time enters only as the `now` argument. Every decision appends an event (kind, step,
version, request_id, lease_version, outcome) that the shell drains for its event log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from system.trainer import data, local, model
from system.trainer.checkpoint import Checkpoint
from system.trainer.config import TrainConfig


@dataclass(frozen=True)
class Event:
    kind: str  # step, skip, reject, checkpoint-*, resume, deposed, done
    step: int
    outcome: str = ""
    version: int | None = None
    request_id: str = ""
    lease_version: int = 0
    worker: int | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}


@dataclass
class CheckpointPlan:
    checkpoint: Checkpoint
    request_id: str
    expected_version: int


@dataclass
class CoordinatorCore:
    config: TrainConfig
    coordinator_id: str
    term: int  # lease version: the fencing token
    state: model.SGDState
    step: int  # updates applied
    head_version: int  # version of the checkpoint head key this coordinator believes current
    shard_rows: list[int]  # rows per worker, for the data cursors
    gradient_deadline_s: float = 5.0
    pending: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)
    suspects: set[int] = field(default_factory=set)
    first_gradient_at: float | None = None
    checkpointed_step: int = -1  # last step whose checkpoint is committed (or was resumed from)
    planned_step: int = -1  # last step a checkpoint was planned for
    in_flight: CheckpointPlan | None = None
    deposed: bool = False
    skipped_total: int = 0
    first_step: int = -1  # the step this coordinator started from (set by __post_init__)
    events: list[Event] = field(default_factory=list)
    # Request ids are global in the store: they start with the coordinator's id (None).
    rid_prefix: str | None = None

    def __post_init__(self) -> None:
        self.first_step = self.step
        if self.rid_prefix is None:
            self.rid_prefix = f"{self.coordinator_id}:"

    # ----- queries ---------------------------------------------------------------------

    @property
    def open_step(self) -> int:
        return self.step + 1

    @property
    def done(self) -> bool:
        return self.step >= self.config.steps

    @property
    def finished(self) -> bool:
        """Done and the final checkpoint committed: the run's result is durable."""
        return self.done and self.checkpointed_step >= self.config.steps

    def expected_workers(self) -> set[int]:
        return set(range(self.config.workers)) - self.suspects

    def _event(self, kind: str, **kw: object) -> None:
        kw.setdefault("step", self.step)
        self.events.append(Event(kind, lease_version=self.term, **kw))  # type: ignore[arg-type]

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    # ----- workers ---------------------------------------------------------------------

    def on_worker_seen(self, worker: int) -> None:
        """A worker pulled parameters: it is alive and will push for the open step."""
        if worker in self.suspects:
            self.suspects.discard(worker)
            self._event("worker-back", worker=worker)

    def on_gradient(self, worker: int, step: int, term: int, grad: np.ndarray, rows: int,
                    now: float) -> str:
        """'' if accepted, else the reason it was rejected."""
        if self.deposed:
            reason = "not-active"
        elif term != self.term:
            reason = "other-term"
        elif not 0 <= worker < self.config.workers:
            reason = "unknown-worker"
        elif self.done or step != self.open_step:
            reason = "stale-step" if step <= self.step else "future-step"
        elif worker in self.pending:
            reason = "duplicate"
        elif grad.shape != self.state.params.shape or grad.dtype != self.state.params.dtype:
            reason = "bad-shape"
        else:
            self.pending[worker] = (grad, rows)
            self.suspects.discard(worker)
            if self.first_gradient_at is None:
                self.first_gradient_at = now
            return ""
        self._event("reject", worker=worker, outcome=reason, detail=f"step {step} term {term}")
        return reason

    def ready_to_close(self, now: float) -> bool:
        if self.deposed or self.done or not self.pending:
            return False
        if self.expected_workers() <= set(self.pending):
            return True
        assert self.first_gradient_at is not None
        return now - self.first_gradient_at >= self.gradient_deadline_s

    def close_step(self) -> None:
        """Apply the open step's update from the gradients received (ready_to_close)."""
        missing = sorted(set(range(self.config.workers)) - set(self.pending))
        for worker in missing:
            self.skipped_total += 1
            self.suspects.add(worker)
            self._event("skip", step=self.open_step, worker=worker, outcome="missing")
        local.apply_step(self.config, self.state, self.pending)
        self.step += 1
        self.pending = {}
        self.first_gradient_at = None
        if self.step % 100 == 0 or self.done or missing or self.step == self.first_step + 1:
            # The first step after a (re)start marks the end of a failover.
            self._event("step", outcome="applied", detail=f"workers {self.config.workers - len(missing)}")

    # ----- checkpoints -----------------------------------------------------------------

    def checkpoint_due(self) -> bool:
        return (not self.deposed and self.step > self.planned_step
                and (self.step % self.config.checkpoint_every == 0 or self.done))

    def plan_checkpoint(self) -> CheckpointPlan:
        assert self.checkpoint_due() and self.in_flight is None, "at most one checkpoint in flight"
        self.planned_step = self.step
        ckpt = Checkpoint(
            step=self.step, params=self.state.params.copy(), velocity=self.state.velocity.copy(),
            config_hash=self.config.config_hash(),
            cursors=[data.data_cursor(self.step, rows, self.config.batch_size) for rows in self.shard_rows],
            rng={"algorithm": "philox-seedsequence", "key": "(seed, worker+1, epoch, 0xBA7C4)",
                 "seed": self.config.seed},
            done=self.done)
        self.in_flight = CheckpointPlan(ckpt, f"{self.rid_prefix}step-{self.step}", self.head_version)
        self._event("checkpoint-invoke", step=self.step, request_id=self.in_flight.request_id,
                    version=self.head_version)
        return self.in_flight

    def on_checkpoint_committed(self, version: int) -> None:
        plan = self.in_flight
        assert plan is not None
        self.in_flight = None
        self.head_version = version
        self.checkpointed_step = max(self.checkpointed_step, plan.checkpoint.step)
        self._event("checkpoint-ok", step=plan.checkpoint.step, version=version,
                    request_id=plan.request_id, outcome="ok")

    def on_checkpoint_mismatch(self, current_version: int) -> None:
        """Another coordinator moved the head: step down at once, for good."""
        plan = self.in_flight
        self.in_flight = None
        self._event("checkpoint-fail", step=plan.checkpoint.step if plan else self.step,
                    version=current_version, request_id=plan.request_id if plan else "",
                    outcome="cas-mismatch")
        self.step_down("checkpoint compare-and-swap mismatch")

    def on_checkpoint_unknown(self, detail: str) -> None:
        """The write's outcome is unknown and the lease no longer allows retrying."""
        plan = self.in_flight
        self.in_flight = None
        self._event("checkpoint-info", step=plan.checkpoint.step if plan else self.step,
                    request_id=plan.request_id if plan else "", outcome="indeterminate", detail=detail)
        self.step_down("checkpoint outcome unknown and lease lapsed")

    def on_checkpoint_abandoned(self, why: str) -> None:
        """The shell did not send the write (its lease lapsed first): certainly not written."""
        plan = self.in_flight
        self.in_flight = None
        self._event("checkpoint-fail", step=plan.checkpoint.step if plan else self.step,
                    request_id=plan.request_id if plan else "", outcome="not-sent", detail=why)
        self.step_down(why)

    def step_down(self, why: str) -> None:
        if not self.deposed:
            self.deposed = True
            self.pending = {}
            self._event("deposed", outcome="step-down", detail=why)
