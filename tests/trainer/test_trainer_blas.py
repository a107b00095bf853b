"""The BLAS kernel the trainer's containers run (system/trainer/blas.py `blas_kernel_env`):
the harness computes the fault-free reference in its own process, so processes it starts
elsewhere must run OpenBLAS's same kernel, or a correct run ends "differs-from-reference".
(Seen on a machine whose environment set OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU: the
containers detected SkylakeX and every docker trainer run differed from its first step;
tests/nemesis/test_trainer_workload.py's docker run is the end-to-end check.)"""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

from system.trainer.blas import blas_kernel_env


def _openblas_architecture() -> str | None:
    return next((str(i["architecture"]) for i in threadpool_info()
                 if i.get("internal_api") == "openblas" and i.get("architecture")), None)


def test_a_kernel_named_in_the_environment_is_passed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert blas_kernel_env() == {"OPENBLAS_CORETYPE": "Haswell"}


def test_without_one_the_kernel_this_process_detected_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    import numpy  # noqa: F401 - threadpoolctl sees the BLAS once numpy loaded it

    architecture = _openblas_architecture()
    if architecture is None:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    assert blas_kernel_env() == {"OPENBLAS_CORETYPE": architecture}

