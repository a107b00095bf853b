"""Checkers that decide from an operation history alone whether a run was correct.

Public API (docs/checker.md):
    check_linearizable(history, model, *, budget_s=60, all_keys=False, partition=True) -> Result
    check_versioned_kv(history, *, budget_s=60) -> Result  (every key, model versioned-kv)
    check_lost_writes(history) -> Result
    models: register, cas_register, versioned_kv, etcd, kv (checker.models)
    Result.valid is True, False or "unknown"; Result.to_json() for the JSON report.
"""

from checker import models
from checker.linearizability import check_linearizable, check_versioned_kv
from checker.lost_writes import check_lost_writes
from checker.result import UNKNOWN, Counterexample, KeyResult, Result

__all__ = [
    "UNKNOWN",
    "Counterexample",
    "KeyResult",
    "Result",
    "check_linearizable",
    "check_versioned_kv",
    "check_lost_writes",
    "models",
]
