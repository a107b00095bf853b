"""Elections while the store takes its largest default value, on an idle and a loaded machine.

    python benchmarks/large_value_elections.py [--puts 10] [--hogs 0,8] [--value-mib 16]

For each `--hogs` figure (busy-loop processes started beside the cluster: a machine with
no spare CPU), starts a 3-node cluster of the store with its default settings (tick 20 ms,
election timeout 0.5-1 s, value limit 16 MiB), puts `--puts` values of `--value-mib` MiB,
and prints one table row: the terms of every node before and after (a term change is an
election), the leader changes, each put's latency (median / max) and the load average
seen during the puts (min / max of the 1-minute figure).

Why a benchmark and not a test: a 16 MiB value is copied several times on each node's
event loop (parse, encode, frame, fsync, apply: about a second of loop time on a busy
2-core machine), and the loop that copies it is the one that sends heartbeats, so whether
a follower's election timer fires first depends on how much CPU the machine has to spare
— a timing figure (issue 22; docs/kv-node.md, "Message sizes"). The test suite keeps what
holds at any load: the puts succeed, every replica gets the value, one byte more is
refused unread (tests/kv/test_node_large_values.py). Every process it starts is killed at
the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tabulate import tabulate  # noqa: E402

from system.kv.local_cluster import LocalCluster  # noqa: E402
from system.trainer.procs import cpu_hog  # noqa: E402


class LoadSampler:
    """The 1-minute load average, sampled every 0.5 s while running."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self.samples.append(os.getloadavg()[0])
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def span(self) -> str:
        return f"{min(self.samples):.1f}-{max(self.samples):.1f}"


def _terms(cluster: LocalCluster) -> dict[str, int]:
    """Every node's term, each asked again until it answers (a busy node may be slow)."""
    terms = {}
    for node in cluster.ids:
        deadline = time.monotonic() + 60
        while (status := cluster.status(node, timeout_s=5)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} did not answer Status within 60 s")
        terms[node] = status.term
    return terms


def one_run(hogs: int, puts: int, value_bytes: int, work: Path) -> dict:
    value = bytes(range(256)) * (value_bytes // 256)
    with cpu_hog(hogs), LocalCluster(3, work) as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=60)
        with cluster.client(timeout_s=300) as kv:
            kv.put("warm", b"up")
            leader = cluster.leader()
            terms = _terms(cluster)
            latencies, leaders = [], {leader}
            with LoadSampler() as load:
                for i in range(puts):
                    started = time.monotonic()
                    kv.put(f"big/{i % 2}", value)
                    latencies.append(time.monotonic() - started)
                    leaders.add(cluster.leader())
                    print(f"  hogs {hogs}: put {i + 1}/{puts} in {latencies[-1]:.2f} s", flush=True)
            after = _terms(cluster)
    return {"hogs": hogs, "load": load.span(),
            "terms": f"{max(terms.values())} -> {max(after.values())}",
            "elections": max(after.values()) - max(terms.values()),
            "leaders": len(leaders - {None}),
            "put s median / max": f"{statistics.median(latencies):.2f} / {max(latencies):.2f}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/large_value_elections.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=10)
    parser.add_argument("--hogs", default="0,8", help="busy loops per row, comma-separated")
    parser.add_argument("--value-mib", type=int, default=16, help="default: the store's limit")
    args = parser.parse_args(argv)
    rows = []
    for hogs in (int(h) for h in args.hogs.split(",")):
        with tempfile.TemporaryDirectory(prefix="mao-large-values-") as work:
            print(f"3 nodes, {args.puts} puts of {args.value_mib} MiB beside {hogs} busy loops ...",
                  flush=True)
            rows.append(one_run(hogs, args.puts, args.value_mib * 1024 * 1024, Path(work)))
    print(f"\n{os.cpu_count()} cores; default node settings (election timeout 0.5-1 s)")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
