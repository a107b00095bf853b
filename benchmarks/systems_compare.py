"""Our store and etcd under the same harness, side by side (issue 23, Deliver 3).

    python benchmarks/systems_compare.py [--duration 300] [--seeds 1-5]
        [--systems store,etcd] [--platforms local,docker] [--out benchmarks/results/systems.md]

For each system, platform and seed, one at a time, it runs

    python -m nemesis run --system S --platform P --faults partition,kill,pause,member
                          --duration D --seed N

and reads the run folder it made (nemesis/report/data.py: the history's operations and the
nemesis's fault windows; results.json: the verdict) for: the verdict and exit code; ok / fail
/ info operations; availability, acknowledged operations per second inside fault windows
and outside them; and for each fault, the time from its start to the first acknowledged
write after it (median and max per run). It writes a table with one row per run and a
summary row per system and platform (medians across seeds) to --out.

Ctrl-C stops the current run (the harness tears its cluster down on SIGINT) and writes
what was measured so far beside --out as `<name>.partial.md`, saying so; --out itself is
only written by a complete comparison.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tabulate import tabulate  # noqa: E402

from benchmarks.kvbench.machine import load_average  # noqa: E402
from nemesis.report.data import RunData, load_run, verdict_sentence  # noqa: E402

FAULTS = "partition,kill,pause,member"
# A write is a put or delete, conditional or not (OpPoint.f calls conditional ones "cas").
WRITES = ("put", "delete", "cas")
EXIT_WORDS = {0: "valid", 1: "invalid", 2: "unknown", 3: "harness error"}
# The harness names the run folder as it makes it ("run folder: X") and again at the end
# ("... Run folder: X", "run folder (partial): X"), so an interrupted run still has one.
RUN_FOLDER = re.compile(r"run folder(?: \(partial\))?: (\S+)", re.IGNORECASE)


@dataclass
class FaultRecovery:
    """One fault window and the first acknowledged write invoked at or after its start."""

    label: str
    fault: str  # partition, kill, pause, member
    start_s: float
    to_first_write_s: float | None  # None: no write was acknowledged after it in the run


@dataclass
class RunMeasure:
    """What one run folder says, in the comparison's terms."""

    run_dir: Path
    system: str
    system_version: str
    verdict: str  # valid | invalid | unknown | crashed (nemesis/report/data.py)
    counts: dict[str, int]  # ok / fail / info over the workload's operations
    workload_s: float  # first record to the heal that ended the workload
    inside_s: float  # time covered by at least one fault window
    ok_inside: int  # acknowledged (ok) operations completed inside a fault window
    ok_outside: int
    recoveries: list[FaultRecovery] = field(default_factory=list)
    sentence: str = ""  # the report's verdict sentence
    reproduce: str = ""

    @property
    def outside_s(self) -> float:
        return max(0.0, self.workload_s - self.inside_s)

    @property
    def rate_inside(self) -> float | None:
        return self.ok_inside / self.inside_s if self.inside_s > 0 else None

    @property
    def rate_outside(self) -> float | None:
        return self.ok_outside / self.outside_s if self.outside_s > 0 else None

    @property
    def recovery_times(self) -> list[float]:
        return [r.to_first_write_s for r in self.recoveries if r.to_first_write_s is not None]

    @property
    def recovery_median(self) -> float | None:
        times = self.recovery_times
        return statistics.median(times) if times else None

    @property
    def recovery_max(self) -> float | None:
        times = self.recovery_times
        return max(times) if times else None

    @property
    def fault_kinds(self) -> dict[str, int]:
        """How many windows of each fault (the nemesis deals a different mix per system:
        the store's leader faults are also aimed at its snapshot and rejoin windows)."""
        kinds: dict[str, int] = {}
        for r in self.recoveries:
            kinds[r.fault] = kinds.get(r.fault, 0) + 1
        return dict(sorted(kinds.items()))

    @property
    def without_write(self) -> int:
        """Faults after whose start no write was acknowledged at all."""
        return sum(r.to_first_write_s is None for r in self.recoveries)


def workload_end_s(data: RunData) -> float:
    """When the workload ended: the nemesis's heal-all record, written after the clients
    stopped and before the final reads (which are no measure of availability). A run cut
    short before its heal ends with its history."""
    for record in data.records:
        if not record.is_client and record.f == "heal-all":
            return data._seconds(record)
    return data.duration_s


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def measure(run_dir: Path) -> RunMeasure:
    """The comparison's figures for one stored run folder.

    Availability counts operations by their completion (when the acknowledgement came) in
    [0, workload end]: inside if some fault window covers that moment. A window never ended
    by its own event is cut at the workload's end. The time to the first write after a fault
    counts only writes *invoked* at or after the fault's start — one invoked just before
    was likely committed before the fault took effect and says nothing about recovery — that
    were acknowledged and applied (a conditional write whose version did not match is `ok`
    but wrote nothing)."""
    data = load_run(run_dir)
    end = workload_end_s(data)
    applied = {op.call: (op.completion.applied if op.completion is not None else None)
               for op in data.operations}
    points = [p for p in data.points if p.start_s < end]  # not the final reads
    counts = {"ok": 0, "fail": 0, "info": 0}
    for point in points:
        counts[point.outcome] += 1
    windows = [(w.start_s, min(w.end_s, end)) for w in data.windows if w.start_s < end]
    inside_s = _union_length([(s, e) for s, e in windows if e > s])
    ok_inside = ok_outside = 0
    for point in points:
        if point.outcome != "ok" or point.end_s is None or point.end_s > end:
            continue
        if any(s <= point.end_s < e for s, e in windows):
            ok_inside += 1
        else:
            ok_outside += 1
    writes = sorted((p for p in points if p.outcome == "ok" and p.f in WRITES
                     and p.end_s is not None and p.end_s <= end
                     and applied.get(p.call) is not False), key=lambda p: p.start_s)
    recoveries = []
    for window in data.windows:
        if window.start_s >= end:
            continue
        after = [p.end_s for p in writes if p.start_s >= window.start_s]
        recoveries.append(FaultRecovery(
            label=window.label, fault=window.fault, start_s=window.start_s,
            to_first_write_s=min(after) - window.start_s if after else None))
    name, version = data.system
    return RunMeasure(run_dir=Path(run_dir), system=name, system_version=version,
                      verdict=data.verdict, counts=counts, workload_s=end, inside_s=inside_s,
                      ok_inside=ok_inside, ok_outside=ok_outside, recoveries=recoveries,
                      sentence=verdict_sentence(data),
                      reproduce=str(data.test.get("reproduce", "")))


# ----- running the harness -------------------------------------------------------------


@dataclass
class RunOutcome:
    system: str
    platform: str
    seed: int
    command: list[str]
    exit_code: int | None  # None: interrupted before it ended
    run_dir: Path | None
    measure: RunMeasure | None = None
    error: str | None = None  # why it could not be measured


def harness_command(system: str, platform: str, seed: int, duration_s: float) -> list[str]:
    return ["python", "-m", "nemesis", "run", "--system", system, "--platform", platform,
            "--faults", FAULTS, "--duration", f"{duration_s:g}", "--seed", str(seed)]


def run_harness(command: list[str], prefix: str) -> tuple[int | None, Path | None, bool]:
    """Runs one harness command, echoing its lines; returns (exit code, run folder,
    interrupted). The harness runs in its own session so that Ctrl-C reaches it exactly
    once, forwarded from here: its first SIGINT tears the cluster down, later ones would be
    ignored anyway."""
    child = subprocess.Popen([sys.executable, *command[1:]], cwd=REPO_ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, bufsize=1)
    run_dir: Path | None = None
    interrupted = False
    assert child.stdout is not None
    while True:
        try:
            for line in child.stdout:
                print(f"{prefix}{line.rstrip()}", flush=True)
                found = RUN_FOLDER.search(line)
                if found:
                    path = Path(found.group(1))
                    run_dir = path if path.is_absolute() else REPO_ROOT / path
            child.wait()
            break
        except KeyboardInterrupt:
            if not interrupted:
                interrupted = True
                print(f"{prefix}Ctrl-C: stopping this run (the harness tears its cluster down) ...",
                      flush=True)
                if child.poll() is None:
                    child.send_signal(signal.SIGINT)
    return (None if interrupted else child.returncode), run_dir, interrupted


# ----- the table -----------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def run_row(outcome: RunOutcome) -> list[str]:
    m = outcome.measure
    folder = str(outcome.run_dir.relative_to(REPO_ROOT) if outcome.run_dir
                 and outcome.run_dir.is_relative_to(REPO_ROOT) else outcome.run_dir or "-")
    head = [outcome.system, outcome.platform, str(outcome.seed)]
    if m is None:
        word = "interrupted" if outcome.exit_code is None else EXIT_WORDS.get(
            outcome.exit_code, "?")
        code = "-" if outcome.exit_code is None else str(outcome.exit_code)
        return head + [f"{word} ({code}); not measured: {outcome.error}"] + ["-"] * 8 + [folder]
    no_write = f" ({m.without_write} none)" if m.without_write else ""
    return head + [
        f"{m.verdict} ({outcome.exit_code})",
        f"{m.counts['ok']}", f"{m.counts['fail']}", f"{m.counts['info']}",
        f"{len(m.recoveries)}: " + ", ".join(f"{k} {n}" for k, n in m.fault_kinds.items())
        if m.recoveries else "0",
        _num(m.rate_outside), _num(m.rate_inside),
        _seconds(m.recovery_median), _seconds(m.recovery_max) + no_write, folder]


def summary_row(system: str, platform: str, outcomes: list[RunOutcome]) -> list[str]:
    measured = [o for o in outcomes if o.measure is not None]
    verdicts: dict[str, int] = {}
    for o in outcomes:
        word = o.measure.verdict if o.measure else (
            "interrupted" if o.exit_code is None else "not measured")
        verdicts[word] = verdicts.get(word, 0) + 1
    ms = [o.measure for o in measured]

    def med(values: list[float | None], fmt) -> str:  # noqa: ANN001
        value = _median(values)
        return fmt(value) if value is not None else "-"

    no_write = sum(m.without_write for m in ms)
    return [system, platform, f"median of {len(ms)}",
            ", ".join(f"{n} {w}" for w, n in sorted(verdicts.items())),
            med([m.counts["ok"] for m in ms], lambda v: f"{v:g}"),
            med([m.counts["fail"] for m in ms], lambda v: f"{v:g}"),
            med([m.counts["info"] for m in ms], lambda v: f"{v:g}"),
            med([len(m.recoveries) for m in ms], lambda v: f"{v:g}"),
            med([m.rate_outside for m in ms], _num), med([m.rate_inside for m in ms], _num),
            med([m.recovery_median for m in ms], _seconds),
            med([m.recovery_max for m in ms], _seconds)
            + (f" ({no_write} none in all)" if no_write else ""), ""]


HEADERS = ["system", "platform", "seed", "verdict (exit)", "ok", "fail", "info", "faults",
           "ack/s outside faults", "ack/s inside faults", "fault→write median s",
           "fault→write max s", "run folder"]


def render(outcomes: list[RunOutcome], *, command: str, load_before: str, load_after: str,
           versions: dict[str, str], duration_s: float, complete: bool, note: str = "") -> str:
    lines = ["# Our store and etcd under the harness", ""]
    if not complete:
        lines += [f"**PARTIAL: {note}** Only the runs in the table below were measured.", ""]
    lines += [
        f"Made by `{command}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
        f"UTC ({os.cpu_count()} cores; load average before {load_before}, "
        f"after {load_after}).",
        "",
        "Each run: `python -m nemesis run --system S --platform P --faults " + FAULTS
        + f" --duration {duration_s:g} --seed N` (5 nodes, the nemesis at its default "
        "`--interval 10`, the kv workload at its defaults), one at a time. The workload "
        "offers 100 operations per second over all clients (`--rate 100`), so about 100 ack/s "
        "outside faults is the offered load, not either system's capacity; availability here "
        "is how much of it was served.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".",
        "",
        "- **verdict (exit)**: the checkers' verdict and the harness's exit code "
        "(0 valid, 1 invalid, 2 unknown, 3 the harness did not finish).",
        "- **ok / fail / info**: the workload's operations by outcome (final reads excluded).",
        "- **ack/s outside / inside faults**: acknowledged (ok) operations per second, by "
        "completion time, over the time covered by no fault window / by at least one "
        "(windows as the history's nemesis events record them, cut at the workload's end).",
        "- **fault→write**: for each fault window, seconds from its start to the completion of "
        "the first write (put, delete, conditional or not, applied) invoked at or after its "
        "start; median and max over the run's faults; `none`: a fault after which no write "
        "was acknowledged in the run (not counted as 0).",
        "- **faults**: fault windows in the run, by kind. The same seed does not deal the same "
        "faults to both systems: on the store the nemesis also aims leader faults at "
        "snapshot transfers and member rejoins (docs/nemesis.md, Windows), which etcd does "
        "not report. Summary rows: medians across seeds of the per-run figures.",
        "",
    ]
    rows: list[list[str]] = []
    groups: dict[tuple[str, str], list[RunOutcome]] = {}
    for o in outcomes:
        groups.setdefault((o.system, o.platform), []).append(o)
    for (system, platform), group in groups.items():
        rows += [run_row(o) for o in group]
        rows.append(summary_row(system, platform, group))
    lines.append(tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True))
    findings = [o for o in outcomes if o.measure and o.measure.verdict != "valid"]
    if findings:
        lines += ["", "## Runs that were not valid", ""]
        for o in findings:
            m = o.measure
            assert m is not None
            lines += [f"- {o.system} on {o.platform}, seed {o.seed}: {m.sentence}",
                      f"  run folder `{o.run_dir}`; reproduce: `{m.reproduce}`"]
    lines.append("")
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    """"1-5" or "1,3,7" (or both: "1-3,7")."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = (int(x) for x in part.split("-", 1))
            if high < low:
                raise argparse.ArgumentTypeError(f"seed range {part!r} runs backwards")
            seeds += range(low, high + 1)
        elif part:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def _names(allowed: tuple[str, ...]):  # noqa: ANN202
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return names
    return parse


def versions_of(outcomes: list[RunOutcome]) -> dict[str, str]:
    """System name -> its version(s) as the run folders record them (several if the
    runs span commits)."""
    seen: dict[str, list[str]] = {}
    for o in outcomes:
        if o.measure is not None and o.measure.system_version not in seen.setdefault(
                o.measure.system, []):
            seen[o.measure.system].append(o.measure.system_version)
    return {name: " and ".join(found) for name, found in seen.items()}


def tabulate_stored(run_dirs: list[Path], out: Path, command: str) -> int:
    """The table of run folders made before (by this script or by hand). The exit code is
    the one the harness returns for the folder's verdict (nemesis/runner.py finish_run);
    the machine's load during those runs is not known here and the file says so."""
    codes = {"valid": 0, "invalid": 1, "unknown": 2, "crashed": 3}
    outcomes, durations = [], set()
    for run_dir in run_dirs:
        run_dir = run_dir.resolve()
        m = measure(run_dir)
        config = load_run(run_dir).test.get("config") or {}
        durations.add(config.get("duration_s"))
        outcomes.append(RunOutcome(m.system, str(config.get("platform")),
                                   int(config.get("seed") or 0), [], codes[m.verdict],
                                   run_dir, m))
    order = {"store": 0, "etcd": 1, "local": 0, "docker": 1}
    outcomes.sort(key=lambda o: (order.get(o.system, 9), order.get(o.platform, 9), o.seed))
    unknown = "not known (tabulated from stored run folders; see each run's own output)"
    duration = durations.pop() if len(durations) == 1 else None
    text = render(outcomes, command=command, load_before=unknown, load_after=unknown,
                  versions=versions_of(outcomes), duration_s=duration or 0, complete=True)
    if duration is None:
        text = text.replace(" --duration 0 ", " --duration (varies) ")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    print(f"written to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1-5"),
                        help="e.g. 1-5 or 1,3 (default 1-5)")
    parser.add_argument("--systems", type=_names(("store", "etcd")), default=["store", "etcd"])
    parser.add_argument("--platforms", type=_names(("local", "docker")),
                        default=["local", "docker"])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/systems.md")
    parser.add_argument("--measure", type=Path, nargs="+", metavar="RUN_DIR",
                        help="run nothing: tabulate these stored run folders (e.g. the runs of "
                             "several invocations, or after a change of a definition here)")
    args = parser.parse_args(argv)
    command = "python benchmarks/systems_compare.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    if args.measure:
        return tabulate_stored(args.measure, args.out, command)
    plan = [(s, p, n) for s in args.systems for p in args.platforms for n in args.seeds]
    load_before = load_average()
    outcomes: list[RunOutcome] = []
    interrupted = False
    for i, (system, platform, seed) in enumerate(plan, 1):
        cmd = harness_command(system, platform, seed, args.duration)
        tag = f"[{i}/{len(plan)} {system} {platform} seed {seed}]"
        print(f"{tag} {shlex.join(cmd)}  (load {load_average()})", flush=True)
        code, run_dir, stopped = run_harness(cmd, "    ")
        outcome = RunOutcome(system, platform, seed, cmd, code, run_dir)
        outcomes.append(outcome)
        if stopped:
            outcome.error = "interrupted by Ctrl-C"
            print(f"{tag} interrupted; run folder {run_dir or '(none made)'}", flush=True)
            interrupted = True
            break
        if run_dir is None or not (run_dir / "history.jsonl").exists():
            outcome.error = "the harness named no run folder with a history"
        else:
            try:
                outcome.measure = measure(run_dir)
            except Exception as exc:  # noqa: BLE001 - one unreadable run must not lose the rest
                outcome.error = f"{type(exc).__name__}: {exc}"
        m = outcome.measure
        print(f"{tag} exit {code}: " + (
            f"{m.verdict}, ok {m.counts['ok']} fail {m.counts['fail']} info {m.counts['info']}, "
            f"ack/s outside {_num(m.rate_outside)} inside {_num(m.rate_inside)}, "
            f"fault→write median {_seconds(m.recovery_median)} max {_seconds(m.recovery_max)}"
            f" ({m.without_write} without a write); {run_dir}"
            if m else f"not measured: {outcome.error}"), flush=True)
    load_after = load_average()
    versions = versions_of(outcomes)
    out = args.out
    note = ""
    if interrupted:
        done = sum(o.measure is not None for o in outcomes)
        note = (f"interrupted by Ctrl-C during run {len(outcomes)} of {len(plan)}; "
                f"{done} runs measured, the interrupted one and {len(plan) - len(outcomes)} "
                f"not started are not.")
        out = out.with_name(out.stem + ".partial.md")
    text = render(outcomes, command=command, load_before=load_before, load_after=load_after,
                  versions=versions, duration_s=args.duration, complete=not interrupted,
                  note=note)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    if interrupted:
        print(f"PARTIAL: {note} Written to {out}; {args.out} left as it was.")
        return 130
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
