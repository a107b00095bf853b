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


pin_blas_threads()
