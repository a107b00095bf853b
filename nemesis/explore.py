"""`python -m nemesis explore --platform sim --runs N`: many simulated runs, settings drawn.

What it is for: one `run` tests one configuration; bugs hide in the ones nobody picked
(swarm testing, as system/sim/swarm.py does for the bare core). Each run here draws its
own fault mix, cluster size, client count and pace, fault interval, operation timeout,
read consistency and length from its seed (`KNOBS`, one line each), and is an ordinary
`nemesis run --platform sim` (runner.run: same run folder, same checkers), so every
finding is reproduced by the single `run` line printed for it. Failures are grouped by
signature (`signature`: the checkers that failed and the anomaly kinds, plus any safety
rule the simulator's monitor saw); the first run of each new signature is shrunk by
nemesis/shrink.py into a pytest file.

    explore folder: store/explore/<timestamp>/
        runs/kv/<timestamp>/   each run's folder (valid ones removed unless --keep-valid:
                               a few MB each, and their seed and line reproduce them)
        tests/test_*.py        one generated test per distinct signature (canaries only)
        shrink-<seed>.txt      what the shrinker printed
        explore.json           every run's seed, settings, verdict, signature; the summary

Seeds: run i (from 0) has seed `--seed + i`, so `--seed 301 --runs 5` is seeds 301-305,
and each knob draws from its own generator (`explore:<seed>:<knob>`): a knob added later
does not change what the others draw for a seed.

What it must never do: decide a verdict itself (the run's checkers do), or count a harness
error or an unknown verdict as a violation.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from nemesis.check import EXIT_HARNESS, EXIT_INVALID, EXIT_UNKNOWN, EXIT_VALID
from nemesis.store import new_run_dir, read_json, write_json


@dataclass(frozen=True)
class Knob:
    """One setting a run draws: the `run` flag it is, the RunConfig field it sets, how it is
    drawn from the knob's own generator, and how `--set FLAG=VALUE` reads it."""

    flag: str
    field: str
    draw: Callable[[random.Random], Any]
    parse: Callable[[str], Any] = float


def sim_faults() -> list[str]:
    """Every fault the sim platform runs (a fault added to nemesis/faults.py joins the draw),
    but those outside Raft's model (`BEYOND_RAFT`): the monitor would report what they do
    as a broken rule, and the shrinker cannot replay them."""
    from nemesis.faults import BEYOND_RAFT, FAULTS, unsupported

    return [f for f in FAULTS if f != "none" and f not in BEYOND_RAFT
            and unsupported([f], "sim") is None]


def _fault_mix(rng: random.Random) -> list[str]:
    """Each fault in with even odds (at least one): some runs get one kind, some all."""
    faults = sim_faults()
    return [f for f in faults if rng.random() < 0.5] or [rng.choice(faults)]


# Workload mixes a run draws from (`--mix`): the default (every kind, every version
# class), reads against few writes, compare-and-swap and delete churn (keys deleted and
# re-created often), and plain puts and gets (Jepsen's register).
MIXES = ("get=20,stale-get=10,put=15,cas=30,delete=10,cas-delete=15,replay=5",
         "get=50,stale-get=20,put=10,cas=10,delete=5,cas-delete=5",
         "get=10,put=5,cas=40,delete=15,cas-delete=30",
         "get=50,put=50")


def _mix(rng: random.Random) -> dict[str, int]:
    from workloads.kv import parse_mix

    return parse_mix(rng.choice(MIXES))


def _parse_mix(text: str) -> dict[str, int]:
    from workloads.kv import parse_mix

    return parse_mix(text)


# A new knob is one line here (and the `run` flag it names).
KNOBS: tuple[Knob, ...] = (
    Knob("faults", "faults", _fault_mix, lambda text: text.split(",")),
    Knob("nodes", "nodes", lambda r: r.choice((3, 5, 7)), int),
    Knob("concurrency", "concurrency", lambda r: r.choice((2, 5, 10)), int),
    # 0: as fast as each client goes (a write in flight at every fault: no-dedup needs it)
    Knob("rate", "rate", lambda r: r.choice((0.0, 50.0, 200.0))),
    Knob("interval", "interval_s", lambda r: r.choice((1.0, 2.0, 5.0))),
    Knob("op-timeout", "op_timeout_s", lambda r: r.choice((1.0, 3.0))),
    Knob("read-consistency", "read_consistency",
         lambda r: r.choice(("linearizable", "linearizable", "linearizable", "stale")), str),
    # Short runs, many of them: a simulated second costs up to a wall second on a loaded
    # machine (more clients, more nodes and rate 0 cost most).
    Knob("duration", "duration_s", lambda r: r.choice((5.0, 10.0, 20.0))),
    Knob("mix", "mix", _mix, _parse_mix),
)
KNOB_BY_FLAG = {k.flag: k for k in KNOBS}


def draw(seed: int, pinned: dict[str, Any]) -> dict[str, Any]:
    """The settings of run `seed` (RunConfig fields); `pinned` (by flag) wins over the draw."""
    settings = {}
    for knob in KNOBS:
        rng = random.Random(f"explore:{seed}:{knob.flag}")
        settings[knob.field] = pinned[knob.flag] if knob.flag in pinned else knob.draw(rng)
    return settings


def parse_pins(items: list[str]) -> dict[str, Any]:
    """`--set FLAG=VALUE` items; ValueError names what is wrong."""
    pins: dict[str, Any] = {}
    for item in items:
        flag, sep, text = item.partition("=")
        flag = flag.strip().lstrip("-")
        if not sep or flag not in KNOB_BY_FLAG:
            raise ValueError(f"--set {item!r}: expected FLAG=VALUE with FLAG one of "
                             f"{', '.join(KNOB_BY_FLAG)}")
        try:
            pins[flag] = KNOB_BY_FLAG[flag].parse(text)
        except ValueError:
            raise ValueError(f"--set {item!r}: {text!r} is not a valid {flag}") from None
    if "faults" in pins:
        unknown = [f for f in pins["faults"] if f not in (*sim_faults(), "none")]
        if unknown:
            raise ValueError(f"--set faults: {', '.join(unknown)} not run by the sim platform "
                             f"(it runs {', '.join(sim_faults())})")
    return pins


# ----- signatures --------------------------------------------------------------------------


def signature(results: dict[str, Any], run_dir: Path) -> str:
    """What failed, as a short stable name: each checker that failed with the kind of its
    earliest anomaly (`linearizability:stale-read`, `lost-writes:lost-write`), and the
    first safety rule the simulator's monitor saw (`invariant:exactly-once`: the rules it
    saw after the first mostly follow from it), joined by `+`; "" if nothing failed.
    One kind per checker keeps the count of distinct signatures meaningful: a run of a
    canary breaks many keys, each in its own way."""
    from system.sim.invariants import Rule

    parts = []
    monitor = (results.get("sim") or {}).get("monitor_violations") or []
    if monitor:
        text = monitor[0].partition("] ")[2]
        rule = next((r for r in Rule if text.startswith(r.value + ":")), None)
        parts.append(f"invariant:{(rule.name if rule else 'unknown').lower().replace('_', '-')}")
    lin = results.get("linearizable") or {}
    if lin.get("valid") is False:
        parts.append(f"linearizability:{_lin_kind(lin, run_dir)}")
    lost = results.get("lost_writes") or {}
    if lost.get("valid") is False:
        anomalies = sorted(lost.get("anomalies") or [], key=lambda a: min(
            (op["invoke_index"] for op in a.get("operations") or []), default=0))
        parts.append(f"lost-writes:{anomalies[0]['kind']}" if anomalies else "lost-writes")
    if (results.get("replicas_agree") or {}).get("valid") is False:
        parts.append("replicas:replica-diverged")
    if (results.get("replays") or {}).get("valid") is False:
        parts.append("replays:answered-differently")
    if (results.get("stale_read_states") or {}).get("valid") is False:
        parts.append("stale-reads:unwritten-state")
    if (results.get("nodes_stay_up") or {}).get("valid") is False:
        parts.append("crashes:node-crashed")
    if (results.get("safety_reports") or {}).get("valid") is False:
        parts.append("safety-reports:committed-log-diverged")
    return "+".join(sorted(parts))


def _lin_kind(lin: dict[str, Any], run_dir: Path) -> str:
    """The kind of the earliest counterexample, from the operation it cannot place: a read
    older than the write before it (stale-read), another bad read (read), a write or a
    compare-and-swap whose version does not follow (write, cas)."""
    from histories.read import read_operations

    blocked = [k["counterexample"] for k in lin.get("keys", [])
               if k.get("valid") is False and k.get("counterexample")]
    if not blocked:
        return "invalid"  # a budget or a malformed history: no counterexample to classify
    example = min(blocked, key=lambda c: c["blocking"]["op"]["invoke_index"])
    ops = {op.id: op for op in read_operations(run_dir / "history.jsonl",
                                               allow_truncated_tail=True)}
    op = ops.get(example["blocking"]["op"]["id"])
    if op is None:
        return "invalid"
    if op.f != "get":
        return "cas" if op.expected_version is not None else "write"
    last = example.get("last_write")
    before = ops.get(last["id"]) if last else None
    return "stale-read" if before is not None and (op.version or 0) < (before.version or 0) \
        else "read"


# ----- the exploration ---------------------------------------------------------------------


@dataclass
class Outcome:
    index: int
    seed: int
    settings: dict[str, Any]
    code: int
    signature: str
    reproduce: str
    run_dir: str
    wall_s: float
    simulated_s: float = 0.0
    steps: int = 0
    note: str = ""  # a harness error's line


@dataclass
class Finding:
    """A distinct signature: its first run, how often it came, and its shrunk test."""

    signature: str
    first: Outcome
    runs: int = 1
    test: str = ""
    shrink_note: str = ""


@dataclass
class Exploration:
    runs: int
    seed: int
    unsafe: str | None
    store: Path
    budget_s: float | None = None
    tests_out: Path | None = None
    keep_valid: bool = False
    shrink: bool = True
    pinned: dict[str, Any] = field(default_factory=dict)
    check_budget_s: float = 60.0  # run's default: the reproduce line leaves it out


WORD = {EXIT_VALID: "valid", EXIT_INVALID: "INVALID", EXIT_UNKNOWN: "unknown",
        EXIT_HARNESS: "HARNESS ERROR"}


def explore(plan: Exploration, out=None) -> int:  # noqa: ANN001 - a text stream
    """Every run, then the summary; returns 1 if any run found a violation, else 3 if any
    run was a harness error, else 0 (unknown verdicts are counted, not failed)."""
    from nemesis.runner import _Terminate as Terminated  # SIGTERM during a run

    out = out if out is not None else sys.stdout
    folder = new_run_dir(plan.store, "explore", point_latest=False)
    what = f"--unsafe {plan.unsafe}" if plan.unsafe else "the safe store"
    seeds = f"seeds {plan.seed}..{plan.seed + plan.runs - 1}"
    print(f"exploring {what} on the simulator: {plan.runs} runs, {seeds}"
          + (f", budget {plan.budget_s:g} s" if plan.budget_s else "") + f"; folder {folder}",
          file=out, flush=True)
    started = time.monotonic()
    outcomes: list[Outcome] = []
    findings: dict[str, Finding] = {}
    interrupted = False
    for index in range(plan.runs):
        if plan.budget_s is not None and time.monotonic() - started >= plan.budget_s:
            print(f"budget of {plan.budget_s:g} s reached after {index} runs", file=out,
                  flush=True)
            break
        try:
            outcome = _one_run(plan, folder, index)
        except (KeyboardInterrupt, Terminated):
            print(f"interrupted during run {index + 1}; the summary covers the runs before it",
                  file=out, flush=True)
            interrupted = True
            break
        outcomes.append(outcome)
        print(_progress_line(outcome, plan.runs, time.monotonic() - started), file=out,
              flush=True)
        if outcome.signature in findings:
            findings[outcome.signature].runs += 1
        elif outcome.signature:
            finding = findings[outcome.signature] = Finding(outcome.signature, outcome)
            if plan.shrink:
                _shrink(finding, plan, folder, out)
        if not outcome.signature and not plan.keep_valid and outcome.code == EXIT_VALID:
            shutil.rmtree(outcome.run_dir, ignore_errors=True)
    wall = time.monotonic() - started
    for line in summary_lines(outcomes, findings, wall):
        print(line, file=out)
    write_json(folder / "explore.json", {
        "runs": [o.__dict__ for o in outcomes], "unsafe": plan.unsafe, "seed": plan.seed,
        "wall_s": round(wall, 1), "pinned": plan.pinned,
        "findings": [{"signature": f.signature, "runs": f.runs, "first_seed": f.first.seed,
                      "reproduce": f.first.reproduce, "run_dir": f.first.run_dir,
                      "test": f.test, "shrink_note": f.shrink_note}
                     for f in findings.values()]})
    print(f"explore folder: {folder}", file=out, flush=True)
    if findings:
        return EXIT_INVALID
    harness_errors = interrupted or any(o.code == EXIT_HARNESS for o in outcomes)
    return EXIT_HARNESS if harness_errors else EXIT_VALID


def _one_run(plan: Exploration, folder: Path, index: int) -> Outcome:
    from nemesis.runner import RunConfig, run

    seed = plan.seed + index
    settings = draw(seed, plan.pinned)
    config = RunConfig(argv=[], platform="sim", platform_reason=f"explore run {index + 1}",
                       workload="kv", seed=seed, store=folder / "runs", unsafe=plan.unsafe,
                       check_budget_s=plan.check_budget_s, write_report=False, **settings)
    config.argv = config.reproduce().split()
    began = time.monotonic()
    console = io.StringIO()
    code = run(config, out=console)
    run_dir = (folder / "runs" / "latest").resolve()
    results_path = run_dir / "results.json"
    results = read_json(results_path) if results_path.exists() else {}
    sim = results.get("sim") or {}
    note = ""
    if code != EXIT_VALID:  # what a person opens first (a valid run's folder is removed)
        from nemesis.report import after_run

        after_run(run_dir)
    if results.get("harness_error") == "interrupted":
        raise KeyboardInterrupt  # Ctrl-C or SIGTERM during the run: the exploration stops
    if code == EXIT_HARNESS:
        note = next((line for line in console.getvalue().splitlines()
                     if line.startswith("harness error")), "harness error (see harness.log)")
    return Outcome(index=index, seed=seed, settings=settings, code=code,
                   signature=signature(results, run_dir) if code != EXIT_HARNESS else "",
                   reproduce=config.reproduce(), run_dir=str(run_dir),
                   wall_s=round(time.monotonic() - began, 2),
                   simulated_s=sim.get("simulated_s", 0.0), steps=sim.get("steps", 0), note=note)


def mix_text(settings: dict[str, Any]) -> str:
    return (f"{','.join(settings['faults'])} n={settings['nodes']} c={settings['concurrency']} "
            f"rate={settings['rate']:g} int={settings['interval_s']:g}s "
            f"{settings['duration_s']:g}s")


def _progress_line(o: Outcome, total: int, elapsed: float) -> str:
    verdict = o.signature or WORD.get(o.code, str(o.code))
    if o.signature and o.code != EXIT_INVALID:  # the monitor alone saw it
        verdict += f" (history {WORD.get(o.code, o.code)})"
    line = (f"run {o.index + 1}/{total} seed {o.seed} {mix_text(o.settings)}: {verdict} "
            f"({o.wall_s:.1f} s, total {elapsed:.0f} s)")
    return line + (f" - {o.note}" if o.note else "")


def _shrink(finding: Finding, plan: Exploration, folder: Path, out) -> None:  # noqa: ANN001
    """The first run of a new signature, shrunk by nemesis/shrink.py into a test."""
    from nemesis.shrink import EXIT_SHRUNK, ShrinkRefused, shrink_run

    first = finding.first
    tests = folder / "tests"
    tests.mkdir(exist_ok=True)
    name = f"test_{(plan.unsafe or 'safe').replace('-', '_')}_seed_{first.seed}.py"
    log_path = folder / f"shrink-{first.seed}.txt"
    print(f"  new signature {finding.signature}: shrinking seed {first.seed} ...", file=out,
          flush=True)
    began = time.monotonic()
    text = io.StringIO()
    try:
        code = shrink_run(Path(first.run_dir), tests / name, text)
    except ShrinkRefused as exc:
        code, finding.shrink_note = EXIT_HARNESS, str(exc)
    log_path.write_text(text.getvalue(), encoding="utf-8")
    if (tests / name).exists():
        finding.test = str(tests / name)
        if plan.tests_out is not None:
            plan.tests_out.mkdir(parents=True, exist_ok=True)
            finding.test = str(shutil.copy(tests / name, plan.tests_out / name))
    if code != EXIT_SHRUNK and not finding.shrink_note:
        lines = [line.strip() for line in text.getvalue().splitlines() if line.strip()]
        notes = [line for line in lines if line.startswith("note:")]  # why not verified
        finding.shrink_note = (notes or lines or [f"shrink exited {code}"])[-1]
    took = time.monotonic() - began
    print(f"  {'test: ' + finding.test if finding.test else 'no test'} ({took:.0f} s"
          + (f"; {finding.shrink_note}" if finding.shrink_note else "") + f"; log {log_path})",
          file=out, flush=True)


def summary_lines(outcomes: list[Outcome], findings: dict[str, Finding], wall: float) -> list[str]:
    counts = {code: sum(o.code == code for o in outcomes) for code in WORD}
    violating = sum(bool(o.signature) for o in outcomes)
    totals = [["runs", len(outcomes)],
              ["simulated s", round(sum(o.simulated_s for o in outcomes), 1)],
              ["simulated steps", sum(o.steps for o in outcomes)],
              ["wall s", round(wall, 1)],
              ["valid / invalid / unknown / harness error",
               " / ".join(str(counts[c]) for c in WORD)],
              ["runs with a violation", violating],
              ["distinct signatures", len(findings)]]
    lines = ["", tabulate(totals, tablefmt="simple")]
    if findings:
        rows = [[f.signature, f.runs, f.first.seed, mix_text(f.first.settings),
                 _short(f.test) if f.test else "-" + (f" ({f.shrink_note})" if f.shrink_note
                                                      else "")]
                for f in findings.values()]
        lines += ["", tabulate(rows, headers=["signature", "runs", "first seed", "its settings",
                                              "shrunk test"], tablefmt="simple"), ""]
        lines += [f"reproduce {f.signature}: {f.first.reproduce}" for f in findings.values()]
    errors = [o for o in outcomes if o.code == EXIT_HARNESS]
    if errors:
        lines += ["", f"harness errors in {len(errors)} run(s); first: seed {errors[0].seed}: "
                      f"{errors[0].note}; reproduce: {errors[0].reproduce}"]
    return lines


def _short(path: str) -> str:
    """`path` relative to the working directory when it is inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def refuse_unsafe(unsafe: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The one-line refusal of `--unsafe` without MAO_ALLOW_UNSAFE=1, else None."""
    from system.kv.unsafe import ALLOW_ENV_VAR

    env = os.environ if environ is None else environ
    if unsafe and env.get(ALLOW_ENV_VAR) != "1":
        return (f"--unsafe {unsafe} runs a deliberately broken store; set {ALLOW_ENV_VAR}=1 "
                f"to explore it")
    return None
