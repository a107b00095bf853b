"""Model math, data, sharding and batch order (no processes, no network)."""

from __future__ import annotations

import numpy as np
import pytest

import system.trainer  # noqa: F401  (pins BLAS to one thread before numpy work)
from system.trainer import data, local, model
from system.trainer.config import ConfigError, TrainConfig

# Per-dataset settings the accuracy tests use (also the CLI's defaults, see docs/trainer.md).
SETTINGS = {
    "breast_cancer": dict(steps=500, batch_size=16, learning_rate=0.05),
    "digits_binary": dict(steps=1000, batch_size=32, learning_rate=0.05),
    "digits": dict(steps=1000, batch_size=32, learning_rate=0.05),
    "shuttle": dict(steps=1000, batch_size=64, learning_rate=0.1),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_held_out_accuracy_within_one_point_of_scikit_learn(name: str) -> None:
    from sklearn.linear_model import LogisticRegression

    config = TrainConfig(dataset=name, workers=4, **SETTINGS[name])
    ds = data.load(config)
    ours = model.accuracy(local.train_local(config, dataset=ds).params, ds.x_test, ds.y_test)
    # Same objective: scikit-learn minimizes C*sum(loss) + ||w||^2/2, ours mean(loss) + l2/2 ||w||^2.
    reference = LogisticRegression(C=1.0 / (config.l2 * len(ds.y_train)), max_iter=5000)
    theirs = reference.fit(ds.x_train, ds.y_train).score(ds.x_test, ds.y_test)
    assert ours >= theirs - 0.01, (name, ours, theirs)


def test_bundled_datasets_have_the_documented_shapes() -> None:
    shapes = {"breast_cancer": (569, 30, 2), "digits": (1797, 64, 10),
              "digits_binary": (1797, 64, 2), "shuttle": (49097, 9, 2)}
    for name, (rows, features, classes) in shapes.items():
        ds = data.load(TrainConfig(dataset=name))
        assert (len(ds.y_train) + len(ds.y_test), ds.features, ds.classes) == (rows, features, classes)


def test_gradient_matches_finite_differences_binary_and_multinomial() -> None:
    rng = np.random.Generator(np.random.Philox(7))
    for classes in (2, 4):
        x = rng.standard_normal((20, 3))
        y = rng.integers(0, classes, 20)
        params = rng.standard_normal((4, model.outputs_for(classes))) * 0.1
        analytic = model.gradient_sum(params, x, y) / len(y)
        numeric = np.zeros_like(params)
        for i in np.ndindex(params.shape):
            e = np.zeros_like(params)
            e[i] = 1e-6
            numeric[i] = (model.loss(params + e, x, y, 0.0) - model.loss(params - e, x, y, 0.0)) / 2e-6
        np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-7)


def test_shards_partition_the_training_rows() -> None:
    for n, w in [(10, 3), (569, 4), (7, 7)]:
        bounds = [data.shard_bounds(n, w, i) for i in range(w)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert max(h - lo for lo, h in bounds) - min(h - lo for lo, h in bounds) <= 1


def test_more_workers_than_rows_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="only 5 training rows"):
        data.shard_bounds(5, 6, 0)


def test_unknown_dataset_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'mnist'"):
        TrainConfig(dataset="mnist").validate()


def test_batch_is_a_function_of_seed_worker_and_step() -> None:
    a = data.batch_positions(1, 0, 5, 100, 32)
    assert np.array_equal(a, data.batch_positions(1, 0, 5, 100, 32))
    assert not np.array_equal(a, data.batch_positions(1, 1, 5, 100, 32))
    assert not np.array_equal(a, data.batch_positions(2, 0, 5, 100, 32))
    # Every row is visited once per epoch, whatever the batch size.
    seen = np.concatenate([data.batch_positions(3, 2, s, 10, 4) for s in range(1, 6)])
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert data.data_cursor(5, 10, 4) == (2, 0)


def test_sum_in_worker_order_ignores_arrival_order() -> None:
    rng = np.random.Generator(np.random.Philox(3))
    grads = {w: (rng.standard_normal((5, 1)) * 10 ** w, 3) for w in range(4)}
    forward = model.sum_in_worker_order(dict(sorted(grads.items())))
    backward = model.sum_in_worker_order(dict(sorted(grads.items(), reverse=True)))
    assert forward[1] == 12 and forward[0].tobytes() == backward[0].tobytes()


def test_synthetic_rows_do_not_depend_on_how_they_are_generated() -> None:
    whole_x, whole_y = data.synthetic_rows(5, 8, 0, 70_000)
    part_x, part_y = data.synthetic_rows(5, 8, 65_000, 70_000)
    assert whole_x.dtype == np.float32
    assert np.array_equal(whole_x[65_000:], part_x) and np.array_equal(whole_y[65_000:], part_y)


def test_synthetic_model_approaches_the_known_best_accuracy() -> None:
    config = TrainConfig(dataset="synthetic", synthetic_rows=40_000, synthetic_features=20,
                         workers=2, steps=300, batch_size=128, learning_rate=0.05)
    ds = data.load(config)
    params = local.train_local(config, dataset=ds).params
    assert params.dtype == np.float32
    assert ds.best_accuracy == pytest.approx(0.90)
    assert model.accuracy(params, ds.x_test, ds.y_test) > ds.best_accuracy - 0.02


def test_bundled_files_read_directly_equal_the_packages_loaders() -> None:
    from river.datasets import Shuttle
    from sklearn.datasets import load_breast_cancer, load_digits

    x, y = data._raw("breast_cancer")
    ref = load_breast_cancer()
    assert np.array_equal(x, ref.data) and np.array_equal(y, ref.target)
    x, y = data._raw("digits")
    ref = load_digits()
    assert np.array_equal(x, ref.data) and np.array_equal(y, ref.target)
    x, y = data._raw("shuttle")
    first_x, first_y = next(iter(Shuttle()))
    assert list(x[0]) == [float(v) for v in first_x.values()] and y[0] == int(first_y)
