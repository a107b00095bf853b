"""Which faults make a harness run catch each broken Raft core? The matrix of issue 21.

    MAO_ALLOW_UNSAFE=1 python -m benchmarks.core_variants [--platform sim] [--seeds 2401-2405]
        [--variants votes-twice,...] [--faults "partition,kill;pause;kill-all"]
        [--duration 30] [--interval 3] [--safe] [--store DIR]

For each variant (`--unsafe NAME`, system/raft/unsafe.py) and each fault mix (`;` between
mixes), runs `python -m nemesis run` at each seed and counts the runs that exit 1
(invalid), with the median seconds to the first violation (benchmarks/canaries.py's
measure). `--safe` adds the real store under the same mixes and seeds (counts exit 0).
Prints one line per run as it ends and a Markdown table at the end; every run's folder
stays under the store directory for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tabulate import tabulate

from benchmarks.canaries import one_run
from nemesis import check
from system.kv.unsafe import ALLOW_ENV_VAR
from system.raft.unsafe import VARIANTS

# Variants that break only liveness (a cluster that stops making progress, never a wrong
# answer): the harness is not expected to call their runs invalid.
LIVENESS_ONLY = ("skips-pre-vote",)


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core_variants",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("sim", "local", "docker"), default="sim")
    parser.add_argument("--seeds", default="2401-2405", help="FIRST-LAST (default %(default)s)")
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in LIVENESS_ONLY))
    parser.add_argument("--faults", default="partition,kill;pause;kill-all;lose-unsynced",
                        help="fault mixes, ';' between them (default %(default)s)")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--safe", action="store_true", help="also the real store, same mixes")
    parser.add_argument("--store", type=Path, default=Path("/tmp/mao-core-variants/store"))
    args = parser.parse_args(argv)
    if os.environ.get(ALLOW_ENV_VAR) != "1":
        parser.error(f"the runs use broken Raft cores; set {ALLOW_ENV_VAR}=1 to run them")
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"unknown variant {', '.join(sorted(unknown))}; known: {', '.join(VARIANTS)}")
    mixes = [m for m in args.faults.split(";") if m]
    args.store.mkdir(parents=True, exist_ok=True)
    log = (args.store.parent / f"core-variants-{args.platform}.log").open("a", encoding="utf-8")
    rows = []
    started = time.monotonic()
    for unsafe in [*variants, *([None] if args.safe else [])]:
        for faults in mixes:
            runs = []
            for seed in _seeds(args.seeds):
                try:
                    r = one_run(args.platform, faults, seed, args.duration, args.nodes, unsafe,
                                args.store, log, interval=args.interval)
                except subprocess.TimeoutExpired as exc:  # a starved machine: say so, go on
                    r = {"code": "timeout", "wall_s": exc.timeout, "first_violation_s": None}
                r.update(_replicas(r))
                runs.append(r)
                print(f"[{time.monotonic() - started:6.0f}s] {unsafe or 'safe'} {faults} seed "
                      f"{seed}: exit {r['code']} ({r['wall_s']:.0f} s)"
                      + (f", first violation at {r['first_violation_s']:.1f} s"
                         if r["first_violation_s"] is not None else "")
                      + (f", invalid by {'+'.join(r['invalid_by'])}" if r["invalid_by"] else "")
                      + (f", {r['stuck']} replica(s) never caught up" if r["stuck"] else ""),
                      flush=True)
            wanted = check.EXIT_INVALID if unsafe else check.EXIT_VALID
            firsts = [r["first_violation_s"] for r in runs if r["first_violation_s"] is not None]
            rows.append([unsafe or "none (safe store)", faults,
                         f"{sum(r['code'] == wanted for r in runs)}/{len(runs)} "
                         f"{'caught' if unsafe else 'valid'}",
                         f"{statistics.median(firsts):.1f}" if firsts else "-",
                         f"{sum('replicas' in r['invalid_by'] for r in runs)}/{len(runs)}",
                         f"{sum(bool(r['stuck']) for r in runs)}/{len(runs)}",
                         " ".join(str(r["code"]) for r in runs)])
    print(f"\n{args.platform}, seeds {args.seeds}, --duration {args.duration:g} "
          f"--interval {args.interval:g}, {args.nodes} nodes\n")
    print(tabulate(rows, headers=["variant", "faults", "result", "median s to first violation",
                                  "replica-diverged", "a replica never caught up", "exit codes"],
                   tablefmt="github"))
    return 0


def _replicas(run: dict) -> dict:
    """Which checkers found the run invalid, and how many replicas never caught up
    (checker/replicas.py: reported, not invalid), from the run's results.json."""
    path = Path(run.get("run_dir") or "") / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"invalid_by": [], "stuck": 0}
    names = {"linearizable": "lin", "lost_writes": "lost", "replicas_agree": "replicas"}
    invalid_by = [short for name, short in names.items()
                  if (results.get(name) or {}).get("valid") is False]
    stuck = ((results.get("replicas_agree") or {}).get("counts") or {}).get("lagging_nodes", 0)
    return {"invalid_by": invalid_by, "stuck": stuck}


if __name__ == "__main__":
    sys.exit(main())
