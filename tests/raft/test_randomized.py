"""Randomized simulation: many seeds of random faults (swarm testing), each checked for
Raft's safety properties after every step, for liveness once healed, and for
linearizability of the clients' history at the end (see system/sim/swarm.py).

CI runs 500 seeds of the real core, and for every broken variant of tests/raft/broken.py
shows that the same randomized run finds a violation within 500 seeds. A failure names
the command that replays the seed exactly.
"""

from __future__ import annotations

import pytest

from checker import check_versioned_kv
from system.sim.swarm import SeedResult, replay_command, run_seed
from tests.raft import broken

SEEDS = 500
CHUNK = 50  # seeds per test, so progress shows and pytest-xdist can spread them


def describe_failures(results: list[SeedResult], variant_path: str | None = None) -> str:
    lines = []
    for result in results:
        lines.append(f"seed {result.seed}: {replay_command(result.seed, variant_path)}")
        lines.extend("    " + v.line().splitlines()[0] for v in result.violations[:3])
    return "\n".join(lines)


def test_a_few_seeds_pass_quickly() -> None:
    """A fast smoke run of the randomized simulation (the full one is slow)."""
    results = [run_seed(seed, check=check_versioned_kv) for seed in range(1000, 1005)]
    failed = [r for r in results if not r.ok]
    assert not failed, describe_failures(failed)
    assert_linearizable(results)


def assert_linearizable(results: list[SeedResult]) -> None:
    """Every seed's history was decided valid by the checker: an "unknown" (budget ran
    out) is not a pass."""
    undecided = [r for r in results if r.linearizability != "valid"]
    assert not undecided, "\n".join(
        f"seed {r.seed}: linearizability {r.linearizability} {r.linearizability_note}"
        for r in undecided
    )


@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_randomized_seeds_keep_every_safety_property(first: int) -> None:
    results = [run_seed(seed, record_trace=False, check=check_versioned_kv)
               for seed in range(first, first + CHUNK)]
    failed = [r for r in results if not r.ok]
    assert not failed, describe_failures(failed)
    assert_linearizable(results)
    # The runs do what they claim: faults were injected and clients got answers.
    faults = sum(sum(r.faults.values()) for r in results)
    assert faults > CHUNK and sum(r.ops["ok"] for r in results) > CHUNK


def seeds_to_first_violation(name: str) -> tuple[int, SeedResult | None]:
    for seed in range(SEEDS):
        result = run_seed(seed, broken.ALL[name], record_trace=False, check=check_versioned_kv)
        if not result.ok:
            return seed + 1, result
    return SEEDS, None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(broken.ALL))
def test_randomized_run_finds_each_broken_variant_within_500_seeds(name: str) -> None:
    needed, result = seeds_to_first_violation(name)
    assert result is not None, f"{name}: no violation found in {SEEDS} seeds"
    first = result.violations[0]
    print(f"{name}: {needed} seed(s); first violation: {first.rule.value}")
