"""numpy arrays <-> the Tensor message (raw bytes, shape, dtype): exact, no text round trip."""

from __future__ import annotations

import numpy as np

from system.trainer.proto import trainer_pb2


def to_tensor(a: np.ndarray) -> trainer_pb2.Tensor:
    a = np.ascontiguousarray(a)
    return trainer_pb2.Tensor(shape=list(a.shape), dtype=a.dtype.str, data=a.tobytes())


def from_tensor(t: trainer_pb2.Tensor) -> np.ndarray:
    return np.frombuffer(t.data, dtype=np.dtype(t.dtype)).reshape(tuple(t.shape)).copy()
