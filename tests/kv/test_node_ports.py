"""No silent port sharing: every node binds its port alone, a port in use or a bad
--listen is a one-line error (exit 2) before the data directory is created, and a second
cluster started on the ports of a running one fails instead of splitting its clients.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nemesis.platforms.local_cluster import REPO_ROOT, LocalCluster
from system.kv.server import SERVER_OPTIONS
from system.ports import port_band

pytestmark = pytest.mark.integration


def _serve(tmp_path: Path, listen: str, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "system.kv", "serve", "--id", "n9", "--listen", listen,
         "--data-dir", str(data_dir), "--log-file", str(tmp_path / "n9.log.jsonl")],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=60,
    )


def _consecutive_free_ports(count: int) -> int:
    # Drawn below the kernel's ephemeral range (system/ports.py says why).
    band = port_band() or range(20000, 32768)
    rng = random.SystemRandom()
    for _ in range(50):
        base = rng.randrange(band.start, band.stop - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no run of free consecutive ports found")


def test_a_port_in_use_is_a_one_line_error_before_the_data_directory_exists(tmp_path) -> None:
    # The other listener turns SO_REUSEPORT on, as gRPC does by default: the case where
    # two servers silently shared the port.
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        data_dir = tmp_path / "n9"
        done = _serve(tmp_path, f"127.0.0.1:{port}", data_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in done.stderr
    assert not data_dir.exists()


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", "127.0.0.1:", ":7001",
                                    "no-such-host.invalid:7001"])
def test_a_bad_listen_address_is_a_one_line_error(tmp_path, listen: str) -> None:
    data_dir = tmp_path / "n9"
    done = _serve(tmp_path, listen, data_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "refuses to start" in done.stderr
    assert not data_dir.exists()


def test_a_node_server_binds_its_port_alone() -> None:
    """With the server options every node uses, a second gRPC server (default options,
    SO_REUSEPORT on) cannot bind the same port. Without them both bind, and clients reach
    either one at random."""
    first = grpc.server(futures.ThreadPoolExecutor(1), options=list(SERVER_OPTIONS))
    second = grpc.server(futures.ThreadPoolExecutor(1))
    try:
        port = first.add_insecure_port("127.0.0.1:0")
        first.start()
        try:
            bound = second.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:
            bound = 0
        assert bound == 0
    finally:
        first.stop(None)
        second.stop(None)


def test_a_second_cluster_on_the_same_ports_fails_to_start(tmp_path) -> None:
    base = _consecutive_free_ports(3)
    with LocalCluster(3, tmp_path / "a", base_port=base) as running:
        running.start()
        running.wait_for_leader(timeout_s=30)
        with LocalCluster(3, tmp_path / "b", base_port=base) as second:
            second.start()
            running.wait_until(lambda: not any(map(second.is_running, second.ids)) or None, 30,
                               "every node of the second cluster to exit")
            for node_id, spec in second.specs.items():
                assert second.exit_code(node_id) == 2
                assert "the port is in use" in spec.stderr_file.read_text()
                assert not spec.data_dir.exists()
        kv = running.client()
        try:
            kv.put("k", b"v")
            assert kv.get("k").value == b"v"
        finally:
            kv.close()


def test_a_data_directory_under_a_file_is_a_one_line_error(tmp_path) -> None:
    """Before: a NotADirectoryError traceback and exit 1 (issue 22)."""
    (tmp_path / "a-file").write_text("not a directory\n")
    port = _consecutive_free_ports(1)
    done = _serve(tmp_path, f"127.0.0.1:{port}", tmp_path / "a-file" / "n9")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot use the data directory" in done.stderr and "Not a directory" in done.stderr
