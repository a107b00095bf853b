"""Logistic regression (binary and multinomial) and mini-batch SGD with momentum, in numpy.

Pure math, no I/O: every function is deterministic given its inputs (with one BLAS
thread, see blas.py). Binary problems use one logit column (sigmoid), multinomial ones
one column per class (softmax); the parameters are one matrix W of shape
(features + 1, outputs) whose last row is the bias.

The loss is the mean log-loss over the rows plus l2/2 * ||W[:-1]||^2 (the bias is not
penalized, as in scikit-learn). Workers send the *sum* of per-row gradients of their batch
and its row count; the coordinator adds them in worker order and divides by the total,
so a skipped worker changes the mean, not its scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def outputs_for(classes: int) -> int:
    return 1 if classes == 2 else classes


def init_params(features: int, classes: int, dtype: np.dtype = np.float64) -> np.ndarray:
    # Zero start: the loss is convex, so no symmetry needs breaking, and zero is the same
    # in every process without a random state.
    return np.zeros((features + 1, outputs_for(classes)), dtype=dtype)


def logits(params: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x @ params[:-1] + params[-1]


def _probabilities(z: np.ndarray) -> np.ndarray:
    if z.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-z))
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _targets(y: np.ndarray, outputs: int, dtype: np.dtype) -> np.ndarray:
    if outputs == 1:
        return y.astype(dtype).reshape(-1, 1)
    t = np.zeros((len(y), outputs), dtype=dtype)
    t[np.arange(len(y)), y] = 1
    return t


def gradient_sum(params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Sum over the rows of the log-loss gradient (no L2; the coordinator adds it once)."""
    residual = _probabilities(logits(params, x)) - _targets(y, params.shape[1], params.dtype)
    grad = np.empty_like(params)
    grad[:-1] = x.T @ residual
    grad[-1] = residual.sum(axis=0)
    return grad


def loss(params: np.ndarray, x: np.ndarray, y: np.ndarray, l2: float) -> float:
    z = logits(params, x).astype(np.float64)
    if z.shape[1] == 1:
        zz = z[:, 0]
        # log(1 + e^z) - y z, written to stay finite for large |z|
        per_row = np.logaddexp(0.0, zz) - y * zz
    else:
        per_row = np.logaddexp.reduce(z, axis=1) - z[np.arange(len(y)), y]
    return float(per_row.mean() + 0.5 * l2 * np.sum(params[:-1].astype(np.float64) ** 2))


def predict(params: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = logits(params, x)
    return (z[:, 0] > 0).astype(np.int64) if z.shape[1] == 1 else z.argmax(axis=1)


def accuracy(params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float((predict(params, x) == y).mean())


@dataclass
class SGDState:
    params: np.ndarray
    velocity: np.ndarray  # momentum buffer, same shape as params


def sgd_momentum_step(state: SGDState, grad_sum: np.ndarray, rows: int, *, learning_rate: float,
                      momentum: float, l2: float) -> None:
    """One update in place: g = grad_sum/rows + l2*W (bias excluded);
    v = momentum*v + g; W -= learning_rate*v. Fixed operation order, so the same inputs
    give the same bits."""
    g = grad_sum / rows
    g[:-1] += l2 * state.params[:-1]
    state.velocity *= momentum
    state.velocity += g
    state.params -= learning_rate * state.velocity


def sum_in_worker_order(gradients: dict[int, tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """Add per-worker (grad_sum, rows) in ascending worker id: floating-point addition is
    not associative, so the order must not depend on arrival."""
    total: np.ndarray | None = None
    rows = 0
    for worker in sorted(gradients):
        g, n = gradients[worker]
        total = g.copy() if total is None else total + g
        rows += n
    if total is None:
        raise ValueError("no gradient to sum")
    return total, rows
