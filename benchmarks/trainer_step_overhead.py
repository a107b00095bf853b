"""A trainer step's overhead: CPU per step of the coordinator and of each worker beyond the
gradient arithmetic, context switches per step, and steps/s of 2 workers against the
single-process loop, measured in one run. Used by trainer_bench.py (its step rows).

    python benchmarks/trainer_step_overhead.py [--quick]

Per size (rows a step in total, split over 2 workers): the single-process loop runs first
(`local.py`, one shard holding every training row, the whole batch in one gradient), then a
fault-free `TrainerRun` (1 coordinator, 2 workers, checkpoint every 100 steps, inline).
Its processes' CPU (/proc/<pid>/stat utime+stime, every thread) and context switches
(/proc/<pid>/task/*/status, voluntary + nonvoluntary, every thread) are read twice while it
trains, so start-up and the final grace period are outside the window; the step count
comes from the coordinator's Status at each reading. The arithmetic's CPU per step is
measured in this process on the same shards: a worker's `gradient` (batch positions,
gather, gradient sum) and the coordinator's `apply_step` (fixed-order sum, momentum step).
CPU time is robust under load; steps/s is not: the single-process loop runs right before
and right after the distributed run (the mean of the two), and the table adds the ratio
the CPU allows on 2 idle cores (single-process CPU per step against the distributed run's
total over 2 cores), which the load does not move.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import system.trainer  # noqa: E402, F401, I001  (one BLAS thread, before numpy loads)

from system.trainer import data, local  # noqa: E402
from system.trainer.config import TrainConfig  # noqa: E402
from system.trainer.run import TrainerRun  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Size:
    dataset: str
    rows_per_step: int  # in total, over the 2 workers
    steps: int
    synthetic_rows: int = 1_000_000


@dataclass
class Overhead:
    size: Size
    single_steps_s: float
    single_ms: float  # CPU per step of the single-process loop
    dist_steps_s: float
    coordinator_ms: float  # CPU per step
    worker_ms: list[float]
    coordinator_ctx: float  # context switches per step
    worker_ctx: list[float]
    worker_math_ms: float  # CPU per step of one worker's gradient
    coordinator_math_ms: float  # CPU per step of apply_step
    load: tuple[float, float]  # load average at the start and the end


def proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) of a process, every thread."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended between the listing and the read
            continue
    return cpu, switches


def config_for(size: Size, workers: int, job: str, steps: int | None = None) -> TrainConfig:
    return TrainConfig(dataset=size.dataset, workers=workers, steps=steps or size.steps,
                       batch_size=size.rows_per_step // workers, learning_rate=0.05,
                       synthetic_rows=size.synthetic_rows, checkpoint_every=100, job=job)


def single_process(size: Size, steps: int) -> tuple[float, float]:
    """(steps/s, CPU ms per step) of the single-process loop."""
    one = config_for(size, 1, "baseline")
    dataset = data.load(one)
    shard = local.WorkerShard(one, 0, dataset)
    state = local.initial_state(one, dataset)
    shard.gradient(state.params, 1)  # warm the permutation cache
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        local.apply_step(one, state, {0: shard.gradient(state.params, step)})
    return steps / (time.perf_counter() - start), 1000 * (time.process_time() - cpu) / steps


def arithmetic(size: Size, steps: int) -> tuple[float, float]:
    """(CPU ms per step of one worker's gradient (of 2), CPU ms per step of the
    coordinator's apply_step (2 gradients))."""
    one = config_for(size, 1, "baseline")
    dataset = data.load(one)
    two = config_for(size, 2, "baseline")
    shards = [local.WorkerShard(two, w, dataset if size.dataset != "synthetic" else None) for w in range(2)]
    state = local.initial_state(two, dataset)
    n = max(50, steps // 4)
    grad_cpu = apply_cpu = 0.0
    for step in range(1, n + 1):
        t0 = time.process_time()
        grads = {s.worker: s.gradient(state.params, step) for s in shards}
        t1 = time.process_time()
        local.apply_step(two, state, grads)
        apply_cpu += time.process_time() - t1
        grad_cpu += t1 - t0
    return 1000 * grad_cpu / (2 * n), 1000 * apply_cpu / n


def measure(size: Size, job: str, say=print) -> Overhead:  # noqa: ANN001
    load0 = os.getloadavg()[0]
    worker_math, coord_math = arithmetic(size, min(size.steps, 2000))
    # The single-process loop right before and right after the distributed run: the mean
    # of the two meets about the load the distributed run met.
    first_rate, first_ms = single_process(size, min(size.steps, 2000))
    config = config_for(size, 2, job)
    with TrainerRun(config, standbys=0, lease_s=5.0) as run:
        run.start()
        first = run.wait_until(lambda: (s if (s := run.status()) and s.active and s.step >= 20 else None),
                               300, "the run's step 20")
        names = [run.active_coordinator() or first.coordinator_id, "w0", "w1"]
        pids = [run.procs[n].pid for n in names]
        before = [proc_usage(p) for p in pids]
        st0 = run.status()
        t0 = time.monotonic()
        target = st0.step + int(0.8 * (size.steps - st0.step))
        st1 = run.wait_until(lambda: (s if (s := run.status()) and s.step >= target else None),
                             900, f"step {target}", poll_s=0.2)
        after = [proc_usage(p) for p in pids]
        t1 = time.monotonic()
        run.wait_finished(900)
    last_rate, last_ms = single_process(size, min(size.steps, 2000))
    steps = st1.step - st0.step
    cpu = [1000 * (a[0] - b[0]) / steps for a, b in zip(after, before, strict=True)]
    ctx = [(a[1] - b[1]) / steps for a, b in zip(after, before, strict=True)]
    return Overhead(size, (first_rate + last_rate) / 2, (first_ms + last_ms) / 2, steps / (t1 - t0),
                    cpu[0], cpu[1:], ctx[0], ctx[1:], worker_math, coord_math,
                    (load0, os.getloadavg()[0]))


SIZES_FULL = [Size("digits", 128, 3000), Size("digits", 256, 3000),
              Size("synthetic", 65_536, 300, synthetic_rows=262_144)]
SIZES_QUICK = [Size("digits", 128, 1500), Size("synthetic", 65_536, 120, synthetic_rows=262_144)]


def table(results: list[Overhead], say=print) -> None:  # noqa: ANN001
    say("\n| rows a step (2 workers) | coordinator CPU / step: total (arithmetic) | worker CPU / step: "
        "each (arithmetic) | context switches / step: coordinator, workers | steps/s: 1 process, "
        "2 workers | ratio | CPU bound of the ratio | load average |")
    say("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        s = r.size
        say(f"| {s.rows_per_step:,} {s.dataset} ({s.rows_per_step // 2:,} each) "
            f"| {r.coordinator_ms:.3f} ms ({r.coordinator_math_ms:.3f}) "
            f"| {', '.join(f'{w:.3f}' for w in r.worker_ms)} ms ({r.worker_math_ms:.3f}) "
            f"| {r.coordinator_ctx:.1f}, {', '.join(f'{c:.1f}' for c in r.worker_ctx)} "
            f"| {r.single_steps_s:,.0f}, {r.dist_steps_s:,.0f} | {r.dist_steps_s / r.single_steps_s:.2f}x "
            f"| {cpu_bound(r):.2f}x | {r.load[0]:.1f} -> {r.load[1]:.1f} |")


def cpu_bound(r: Overhead) -> float:
    """The highest ratio the CPU allows on 2 otherwise idle cores: the single-process loop's
    CPU per step against the distributed run's (all three processes), shared by 2 cores
    with no waiting. Robust under load, unlike the measured ratio."""
    return r.single_ms / ((r.coordinator_ms + sum(r.worker_ms)) / 2)


def run_all(quick: bool, say=print) -> list[Overhead]:  # noqa: ANN001
    results = [measure(size, f"step-{size.dataset}-{size.rows_per_step}", say)
               for size in (SIZES_QUICK if quick else SIZES_FULL)]
    table(results, say)
    return results


if __name__ == "__main__":
    run_all("--quick" in sys.argv[1:])
