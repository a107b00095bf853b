"""Datasets, the train/test split, sharding of rows across workers, and the batch order.

Everything here is a pure function of (config, seed): every process that loads the same
configuration gets the same arrays, the same shards and the same batch for a given
(worker, step) with no state to carry. That is what lets a standby coordinator resume at
step n and have the workers produce exactly the gradients the dead coordinator would have
received: a worker's "data cursor" is a function of the step, not something it remembers.

No dataset is downloaded at run time: breast_cancer and digits ship with scikit-learn,
Shuttle ships with river, synthetic is generated from the seed.

What it must never do: use the global numpy or Python random state.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from system.trainer.config import ConfigError, TrainConfig

SYNTHETIC_LABEL_NOISE = 0.10  # labels flipped with this probability: best accuracy is 0.90
SYNTHETIC_BLOCK_ROWS = 65_536  # rows are generated in blocks keyed by (seed, block)


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # (n_train, features), standardized with the training mean/std
    y_train: np.ndarray  # (n_train,) int64 class ids 0..classes-1
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    best_accuracy: float | None = None  # known Bayes accuracy (synthetic only)

    @property
    def features(self) -> int:
        return self.x_train.shape[1]


# The packaged files the bundled datasets are read from (the Docker image copies just these
# from the host's packages instead of installing scikit-learn and river).
BUNDLED_FILES = (("sklearn", "datasets/data/breast_cancer.csv"),
                 ("sklearn", "datasets/data/digits.csv.gz"),
                 ("river", "datasets/shuttle.csv.gz"))


def _package_file(package: str, relative: str) -> Path:
    """A data file shipped inside an installed package, found WITHOUT importing it:
    importing scikit-learn or river costs about 2 s of CPU per process, and every worker
    and coordinator loads the data (tests check the arrays equal the packages' loaders)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"dataset needs the {package!r} package; pip install {package}")
    return Path(spec.submodule_search_locations[0]) / relative


def _raw(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "breast_cancer":
        # scikit-learn's load_breast_cancer reads this file: a count line, then rows with the target last.
        table = np.loadtxt(_package_file("sklearn", "datasets/data/breast_cancer.csv"),
                           delimiter=",", skiprows=1, dtype=np.float64)
        return table[:, :-1], table[:, -1].astype(np.int64)
    if name in ("digits", "digits_binary"):
        table = np.loadtxt(_package_file("sklearn", "datasets/data/digits.csv.gz"),
                           delimiter=",", dtype=np.float64)
        y = table[:, -1].astype(np.int64)
        if name == "digits_binary":
            y = (y >= 5).astype(np.int64)  # digits 0-4 against 5-9
        return table[:, :-1], y
    if name == "shuttle":
        with gzip.open(_package_file("river", "datasets/shuttle.csv.gz"), "rt") as f:
            table = np.loadtxt(f, delimiter=",", skiprows=1, dtype=np.float64)
        return table[:, :-1], table[:, -1].astype(np.int64)
    raise ConfigError(f"unknown dataset {name!r}")


def _generator(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


def synthetic_true_weights(seed: int, features: int) -> np.ndarray:
    rng = _generator(seed, 0xC0FFEE)
    return rng.standard_normal(features).astype(np.float32)


def synthetic_rows(seed: int, features: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [start, stop) of the synthetic set: x ~ N(0, 1) float32, y = [x.w > 0] with
    10% of labels flipped, so the best achievable accuracy is exactly 0.90. Each block of
    rows comes from its own keyed generator, so a worker makes only its own shard."""
    w = synthetic_true_weights(seed, features)
    xs, ys = [], []
    first, last = start // SYNTHETIC_BLOCK_ROWS, (stop - 1) // SYNTHETIC_BLOCK_ROWS
    for block in range(first, last + 1):
        rng = _generator(seed, block + 1)
        x = rng.standard_normal((SYNTHETIC_BLOCK_ROWS, features), dtype=np.float32)
        flip = rng.random(SYNTHETIC_BLOCK_ROWS) < SYNTHETIC_LABEL_NOISE
        y = ((x @ w) > 0).astype(np.int64) ^ flip
        lo = max(start, block * SYNTHETIC_BLOCK_ROWS) - block * SYNTHETIC_BLOCK_ROWS
        hi = min(stop, (block + 1) * SYNTHETIC_BLOCK_ROWS) - block * SYNTHETIC_BLOCK_ROWS
        xs.append(x[lo:hi])
        ys.append(y[lo:hi])
    return np.concatenate(xs), np.concatenate(ys)


def synthetic_split(config: TrainConfig) -> tuple[int, int]:
    """(n_train, n_test): the first rows train, the last test_fraction rows test."""
    n_test = max(1, int(config.synthetic_rows * config.test_fraction))
    return config.synthetic_rows - n_test, n_test


def load(config: TrainConfig, *, train_rows: tuple[int, int] | None = None) -> Dataset:
    """The dataset of `config`, split and standardized. For synthetic, `train_rows`
    restricts the generated training rows to a range (a worker's shard); the features are
    already standardized by construction."""
    if config.dataset == "synthetic":
        n_train, n_test = synthetic_split(config)
        lo, hi = train_rows if train_rows is not None else (0, n_train)
        x_tr, y_tr = synthetic_rows(config.seed, config.synthetic_features, lo, hi)
        x_te, y_te = synthetic_rows(config.seed, config.synthetic_features, n_train, n_train + n_test)
        return Dataset("synthetic", x_tr, y_tr, x_te, y_te, 2, 1.0 - SYNTHETIC_LABEL_NOISE)
    return _load_bundled(config.dataset, config.seed, config.test_fraction)


@lru_cache(maxsize=4)
def _load_bundled(name: str, seed: int, test_fraction: float) -> Dataset:
    x, y = _raw(name)
    order = _generator(seed, 0x5B117).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0  # constant columns (digits has some) stay zero instead of NaN
    scale = lambda a: np.ascontiguousarray((a - mean) / std)  # noqa: E731
    classes = int(y.max()) + 1
    return Dataset(name, scale(x[train]), y[train], scale(x[test]), y[test], classes)


def n_train_rows(config: TrainConfig) -> int:
    if config.dataset == "synthetic":
        return synthetic_split(config)[0]
    return len(_load_bundled(config.dataset, config.seed, config.test_fraction).y_train)


def shard_bounds(n_rows: int, workers: int, worker: int) -> tuple[int, int]:
    """Worker `worker`'s rows are [lo, hi) of the training set (already shuffled by the
    split): contiguous, sizes differing by at most one, like np.array_split."""
    if workers > n_rows:
        raise ConfigError(f"{workers} workers but only {n_rows} training rows; use at most {n_rows} workers")
    base, extra = divmod(n_rows, workers)
    lo = worker * base + min(worker, extra)
    return lo, lo + base + (1 if worker < extra else 0)


def batch_positions(seed: int, worker: int, step: int, shard_rows: int, batch_size: int) -> np.ndarray:
    """Indices into the worker's shard of its batch at `step` (1-based). The worker walks
    an endless sequence of epochs, each a permutation of its shard keyed by
    (seed, worker, epoch); step s takes positions [(s-1)*b, s*b) of that sequence."""
    positions = np.arange((step - 1) * batch_size, step * batch_size, dtype=np.int64)
    epochs = positions // shard_rows
    offsets = positions % shard_rows
    out = np.empty_like(positions)
    for epoch in np.unique(epochs):
        mask = epochs == epoch
        out[mask] = _epoch_permutation(seed, worker, int(epoch), shard_rows)[offsets[mask]]
    return out


@lru_cache(maxsize=8)
def _epoch_permutation(seed: int, worker: int, epoch: int, shard_rows: int) -> np.ndarray:
    rng = _generator(seed, worker + 1, epoch, 0xBA7C4)
    return rng.permutation(shard_rows)


def data_cursor(step: int, shard_rows: int, batch_size: int) -> tuple[int, int]:
    """(epoch, position in epoch) of the next batch after `step` steps: what a worker
    would have to remember if its batch order were not a function of the step."""
    return divmod(step * batch_size, shard_rows)
