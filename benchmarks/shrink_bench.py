"""Shrink the first failing seed of every broken variant and every store canary.

    python -m benchmarks.shrink_bench [--write-tests tests/raft/shrunk] [--only NAME ...]

For each variant of tests/raft/broken.py (`ALL`) and each store canary's simulator variant
(system/sim/unsafe.py): run seeds 0, 1, 2, ... of the randomized simulation until one
fails, shrink its schedule (system/sim/shrink.py), and print one row: the seed, the broken
rule, the original and minimal schedule lengths (steps, faults, client ops), the nodes, and
the shrink's CPU and wall time. With `--write-tests DIR`, each verified minimal schedule is
written as DIR/test_<variant>.py. The table goes to benchmarks/results/shrink.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from tabulate import tabulate

from checker import check_versioned_kv
from system.sim import swarm
from system.sim.cli import load_variant
from system.sim.invariants import Rule
from system.sim.schedule import counts
from system.sim.shrink import generated_test_source, shrink

MAX_SEEDS = 500
VARIANTS = [f"tests.raft.broken:{name}" for name in (
    "ACKNOWLEDGES_AT_APPEND", "COMMITS_OLD_TERM_ENTRIES", "FORGETS_VOTE_ON_RESTART",
    "IGNORES_REQUEST_IDS", "INSTALLS_SNAPSHOT_BY_INDEX_ONLY", "READS_WITHOUT_QUORUM_CHECK",
    "RESTORES_SNAPSHOT_ONLY", "SKIPS_FSYNC", "SKIPS_PRE_VOTE", "VOTES_TWICE")] + [
    f"system.sim.unsafe:{name}" for name in ("ACK_BEFORE_COMMIT", "STALE_READ", "NO_DEDUP")]


def first_failing(variant_path: str) -> tuple[int, swarm.SwarmRun] | None:
    variant = load_variant(variant_path)
    for seed in range(MAX_SEEDS):
        run = swarm.SwarmRun(seed, variant, record_trace=False, check=check_versioned_kv)
        run.sim.schedule = []
        result = run.run()
        if not result.ok and result.violations[0].rule is not Rule.LIVENESS:
            return seed, run
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shrink_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write-tests", type=Path, metavar="DIR")
    parser.add_argument("--only", nargs="*", default=None, help="variant attribute names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/shrink.md"))
    args = parser.parse_args(argv)
    paths = [p for p in VARIANTS if args.only is None or p.split(":")[1] in args.only]
    rows = []
    for path in paths:
        name = path.split(":")[1]
        found = first_failing(path)
        if found is None:
            rows.append([name, f"none in {MAX_SEEDS}"] + [""] * 9)
            print(rows[-1], flush=True)
            continue
        seed, run = found
        rule = run.sim.violations[0].rule
        shrunk = shrink(run.sim.settings, run.sim.variant, list(run.sim.schedule), rule,
                        check=check_versioned_kv)
        c = counts(shrunk.steps)
        original = counts(shrunk.original)
        rows.append([name, seed, rule.value,
                     f"{original['steps']} / {original['faults']} / {original['client ops']}",
                     c["steps"], c["faults"], c["client ops"], shrunk.settings["node_count"],
                     "yes" if shrunk.minimal else "no (budget)",
                     f"{shrunk.cpu_seconds:.1f}", f"{shrunk.seconds:.1f}",
                     "yes" if shrunk.verified else "NO: " + "; ".join(shrunk.notes)])
        print(rows[-1], flush=True)
        if args.write_tests and shrunk.verified:
            args.write_tests.mkdir(parents=True, exist_ok=True)
            test_name = name.lower()
            origin = swarm.replay_command(seed, path)
            (args.write_tests / f"test_{test_name}.py").write_text(
                generated_test_source(shrunk, test_name, path, origin), encoding="utf-8")
    headers = ["variant", "seed", "broken rule", "original steps / faults / ops",
               "minimal steps", "faults", "client ops", "nodes", "1-minimal", "CPU s",
               "wall s", "test fails on it, passes on the real core"]
    table = tabulate(rows, headers=headers, tablefmt="github")
    print(table)
    args.out.write_text(
        f"# Shrinking the first failing seed of each broken variant\n\n"
        f"`python -m benchmarks.shrink_bench --write-tests tests/raft/shrunk` on "
        f"{time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, a 2-core machine "
        f"shared with other jobs (CPU s is the shrink's own CPU time; wall s includes waiting "
        f"for the CPU).\n\n{table}\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
