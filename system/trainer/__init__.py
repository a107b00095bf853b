"""The data-parallel logistic-regression trainer (docs/trainer.md).

Importing the package pins BLAS to one thread before numpy loads (see blas.py).
"""

from system.trainer import blas as _blas  # noqa: F401  (must run before numpy is imported)
