"""The whole synchronous data-parallel computation in one process, no network.

It runs the same arithmetic as the distributed trainer (each worker's batch at each step,
gradients added in worker order, one momentum update), so a fault-free distributed run
must end bit-for-bit equal to `train_local` with the same configuration. Tests and the
benchmark's single-process baseline use it.
"""

from __future__ import annotations

import numpy as np

from system.trainer import data, model
from system.trainer.config import TrainConfig


class WorkerShard:
    """One worker's rows and its batch order; the gradient of its batch at a step."""

    def __init__(self, config: TrainConfig, worker: int, dataset: data.Dataset | None = None) -> None:
        self.config = config
        self.worker = worker
        n_rows = data.n_train_rows(config)
        lo, hi = data.shard_bounds(n_rows, config.workers, worker)
        if config.dataset == "synthetic":
            ds = dataset if dataset is not None else data.load(config, train_rows=(lo, hi))
            self.x, self.y = (ds.x_train, ds.y_train) if dataset is None else (ds.x_train[lo:hi], ds.y_train[lo:hi])
        else:
            ds = dataset if dataset is not None else data.load(config)
            self.x, self.y = ds.x_train[lo:hi], ds.y_train[lo:hi]
        self.rows = hi - lo

    def gradient(self, params: np.ndarray, step: int) -> tuple[np.ndarray, int]:
        idx = data.batch_positions(self.config.seed, self.worker, step, self.rows,
                                   self.config.batch_size)
        return model.gradient_sum(params, self.x[idx], self.y[idx]), len(idx)


def initial_state(config: TrainConfig, dataset: data.Dataset) -> model.SGDState:
    params = model.init_params(dataset.features, dataset.classes, dataset.x_train.dtype)
    return model.SGDState(params, np.zeros_like(params))


def apply_step(config: TrainConfig, state: model.SGDState,
               gradients: dict[int, tuple[np.ndarray, int]]) -> None:
    total, rows = model.sum_in_worker_order(gradients)
    model.sgd_momentum_step(state, total, rows, learning_rate=config.learning_rate,
                            momentum=config.momentum, l2=config.l2)


def train_local(config: TrainConfig, steps: int | None = None,
                dataset: data.Dataset | None = None) -> model.SGDState:
    dataset = dataset if dataset is not None else data.load(config)
    shards = [WorkerShard(config, w, dataset) for w in range(config.workers)]
    state = initial_state(config, dataset)
    for step in range(1, (steps if steps is not None else config.steps) + 1):
        apply_step(config, state, {s.worker: s.gradient(state.params, step) for s in shards})
    return state
