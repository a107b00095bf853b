"""The training configuration and its hash.

The hash covers exactly the fields that change the arithmetic (dataset, split, model,
optimizer, batch, workers, seed, steps): a checkpoint written under another hash cannot be
resumed, because its parameters would be continued with different math. Timeouts, ports
and the checkpoint store do not enter the hash: changing them never changes the model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

DATASETS = ("breast_cancer", "digits", "digits_binary", "shuttle", "synthetic")


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line saying what to change."""


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "digits"
    workers: int = 4
    steps: int = 2000
    batch_size: int = 32  # rows per worker per step
    learning_rate: float = 0.1
    momentum: float = 0.9
    l2: float = 1e-4  # loss = mean log-loss + l2/2 * ||W||^2 (bias not penalized)
    seed: int = 0
    test_fraction: float = 0.25
    synthetic_rows: int = 1_000_000  # only for dataset "synthetic"
    synthetic_features: int = 100
    checkpoint_every: int = 100  # steps between checkpoints (and one at the end)
    job: str = "default"  # key prefix in the store: several jobs can share one store

    # Fields that do not change the arithmetic (excluded from the hash).
    _NOT_HASHED = ("checkpoint_every", "job")

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}")
        for name in ("workers", "steps", "batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test fraction must be between 0 and 1, got {self.test_fraction}")
        if self.learning_rate <= 0 or not 0 <= self.momentum < 1 or self.l2 < 0:
            raise ConfigError("need learning rate > 0, 0 <= momentum < 1 and l2 >= 0")
        if not self.job or "/" in self.job:
            raise ConfigError(f"job name must be non-empty and contain no '/', got {self.job!r}")

    def hashed_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self._NOT_HASHED}

    def config_hash(self) -> str:
        canonical = json.dumps(self.hashed_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls(**json.loads(text))
