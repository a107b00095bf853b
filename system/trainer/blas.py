"""One BLAS thread per process, so a process's arithmetic is fixed.

Why: a multi-threaded BLAS splits a matrix product into a number of partial sums that
depends on the thread count and on timing, so the same gradient can differ in the last
bits between two runs. The determinism property (a faulted run ends bit-for-bit equal to
the fault-free run) needs the same sums in the same order every time.

Import this module before numpy in every entry point (`system.trainer.__init__` does it,
so importing anything from the package is enough). It must never import numpy itself
before setting the variables: OpenBLAS reads them once, when it loads.
"""

from __future__ import annotations

import os

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                         "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def pin_blas_threads() -> None:
    """Set every BLAS thread variable to 1 (children inherit them), and if numpy was
    already imported by someone else, limit its pools through threadpoolctl."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ[name] = "1"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: the environment variables are the main mechanism
        return
    threadpool_limits(1)


def blas_kernel_env() -> dict[str, str]:
    """`OPENBLAS_CORETYPE` naming the kernel this process's OpenBLAS runs, for processes
    started elsewhere (containers) whose arithmetic must match this one's bit for bit.

    Why: OpenBLAS picks its kernels by the CPU it detects, unless OPENBLAS_CORETYPE names
    one, and two kernels round a product differently. A machine whose environment sets
    OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU ran the harness's fault-free reference
    with the Haswell kernel while the trainer's containers detected SkylakeX: every docker
    trainer run ended "differs-from-reference" from its first step. Empty when numpy's
    BLAS is not OpenBLAS (then nothing is known to pass on)."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return {"OPENBLAS_CORETYPE": os.environ["OPENBLAS_CORETYPE"]}
    try:
        import numpy  # noqa: F401 - loads the BLAS that threadpoolctl then reports
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    for info in threadpool_info():
        if info.get("internal_api") == "openblas" and info.get("architecture"):
            return {"OPENBLAS_CORETYPE": str(info["architecture"])}
    return {}


pin_blas_threads()
