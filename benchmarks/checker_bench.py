"""Benchmark of the linearizability checker over every published history in the shared corpus.

Prints (and writes to benchmarks/results/checker.md) a table of file, operations, verdict,
seconds, with the totals per corpus beside Porcupine's times measured on this machine kind
(`porcupine_s` in each expected.tsv), plus Porcupine's unpartitioned stress test (the two
10-client kv histories with --no-partition) and Porcupine's kv/c50-bad.txt with every key
checked under per-key budgets. Check time excludes parsing (as Porcupine's benchmarks do);
each file's time is the median of --repeat runs, in CPU seconds of this process (the
checker is single-threaded; CPU time is what stays comparable on a shared, loaded machine).

Also: the six long single keys of ../shared/data/longkeys/ beside Porcupine's time and peak
memory (each in its own process: CPU user+sys and wall of the check, peak RSS), and EDN
reading speed against edn-format on a seeded 7.6 MB Jepsen-style history (same run).

    python benchmarks/checker_bench.py [--repeat 3] [--skip-all-keys] [--only corpus|long|edn] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import edn_format

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from checker import check_linearizable, models  # noqa: E402
from checker.corpus import CORPORA, find_shared_data, load_corpus  # noqa: E402
from histories.edn import read_edn_history, records_from_maps  # noqa: E402
from histories.load import load_history  # noqa: E402
from histories.pairing import pair_operations  # noqa: E402

# Porcupine's reference times for the unpartitioned stress test (from the checker issue).
NO_PARTITION_REFERENCE_S = {"c10-ok.txt": (True, 7.0), "c10-bad.txt": (False, 6.1)}


def _verdict(valid: object) -> str:
    return {True: "valid", False: "invalid"}.get(valid, "unknown")  # type: ignore[call-overload]


def _timed(operations, model, repeat: int, **options) -> tuple[object, float, str]:
    times = []
    result = None
    for _ in range(repeat):
        started = time.process_time()
        result = check_linearizable(operations, model, **options)
        times.append(time.process_time() - started)
    return result.valid, statistics.median(times), result.note  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-all-keys", action="store_true", help="skip the c50-bad --all-keys run (~1 min)")
    parser.add_argument("--only", choices=["corpus", "long", "edn", "e2e", "generated"],
                        help="run one section (the others are left out of the file)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2501, 2502, 2503],
                        help="histgen seeds of the generated 30-client keys (section generated)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "checker.md")
    args = parser.parse_args()
    data = find_shared_data()
    if data is None:
        print("shared corpus not found: set MAO_SHARED_DATA to the shared/data folder", file=sys.stderr)
        return 2

    lines = [
        "# Checker benchmark",
        "",
        f"`python benchmarks/checker_bench.py --repeat {args.repeat}` on {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}. Seconds are the median CPU time of "
        "the check (parsing excluded) per history; Porcupine's are from `expected.tsv` (Go, same machine kind). "
        f"Load average when the run started: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores.",
        "",
    ]
    mismatches: list[str] = []
    summary: list[tuple[str, int, float, float]] = []
    if args.only in (None, "long"):
        lines += _long_keys(data, args.repeat, mismatches)
    if args.only in (None, "e2e"):
        lines += _end_to_end(data, args.repeat, mismatches)
    if args.only in (None, "generated"):
        lines += _generated_keys(args.seeds, mismatches)
    if args.only in (None, "edn"):
        lines += _edn_reading()
    for corpus in CORPORA if args.only in (None, "corpus") else ():
        entries = load_corpus(data, corpus)
        rows = []
        ours_total = 0.0
        theirs_total = 0.0
        for entry in entries:
            records, _ = load_history(entry.path)
            operations = pair_operations(records)
            model = models.by_name(entry.model, entry.init)
            valid, seconds, note = _timed(operations, model, args.repeat, budget_s=60)
            ok = valid == entry.expected_valid
            if not ok:
                mismatches.append(f"{corpus}/{entry.file}: expected {_verdict(entry.expected_valid)}, got {_verdict(valid)} {note}")
            ours_total += seconds
            theirs_total += entry.porcupine_s or 0.0
            rows.append((entry.file, len(operations), _verdict(valid), "yes" if ok else "NO", seconds, entry.porcupine_s))
            print(f"{corpus}/{entry.file:45s} {len(operations):5d} {_verdict(valid):8s} {seconds:9.4f}s", flush=True)
        summary.append((corpus, len(entries), ours_total, theirs_total))
        lines += [
            f"## {corpus} ({len(entries)} histories)",
            "",
            "| file | ops | verdict | matches | seconds | Porcupine s |",
            "|---|---:|---|---|---:|---:|",
        ]
        for file, ops, verdict, ok, seconds, porcupine in rows:
            ref = "" if porcupine is None else f"{porcupine:.6f}"
            lines.append(f"| {file} | {ops} | {verdict} | {ok} | {seconds:.6f} | {ref} |")
        lines += [
            f"| **total** | {sum(r[1] for r in rows)} | | | **{ours_total:.3f}** | **{theirs_total:.3f}** |",
            "",
        ]

    if args.only == "corpus" or args.only is None:
        lines += _stress_sections(data, args, mismatches, summary)
    lines += ["## Totals", "", "| corpus | histories | ours s | Porcupine s | ratio |", "|---|---:|---:|---:|---:|"]
    for corpus, count, ours, theirs in summary:
        ratio = f"{ours / theirs:.1f}x" if theirs else ""
        lines.append(f"| {corpus} | {count} | {ours:.3f} | {theirs:.3f} | {ratio} |")
    lines += [
        "",
        "Knossos (Clojure), for reference from the issue: decides 99 of the 102 etcd histories "
        "(median 37 ms each) and times out at 60 s on etcd_040, etcd_057 and etcd_099.",
        "",
        f"Verdict mismatches: {len(mismatches) or 'none'}",
    ]
    lines += [f"- {m}" for m in mismatches]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[-(len(summary) + 6 + len(mismatches)):]))
    print(f"written to {args.out}")
    return 1 if mismatches else 0


def _stress_sections(data: Path, args: argparse.Namespace, mismatches: list[str], summary: list) -> list[str]:
    lines = [
        "## Unpartitioned stress test (`--no-partition`)",
        "",
        "| file | ops | verdict | matches | seconds | Porcupine s |",
        "|---|---:|---|---|---:|---:|",
    ]
    no_partition_total = 0.0
    for name, (expected, reference) in NO_PARTITION_REFERENCE_S.items():
        records, _ = load_history(data / "porcupine" / "kv" / name)
        operations = pair_operations(records)
        partitioned, part_s, _ = _timed(operations, models.kv(), args.repeat)
        valid, seconds, note = _timed(operations, models.kv(), 1, partition=False, budget_s=120)
        ok = valid == expected and partitioned == expected
        if not ok:
            mismatches.append(f"{name} (--no-partition): expected {_verdict(expected)}, got {_verdict(valid)} {note}")
        no_partition_total += seconds
        print(f"no-partition {name:35s} {len(operations):5d} {_verdict(valid):8s} {seconds:9.4f}s (partitioned {part_s:.4f}s)", flush=True)
        lines.append(f"| {name} (partitioned: {part_s:.4f} s) | {len(operations)} | {_verdict(valid)} | {'yes' if ok else 'NO'} | {seconds:.3f} | {reference} |")
    lines += [f"| **total** | | | | **{no_partition_total:.3f}** | **13.1** |", ""]
    summary.append(("kv c10 unpartitioned", 2, no_partition_total, 13.1))

    if not args.skip_all_keys:
        path = data / "porcupine" / "kv" / "c50-bad.txt"
        operations = pair_operations(load_history(path)[0])
        started = time.perf_counter()
        result = check_linearizable(operations, models.kv(), all_keys=True, budget_s=20, max_memory_mb=512)
        elapsed = time.perf_counter() - started
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        counts = result.counts
        print(f"c50-bad --all-keys: {counts} in {elapsed:.1f}s, peak RSS {peak_mb:.0f} MB", flush=True)
        lines += [
            "## kv/c50-bad.txt with `--all-keys` (20 s and 512 MB per key)",
            "",
            f"{counts['keys_invalid']} keys invalid, {counts['keys_valid']} valid, {counts['keys_unknown']} unknown, "
            f"{elapsed:.1f} s in total, peak RSS of the benchmark process {peak_mb:.0f} MB "
            "(Porcupine: four of the ten keys do not finish in 20 s; its verbose mode grew past 14 GB).",
            "",
            "| key | ops | verdict | seconds | configurations | note |",
            "|---|---:|---|---:|---:|---|",
        ]
        for key in sorted(result.keys, key=lambda k: str(k.key)):
            lines.append(f"| {key.key} | {key.operations} | {_verdict(key.valid)} | {key.seconds:.3f} | {key.explored} | {key.note} |")
        lines.append("")

    return lines


# One long key per child process, so that its peak RSS is its own; the child reports CPU
# (user+sys) and wall time of the check alone, parsing excluded.
_LONG_CHILD = """
import json, resource, sys, time
from checker import check_linearizable, models
from histories.load import load_history
from histories.pairing import pair_operations
path, model = sys.argv[1], sys.argv[2]
operations = pair_operations(load_history(path)[0])
before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
result = check_linearizable(operations, models.by_name(model))
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
print(json.dumps({"valid": result.valid, "cpu": cpu, "wall": wall, "peak_mb": after.ru_maxrss / 1024,
                  "explored": result.keys[0].explored if result.keys else 0, "note": result.note}))
"""


# One `python -m checker check FILE` as a user runs it, and the same phases timed inside one
# process (CPU seconds: start-up = interpreter and site before the first line of the script).
_PHASES_CHILD = """
import json, sys, time
start = time.process_time()
import checker.cli
from checker import check_linearizable, models
from histories.load import load_history
from histories.pairing import pair_operations
imported = time.process_time()
records = load_history(sys.argv[1])[0]
parsed = time.process_time()
operations = pair_operations(records)
paired = time.process_time()
check_linearizable(operations, models.by_name(sys.argv[2]))
checked = time.process_time()
print(json.dumps({"startup": start, "imports": imported - start, "parse": parsed - imported,
                  "pair": paired - parsed, "check": checked - paired}))
"""


def _end_to_end(data: Path, repeat: int, mismatches: list[str]) -> list[str]:
    """Process start, parse and check: `python -m checker check FILE` in a child, wall and CPU
    (user+sys of the child) beside Porcupine's measured time, then where the CPU goes."""
    lines = [
        "## End to end: `python -m checker check FILE` (process start, parse, check)",
        "",
        "Each run a fresh process, as a user runs it (median of the runs). Wall is what a person "
        "waits; on a loaded machine it mostly measures the others, so the CPU of the child "
        "(user+sys) is beside it: on a quiet machine the wall time is about that. Porcupine's time "
        "is its measured check time from `expected.tsv` (Go, same machine kind, unloaded); the "
        "target is 0.5x. The phases are CPU seconds of the same work timed inside one process.",
        "",
        "| file | ops | verdict | wall s | CPU s | Porcupine s | wall vs Porcupine | CPU vs Porcupine "
        "| start-up | imports | parse | pair | check |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in load_corpus(data, "longkeys"):
        walls, cpus, code = [], [], None
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "checker", "check", str(entry.path)],
                                  capture_output=True, text=True, cwd=REPO, timeout=900)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            code = done.returncode
        verdict = {0: "valid", 1: "invalid", 2: "unknown"}.get(code, f"exit {code}")
        if verdict != _verdict(entry.expected_valid):
            mismatches.append(f"e2e longkeys/{entry.file}: expected {_verdict(entry.expected_valid)}, got {verdict}")
        phases = json.loads(subprocess.run([sys.executable, "-c", _PHASES_CHILD, str(entry.path), entry.model],
                                           capture_output=True, text=True, cwd=REPO, timeout=900, check=True).stdout)
        wall, cpu, theirs = statistics.median(walls), statistics.median(cpus), entry.porcupine_s

        def ratio(x: float, theirs: float | None = theirs) -> str:
            return f"{x / theirs:.2f}x" if theirs else "Porcupine undecided"

        print(f"e2e {entry.file:32s} {verdict:8s} wall {wall:6.2f}s cpu {cpu:6.2f}s porcupine {theirs}", flush=True)
        lines.append(
            f"| {entry.file} | {entry.operations} | {verdict} | {wall:.2f} | {cpu:.2f} | "
            f"{'' if theirs is None else f'{theirs:.2f}'} | {ratio(wall)} | {ratio(cpu)} | "
            + " | ".join(f"{phases[k]:.3f}" for k in ("startup", "imports", "parse", "pair", "check")) + " |"
        )
    lines.append("")
    return lines


def _generated_keys(seeds: list[int], mismatches: list[str]) -> list[str]:
    """30-client keys like the shared ones, from tests/checker/histgen.py's hot_key: a stale
    read planted after everything (and its valid twin), and one planted halfway."""
    from tests.checker.histgen import hot_key

    lines = [
        "## Generated 30-client keys (`tests/checker/histgen.py` hot_key, default budgets)",
        "",
        "20,000 and 50,000 operations, 30 clients, about 1% of writes and cas with unknown outcome. "
        "`stale-end`: every client done, a write of v1, a write of v2, a read of v1 (the shared "
        "`-stale` keys' shape); `valid-end` its valid twin (reads v2); `stale-mid`: the same three "
        "halfway, the traffic going on after. CPU seconds of the check (parsing excluded).",
        "",
        "| seed | ops | plant | expected | verdict | CPU s | configurations |",
        "|---:|---:|---|---|---|---:|---:|",
    ]
    model = models.etcd(0)
    for seed in seeds:
        for size in (20_000, 50_000):
            for plant in ("stale-end", "valid-end", "stale-mid"):
                operations = pair_operations(hot_key(seed, clients=30, operations=size, plant=plant))
                started = time.process_time()
                result = check_linearizable(operations, model)
                cpu = time.process_time() - started
                expected = plant == "valid-end"
                if result.valid != expected:
                    mismatches.append(f"generated seed {seed} {size} {plant}: expected {_verdict(expected)}, "
                                      f"got {_verdict(result.valid)} {result.note}")
                print(f"generated seed {seed} {len(operations)} {plant:9s} {_verdict(result.valid)} cpu {cpu:.2f}s", flush=True)
                lines.append(f"| {seed} | {len(operations)} | {plant} | {_verdict(expected)} | "
                             f"{_verdict(result.valid)} | {cpu:.2f} | {result.keys[0].explored} |")
    lines.append("")
    return lines


def _long_keys(data: Path, repeat: int, mismatches: list[str]) -> list[str]:
    folder = data / "longkeys"
    notes = {}
    with open(folder / "expected.tsv", encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            notes[row["file"]] = (row.get("porcupine_peak_mb") or "", row.get("porcupine_note") or "")
    lines = [
        "## Long single keys (`../shared/data/longkeys/`, default budgets: 60 CPU s and 512 MB per key)",
        "",
        "Each history checked in its own process (median of the runs; peak RSS includes reading the "
        "history). CPU is user+sys of the check alone; wall time too, since the machine is shared. "
        "Porcupine's figures are from `expected.tsv` (same machine kind, unloaded).",
        "",
        "| file | ops | verdict | matches | CPU s | wall s | configurations | peak RSS MB | Porcupine s | Porcupine peak MB / outcome | CPU vs Porcupine |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for entry in load_corpus(data, "longkeys"):
        runs = []
        for _ in range(repeat):
            done = subprocess.run(
                [sys.executable, "-c", _LONG_CHILD, str(entry.path), entry.model],
                capture_output=True, text=True, cwd=REPO, timeout=900,
            )
            if done.returncode != 0:
                mismatches.append(f"longkeys/{entry.file}: the check crashed: {done.stderr.strip()[-300:]}")
                break
            runs.append(json.loads(done.stdout))
        if not runs:
            continue
        cpu = statistics.median(r["cpu"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        valid = runs[0]["valid"]
        ok = all(r["valid"] == entry.expected_valid for r in runs)
        if not ok:
            mismatches.append(f"longkeys/{entry.file}: expected {_verdict(entry.expected_valid)}, got {_verdict(valid)} {runs[0]['note']}")
        peak_mb, note = notes.get(entry.file, ("", ""))
        theirs = entry.porcupine_s
        ratio = f"{cpu / theirs:.2f}x" if theirs else "Porcupine undecided"
        print(f"longkeys/{entry.file:32s} {_verdict(valid):8s} cpu {cpu:7.2f}s wall {wall:7.2f}s peak {max(r['peak_mb'] for r in runs):6.0f} MB", flush=True)
        lines.append(
            f"| {entry.file} | {entry.operations} | {_verdict(valid)} | {'yes' if ok else 'NO'} | {cpu:.2f} | {wall:.2f} | "
            f"{runs[0]['explored']} | {max(r['peak_mb'] for r in runs):.0f} | {'' if theirs is None else f'{theirs:.2f}'} | "
            f"{peak_mb + ' MB' if peak_mb else note} | {ratio} |"
        )
    lines.append("")
    return lines


def _write_jepsen_edn(path: Path, target_bytes: int) -> int:
    """A Jepsen-style cas-register history.edn (one op map per line, :time and :index), seeded."""
    rng = random.Random(7)
    in_flight: dict[int, tuple[str, str]] = {}
    index = 0
    clock = 0
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("[")
        while written < target_bytes:
            process = rng.randrange(20)
            clock += rng.randrange(1, 100_000)
            if process in in_flight:
                f, value = in_flight.pop(process)
                kind = rng.choice([":ok", ":ok", ":ok", ":fail", ":info"])
            else:
                f = rng.choice([":read", ":write", ":cas"])
                value = {":read": "nil", ":write": str(rng.randrange(5)), ":cas": f"[{rng.randrange(5)} {rng.randrange(5)}]"}[f]
                in_flight[process] = (f, value)
                kind = ":invoke"
            line = f"{{:type {kind}, :f {f}, :value {value}, :process {process}, :time {clock}, :index {index}}}\n "
            out.write(line)
            written += len(line)
            index += 1
        out.write("]\n")
    return index


def _edn_reading() -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "history.edn"
        records = _write_jepsen_edn(path, 7_600_000)
        size_mb = path.stat().st_size / 1e6
        text = path.read_text(encoding="utf-8")
        started = time.process_time()
        fast = read_edn_history(path)
        fast_s = time.process_time() - started
        started = time.process_time()
        maps = edn_format.loads_all(text)[0]  # the reader before: edn-format for everything
        slow = records_from_maps(list(maps), path=str(path))
        slow_s = time.process_time() - started
    same = fast == slow
    print(f"EDN {size_mb:.1f} MB: fast {fast_s:.2f}s, edn-format {slow_s:.2f}s, same records: {same}", flush=True)
    return [
        "## Reading EDN (a seeded 7.6 MB Jepsen-style history.edn, same run)",
        "",
        "| reader | records | CPU s | MB/s |",
        "|---|---:|---:|---:|",
        f"| edn-format for everything (before) | {len(slow)} | {slow_s:.2f} | {size_mb / slow_s:.2f} |",
        f"| histories.edn_reader, edn-format as fallback (now) | {len(fast)} | {fast_s:.2f} | {size_mb / fast_s:.2f} |",
        "",
        f"{slow_s / fast_s:.1f}x faster; identical records: {'yes' if same else 'NO'} ({records} ops maps).",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
