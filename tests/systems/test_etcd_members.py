"""etcd membership (nemesis/systems/etcd/members.py) on a real cluster: add a learner,
start it, promote it once in sync, remove it; status names roles and the leader; TLS with
a client certificate works and a plaintext client is refused in one line."""

from __future__ import annotations

import pytest

from nemesis.systems.etcd import members
from nemesis.systems.etcd.client import EtcdClient, NotFound, TlsFailure
from nemesis.systems.etcd.node import EtcdMember, data_files, version
from system.ports import free_ports
from tests.nemesis.waiting import wait_until

pytestmark = pytest.mark.integration


def test_status_names_leader_and_followers(etcd_cluster_factory):
    cluster = etcd_cluster_factory()
    leader = cluster.leader()
    views = {name: cluster.status(name) for name in cluster.names}
    assert {v.role for v in views.values()} == {"leader", "follower"}
    assert views[leader].role == "leader" and views[leader].node_id == leader
    assert all(v.leader_id == leader and v.term >= 1 for v in views.values())
    assert views[leader].version == version()
    assert members.status("127.0.0.1:1", timeout_s=0.5) is None  # never raises
    files = data_files(cluster.members[leader].data_dir)
    assert files["wal"] and files["db"]


def test_learner_added_started_promoted_and_removed(etcd_cluster_factory):
    cluster = etcd_cluster_factory()
    addresses = list(cluster.addresses.values())
    client_port, peer_port = free_ports(2)
    peer = f"127.0.0.1:{peer_port}"
    # etcd answers a MemberAdd once the change is applied (a duplicate once it is refused
    # there): under a loaded CI run that took longer than the default 15 s once.
    learner = members.add_learner(addresses, f"http://{peer}", timeout_s=60)
    assert learner.is_learner and learner.name == ""  # nameless until it starts
    with pytest.raises(members.MemberError, match="already exist"):
        members.add_learner(addresses, f"http://{peer}", timeout_s=60)
    joined = {n: m.peer for n, m in cluster.members.items()} | {"e4": peer}
    cluster.members["e4"] = EtcdMember("e4", cluster.root / "e4", f"127.0.0.1:{client_port}",
                                       peer, joined, new=False, token=f"test-{cluster.root.name}")
    cluster.start("e4")
    wait_until(lambda: (s := cluster.status("e4")) is not None and s.role == "learner", 30.0,
               "e4 to run as a learner")
    assert members.membership(addresses)[1] == {"e4"}
    promoted = members.promote(addresses, "e4", timeout_s=30.0)
    assert promoted.is_learner is False
    assert members.membership(addresses) == ({"e1", "e2", "e3", "e4"}, set())
    with EtcdClient(cluster.addresses, timeout_s=10.0) as client:
        client.put("after-promote", b"x")
        def e4_has_it() -> bool:
            try:
                r = client.get("after-promote", consistency="stale", via="e4")
            except NotFound:
                return False  # not applied there yet
            return r.node_id == "e4" and r.version == 1
        wait_until(e4_has_it, 10.0, "e4 to serve the write")
    members.remove(addresses, "e4")
    assert members.membership(addresses) == ({"e1", "e2", "e3"}, set())
    with pytest.raises(members.MemberError, match="no such member"):
        members.remove(addresses, "e4")
    with pytest.raises(members.MemberError, match="member list failed"):
        members.member_list(["127.0.0.1:1"], timeout_s=1.0)


def test_promote_gives_up_with_a_clear_error_when_the_learner_never_syncs(etcd_cluster_factory):
    cluster = etcd_cluster_factory()
    addresses = list(cluster.addresses.values())
    (peer_port,) = free_ports(1)
    members.add_learner(addresses, f"http://127.0.0.1:{peer_port}")  # never started
    with pytest.raises(members.MemberError, match="did not catch up with the leader within 2 s"):
        members.promote(addresses, f"http://127.0.0.1:{peer_port}", timeout_s=2.0)


def test_tls_client_certificate_works_and_plaintext_is_refused(etcd_cluster_factory):
    cluster = etcd_cluster_factory(tls=True)
    with EtcdClient(cluster.addresses, timeout_s=10.0, tls=cluster.client_tls()) as client:
        assert client.put("tls", b"x").version == 1
        assert client.get("tls").value == b"x"
    assert "https://" in " ".join(cluster.members["e1"].command())
    with EtcdClient(cluster.addresses, timeout_s=5.0) as plain, pytest.raises(TlsFailure) as refused:
        plain.put("tls", b"plaintext")
    message = str(refused.value)
    assert "\n" not in message and "speaks TLS and this client does not" in message, message
    with EtcdClient(cluster.addresses, timeout_s=10.0, tls=cluster.client_tls()) as client:
        assert client.get("tls").version == 1  # the plaintext put never got through
