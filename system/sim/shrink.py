"""Shrinking: a failing schedule minimised by delta debugging, then written as a test.

What it is for: a randomized seed that breaks a rule is a replayable but long story
(thousands of deliveries and ticks). `shrink` keeps removing parts of its schedule
(system/sim/schedule.py) while the same rule still breaks when the rest is replayed on a
fresh simulation with the same settings and seed: first halves, then quarters, and so on
down to single steps (Zeller's ddmin, as Hypothesis and QuickCheck shrink), until no
single removal still fails or the time budget runs out. It then tries the same schedule on
fewer nodes. The result is printed as named steps and written as a pytest test in the
style of tests/raft/test_interleavings.py: the scenario as named calls, then the assertion
of the broken property — which fails on the broken variant and passes on the real core
(both are checked before the file is written).

What counts as "still fails": a violation of the same `Rule` as the original run's first
one, seen by the safety monitor while replaying or by the end checks (linearizability of
the history, acknowledged writes present, identical state machines). Liveness failures are
not shrunk: a shorter schedule is not a shorter wait.

What it must never do: accept a schedule whose failure it has not just replayed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from system.sim.invariants import Rule
from system.sim.schedule import CLIENT_KINDS, Step, counts, play, step_code
from system.sim.simulation import LinearizabilityCheck, Simulation
from system.sim.variant import SimVariant

SHRINK_BUDGET_S = 45.0  # CPU seconds (the machine is shared): the bound is a minute
CHECK_BUDGET_S = 10.0  # the linearizability checker's budget per key, per replay
END_RULES = (Rule.LINEARIZABILITY, Rule.ACKNOWLEDGED_WRITE_LOST, Rule.STATE_MACHINE_SAFETY)


def replay_fails(settings: dict, variant: SimVariant | None, steps: list[Step],
                 rule: Rule, check: LinearizabilityCheck) -> tuple[bool, list[bool], Simulation]:
    """Replay `steps`; does `rule` break? Also returns which steps applied, and the sim."""
    sim = Simulation(**settings, variant=variant, record_trace=False)  # type: ignore[arg-type]

    def broke(s: Simulation) -> bool:
        return any(v.rule is rule for v in s.violations)

    applied = play(sim, steps, stop=broke)  # an exception is a NO_EXCEPTION violation
    if broke(sim):
        return True, applied, sim
    if rule in END_RULES:
        sim.finish()
        if rule is not Rule.LINEARIZABILITY:
            sim.check_final_state()
        elif sim.check_linearizable(check, budget_s=CHECK_BUDGET_S).valid is False:
            return True, applied, sim
    return broke(sim), applied, sim


Unit = list[Step]  # steps removed together: one client operation's, or a single step


def units_of(steps: list[Step]) -> list[Unit]:
    """The schedule cut into what ddmin removes: every step of one client operation (its
    invoke, submits, time-outs, give-up) together, every other step alone."""
    units: list[Unit] = []
    by_op: dict[int, Unit] = {}
    for step in steps:
        if step.kind in CLIENT_KINDS:
            op = step.args[0]
            if op not in by_op:
                by_op[op] = []
                units.append(by_op[op])
            by_op[op].append(step)
        else:
            units.append([step])
    return units


def flatten(units: list[Unit], order: list[Step]) -> list[Step]:
    """The steps of `units`, in the schedule's order."""
    kept = {id(step) for unit in units for step in unit}
    return [step for step in order if id(step) in kept]


def ddmin(units: list[Unit], fails: Callable[[list[Unit]], bool],
          deadline: float) -> tuple[list[Unit], bool]:
    """Zeller's delta debugging: a sub-list of `units` that still fails, from which no
    single unit can be removed (1-minimal) unless `deadline` (CPU seconds,
    time.process_time) came first. Returns it and whether it is 1-minimal."""
    chunks = 2
    while len(units) >= 2:
        size = -(-len(units) // chunks)
        reduced = False
        for start in range(0, len(units), size):
            if time.process_time() > deadline:
                return units, False
            complement = units[:start] + units[start + size:]
            if complement and fails(complement):
                units = complement
                chunks = max(chunks - 1, 2)
                reduced = True
                break
        if not reduced:
            if chunks >= len(units):
                return units, True
            chunks = min(chunks * 2, len(units))
    return units, True


# Whole classes of steps tried away first: one replay each, and most failures need few.
KIND_CLASSES = (CLIENT_KINDS, frozenset({"duplicate"}), frozenset({"drop"}),
                frozenset({"membership"}), frozenset({"cut", "partition", "heal", "heal_link"}),
                frozenset({"crash", "restart"}))


@dataclass
class ShrinkResult:
    rule: Rule
    original: list[Step]
    steps: list[Step]
    settings: dict
    minimal: bool  # no single step can be removed (False: the time budget ran out first)
    seconds: float  # wall clock
    cpu_seconds: float
    replays: int
    verified: bool  # the generated test passes on the real core and fails on the variant
    notes: list[str] = field(default_factory=list)

    def table_row(self) -> dict[str, object]:
        c = counts(self.steps)
        return {"rule": self.rule.value, "original steps": len(self.original), **c,
                "nodes": self.settings["node_count"], "1-minimal": self.minimal,
                "shrink CPU s": round(self.cpu_seconds, 1), "replays": self.replays}


def shrink(settings: dict, variant: SimVariant | None, original: list[Step], rule: Rule,
           budget_s: float = SHRINK_BUDGET_S, *, check: LinearizabilityCheck) -> ShrinkResult:
    """Minimise `original` (a schedule that breaks `rule` on `variant`); `check` decides
    linearizability (`checker.check_versioned_kv`)."""
    started, started_cpu = time.monotonic(), time.process_time()
    deadline = started_cpu + budget_s
    replays = 0

    def fails_with(config: dict) -> Callable[[list[Step]], bool]:
        def fails(steps: list[Step]) -> bool:
            nonlocal replays
            replays += 1
            return replay_fails(config, variant, steps, rule, check)[0]
        return fails

    fails = fails_with(settings)
    if not fails(original):
        raise ValueError(f"the recorded schedule does not break {rule.value!r} when replayed")
    # Cheap first cuts: everything after the violation (replay stops there), then ddmin.
    _, applied, _ = replay_fails(settings, variant, original, rule, check)
    steps = [s for s, ok in zip(original, applied, strict=False) if ok]
    if not fails(steps):
        steps = original
    for kinds in KIND_CLASSES:
        fewer = [s for s in steps if s.kind not in kinds]
        if len(fewer) < len(steps) and fails(fewer):
            steps = fewer
    # Fewer nodes: the same schedule without the highest-numbered nodes' steps.
    while settings["node_count"] > 3 and time.process_time() < deadline:
        smaller = {**settings, "node_count": settings["node_count"] - 2}
        kept = {f"n{i}" for i in range(1, smaller["node_count"] + smaller.get("spare_nodes", 0) + 1)}
        fewer = [s for s in steps if not _mentions_other_nodes(s, kept)]
        if not fails_with(smaller)(fewer):
            break
        settings, steps = smaller, fewer
        fails = fails_with(settings)
    order = steps
    units, minimal = ddmin(units_of(steps), lambda us: fails(flatten(us, order)), deadline)
    steps = flatten(units, order)
    # Keep only the steps that applied in the final replay, and check it still fails.
    _, applied, _ = replay_fails(settings, variant, steps, rule, check)
    applied_steps = [s for s, ok in zip(steps, applied, strict=False) if ok]
    if fails(applied_steps):
        steps = applied_steps
    # The generated test's own two checks, on the real core and on the variant.
    real = broken_rules(_replayed(settings, None, steps), check)
    notes = [f"on the real core the scenario breaks: {', '.join(sorted(r.value for r in real))}"
             ] if real else []
    if rule not in broken_rules(_replayed(settings, variant, steps), check):
        notes.append(f"the end checks of the generated test do not see {rule.value}")
    passes = not notes
    return ShrinkResult(rule, original, steps, settings, minimal, time.monotonic() - started,
                        time.process_time() - started_cpu, replays, passes, notes)


def _replayed(settings: dict, variant: SimVariant | None, steps: list[Step]) -> Simulation:
    sim = Simulation(**settings, variant=variant, record_trace=False)  # type: ignore[arg-type]
    play(sim, steps)
    return sim


def _mentions_other_nodes(step: Step, kept: set[str]) -> bool:
    def names(value: object) -> list[str]:
        if isinstance(value, str):
            return [value] if value.startswith("n") and value[1:].isdigit() else []
        if isinstance(value, tuple | list):
            return [n for item in value for n in names(item)]
        return []
    return any(n not in kept for n in names(step.args))


# ---------------------------------------------------------------------------------------
# The shrunk schedule as a test
# ---------------------------------------------------------------------------------------


def generated_test_source(result: ShrinkResult, name: str, variant_path: str, origin: str) -> str:
    """A pytest module: the scenario as named calls, a test that the real core keeps the
    property, and a test that the broken variant breaks it."""
    settings = "".join(f"        {k}={v!r},\n" for k, v in result.settings.items())
    body = "\n".join(f"        {step_code(s)}" for s in result.steps)
    c = counts(result.steps)
    module, _, attribute = variant_path.partition(":")
    imports = "\n".join(sorted([
        "from checker import check_versioned_kv",
        "from system.sim.invariants import Rule", "from system.sim.schedule import Replay",
        "from system.sim.shrink import broken_rules",
        "from system.sim.simulation import Simulation",
        "from system.sim.variant import SimVariant", f"from {module} import {attribute}"]))
    return f'''"""Shrunk from `{origin}`:
{c["steps"]} steps ({c["faults"]} faults, {c["client ops"]} client ops) of the original {len(result.original)},
in {result.cpu_seconds:.1f} s CPU by `--shrink`. The broken rule: {result.rule.value}.

Generated by system/sim/shrink.py; the scenario replays through `Replay`, which skips a
step that does not apply on the core under test (a message the real core never sends)."""

from __future__ import annotations

{imports}


def scenario(variant: SimVariant | None = None) -> Simulation:
    sim = Simulation(
{settings}        variant=variant,
    )
    with Replay(sim) as r:
{body}
    return sim


def test_{name}_keeps_{result.rule.name.lower()}() -> None:
    assert broken_rules(scenario(), check_versioned_kv) == set()


def test_{name}_is_caught_on_{attribute.lower()}() -> None:
    assert Rule.{result.rule.name} in broken_rules(scenario({attribute}), check_versioned_kv)
'''


def broken_rules(sim: Simulation, check: LinearizabilityCheck) -> set[Rule]:
    """Every rule the scenario broke: the monitor's, and the end checks' (the clients'
    open operations end, the history must be linearizable by `check`, state machines agree)."""
    sim.finish()
    sim.check_final_state()
    rules = {v.rule for v in sim.violations}
    if sim.check_linearizable(check, budget_s=CHECK_BUDGET_S).valid is False:
        rules.add(Rule.LINEARIZABILITY)
    return rules
