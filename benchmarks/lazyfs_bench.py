"""What the lazy disk costs: acknowledged puts per second of a 3-node local cluster with
and without `lazy_disk` (the same clients, the same duration, one after the other).

    python -m benchmarks.lazyfs_bench [--seconds 20] [--clients 8] [--platform local]

A quick figure, not a benchmark suite: every write goes through a Python FUSE process,
so the layer's own overhead per write and per fsync is what the ratio shows.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

from nemesis.platforms.base import ClusterConfig, Platform
from system.kv.client import KVClient


def _platform(kind: str, config: ClusterConfig) -> Platform:
    if kind == "docker":
        from nemesis.platforms.docker import DockerPlatform

        return DockerPlatform(config)
    from nemesis.platforms.local import LocalPlatform

    return LocalPlatform(config)


def measure(kind: str, lazy: bool, seconds: float, clients: int, value_size: int) -> float:
    with TemporaryDirectory(prefix="lazyfs-bench-") as tmp:
        config = ClusterConfig(nodes=3, run_id=f"bench-{uuid.uuid4().hex[:6]}",
                               work_dir=Path(tmp), lazy_disk=lazy)
        platform = _platform(kind, config)
        try:
            platform.start()
            deadline = time.monotonic() + 90
            while platform.ready() is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no leader: {platform.describe()}")
                time.sleep(0.1)
            counts = [0] * clients
            stop = time.monotonic() + seconds
            value = b"v" * value_size

            def run(i: int) -> None:
                with KVClient(platform.client_addresses, timeout_s=30.0) as kv:
                    n = 0
                    while time.monotonic() < stop:
                        kv.put(f"c{i}-{n % 100}", value)
                        n += 1
                    counts[i] = n

            threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(counts) / (time.monotonic() - t0)
        finally:
            platform.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("local", "docker"), default="local")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--value-size", type=int, default=100)
    args = parser.parse_args()
    plain = measure(args.platform, False, args.seconds, args.clients, args.value_size)
    lazy = measure(args.platform, True, args.seconds, args.clients, args.value_size)
    print(f"{args.platform}, 3 nodes, {args.clients} clients, {args.value_size}-byte values, "
          f"{args.seconds:g} s each: plain disk {plain:.0f} puts/s, lazy disk {lazy:.0f} "
          f"puts/s ({lazy / plain:.2f}x)")


if __name__ == "__main__":
    main()
