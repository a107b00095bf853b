"""Lease depositions in a fault-free trainer run beside a CPU hog.

    python benchmarks/trainer_lease_bench.py [--steps 4000] [--hogs 16] [--runs 1] [--proxies]

Starts `--hogs` busy-loop processes (a CPU hog: nothing but `while True: pass`), then a
whole trainer job on this machine (its own 3-node store, one coordinator and a standby,
the workers), with no fault at all, and prints per run: depositions (`deposed` events:
a coordinator that stepped down — a lapsed or lost lease with nothing killed or paused),
takeovers, steps reached, skipped gradients, whether the final parameters equal the
single-process reference bit for bit, the wall time and the load average seen during the
run (min / max of the 1-minute figure, sampled every 0.5 s). For each deposition, the
renewal history of the coordinator that lost its lease: how long its last renewals took
from invoke to answer and how long it had been since its last successful one — which is
what tells a slow store round trip from a renewer that did not run. And the renewals'
round trips (invoke -> answer: median, 99th percentile, max) against their budget: a
renewal is sent RENEW_FRACTION of the lease after the last one and must be answered within
HOLDER_FRACTION of the lease of that one's sending (lease.py: 0.1 and 0.8, so 0.7 lease,
1.4 s at the default 2 s; 0.4 lease before issue 22, 0.5 before issue 25).

`--proxies` puts a TCP proxy (nemesis/platforms/tcp_proxy.py, threads in this process)
between each coordinator and each store node, as the nemesis's trainer workload does
(workloads/trainer.py): the path a harness run's renewals take.

The figure is a timing figure: it depends on the machine and everything else running on
it, so it is a benchmark, not a test (docs/trainer.md, "leases under load"). Every
process it starts — hogs, trainer, store — is killed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import system.trainer  # noqa: E402, F401, I001  (one BLAS thread, before numpy loads)

from system.trainer.config import TrainConfig  # noqa: E402
from system.trainer.lease import HOLDER_FRACTION, RENEW_FRACTION  # noqa: E402
from system.trainer.local import train_local  # noqa: E402
from system.trainer.procs import cpu_hog  # noqa: E402
from system.trainer.run import TrainerRun  # noqa: E402

def renewal_story(events: list[dict], coordinator: str, until: float) -> str:
    """The last renewals of `coordinator` before `until`: invoke -> answer durations and
    the gap since its last successful one."""
    mine = [e for e in events if e.get("coordinator_id") == coordinator and e["kind"] == "lease-write"
            and e["time"] <= until + 5]
    invoked: dict[str, float] = {}
    lines, last_ok = [], None
    for e in mine:
        if e["phase"] == "invoke":
            invoked[e["request_id"]] = e["time"]
        elif e["request_id"] in invoked:
            took = e["time"] - invoked[e["request_id"]]
            lines.append(f"{e['detail']} {e['phase']}{'/' + e['outcome'] if e.get('outcome') else ''} "
                         f"after {took:.2f}s")
            if e["phase"] == "ok":
                last_ok = e["time"]
    since = f"; last ok renewal {until - last_ok:.2f}s before" if last_ok else ""
    pending = [rid for rid in invoked if not any(x.get("request_id") == rid and x["phase"] != "invoke"
                                                    for x in mine)]
    waiting = f"; {len(pending)} renewal(s) never answered" if pending else ""
    return ", ".join(lines[-4:]) + since + waiting


class ProxiedRun(TrainerRun):
    """Each coordinator reaches each store node through its own TcpProxy, by node id (the
    trainer workload's arrangement)."""

    def coordinator_kv(self, cid: str) -> str:
        from nemesis.platforms.tcp_proxy import TcpProxy

        assert self.cluster is not None
        proxies = {node: TcpProxy(spec.address) for node, spec in self.cluster.specs.items()}
        self.proxies = getattr(self, "proxies", []) + list(proxies.values())
        return ",".join(f"{node}={proxy.address}" for node, proxy in proxies.items())

    def worker_kv(self) -> str:
        assert self.cluster is not None
        return ",".join(f"{node}={spec.address}" for node, spec in self.cluster.specs.items())

    def close(self) -> None:
        super().close()
        for proxy in getattr(self, "proxies", []):
            proxy.close()


def renewal_round_trips(events: list[dict]) -> list[float]:
    invoked = {e["request_id"]: e["time"] for e in events
               if e["kind"] == "lease-write" and e["detail"] == "renew" and e["phase"] == "invoke"}
    return sorted(e["time"] - invoked[e["request_id"]] for e in events
                  if e["kind"] == "lease-write" and e["detail"] == "renew" and e["phase"] != "invoke"
                  and e["request_id"] in invoked)


def one_run(config: TrainConfig, lease_s: float, timeout_s: float, proxies: bool = False) -> dict:
    loads: list[float] = []
    next_sample = [0.0]

    def finished_sampling(run: TrainerRun) -> bool:
        now = time.monotonic()
        if now >= next_sample[0]:
            loads.append(os.getloadavg()[0])
            next_sample[0] = now + 0.5
        return run.finished()

    started = time.monotonic()
    with (ProxiedRun if proxies else TrainerRun)(config, standbys=1, lease_s=lease_s) as run:
        run.start()
        run.wait_until(lambda: finished_sampling(run), timeout_s, "the run to finish")
        latest = run.wait_finished(60)
        events = run.events()
    wall_s = time.monotonic() - started
    deposed = [e for e in events if e["kind"] == "deposed"]
    reference = train_local(config)
    trips = renewal_round_trips(events)
    return {
        "renewals": trips,
        "depositions": len(deposed),
        "takeovers": sum(e["kind"] == "lease-acquired" for e in events) - 1,
        "steps": latest.checkpoint.step,
        "skipped": sum(e["kind"] == "skip" for e in events),
        "bit_equal": latest.checkpoint.params.tobytes() == reference.params.tobytes(),
        "wall_s": wall_s,
        "load": (min(loads), max(loads)) if loads else (float("nan"), float("nan")),
        "why": [f"{e['coordinator_id']} at step {e['step']} ({e.get('detail')}): "
                f"{renewal_story(events, e['coordinator_id'], e['time'])}" for e in deposed],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--hogs", type=int, default=16, help="busy-loop processes beside the run")
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--proxies", action="store_true", help="coordinators reach the store through TCP proxies")
    args = parser.parse_args()
    config = TrainConfig(dataset=args.dataset, workers=args.workers, steps=args.steps, batch_size=32,
                         learning_rate=0.05, checkpoint_every=100, job="lease-bench")
    print(f"{args.dataset}, {args.workers} workers, {args.steps} steps, lease {args.lease_s:g} s, "
          f"{args.hogs} busy-loop processes on {os.cpu_count()} cores"
          f"{', coordinators through TCP proxies' if args.proxies else ''}; load average before: "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    with cpu_hog(args.hogs):
        for n in range(1, args.runs + 1):
            r = one_run(dataclasses.replace(config, job=f"lease-bench-{os.getpid()}-{n}"),
                        args.lease_s, args.timeout_s, args.proxies)
            print(f"run {n}: depositions {r['depositions']}, takeovers {r['takeovers']}, "
                  f"steps {r['steps']}, skipped gradients {r['skipped']}, "
                  f"bit-for-bit equal to the reference: {'yes' if r['bit_equal'] else 'NO'}, "
                  f"wall {r['wall_s']:.0f} s, load average {r['load'][0]:.1f}-{r['load'][1]:.1f}",
                  flush=True)
            trips = r["renewals"]
            if trips:
                budget = (HOLDER_FRACTION - RENEW_FRACTION) * args.lease_s
                print(f"  renewal round trips: {len(trips)}, median {1000 * trips[len(trips) // 2]:.0f} ms, "
                      f"p99 {1000 * trips[int(len(trips) * 0.99)]:.0f} ms, max {1000 * trips[-1]:.0f} ms; "
                      f"over the {budget:.1f} s budget: {sum(t > budget for t in trips)}", flush=True)
            for line in r["why"]:
                print(f"  deposed: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
