"""The Docker platform against a real engine: image cache, leader election, kill/restart,
pause/resume, iptables partitions and loss (also across a restart), and cleanup.

Each test starts its own 3-node cluster (about 3 s once the image is cached). The first
run on a machine builds the image (~2 min, see docs/nemesis.md). Skipped only when no
Docker engine answers; on this project's machines and in CI one does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemesis.platforms.base import ClusterConfig, PlatformError, PlatformUnavailable
from nemesis.platforms.docker import (
    LABEL_RUN,
    DockerPlatform,
    clean,
    docker_available,
    engine,
)
from nemesis.platforms.image import LABEL_PROJECT, PROJECT, ensure_image, node_tag
from system.kv.client import Indeterminate, KVClient, Unavailable
from tests.nemesis.waiting import wait_until

AVAILABLE, REASON = docker_available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not AVAILABLE, reason=f"needs a Docker engine ({REASON})"),
    pytest.mark.timeout(600),
]


def agreed_leader(platform: DockerPlatform, among: list[str]) -> str | None:
    """The node of `among` that leads and that every other node of `among` follows."""
    statuses = {n: platform.status(n, timeout_s=0.5) for n in among}
    # A fresh node may vote only once the others confirmed it (docs/kv.md): until every one
    # has, killing the leader could leave no electable majority.
    if any(st is None or st.vote_withheld for st in statuses.values()):
        return None
    leaders = {st.leader_id for st in statuses.values()}  # type: ignore[union-attr]
    if len(leaders) != 1:
        return None
    (leader,) = leaders
    st = statuses.get(leader)
    return leader if st is not None and st.role == "leader" else None


def wait_leader(platform: DockerPlatform, among: list[str] | None = None,
                timeout_s: float = 30.0) -> str:
    among = among or platform.node_ids
    return wait_until(lambda: agreed_leader(platform, among), timeout_s,
                      f"a leader agreed on by {among}", platform.describe)


def wait_applied(platform: DockerPlatform, node_id: str, index: int, timeout_s: float = 30.0):
    def caught_up():
        st = platform.status(node_id)
        return st if st is not None and st.applied_index >= index else None

    return wait_until(caught_up, timeout_s, f"{node_id} to apply index {index}",
                      platform.describe)


def kv_client(platform: DockerPlatform) -> KVClient:
    # By node id: a follower's hint is then followed by id, never by the in-network address.
    return KVClient(platform.client_addresses, timeout_s=20.0, attempt_timeout_s=1.0)


def labelled(run_id: str | None = None) -> dict[str, list[str]]:
    client = engine()
    try:
        labels = [f"{LABEL_PROJECT}={PROJECT}"]
        if run_id is not None:
            labels.append(f"{LABEL_RUN}={run_id}")
        filters = {"label": labels}
        return {
            "containers": sorted(c.name for c in client.containers.list(all=True, filters=filters)),
            "networks": sorted(n.name for n in client.networks.list(filters=filters)),
            "volumes": sorted(v.name for v in client.volumes.list(filters=filters)),
        }
    finally:
        client.close()


NOTHING = {"containers": [], "networks": [], "volumes": []}


@pytest.fixture(scope="module")
def image() -> str:
    return ensure_image()


def make_config(tmp_path: Path, name: str) -> ClusterConfig:
    return ClusterConfig(nodes=3, run_id=f"test-{name}-{uuid.uuid4().hex[:6]}", work_dir=tmp_path)


@pytest.fixture
def cluster(image: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DockerPlatform]:
    config = make_config(tmp_path, request.node.name.removeprefix("test_")[:20].replace("_", "-"))
    platform = DockerPlatform(config, image=image)
    try:
        platform.start()
        yield platform
    finally:
        platform.collect_logs()
        platform.close()
    assert labelled(config.run_id) == NOTHING


# ----- engine --------------------------------------------------------------------------

def test_no_engine_is_reported_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, reason = docker_available()
    assert ok and reason.startswith("Docker engine ") and " answers at " in reason
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    t0 = time.monotonic()
    ok, reason = docker_available()
    assert not ok and reason.startswith("no Docker engine: ") and "\n" not in reason
    with pytest.raises(PlatformUnavailable, match="no Docker engine answers at unix://"):
        DockerPlatform(make_config(tmp_path, "no-engine"))
    assert time.monotonic() - t0 < 10


# ----- image ---------------------------------------------------------------------------

def test_image_is_cached_and_labelled(image: str) -> None:
    t0 = time.monotonic()
    assert ensure_image() == image == node_tag()
    assert time.monotonic() - t0 < 10, "a cached image should be found in about a second"
    client = engine()
    try:
        kinds = {im.labels.get("mao.kind") for im in client.images.list(
            filters={"label": f"{LABEL_PROJECT}={PROJECT}"})}
        assert {"base", "deps", "node"} <= kinds
    finally:
        client.close()


# ----- nodes ---------------------------------------------------------------------------

def test_start_elects_a_leader_on_loopback_ports(cluster: DockerPlatform) -> None:
    addresses = cluster.client_addresses
    assert sorted(addresses) == ["n1", "n2", "n3"]
    assert all(a.startswith("127.0.0.1:") for a in addresses.values())
    leader = wait_leader(cluster)
    assert cluster.leader() == leader
    for node_id in cluster.node_ids:
        container = cluster._container(node_id)
        bindings = container.attrs["HostConfig"]["PortBindings"]["7000/tcp"]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
        assert cluster.is_running(node_id) and cluster.exit_code(node_id) is None
    with kv_client(cluster) as kv:
        assert kv.put("k", b"v").version == 1
        assert kv.get("k").value == b"v"
    assert not cluster.supports_delay()


def test_kill_leader_then_restart_rejoins(cluster: DockerPlatform) -> None:
    old = wait_leader(cluster)
    address, ip = cluster.client_addresses[old], cluster.node_ips[old]
    cluster.kill(old)
    assert not cluster.is_running(old)
    assert cluster.exit_code(old) == 137
    rest = [n for n in cluster.node_ids if n != old]
    new = wait_leader(cluster, rest)
    assert new != old
    with kv_client(cluster) as kv:
        written = kv.put("after-failover", b"1")
    cluster.restart(old)
    assert cluster.client_addresses[old] == address
    container = cluster._container(old)
    container.reload()
    assert container.attrs["NetworkSettings"]["Networks"][cluster.network_name]["IPAddress"] == ip
    st = wait_applied(cluster, old, written.applied_index)
    assert st.leader_id in cluster.node_ids
    logs = cluster.collect_logs()
    assert {f"{n}.log" for n in cluster.node_ids} <= set(logs)
    assert "node restored from disk" in logs[f"{old}.log"].read_text()


def test_stop_is_graceful(cluster: DockerPlatform) -> None:
    wait_leader(cluster)
    follower = next(n for n in cluster.node_ids if cluster.status(n).role != "leader")
    cluster.stop_node(follower)
    assert cluster.exit_code(follower) == 0
    cluster.start_node(follower)
    wait_leader(cluster)


def test_pause_and_resume(cluster: DockerPlatform) -> None:
    leader = wait_leader(cluster)
    cluster.pause(leader)
    assert cluster.is_running(leader)  # paused counts as running
    assert cluster.status(leader, timeout_s=0.3) is None
    rest = [n for n in cluster.node_ids if n != leader]
    new = wait_leader(cluster, rest)
    assert new != leader
    with kv_client(cluster) as kv:
        written = kv.put("during-pause", b"x")
    cluster.resume(leader)
    wait_applied(cluster, leader, written.applied_index)
    wait_leader(cluster)


# ----- network -------------------------------------------------------------------------

def isolate(platform: DockerPlatform, node_id: str) -> None:
    for other in platform.node_ids:
        if other != node_id:
            platform.cut(node_id, other)
            platform.cut(other, node_id)


def iptables_rules(platform: DockerPlatform, node_id: str) -> str:
    """The filter table inside node_id's network namespace (nft or legacy backend)."""
    container = platform._container(node_id)
    rules = container.exec_run(["iptables-save"]).output.decode()
    if "-A MAO" not in rules:
        rules = container.exec_run(["iptables-legacy-save"]).output.decode()
    return rules


def test_isolated_leader_cannot_commit_and_rejoins_after_heal(cluster: DockerPlatform) -> None:
    old = wait_leader(cluster)
    rest = [n for n in cluster.node_ids if n != old]
    isolate(cluster, old)
    new = wait_leader(cluster, rest)
    assert new != old
    stuck = cluster.status(old)
    assert stuck is not None, "clients still reach an isolated node"
    with kv_client(cluster) as kv:
        for i in range(5):
            written = kv.put(f"majority-{i}", b"m")
    # The isolated node learns nothing of the majority's writes, and cannot commit its own.
    assert cluster.status(old).commit_index < written.applied_index
    lone = KVClient({old: cluster.client_addresses[old]}, timeout_s=2.0, attempt_timeout_s=0.5)
    with lone, pytest.raises((Unavailable, Indeterminate)):
        lone.put("minority", b"never")
    assert cluster.status(old).commit_index < written.applied_index
    cluster.heal_all()
    assert cluster.links == {}
    wait_applied(cluster, old, written.applied_index)
    wait_leader(cluster)


def test_one_way_cut_and_heal_link(cluster: DockerPlatform) -> None:
    wait_leader(cluster)
    cluster.cut("n1", "n2")
    assert cluster.links == {("n1", "n2"): 1.0}
    rules = iptables_rules(cluster, "n2")
    assert f"-A MAO -s {cluster.node_ips['n1']}/32 -j DROP" in rules
    cluster.heal_link("n1", "n2")
    assert cluster.links == {}
    with pytest.raises(PlatformError):
        cluster.cut("n1", "n9")
    with pytest.raises(PlatformError):
        cluster.set_loss("n1", "n2", 1.5)


def test_loss_on_every_link_does_not_break_the_cluster(cluster: DockerPlatform) -> None:
    wait_leader(cluster)
    for src in cluster.node_ids:
        for dst in cluster.node_ids:
            if src != dst:
                cluster.set_loss(src, dst, 0.2)
    assert set(cluster.links.values()) == {0.2}
    with kv_client(cluster) as kv:
        for i in range(10):
            written = kv.put(f"lossy-{i}", b"l")
        assert kv.get("lossy-9").value == b"l"
    cluster.heal_all()
    for node_id in cluster.node_ids:
        wait_applied(cluster, node_id, written.applied_index)


def test_cut_survives_a_restart_of_the_cut_node(cluster: DockerPlatform) -> None:
    leader = wait_leader(cluster)
    victim = next(n for n in cluster.node_ids if n != leader)
    isolate(cluster, victim)
    cluster.restart(victim)  # a fresh network namespace: the platform re-installs the rules
    rest = [n for n in cluster.node_ids if n != victim]
    rules = iptables_rules(cluster, victim)
    for other in rest:
        assert f"-A MAO -s {cluster.node_ips[other]}/32 -j DROP" in rules
    wait_leader(cluster, rest)
    wait_until(lambda: cluster.status(victim), 30, f"{victim} to answer after its restart")
    with kv_client(cluster) as kv:
        written = kv.put("while-cut", b"c")
    assert cluster.status(victim).commit_index < written.applied_index
    assert cluster.status(victim).leader_id not in rest
    cluster.pause(victim)  # rules change on a paused node too (through a helper container)
    cluster.heal_all()
    cluster.resume(victim)
    wait_applied(cluster, victim, written.applied_index)


# ----- cleanup -------------------------------------------------------------------------

def test_nothing_is_left_behind(image: str, tmp_path: Path) -> None:
    config = make_config(tmp_path, "cleanup")
    assert labelled(config.run_id) == NOTHING
    with pytest.raises(RuntimeError, match="boom"), DockerPlatform(config, image=image) as p:
        p.start()
        p.cut("n1", "n2")
        p.pause("n3")
        here = labelled(config.run_id)
        assert len(here["containers"]) == 3 and len(here["volumes"]) == 3
        assert here["networks"] == [p.network_name]
        raise RuntimeError("boom")
    assert labelled(config.run_id) == NOTHING
    p.close()  # idempotent

    # A start that fails half way (no such image) still closes cleanly.
    failed = DockerPlatform(make_config(tmp_path, "failed"), image="mao-node:does-not-exist")
    with pytest.raises(PlatformError):
        failed.start()
    failed.close()
    assert labelled(failed.config.run_id) == NOTHING

    # What a crashed run leaves, `clean(run_id)` removes.
    crashed = DockerPlatform(make_config(tmp_path, "crashed"), image=image)
    crashed.start()
    removed = clean(crashed.config.run_id)
    assert sum(r.startswith("container ") for r in removed) == 3
    assert sum(r.startswith("volume ") for r in removed) == 3
    assert f"network {crashed.network_name}" in removed
    assert labelled(crashed.config.run_id) == NOTHING
    crashed.close()


def test_an_engine_error_reads_as_the_engines_reason_not_the_request_url():
    """A port that could not be published exited 3 with a line cut inside the request URL."""
    import docker.errors
    import requests

    from nemesis.platforms.docker import _one_line

    response = requests.Response()
    response.status_code, response.reason = 500, "Internal Server Error"
    response.url = "http+docker://localhost/v1.47/containers/" + "a" * 300 + "/start"
    reason = ("driver failed programming external connectivity on endpoint mao-n1: "
              "Bind for 127.0.0.1:7001 failed: port is already allocated")
    exc = docker.errors.APIError("500 Server Error", response=response, explanation=reason)
    assert _one_line(exc) == reason
    assert _one_line(ValueError("two\n  lines")) == "two lines"
