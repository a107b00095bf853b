"""Does the harness catch every canary, and pass the safe store? The matrix of issue 7.

    python -m benchmarks.canaries [--seeds 5] [--platforms docker,local] [--duration 60]
        [--valid-duration 120] [--only canaries|valid] [--out benchmarks/results/canaries.md]

For each canary (`--unsafe NAME`, the store's deliberately broken variants) and platform,
runs `python -m nemesis run` with the faults that expose it for `--seeds` seeds and counts
the runs that exit 1 (invalid); for each platform, runs the safe store under
partition,kill,pause on 5 nodes and counts the runs that exit 0. Reports the median time
from the start of the history to the first operation a checker names. Writes a Markdown
table; each run's folder stays under the store directory for inspection.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tabulate import tabulate

from nemesis import check

REPO = Path(__file__).resolve().parents[1]
# The faults that expose each canary (issue 7: "find the fault schedule that exposes it").
CANARY_FAULTS = {
    "ack-before-commit": "partition",  # an isolated leader acknowledges what never commits
    "stale-read": "partition",  # a cut-off node answers reads from its old state
    "no-dedup": "pause,kill",  # a write retried after its leader froze or died applies twice
    "skips-fsync": "lose-unsynced",  # a power loss of every node drops acknowledged, unsynced writes
}
# Workload settings a canary needs besides its faults. no-dedup shows only when a write is
# in flight at the moment its leader freezes or dies; at the default 100 ops/s about one
# write is, and 60 s runs caught it in 1 to 3 of 5 seeds; clients going as fast as they can
# keep one write in flight per client (3 of 3 caught in the trial that chose this).
CANARY_ARGS = {"no-dedup": ["--rate", "0"]}
SAFE_FAULTS = "partition,kill,pause"
# The trainer's canaries (system/trainer/unsafe.py) under `--workload trainer`: each needs a
# coordinator that loses its lease while alive (a pause past it) or a write whose answer
# is lost (workloads/trainer.py: the faults that land inside a checkpoint write).
TRAINER_CANARY_FAULTS = {
    "no-fencing": "pause",  # paused mid-write (coordinator-mid-write), it wakes and puts past its successor
    "no-request-id": "partition",  # coordinator-reply-lost: the retry of a committed write gets a new id
    "write-after-lease-loss": "pause",  # a coordinator paused past its lease flushes its state
    # The harness's default faults: the first three go to the trainer's windows (a kill in the
    # checkpoint write, the renewal, the takeover), which is where these show.
    "lease-by-put": "partition,kill",  # its first take is a plain put
    "shared-request-ids": "partition,kill",  # the successor rewrites the killed writer's step
    "stale-resume": "partition,kill",  # any takeover after checkpoints committed
}
TRAINER_SAFE_FAULTS = "kill,pause,partition"


def one_run(platform: str, faults: str, seed: int, duration: float, nodes: int,
            unsafe: str | None, store: Path, log, workload: str = "kv",  # noqa: ANN001
            interval: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "nemesis", "run", "--platform", platform, "--faults", faults,
           "--duration", f"{duration:g}", "--nodes", str(nodes), "--seed", str(seed),
           "--store", str(store), "--workload", workload]
    if interval is not None:
        cmd += ["--interval", f"{interval:g}"]
    if unsafe:
        cmd += ["--unsafe", unsafe, *CANARY_ARGS.get(unsafe, [])]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          timeout=duration * 4 + 300, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.monotonic() - started
    log.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    log.flush()
    run_dir = (store / "latest").resolve()
    first = None
    broken: list[str] = []
    if proc.returncode == check.EXIT_INVALID:
        results = check.check_run(run_dir)
        first = check.first_violation_s(results, run_dir)
        broken = [p for p, v in (results.get("properties") or {}).items() if v is False]
    return {"code": proc.returncode, "wall_s": wall, "first_violation_s": first,
            "run_dir": str(run_dir), "broken": broken}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.canaries", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--platforms", default="docker,local")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--valid-duration", type=float, default=120.0)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--only", choices=("canaries", "valid"), default=None)
    parser.add_argument("--variants", default=None,
                        help="canaries to run (comma list; default all of the workload's)")
    parser.add_argument("--workload", choices=("kv", "trainer"), default="kv",
                        help="kv: the store's canaries; trainer: the trainer's (--workload trainer)")
    parser.add_argument("--interval", type=float, default=None,
                        help="--interval of every run (default: the harness's)")
    parser.add_argument("--store", type=Path, default=Path("/tmp/mao-canaries/store"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/canaries.md")
    args = parser.parse_args(argv)
    canary_faults = TRAINER_CANARY_FAULTS if args.workload == "trainer" else CANARY_FAULTS
    safe_faults = TRAINER_SAFE_FAULTS if args.workload == "trainer" else SAFE_FAULTS
    if args.variants is None:
        args.variants = ",".join(canary_faults)
    platforms = [p for p in args.platforms.split(",") if p]
    args.store.mkdir(parents=True, exist_ok=True)
    log = (args.store.parent / "canaries.log").open("a", encoding="utf-8")
    rows = []
    plan = []
    if args.only != "valid":
        wanted = [v for v in args.variants.split(",") if v]
        unknown = set(wanted) - set(canary_faults)
        if unknown:
            parser.error(f"unknown canary {', '.join(sorted(unknown))}; known: {', '.join(canary_faults)}")
        plan += [(name, canary_faults[name], args.duration) for name in wanted]
    if args.only != "canaries":
        plan += [(None, safe_faults, args.valid_duration)]
    started = time.monotonic()
    for unsafe, faults, duration in plan:
        for platform in platforms:
            runs = []
            for seed in range(1, args.seeds + 1):
                r = one_run(platform, faults, seed, duration, args.nodes, unsafe, args.store, log,
                            args.workload, args.interval)
                runs.append(r)
                print(f"[{time.monotonic() - started:6.0f}s] {unsafe or 'safe'} {platform} "
                      f"seed {seed}: exit {r['code']} ({r['wall_s']:.0f} s)"
                      + (f", first violation at {r['first_violation_s']:.1f} s"
                         if r["first_violation_s"] is not None else ""), flush=True)
            codes = [r["code"] for r in runs]
            firsts = [r["first_violation_s"] for r in runs if r["first_violation_s"] is not None]
            wanted = check.EXIT_INVALID if unsafe else check.EXIT_VALID
            hits = sum(c == wanted for c in codes)
            safe = "none (safe trainer)" if args.workload == "trainer" else "none (safe store)"
            caught = ""
            if unsafe and args.workload == "trainer":
                caught = " (" + ", ".join(sorted({p for r in runs for p in r.get("broken", [])})) + ")"
            rows.append([
                (unsafe or safe) + caught, platform,
                " ".join([faults, *CANARY_ARGS.get(unsafe or "", [])]), f"{duration:g}",
                f"{hits}/{len(runs)} {'caught' if unsafe else 'valid'}",
                f"{statistics.median(firsts):.1f}" if firsts else "-",
                " ".join(str(c) for c in codes),
            ])
    table = tabulate(rows, headers=["variant", "platform", "faults", "run s", "result",
                                    "median s to first violation", "exit codes (seeds 1..)"],
                     tablefmt="github")
    load = os.getloadavg()
    text = (f"# Canary matrix (issue 7)\n\n"
            f"`python -m benchmarks.canaries --workload {args.workload} --seeds {args.seeds} "
            f"--platforms {args.platforms} "
            + (f"--interval {args.interval:g} " if args.interval is not None else "") +
            f"--duration {args.duration:g} --valid-duration {args.valid_duration:g}` "
            f"({args.nodes} nodes, default concurrency and rate; load average at the end "
            f"{load[0]:.1f}). A canary row counts runs that exited 1 (invalid); the safe row "
            f"counts runs that exited 0 (valid). Seconds to the first violation are measured "
            f"from the history's first record to the completion of the earliest operation a "
            f"checker names.\n\n{table}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.only and args.out.exists():
        # Keep the other half of the matrix: append this half's table under its own heading.
        text = args.out.read_text() + f"\n## {args.only}\n\n{table}\n"
    args.out.write_text(text, encoding="utf-8")
    print(table)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
