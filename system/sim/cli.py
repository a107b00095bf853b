"""`python -m system.sim`: the randomized simulation over many seeds, or one seed replayed.

What it is for: a person's entry point to the swarm runs (system/sim/swarm.py). The only
I/O in the simulator package is here: printing, and `--history-out` writing a failing
seed's history through `histories.write`. Linearizability is decided by the checker `main`
is given (`check`): the command's entry point, system/sim/__main__.py, passes the project's
(`checker.check_versioned_kv`); nothing else in system/ imports the harness.
"""

from __future__ import annotations

from system.sim.history import HistoryEvent, to_records
from system.sim.simulation import LinearizabilityCheck
from system.sim.variant import SimVariant


def load_variant(path: str) -> SimVariant:
    """Import a SimVariant named "package.module:attribute" (e.g. a broken variant from
    tests/raft/broken.py, so a failing seed of it can be replayed from the shell)."""
    import importlib

    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--variant must look like package.module:name, got {path!r}")
    variant = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(variant, SimVariant):
        raise ValueError(f"{path!r} is not a SimVariant (got {type(variant).__name__})")
    return variant


def write_history(history: list[HistoryEvent], path: str) -> None:
    """Write a run's history as `history.jsonl` (docs/histories.md) for
    `python -m checker check PATH --model versioned-kv --html out.html`. The `time` of a
    record is the simulator step it happened at (the sim has no clock), for display only."""
    from histories.write import HistoryWriter

    records = to_records(history)
    step = 0
    with HistoryWriter(path, clock_ns=lambda: step) as writer:
        invokes: dict[int, int] = {}  # process -> index of its invoke in the file
        for record in records:
            fields = {
                name: value
                for name, value in record.to_json().items()
                if name not in ("index", "time", "process", "type", "f", "key", "value")
            }
            step = dict(record.extra)["step"]
            if record.type.value == "invoke":
                invokes[record.process] = writer.invoke(  # type: ignore[index]
                    record.process, record.f, record.key, record.value, **fields,  # type: ignore[arg-type]
                )
            else:
                writer.complete(
                    invokes.pop(record.process), record.type, record.value, **fields,  # type: ignore[arg-type]
                )


def save_history(history: list[HistoryEvent], directory: str, seed: int):  # noqa: ANN201
    """DIR/seed-N/history.jsonl (replaced if it exists: the same seed gives the same file)."""
    from pathlib import Path

    path = Path(directory) / f"seed-{seed}" / "history.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    write_history(history, str(path))
    return path


def main(argv: list[str] | None = None, *, check: LinearizabilityCheck) -> int:
    """Run the randomized simulation over many seeds, `check` deciding linearizability;
    exit 0 if every seed passed."""
    import argparse
    import sys

    from tabulate import tabulate

    from system.sim import swarm

    parser = argparse.ArgumentParser(
        prog="python -m system.sim",
        description="Randomized, deterministic simulation of a Raft cluster under faults. "
        "Each seed draws its own fault rates (swarm testing), injects faults, heals, and "
        "checks Raft's safety properties after every step and linearizability at the end.",
    )
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to run")
    parser.add_argument("--start-seed", type=int, default=0, help="first seed of the range")
    parser.add_argument("--seed", type=int, help="replay exactly this one seed (verbose)")
    parser.add_argument("--variant", help="package.module:name of a SimVariant to run instead "
                        "of the real core (e.g. tests.raft.broken:VOTES_TWICE)")
    parser.add_argument("--safety-steps", type=int, default=swarm.SAFETY_STEPS)
    parser.add_argument("--liveness-steps", type=int, default=swarm.LIVENESS_STEPS)
    parser.add_argument("--trace", action="store_true", help="with --seed: print the trace")
    parser.add_argument("--history-out", metavar="DIR",
                        help="write the client history of each failing seed (and of --seed "
                        "always) to DIR/seed-N/history.jsonl, for `python -m checker check`")
    parser.add_argument("--shrink", action="store_true",
                        help="with --seed: minimise the failing seed's schedule (delta "
                        "debugging) and print it as named steps")
    parser.add_argument("--test-out", metavar="FILE",
                        help="with --shrink: write the minimal schedule as a pytest test")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if (args.shrink or args.test_out) and args.seed is None:
        parser.error("--shrink needs --seed N (the failing seed to minimise)")
    if args.test_out and not args.shrink:
        parser.error("--test-out goes with --shrink")
    try:
        variant = load_variant(args.variant) if args.variant else None
    except (ImportError, ValueError) as error:
        parser.error(str(error))
    if args.shrink:
        return shrink_seed(args.seed, variant, args.variant, args.safety_steps,
                           args.liveness_steps, args.test_out, check)

    seeds = [args.seed] if args.seed is not None else list(
        range(args.start_seed, args.start_seed + args.seeds)
    )
    every = max(1, len(seeds) // 20)
    totals_faults: dict[str, int] = {}
    totals_ops = {"ok": 0, "fail": 0, "info": 0}
    committed = steps = 0
    failed: list[swarm.SeedResult] = []
    verdicts: dict[str, int] = {}
    for position, seed in enumerate(seeds, 1):
        run = swarm.SwarmRun(seed, variant, args.safety_steps, args.liveness_steps, check=check)
        result = run.run()
        if args.history_out and (not result.ok or args.seed is not None):
            saved = save_history(run.sim.history, args.history_out, seed)
            print(f"seed {seed}: history written to {saved}; check it with\n"
                  f"  python -m checker check {saved} --model versioned-kv "
                  f"--html {saved.parent / 'timeline.html'}")
        for kind, count in result.faults.items():
            totals_faults[kind] = totals_faults.get(kind, 0) + count
        for kind, count in result.ops.items():
            totals_ops[kind] += count
        committed += result.committed
        steps += result.steps
        verdicts[result.linearizability] = verdicts.get(result.linearizability, 0) + 1
        if args.seed is not None:
            print(f"seed {seed}: {result.swarm.line()}")
            print(f"trace hash {result.trace_hash}")
            if args.trace:
                run = swarm.SwarmRun(seed, variant, args.safety_steps, args.liveness_steps,
                                     check=check)
                run.run()
                print("\n".join(run.sim.trace))
        if result.linearizability == "unknown":
            print(f"seed {seed}: linearizability unknown ({result.linearizability_note})")
        if not result.ok:
            failed.append(result)
            print(f"seed {seed} FAILED ({len(result.violations)} violations):")
            for violation in result.violations[:5]:
                print("  " + violation.line().replace("\n", "\n    "))
            print("  replay: " + swarm.replay_command(seed, args.variant))
        if position % every == 0 or position == len(seeds):
            print(f"[{position}/{len(seeds)}] seeds run, {len(failed)} failed", flush=True)

    rows = [
        ["seeds run", len(seeds)],
        ["seeds failed", len(failed)],
        ["simulation steps", steps],
        ["entries committed (sum of final commit indexes)", committed],
        ["client ops ok", totals_ops["ok"]],
        ["client ops fail", totals_ops["fail"]],
        ["client ops info", totals_ops["info"]],
    ]
    rows += [[f"linearizability {k}", v] for k, v in sorted(verdicts.items())]
    rows += [[f"faults: {kind}", count] for kind, count in sorted(totals_faults.items())]
    rows.append(["violations", sum(len(r.violations) for r in failed)])
    print(tabulate(rows, headers=["summary", "count"], tablefmt="github"))
    if failed:
        print("failing seeds (each line replays one):")
        for result in failed:
            print("  " + swarm.replay_command(result.seed, args.variant))
        sys.stdout.flush()
        return 1
    return 0



def shrink_seed(seed: int, variant: SimVariant | None, variant_path: str | None,
                safety_steps: int, liveness_steps: int, test_out: str | None,
                check: LinearizabilityCheck) -> int:
    """`--seed N --shrink`: record the seed's schedule, minimise it, print it (and write
    it as a test). Exit 0 with a verified minimal schedule, 1 if the seed passes or its
    failure cannot be shrunk, 2 if the result could not be verified."""
    from pathlib import Path

    from system.sim import swarm
    from system.sim.invariants import Rule
    from system.sim.schedule import counts
    from system.sim.shrink import generated_test_source, shrink

    run = swarm.SwarmRun(seed, variant, safety_steps, liveness_steps, record_trace=False,
                         check=check)
    run.sim.schedule = []
    result = run.run()
    origin = swarm.replay_command(seed, variant_path)
    if result.ok:
        print(f"seed {seed} passed: nothing to shrink ({origin})")
        return 1
    rule = result.violations[0].rule
    if rule is Rule.LIVENESS:
        print(f"seed {seed} fails only liveness ({result.violations[0].line()}); a shorter "
              f"schedule is not a shorter wait, so it is not shrunk")
        return 1
    schedule = list(run.sim.schedule)
    print(f"seed {seed}: {rule.value} broken; shrinking its schedule of {len(schedule)} steps ...",
          flush=True)
    shrunk = shrink(run.sim.settings, variant, schedule, rule, check=check)
    c = counts(shrunk.steps)
    print(f"minimal schedule: {c['steps']} steps ({c['faults']} faults, {c['client ops']} client "
          f"ops) on {shrunk.settings['node_count']} nodes, from {len(schedule)}; "
          f"{shrunk.replays} replays in {shrunk.cpu_seconds:.1f} s CPU ({shrunk.seconds:.1f} s wall)"
          + ("" if shrunk.minimal else " (time budget reached: not 1-minimal)"))
    for number, step in enumerate(shrunk.steps, 1):
        print(f"  {number:3}. {step.line()}")
    for note in shrunk.notes:
        print(f"  note: {note}")
    if test_out:
        name = (variant.name if variant else "real-core").replace("-", "_") + f"_seed_{seed}"
        Path(test_out).write_text(generated_test_source(shrunk, name, variant_path or "", origin),
                                  encoding="utf-8")
        print(f"test written to {test_out}")
    return 0 if shrunk.verified else 2
