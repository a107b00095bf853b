"""Append + fsync throughput of the node's durable storage (system/kv/storage.py).

Each case appends batches of entries and calls sync() after every batch, the way a node
persists before it sends: records/s and MB/s of entry data, and the mean time per sync.
Also the time to reopen (recover) the log written. Bounded by a count and a time limit
per case. The directory must be on a real disk (not tmpfs) for fsync to mean anything.

    python benchmarks/wal_bench.py [--dir DIR] [--seconds 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from system.kv.storage import DurableStorage  # noqa: E402
from system.raft.types import Entry  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    entry_bytes: int
    entries_per_sync: int
    max_entries: int


CASES = [
    Case("256 B, 1 per sync", 256, 1, 20_000),
    Case("256 B, 64 per sync", 256, 64, 500_000),
    Case("1 MiB, 1 per sync", 1 << 20, 1, 512),
    Case("64 MiB, 1 per sync", 64 << 20, 1, 8),
]


def run_case(case: Case, base_dir: Path, seconds: float) -> list[object]:
    data_dir = Path(tempfile.mkdtemp(prefix="wal-bench-", dir=base_dir))
    data = bytes(range(256)) * (case.entry_bytes // 256)
    try:
        store = DurableStorage.open(data_dir)
        index = 0
        syncs = 0
        started = time.perf_counter()
        deadline = started + seconds
        while index < case.max_entries and time.perf_counter() < deadline:
            batch = [Entry(1, index + offset + 1, data) for offset in range(case.entries_per_sync)]
            store.append(batch)
            store.sync()
            index += len(batch)
            syncs += 1
        elapsed = time.perf_counter() - started
        store.close()
        reopen_started = time.perf_counter()
        with DurableStorage.open(data_dir) as reopened:
            recovered = len(reopened.load().entries)
        reopen_seconds = time.perf_counter() - reopen_started
        assert recovered == index, f"recovered {recovered} of {index} entries"
        return [
            case.name,
            index,
            f"{index / elapsed:,.0f}",
            f"{index * case.entry_bytes / elapsed / 1e6:,.1f}",
            f"{elapsed / syncs * 1000:.2f}",
            f"{reopen_seconds:.2f}",
        ]
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(),
                        help="where to create the temporary data directories (a real disk)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time limit per case")
    args = parser.parse_args()
    rows = [run_case(case, args.dir, args.seconds) for case in CASES]
    print(tabulate(
        rows,
        headers=["case", "entries", "records/s", "MB/s", "ms per sync", "reopen s"],
        tablefmt="github",
    ))


if __name__ == "__main__":
    main()
