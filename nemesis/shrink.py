"""`python -m nemesis shrink RUN_DIR`: a failing run on the simulator, minimised into a test.

What it is for: a run made with `--platform sim` is a function of its configuration and
seed, so it can be played again with every step recorded (`Simulation.schedule`), and the
recorded schedule shrunk by delta debugging (system/sim/shrink.py) until no single step can
be removed without the failure going away. The broken rule is the first the simulator's
safety monitor saw, else linearizability of the simulated clients' history. The minimal
schedule is printed as named steps and, with `--test-out FILE`, written as a pytest test
that fails on the run's variant (its `--unsafe` canary) and passes on the real store.

What it must never do: shrink a run of a real cluster (not replayable: refused), or change
the run folder it reads (the replay writes into a temporary folder that is removed).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

from checker import check_versioned_kv
from nemesis.store import read_json
from system.sim.invariants import Rule
from system.sim.schedule import counts

EXIT_SHRUNK, EXIT_NOTHING, EXIT_UNVERIFIED, EXIT_REFUSED = 0, 1, 2, 3


class ShrinkRefused(ValueError):
    """The folder is not a run this command can shrink; the message says why."""


def load_config(run_dir: Path):  # noqa: ANN201 - a RunConfig
    from nemesis.runner import RunConfig

    test_path = run_dir / "test.json"
    if not test_path.exists():
        raise ShrinkRefused(f"{run_dir} has no test.json; give a run folder such as store/latest")
    config: dict[str, Any] = read_json(test_path).get("config", {})
    if config.get("platform") != "sim":
        raise ShrinkRefused(f"{run_dir} ran on {config.get('platform')!r}; only runs made with "
                            f"--platform sim replay exactly, so only they can be shrunk")
    from nemesis.faults import BEYOND_RAFT

    beyond = [f for f in config.get("faults") or [] if f in BEYOND_RAFT]
    if beyond:
        raise ShrinkRefused(f"{run_dir} ran --faults {beyond[0]}, which restores copies of "
                            f"the nodes' disks: the simulator's replayable schedule does not "
                            f"hold them, so the run cannot be shrunk; rerun it with its "
                            f"reproduce line (the same seed gives the same history)")
    config["store"] = Path(config["store"])
    config["junit"] = None
    return RunConfig(**config)


def shrink_run(run_dir: Path, test_out: Path | None, out) -> int:  # noqa: ANN001 - a text stream
    from nemesis.sim_runner import simulate, variant_for_run
    from system.sim.shrink import generated_test_source, shrink

    config = load_config(run_dir)
    print(f"replaying {run_dir} (seed {config.seed}) with every step recorded ...",
          file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="mao-shrink-") as tmp:
        platform = simulate(config, Path(tmp), "shrink", io.StringIO(), {},
                            record_schedule=True)
    sim = platform.sim
    if sim.violations:
        rule = sim.violations[0].rule
    else:
        sim.finish()
        verdict = sim.check_linearizable(check_versioned_kv)
        rule = Rule.LINEARIZABILITY if verdict.valid is False else None
    if rule is None or rule is Rule.LIVENESS:
        print("the replayed run breaks no safety rule the simulator can shrink (a verdict "
              "from the run's lost-writes check alone, or an unknown one, is not shrunk)",
              file=out)
        return EXIT_NOTHING
    schedule = list(sim.schedule or [])
    print(f"{rule.value} broken; shrinking a schedule of {len(schedule)} steps ...",
          file=out, flush=True)
    variant = variant_for_run(config.unsafe)
    result = shrink(sim.settings, variant, schedule, rule, check=check_versioned_kv)
    c = counts(result.steps)
    print(f"minimal schedule: {c['steps']} steps ({c['faults']} faults, {c['client ops']} "
          f"client ops) on {result.settings['node_count']} nodes, from {len(schedule)}; "
          f"{result.replays} replays in {result.cpu_seconds:.1f} s CPU"
          + ("" if result.minimal else " (time budget reached: not 1-minimal)"), file=out)
    for number, step in enumerate(result.steps, 1):
        print(f"  {number:3}. {step.line()}", file=out)
    for note in result.notes:
        print(f"  note: {note}", file=out)
    if test_out is not None:
        if variant is None:
            print("not writing a test: the run used the real store, so there is no broken "
                  "variant for it to fail on (the real store broke the rule: a bug to fix)",
                  file=out)
            return EXIT_UNVERIFIED
        attribute = variant.name.upper().replace("-", "_")
        name = f"{variant.name.replace('-', '_')}_seed_{config.seed}"
        test_out.write_text(generated_test_source(result, name, f"system.sim.unsafe:{attribute}",
                                        config.reproduce()), encoding="utf-8")
        print(f"test written to {test_out}", file=out)
    return EXIT_SHRUNK if result.verified else EXIT_UNVERIFIED
