"""power_loss on the real platforms (lazy_disk): every node loses its power at once and
comes back with every acknowledged write, while a write nobody fsynced is gone — and a
plain kill (a process crash) keeps such a write.

The store fsyncs before it acknowledges, so acknowledged keys must survive; the loss side
is shown with a tiny writer through a node's mount (a file beside the store's own).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemesis import lazyfs
from nemesis.platforms.base import ClusterConfig, Platform
from nemesis.platforms.lazy_mount import lazy_mounts
from nemesis.platforms.local import LocalPlatform
from system.kv.client import KVClient
from tests.nemesis.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def write_keys(platform: Platform, prefix: str, count: int) -> dict[str, bytes]:
    written = {}
    with KVClient(platform.client_addresses, timeout_s=30.0, attempt_timeout_s=2.0) as kv:
        for i in range(count):
            key, value = f"{prefix}{i}", f"{prefix}-value-{i}".encode() * 20
            kv.put(key, value)  # acknowledged: committed, applied, fsynced on a majority
            written[key] = value
    return written


def read_back(platform: Platform, written: dict[str, bytes]) -> None:
    with KVClient(platform.client_addresses, timeout_s=60.0, attempt_timeout_s=2.0) as kv:
        for key, value in written.items():
            assert kv.get(key).value == value, f"acknowledged key {key} lost"


def power_cycle_everything(platform: Platform) -> None:
    wait_until(platform.ready, 90, "a leader with every node voting", platform.describe)
    written = write_keys(platform, "before-", 40)
    platform.power_loss(list(platform.node_ids))
    assert not any(platform.is_running(n) for n in platform.node_ids)
    for node_id in platform.node_ids:
        platform.start_node(node_id)
    wait_until(platform.leader, 120, "a leader after the power came back", platform.describe)
    read_back(platform, written)
    # and the cluster takes writes again
    read_back(platform, write_keys(platform, "after-", 5))


# ----- local ---------------------------------------------------------------------------

@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalPlatform]:
    reason = lazyfs.fuse_unavailable()
    if reason:
        pytest.skip(f"FUSE is not usable here: {reason}")
    config = ClusterConfig(nodes=3, run_id=f"test-lazy-{uuid.uuid4().hex[:6]}",
                           work_dir=tmp_path, lazy_disk=True)
    platform = LocalPlatform(config)
    root = platform._data_root.resolve()
    try:
        platform.start()
        yield platform
    finally:
        platform.close()
    assert not [m for m in lazy_mounts() if m.is_relative_to(root)], "a mount was left behind"
    assert not root.exists()


def test_local_power_loss_of_every_node_keeps_acknowledged_writes(local: LocalPlatform) -> None:
    assert local.supports_power_loss()
    data_dirs = {n: s.data_dir for n, s in local.cluster.specs.items()}
    assert all(d.resolve() in lazy_mounts() for d in data_dirs.values())
    power_cycle_everything(local)
    assert "node restored from disk" in local.collect_logs()["n1.log"].read_text()


def _canary(data_dir: Path, name: str, data: bytes, *, sync: bool) -> None:
    fd = os.open(data_dir / name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_local_power_loss_drops_unsynced_writes_and_kill_keeps_them(local: LocalPlatform) -> None:
    n1 = local.cluster.specs["n1"].data_dir
    # A power cut: the unsynced canary is gone, the synced one stays.
    _canary(n1, "canary-synced", b"kept", sync=True)
    _canary(n1, "canary-unsynced", b"lost", sync=False)
    assert (n1 / "canary-unsynced").read_bytes() == b"lost"
    local.power_loss(["n1"])
    assert n1.resolve() not in lazy_mounts()
    local.start_node("n1")
    assert (n1 / "canary-synced").read_bytes() == b"kept"
    assert (n1 / "canary-unsynced").read_bytes() == b""
    # A process crash: the page cache survives, so does the unsynced canary.
    _canary(n1, "canary-crash", b"survives a crash", sync=False)
    local.kill("n1")
    local.start_node("n1")
    assert (n1 / "canary-crash").read_bytes() == b"survives a crash"
    # A node that exits by itself is a process crash too (start_node flushes first).
    _canary(n1, "canary-exit", b"survives an exit", sync=False)
    local.cluster.send_signal("n1", 9)
    wait_until(lambda: not local.is_running("n1"), 30, "n1 to exit")
    local.start_node("n1")
    assert (n1 / "canary-exit").read_bytes() == b"survives an exit"
    wait_until(local.ready, 90, "the cluster with n1 back", local.describe)


# ----- docker --------------------------------------------------------------------------

def _docker_reason() -> str | None:
    from nemesis.platforms.docker import docker_available

    ok, reason = docker_available()
    if not ok:
        return reason
    if not Path("/dev/fuse").exists():
        return "the engine's machine has no /dev/fuse"
    return None


@pytest.fixture
def docker(tmp_path: Path) -> Iterator[Platform]:
    reason = _docker_reason()
    if reason:
        pytest.skip(f"needs a Docker engine with FUSE ({reason})")
    from nemesis.platforms.docker import DockerPlatform
    from nemesis.platforms.image import ensure_image

    config = ClusterConfig(nodes=3, run_id=f"test-lazy-{uuid.uuid4().hex[:6]}",
                           work_dir=tmp_path, lazy_disk=True)
    platform = DockerPlatform(config, image=ensure_image())
    try:
        platform.start()
        yield platform
    finally:
        platform.collect_logs()
        platform.close()


def test_docker_power_loss_of_every_node_keeps_acknowledged_writes(docker: Platform) -> None:
    assert docker.supports_power_loss()
    power_cycle_everything(docker)
    assert "node restored from disk" in docker.collect_logs()["n1.log"].read_text()


def _in_node(platform: Platform, node_id: str, script: str) -> str:
    code, output = platform._exec(node_id, script)  # type: ignore[attr-defined]
    assert code == 0, f"`{script}` in {node_id} failed ({code}): {output}"
    return output


def test_docker_power_loss_drops_unsynced_writes_and_kill_keeps_them(docker: Platform) -> None:
    from nemesis.platforms.docker import LAZY_DATA_DIR

    def canary(name: str, text: str, sync: bool) -> None:
        _in_node(docker, "n1", (
            f"python3 -c 'import os; fd = os.open(\"{LAZY_DATA_DIR}/{name}\", "
            f"os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b\"{text}\"); "
            f"{'os.fsync(fd); ' if sync else ''}os.close(fd)'"))

    def read(name: str) -> str:
        return _in_node(docker, "n1", f"cat {LAZY_DATA_DIR}/{name}")

    wait_until(docker.ready, 90, "every node up", docker.describe)
    canary("canary-synced", "kept", sync=True)
    canary("canary-unsynced", "lost", sync=False)
    assert read("canary-unsynced") == "lost"
    docker.power_loss(["n1"])
    assert not docker.is_running("n1") and docker.exit_code("n1") == 137
    docker.start_node("n1")
    wait_until(lambda: docker.status("n1") is not None, 60, "n1 to answer", docker.describe)
    assert read("canary-synced") == "kept"
    assert read("canary-unsynced") == ""
    # A process crash (kill) keeps what the node wrote, synced or not.
    canary("canary-crash", "survives a crash", sync=False)
    docker.kill("n1")
    docker.start_node("n1")
    wait_until(lambda: docker.status("n1") is not None, 60, "n1 to answer", docker.describe)
    assert read("canary-crash") == "survives a crash"
    # So does a graceful stop: the container's shell flushes once the node exited.
    canary("canary-stop", "survives a stop", sync=False)
    docker.stop_node("n1")
    docker.start_node("n1")
    wait_until(lambda: docker.status("n1") is not None, 60, "n1 to answer", docker.describe)
    assert read("canary-stop") == "survives a stop"
    wait_until(docker.ready, 90, "the cluster with n1 back", docker.describe)


def test_clean_kills_the_layers_and_detaches_their_mounts(local: LocalPlatform) -> None:
    from nemesis.platforms.local import RUN_ENV_VAR, clean

    root = local._data_root.resolve()
    for mount in local._mounts.values():  # a layer SIGKILLed leaves a dead mount
        os.killpg(mount.proc.pid, 9)  # type: ignore[union-attr]
        mount.proc.wait(timeout=30)  # type: ignore[union-attr]
    assert len([m for m in lazy_mounts() if m.is_relative_to(root)]) == 3
    removed = clean(local.config.run_id)
    assert sum(line.startswith("mount ") for line in removed) == 3, removed
    assert not [m for m in lazy_mounts() if m.is_relative_to(root)]
    assert not root.exists()
    marker = f"{RUN_ENV_VAR}={local.config.run_id}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                assert marker not in (entry / "environ").read_bytes(), f"process {entry.name} left"
            except OSError:
                continue
