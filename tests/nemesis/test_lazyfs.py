"""The lazy disk (nemesis.lazyfs): unsynced writes are lost on a power cut, synced ones kept.

The model of one file's pending changes (`Pending`) is checked against a plain bytearray
under random writes and truncates; then the layer is mounted for real (FUSE) in a temp
dir and power-cut (SIGKILL of the layer) between writes, fsyncs, renames and flushes.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import time
from pathlib import Path

import pytest

from nemesis import lazyfs
from nemesis.lazyfs import PAGE, Pending
from nemesis.platforms.base import PlatformError
from nemesis.platforms.lazy_mount import LazyMount, lazy_mounts


def test_pending_matches_a_plain_file_under_random_writes_and_truncates(tmp_path: Path) -> None:
    rng = random.Random(20)
    for round_ in range(60):
        path = tmp_path / f"f{round_}"
        initial = rng.randbytes(rng.randrange(0, 3 * PAGE))
        path.write_bytes(initial)
        model = bytearray(initial)
        fd = os.open(path, os.O_RDWR)
        pending = Pending(os.dup(fd))
        for _ in range(30):
            if rng.random() < 0.3:
                length = rng.randrange(0, 4 * PAGE)
                pending.truncate(length)
                model = model[:length] + bytearray(max(0, length - len(model)))
            else:
                offset = rng.randrange(0, 4 * PAGE)
                data = rng.randbytes(rng.randrange(1, 2 * PAGE))
                pending.write(data, offset)
                if offset > len(model):
                    model += bytearray(offset - len(model))
                model[offset: offset + len(data)] = data
            assert pending.size == len(model)
            start = rng.randrange(0, len(model) + 1)
            size = rng.randrange(1, 3 * PAGE)
            assert pending.read(size, start) == bytes(model[start: start + size])
            assert pending.read(len(model) + PAGE, 0) == bytes(model)
            assert path.read_bytes() == initial  # nothing reaches the backing file early
        pending.write_back()
        os.close(pending.fd)
        os.close(fd)
        assert path.read_bytes() == bytes(model)


@pytest.fixture
def disk(tmp_path: Path):  # noqa: ANN201
    reason = lazyfs.fuse_unavailable()
    if reason:
        pytest.skip(f"FUSE is not usable here: {reason}")
    mount = LazyMount((tmp_path / "mnt").resolve(), tmp_path / "backing", tmp_path / "ctl",
                      tmp_path / "lazyfs.log")
    mount.start()
    try:
        yield mount
    finally:
        mount.power_off()
        assert mount.mountpoint not in lazy_mounts()


def _power_cut_and_remount(mount: LazyMount) -> None:
    mount.power_off()
    assert mount.mountpoint not in lazy_mounts()
    mount.start()


def _write(path: Path, data: bytes, *, sync: bool, flags: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _fsync_seconds(path: Path) -> float:
    started = time.monotonic()
    _write(path, b"x", sync=True)
    return time.monotonic() - started


def _delay(mount: LazyMount) -> list[float]:
    return json.loads(lazyfs.request(mount.control, "stats"))["fsync_delay_ms"]


@pytest.mark.slow
def test_a_slowed_disk_delays_each_fsync_and_stays_slow_across_a_power_cut(
        disk: LazyMount) -> None:
    """The slow-disk fault's layer: every fsync waits its draw first, the setting is
    reapplied when the layer is mounted again (a node killed during the fault comes back
    on a slow disk), and `slow(0, 0)` restores it. A bad range is refused."""
    disk.slow(250, 250)
    assert _fsync_seconds(disk.mountpoint / "a") >= 0.25
    _power_cut_and_remount(disk)
    assert _delay(disk) == [250.0, 250.0]
    assert _fsync_seconds(disk.mountpoint / "b") >= 0.25
    disk.slow(0, 0)
    assert _delay(disk) == [0.0, 0.0]
    with pytest.raises(PlatformError, match="fsync delay must be"):
        disk.slow(10, 5)


@pytest.mark.slow
def test_unsynced_write_is_lost_and_synced_write_kept(disk: LazyMount) -> None:
    m = disk.mountpoint
    _write(m / "synced", b"durable", sync=True)
    _write(m / "unsynced", b"volatile", sync=False)
    assert (m / "unsynced").read_bytes() == b"volatile"  # the writer sees its own write
    assert (disk.backing / "unsynced").read_bytes() == b""  # closing made nothing durable
    _power_cut_and_remount(disk)
    assert (m / "synced").read_bytes() == b"durable"
    assert (m / "unsynced").read_bytes() == b""  # created (metadata is not lazy), empty


@pytest.mark.slow
def test_appends_after_the_last_fsync_are_lost_the_ones_before_kept(disk: LazyMount) -> None:
    path = disk.mountpoint / "wal"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"a" * 5000)
    os.fsync(fd)
    os.writev(fd, [b"b" * 3000, b"c" * 100])
    assert path.read_bytes() == b"a" * 5000 + b"b" * 3000 + b"c" * 100
    assert os.stat(path).st_size == 8100
    os.close(fd)
    _power_cut_and_remount(disk)
    assert path.read_bytes() == b"a" * 5000


@pytest.mark.slow
def test_ftruncate_growth_and_shrink_are_pending_until_fsync(disk: LazyMount) -> None:
    path = disk.mountpoint / "segment"
    _write(path, b"x" * 10000, sync=True)
    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 3000)  # shrink
    assert os.fstat(fd).st_size == 3000
    os.ftruncate(fd, 3 * PAGE + 10)  # grow again: zeros past the cut
    os.pwrite(fd, b"y" * 10, 2995)  # a write across the cut
    expected = b"x" * 2995 + b"y" * 10 + bytes(3 * PAGE + 10 - 3005)
    assert os.pread(fd, 4 * PAGE, 0) == expected
    os.close(fd)
    assert (disk.backing / "segment").read_bytes() == b"x" * 10000
    _power_cut_and_remount(disk)
    assert path.read_bytes() == b"x" * 10000
    # The same changes, fsynced, survive.
    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 3000)
    os.ftruncate(fd, 3 * PAGE + 10)
    os.pwrite(fd, b"y" * 10, 2995)
    os.fsync(fd)
    os.close(fd)
    _power_cut_and_remount(disk)
    assert path.read_bytes() == expected


@pytest.mark.slow
def test_open_with_o_trunc_is_pending_too(disk: LazyMount) -> None:
    path = disk.mountpoint / "identity"
    _write(path, b"old record", sync=True)
    _write(path, b"new", sync=False, flags=os.O_TRUNC)
    assert path.read_bytes() == b"new"
    _power_cut_and_remount(disk)
    assert path.read_bytes() == b"old record"


@pytest.mark.slow
def test_rename_of_a_synced_temp_file_survives(disk: LazyMount) -> None:
    m = disk.mountpoint
    _write(m / "snap.tmp", b"snapshot bytes", sync=True)
    os.replace(m / "snap.tmp", m / "snap")
    dirfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dirfd)
    os.close(dirfd)
    # Pending changes follow the file through a rename, and die with the power.
    _write(m / "other.tmp", b"never synced", sync=False)
    os.replace(m / "other.tmp", m / "other")
    assert (m / "other").read_bytes() == b"never synced"
    _power_cut_and_remount(disk)
    assert (m / "snap").read_bytes() == b"snapshot bytes"
    assert not (m / "snap.tmp").exists()
    assert (m / "other").read_bytes() == b""


@pytest.mark.slow
def test_flush_keeps_everything_a_crashed_process_wrote(disk: LazyMount) -> None:
    m = disk.mountpoint
    _write(m / "a", b"unsynced but flushed", sync=False)
    fd = os.open(m / "b", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"0123456789")
    os.ftruncate(fd, 4)
    disk.flush()  # what the platform does after a process crash
    os.write(fd, b"!")  # after a flush the layer writes through
    os.close(fd)
    disk.stop()
    assert (disk.backing / "a").read_bytes() == b"unsynced but flushed"
    # The truncate reached the backing file, then the write at offset 10 went through.
    assert (disk.backing / "b").read_bytes() == b"0123" + bytes(6) + b"!"
    disk.start()
    assert (m / "a").read_bytes() == b"unsynced but flushed"


@pytest.mark.slow
def test_flock_is_exclusive_on_the_mount(disk: LazyMount) -> None:
    first = os.open(disk.mountpoint / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    second = os.open(disk.mountpoint / "LOCK", os.O_RDWR)
    try:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(first)
        first = -1
        fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)


@pytest.mark.slow
def test_memory_is_bounded_by_writing_back_early(tmp_path: Path) -> None:
    reason = lazyfs.fuse_unavailable()
    if reason:
        pytest.skip(f"FUSE is not usable here: {reason}")
    mount = LazyMount((tmp_path / "mnt").resolve(), tmp_path / "backing", tmp_path / "ctl",
                      tmp_path / "lazyfs.log", max_pending_mb=1)
    mount.start()
    try:
        for name in ("big", "small"):
            fd = os.open(mount.mountpoint / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"z" * (3 * 1024 * 1024 if name == "big" else 1000))
            os.close(fd)
        stats = json.loads(lazyfs.request(mount.control, "stats"))
        assert stats["bytes"] <= 1024 * 1024 and stats["written_back"] >= 1, stats
        # Written back early (no fsync) is still a legal outcome of a power cut: the big
        # file's early pages may survive; the small file, still pending, is lost.
        mount.power_off()
        mount.start()
        assert (mount.mountpoint / "small").read_bytes() == b""
        assert 0 < (mount.backing / "big").stat().st_size <= 3 * 1024 * 1024
    finally:
        mount.power_off()
