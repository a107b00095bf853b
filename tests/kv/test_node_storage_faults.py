"""A node process meets damaged files: a corrupt WAL record stops it with an error naming
the file and the offset (it never serves), a torn last record (zero from a block boundary
inside it, as a crash leaves it in a preallocated segment) is zeroed and it serves.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv import wal
from system.kv.client import NotFound

pytestmark = pytest.mark.integration

KEYS = 50


def _single_node_with_data(tmp_path: Path) -> tuple[LocalCluster, Path]:
    cluster = LocalCluster(1, tmp_path)
    cluster.start()
    cluster.wait_for_leader(timeout_s=20)
    with cluster.client() as kv:
        for i in range(KEYS):
            kv.put(f"k{i}", value(i))
    assert cluster.stop("n1") == 0  # graceful: everything acknowledged is on disk
    (segment,) = sorted((cluster.specs["n1"].data_dir / "wal").glob("*.wal"))
    return cluster, segment


def value(i: int) -> bytes:
    # The last value spans block boundaries, so a crash can leave a prefix of it.
    return f"value-{i}".encode() * (8 if i < KEYS - 1 else 2000)


def log_end(segment: Path) -> int:
    scan = wal.SegmentScan(segment, is_last=True)
    for _ in scan:
        pass
    return scan.end


def test_corrupt_wal_record_refuses_to_start_naming_file_and_offset(tmp_path: Path) -> None:
    cluster, segment = _single_node_with_data(tmp_path)
    with cluster:
        data = bytearray(segment.read_bytes())
        middle = log_end(segment) // 2
        data[middle] ^= 0xFF  # one flipped byte inside an acknowledged record
        segment.write_bytes(bytes(data))

        proc = cluster.start_node("n1")
        assert proc.wait(timeout=30) == 3
        message = cluster.specs["n1"].stderr_file.read_text()
        assert "refuses to start" in message
        assert str(segment) in message
        offset = int(re.search(r"corrupt at byte offset (\d+)", message).group(1))
        assert 0 <= offset <= middle  # the damaged record starts at or before the flipped byte


def test_torn_last_wal_record_is_truncated_and_the_node_serves(tmp_path: Path) -> None:
    cluster, segment = _single_node_with_data(tmp_path)
    with cluster:
        end = log_end(segment)
        last_record = [o for o, r in wal.SegmentScan(segment, is_last=True)
                       if getattr(r, "data", b"").endswith(value(KEYS - 1))][-1]
        boundary = (end - 1) // 4096 * 4096
        assert last_record < boundary
        with segment.open("r+b") as f:  # a write cut short by a crash: its last block
            f.seek(boundary)
            f.write(bytes(end - boundary))

        cluster.start_node("n1")
        cluster.wait_for_leader(timeout_s=20)
        log_text = cluster.specs["n1"].log_file.read_text()
        assert "torn last record" in log_text
        with cluster.client() as kv:
            # Everything before the torn record is served; the node takes new writes.
            for i in range(KEYS - 1):
                assert kv.get(f"k{i}").value == value(i)
            kv.put("after-repair", b"ok")
            assert kv.get("after-repair").value == b"ok"
            try:
                last = kv.get(f"k{KEYS - 1}")
            except NotFound:
                pass  # the torn record was the last write: it was never fully on disk
            else:
                assert last.value == value(KEYS - 1)
