"""The standby's early signal of a dead lease holder (liveness.py), and why an early take
stays safe: the watch fires on a killed holder process and never on a paused one; a
take on that signal of a holder that is in fact alive deposes it by the lease CAS."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import system.trainer  # noqa: F401
from system.kv.client import KVClient
from system.trainer.lease import LeaseKeeper
from system.trainer.liveness import HolderWatch, WatchListener

REPO_ROOT = Path(__file__).resolve().parents[2]
_HOLDER = ("import sys, time; sys.path.insert(0, sys.argv[1]); "
           "from system.trainer.liveness import WatchListener; "
           "w = WatchListener('127.0.0.1'); print(w.address, flush=True); time.sleep(120)")


def wait_for(condition, timeout_s: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := condition()):
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_watch_fires_when_the_holder_is_killed_and_never_while_it_is_paused() -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(REPO_ROOT)], stdout=subprocess.PIPE,
                              text=True)
    watch = HolderWatch()
    try:
        address = holder.stdout.readline().strip()  # type: ignore[union-attr]
        watch.follow("c1", 1, address)
        assert not watch.gone(0)
        holder.send_signal(signal.SIGSTOP)
        wait_for(lambda: process_state(holder.pid) == "T", 10, "the holder to be stopped")
        assert not watch.gone(1.0), "a paused holder was taken for dead"
        holder.send_signal(signal.SIGCONT)
        assert not watch.gone(0)
        holder.kill()
        wait_for(lambda: watch.gone(0.2), 10, "the watch to see the killed holder's connection close")
    finally:
        watch.drop()
        holder.kill()
        holder.wait(timeout=10)


def test_a_watch_address_nobody_listens_on_counts_as_gone_and_a_new_holder_is_watched_afresh() -> None:
    listener = WatchListener("127.0.0.1")
    closed = listener.address
    listener.close()
    watch = HolderWatch()
    watch.follow("c1", 1, closed)
    assert watch.gone(0)  # refused: the holder's process has ended
    live = WatchListener("127.0.0.1")
    try:
        watch.follow("c2", 4, live.address)  # another holder: its own connection
        assert not watch.gone(0.2)
        watch.follow("c3", 5, "")  # no watch address: only the lapse can tell
        assert not watch.gone(0)
    finally:
        watch.drop()
        live.close()


@pytest.mark.integration
def test_an_early_take_of_a_live_holder_deposes_it_by_the_lease_cas(kv_cluster, job: str) -> None:
    """Should the death signal ever be wrong (the holder alive), the early take still
    leaves one holder per term: the old holder's next renewal is refused and it stops."""
    with KVClient(kv_cluster.addresses) as kv:
        old = LeaseKeeper(kv, job, f"{job}-c1", "127.0.0.1:1", 30.0)
        old.observe()
        assert old.try_acquire()  # no key yet: taken at once
        assert old.renew() and old.valid()
        new = LeaseKeeper(kv, job, f"{job}-c2", "127.0.0.1:2", 30.0)
        record = new.observe()
        assert record is not None and record.coordinator_id == f"{job}-c1"
        assert not new.try_acquire()  # the lease has 30 s left
        assert new.try_acquire(holder_gone=True)
        assert new.term > old.term
        assert not old.renew(), "the old holder renewed a lease its successor had taken"
        assert not old.valid()
        assert new.renew() and new.valid()


def test_the_holder_forgets_closed_watchers_and_never_closes_a_live_one() -> None:
    listener = WatchListener("127.0.0.1")
    host, port = listener.address.rsplit(":", 1)
    live = HolderWatch()
    try:
        live.follow("c1", 1, listener.address)
        for _ in range(100):  # standbys that came and went
            socket.create_connection((host, int(port)), timeout=5).close()
        wait_for(lambda: len(listener._held) <= 3, 10, "closed watchers to be forgotten")
        assert not live.gone(0.1), "the holder closed a live standby's connection"
    finally:
        live.drop()
        listener.close()
