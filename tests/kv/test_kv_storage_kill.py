"""Real crashes: a child process appends and syncs, printing every acknowledged index; the
test SIGKILLs it at a random moment, reopens the directory and checks that every
acknowledged entry is there and the log is a valid prefix. Several rounds, each child
continuing the log the previous one left (so recovery's repairs are written on too)."""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from system.kv import storage
from system.kv.storage import DurableStorage
from system.raft.types import PersistentState

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 12
LIMIT_ENTRIES = 200_000  # bounds the child's loop even if nobody kills it
WAIT_SECONDS = 60.0

CHILD = r"""
import random, sys
from pathlib import Path
from system.kv.storage import DurableStorage
from system.raft.types import Entry, HardState, SnapshotMeta

def payload(index):
    size = 200_000 if index % 50 == 0 else 100
    unit = str(index).encode() + b"|"
    return (unit * (size // len(unit) + 1))[:size]

data_dir, limit, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
store = DurableStorage.open(data_dir, segment_bytes=256 * 1024)
state = store.load()
term = state.hard_state.term + 1
store.set_hard_state(HardState(term=term, vote="n1", commit=store.last_index))
store.sync()
print("ready", store.last_index, flush=True)
while store.last_index < limit:
    first = store.last_index + 1
    if rng.random() < 0.05 and store.last_index - 3 > store.snapshot_index:
        first = store.last_index - 2  # overwrite a suffix (same data): exercises TRUNCATE
    # An overwrite re-covers the old end, so no acknowledged index is dropped by us.
    last = min(limit, max(store.last_index, first + rng.randint(0, 19)))
    store.append([Entry(term, index, payload(index)) for index in range(first, last + 1)])
    store.sync()
    print("ack", last, flush=True)
    if rng.random() < 0.03 and store.last_index - store.snapshot_index > 100:
        at = store.last_index - 10
        store.save_snapshot(SnapshotMeta(at, store.term(at), ("n1",)), b"snap@%d" % at)
        print("snap", at, flush=True)
print("done", flush=True)
"""


def payload(index: int) -> bytes:
    size = 200_000 if index % 50 == 0 else 100
    unit = str(index).encode() + b"|"
    return (unit * (size // len(unit) + 1))[:size]


def problems_after_recovery(state: PersistentState, acknowledged: int) -> list[str]:
    """What is wrong with the recovered state, given the highest acknowledged index."""
    found: list[str] = []
    snapshot_index = state.snapshot.index if state.snapshot else 0
    if state.snapshot is not None and state.snapshot_data != b"snap@%d" % snapshot_index:
        found.append(f"snapshot at {snapshot_index} carries {state.snapshot_data[:20]!r}")
    expected_index = snapshot_index + 1
    previous_term = state.snapshot.term if state.snapshot else 0
    for entry in state.entries:
        if entry.index != expected_index:
            found.append(f"entry {entry.index} where {expected_index} was expected")
            break
        if entry.data != payload(entry.index):
            found.append(f"entry {entry.index} has wrong data")
        if entry.term < previous_term:
            found.append(f"entry {entry.index} has term {entry.term} < {previous_term}")
        previous_term = entry.term
        expected_index += 1
    last_index = snapshot_index + len(state.entries)
    if last_index < acknowledged:
        found.append(f"log ends at {last_index} but {acknowledged} was acknowledged")
    return found


class Child:
    """The writer process; its output lines arrive on a queue so waits have deadlines."""

    def __init__(self, data_dir: Path, seed: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(data_dir), str(LIMIT_ENTRIES), str(seed)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.decode().strip())
        self.lines.put(None)

    def next_line(self, deadline: float) -> str | None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the writer child printed nothing before the deadline")
        try:
            return self.lines.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError("the writer child printed nothing before the deadline") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT_SECONDS)
        self.reader.join(timeout=WAIT_SECONDS)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")


def crash_round(data_dir: Path, rng: random.Random) -> int:
    """Run a child until it has acknowledged a random number of batches, SIGKILL it;
    return the highest index it acknowledged."""
    child = Child(data_dir, rng.randrange(2**32))
    acknowledged = 0
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        wanted_acks = rng.randint(1, 80)
        acks = 0
        while acks < wanted_acks:
            line = child.next_line(deadline)
            if line is None:
                child.kill()
                raise AssertionError(f"the writer child died: {child.stderr()}")
            kind, _, number = line.partition(" ")
            if kind == "ack":
                acks += 1
                acknowledged = max(acknowledged, int(number))
            elif kind == "done":
                break
    finally:
        child.kill()
    return acknowledged


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_at_random_moments_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    data_dir = tmp_path / "node"
    acknowledged = 0
    for round_number in range(ROUNDS):
        acknowledged = max(acknowledged, crash_round(data_dir, rng))
        with DurableStorage.open(data_dir) as store:
            state = store.load()
        assert problems_after_recovery(state, acknowledged) == [], (
            f"round {round_number}, seed {seed}"
        )
    assert acknowledged > 0


@pytest.mark.slow
@pytest.mark.integration
def test_the_kill_check_fails_when_recovery_loses_the_newest_entries(
    tmp_path: Path, monkeypatch
) -> None:
    """Broken variant: a recovery that loses the newest acknowledged entry (and whatever
    the child wrote after it before the kill landed) must be caught."""
    data_dir = tmp_path / "node"
    acknowledged = crash_round(data_dir, random.Random(7))
    real_replay = storage._replay

    def lossy_replay(wal_dir, snapshot_dir, **options):
        replay = real_replay(wal_dir, snapshot_dir, **options)
        replay.entries[:] = [entry for entry in replay.entries if entry.index < acknowledged]
        return replay

    monkeypatch.setattr(storage, "_replay", lossy_replay)
    with DurableStorage.open(data_dir) as store:
        state = store.load()
    assert any("acknowledged" in problem for problem in problems_after_recovery(state, acknowledged))
