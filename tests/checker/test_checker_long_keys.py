"""Long single-key histories (`../shared/data/longkeys/`): right verdicts, and a memory budget
that holds as a real bound.

Jepsen etcd logs of one register, 10 and 30 clients, 5,000 to 100,000 operations, some with
a planted stale read; Porcupine decides only the three smaller valid ones, this checker all
of them. Times are the
benchmark's business (benchmarks/checker_bench.py); here only verdicts and memory.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checker import check_linearizable, models
from checker.cli import EXIT_UNKNOWN
from checker.corpus import find_shared_data, load_corpus
from histories.load import load_history
from histories.pairing import pair_operations

DATA = find_shared_data()
LONG = load_corpus(DATA, "longkeys") if DATA and (DATA / "longkeys").exists() else []
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not LONG, reason="../shared/data/longkeys not found (MAO_SHARED_DATA)")


# Every key of the corpus is decided within the default memory budget, the 30-client keys
# with a stale read planted at the end included (issue 25): they are refuted from the window
# that starts at their last isolated write (checker/windows.py), where the whole search had
# to exhaust every order of the operations before it and ran out of budget.
@pytest.mark.parametrize("entry", LONG, ids=[e.file for e in LONG])
def test_long_key_verdict_within_the_default_memory_budget(entry) -> None:
    operations = pair_operations(load_history(entry.path)[0])
    assert len(operations) == entry.operations
    # Default memory budget; a generous CPU budget (the benchmark reports the real times).
    result = check_linearizable(operations, models.by_name(entry.model, entry.init), budget_s=300)
    assert result.valid == entry.expected_valid, result.note
    if result.valid is False:
        (counterexample,) = result.counterexamples
        assert counterexample.blocking.f == "read"  # the planted stale read


# Runs the CLI under an address-space limit; prints the peak virtual memory on stderr.
_UNDER_LIMIT = textwrap.dedent(
    """
    import resource, sys
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from checker.cli import main
    code = main(sys.argv[2:])
    peak = [l for l in open("/proc/self/status") if l.startswith("VmPeak")][0].split()[1]
    print("vmpeak_kb", peak, file=sys.stderr)
    sys.exit(code)
    """
)


def _check_under_limit(limit_bytes: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(limit_bytes), "check", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


def _vmpeak(done: subprocess.CompletedProcess) -> int:
    return int(done.stderr.split("vmpeak_kb")[1].split()[0]) * 1024


def test_a_small_memory_budget_ends_unknown_under_an_address_space_limit_not_in_a_kill() -> None:
    # The valid key: the stale one is now refuted in a few configurations (checker/windows.py),
    # this one still needs its whole search, and about 50 MB for it.
    path = str(DATA / "longkeys" / "long-p10-n27000-valid.log")
    # What reading the history and starting the search take: a zero budget stops at once.
    baseline = _check_under_limit(0, path, "--max-memory-mb", "0")
    assert baseline.returncode == EXIT_UNKNOWN, baseline.stderr
    budget_mb = 8
    # Room for the budget, a few times over, but far less than the whole search needs
    # (deciding this history takes tens of MB more than the baseline).
    limit = _vmpeak(baseline) + 4 * budget_mb * 2**20
    done = _check_under_limit(limit, path, "--max-memory-mb", str(budget_mb), "--budget-s", "600")
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert "memory budget" in done.stdout and done.stdout.startswith("UNKNOWN")
