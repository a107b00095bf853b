"""Membership on real processes: a node whose data directory was wiped never costs an
acknowledged write, and rejoins through a membership change (remove, add as a learner,
catch up, promote) driven by `python -m system.kv member ...`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from nemesis.platforms.local_cluster import REPO_ROOT, LocalCluster

pytestmark = pytest.mark.integration


def member_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "system.kv", "member", *args],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=timeout_s,
    )


def no_leader_among(cluster: LocalCluster, nodes: list[str], window_s: float) -> bool:
    """True if none of `nodes` becomes leader during `window_s` (several election
    timeouts): the only way to observe that an election cannot be won."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        if cluster.leader(among=nodes) is not None:
            return False
        time.sleep(0.05)
    return True


def test_a_wiped_voter_never_elects_a_leader_without_an_acknowledged_write_and_rejoins(
    tmp_path,
) -> None:
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=30)
        wiped, lagging = [n for n in cluster.ids if n != leader]
        kv = cluster.client()
        try:
            kv.put("warm", b"up")
            cluster.pause(lagging)  # the write reaches the leader and `wiped` only
            kv.put("k", b"acknowledged")
            # `wiped` loses its disk and is started again with its usual command line.
            cluster.kill(wiped)
            shutil.rmtree(cluster.specs[wiped].data_dir)
            cluster.start_node(wiped)
            cluster.wait_until(
                lambda: "will not vote" in ((cluster.status(wiped) or None) and
                                            cluster.status(wiped).vote_withheld or ""),
                30, f"{wiped} to refuse to vote")
            stderr = cluster.specs[wiped].stderr_file.read_text()
            assert "member remove" in stderr and "member add" in stderr and "wipe" not in stderr
            # The leader dies; `lagging`, which lacks the write, needs `wiped`'s vote.
            cluster.kill(leader)
            cluster.resume(lagging)
            assert no_leader_among(cluster, [wiped, lagging], window_s=4.0), (
                "a leader was elected without the acknowledged write")
            cluster.start_node(leader)
            cluster.wait_for_leader(timeout_s=30)
            assert kv.get("k").value == b"acknowledged"

            # Rejoin: remove the old member, add a new learner, let it catch up, promote.
            addresses = ",".join(cluster.specs[n].address for n in (leader, lagging))
            removed = member_cli("remove", "--cluster", addresses, "--id", wiped)
            assert removed.returncode == 0, removed.stderr
            added = member_cli("add", "--cluster", addresses, "--id", wiped,
                               "--address", cluster.specs[wiped].address)
            assert added.returncode == 0, added.stderr
            cluster.wait_until(lambda: not (cluster.status(wiped) or None) or
                               cluster.status(wiped).vote_withheld == "" or None,
                               30, f"{wiped} known to the cluster as its new learner")
            promoted = member_cli("promote", "--cluster", addresses, "--id", wiped)
            assert promoted.returncode == 0, promoted.stderr
            listed = member_cli("list", "--cluster", addresses)
            assert f"{wiped} {cluster.specs[wiped].address} voter" in listed.stdout
            # A majority without `lagging`: `wiped`, caught up, now holds the write.
            cluster.kill(lagging)
            cluster.wait_for_leader(timeout_s=30, among=[leader, wiped])
            assert kv.get("k").value == b"acknowledged"
        finally:
            kv.close()


def test_a_new_member_joins_as_a_learner_and_is_promoted(tmp_path) -> None:
    """Grow a 3-node cluster to 4: `member add`, start the node with --join, `member
    promote` (which waits until the learner caught up), then it counts in majorities."""
    with LocalCluster(4, tmp_path) as cluster:
        first_three = ["n1", "n2", "n3"]
        peers3 = ",".join(f"{n}={cluster.specs[n].address}" for n in first_three)
        for node_id in first_three:
            others = ",".join(f"{n}={cluster.specs[n].address}" for n in first_three
                              if n != node_id)
            cluster.start_node(node_id, ["--peers", others])
        leader = cluster.wait_for_leader(timeout_s=30, among=first_three)
        kv = cluster.client()
        try:
            for i in range(20):
                kv.put(f"k{i}", b"v%d" % i)
            addresses = ",".join(cluster.specs[n].address for n in first_three)
            added = member_cli("add", "--cluster", addresses, "--id", "n4",
                               "--address", cluster.specs["n4"].address)
            assert added.returncode == 0, added.stderr
            cluster.start_node("n4", ["--peers", peers3, "--join"])
            promoted = member_cli("promote", "--cluster", addresses, "--id", "n4")
            assert promoted.returncode == 0, promoted.stderr
            assert "voters n1,n2,n3,n4" in promoted.stdout
            joined, founder = cluster.status("n4"), cluster.status("n1")
            assert joined.cluster_id == founder.cluster_id != ""  # learned when joining
            assert joined.vote_withheld == ""
            # 4 voters, majority 3: with one of the first three down, every write needs
            # n4's acknowledgement.
            cluster.kill([n for n in first_three if n != leader][0])
            kv.put("needs-n4", b"yes")
            assert kv.get("needs-n4").value == b"yes"
            assert cluster.status("n4").applied_index >= cluster.status(leader).commit_index - 5
        finally:
            kv.close()


def test_a_member_added_with_a_peer_address_is_reached_on_its_peer_port(tmp_path) -> None:
    """`member add --peer-address`: every member sends the new one Raft traffic over its
    plain-TCP peer port, as it does the members on its --peer-links; added without it, a
    member is reached over gRPC on its client port. Bad peer addresses are refused."""
    with LocalCluster(5, tmp_path) as cluster:
        first = ["n1", "n2", "n3"]
        specs = cluster.specs
        for node_id in first:
            others = [n for n in first if n != node_id]
            cluster.start_node(node_id, [
                "--peers", ",".join(f"{n}={specs[n].address}" for n in others),
                "--peer-links", ",".join(f"{n}={specs[n].peer_address}" for n in others)])
        cluster.wait_for_leader(timeout_s=30, among=first)
        addresses = ",".join(specs[n].address for n in first)
        bad = member_cli("add", "--cluster", addresses, "--id", "n4", "--address",
                         specs["n4"].address, "--peer-address", "no-port")
        assert bad.returncode == 2 and "must be HOST:PORT" in bad.stderr, bad.stderr
        same = member_cli("add", "--cluster", addresses, "--id", "n4", "--address",
                          specs["n4"].address, "--peer-address", specs["n4"].address)
        assert same.returncode == 2 and "client address" in same.stderr, same.stderr
        for node_id, peer in (("n4", ["--peer-address", specs["n4"].peer_address]), ("n5", [])):
            added = member_cli("add", "--cluster", addresses, "--id", node_id,
                               "--address", specs[node_id].address, *peer)
            assert added.returncode == 0, added.stderr
            cluster.start_node(node_id, [
                "--peers", ",".join(f"{n}={specs[n].address}" for n in first),
                "--peer-links", ",".join(f"{n}={specs[n].peer_address}" for n in first),
                "--join"])
            promoted = member_cli("promote", "--cluster", addresses, "--id", node_id)
            assert promoted.returncode == 0, promoted.stderr
        want = {"n4": f"tcp {specs['n4'].peer_address}", "n5": f"grpc {specs['n5'].address}"}
        for node_id in first:
            cluster.wait_until(
                lambda n=node_id: all(cluster.status(n) and cluster.status(n).peer_transports
                                      .get(m) == w for m, w in want.items()) or None,
                20, f"{node_id} to reach n4 on its peer port and n5 over gRPC")
        listed = member_cli("list", "--cluster", addresses)
        assert f"sends it raft over tcp {specs['n4'].peer_address})" in listed.stdout, listed.stdout
        # The joined members' own links to the founders are the command line's.
        assert cluster.status("n4").peer_transports["n1"] == f"tcp {specs['n1'].peer_address}"
        with cluster.client() as kv:
            written = kv.put("over-tcp", b"yes")
        cluster.wait_for_applied("n4", written.applied_index)


def _serve(tmp_path, node_id: str, data_dir) -> subprocess.CompletedProcess:  # noqa: ANN001
    from system.ports import free_ports

    (port,) = free_ports(1)
    return subprocess.run(
        [sys.executable, "-m", "system.kv", "serve", "--id", node_id, "--listen",
         f"127.0.0.1:{port}", "--data-dir", str(data_dir),
         "--log-file", str(tmp_path / "log.jsonl")],
        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True, text=True, timeout=60,
    )


def test_a_data_directory_of_another_node_or_a_damaged_identity_is_refused(tmp_path) -> None:
    from system.kv.identity import STATE_MEMBER, Identity, save_identity

    data_dir = tmp_path / "d"
    data_dir.mkdir()
    save_identity(data_dir, Identity("c-1", "n9", "m-1", STATE_MEMBER))
    other = _serve(tmp_path, "n8", data_dir)
    assert other.returncode == 2 and "belongs to node n9, not n8" in other.stderr
    assert other.stderr.count("\n") == 1 and "Traceback" not in other.stderr
    (data_dir / "IDENTITY").write_text('{"body": {"node_id": "n8"}, "crc32c": 1}\n')
    damaged = _serve(tmp_path, "n8", data_dir)
    assert damaged.returncode == 3 and "IDENTITY" in damaged.stderr
    assert "Traceback" not in damaged.stderr
    # Never "just empty it": the wipe comes only after the member was removed.
    assert damaged.stderr.index("member remove") < damaged.stderr.index("wipe")


def test_a_follower_restored_from_an_older_copy_is_caught_up_by_the_same_leader(
    tmp_path,
) -> None:
    """The follower's data directory comes back from a backup taken 30 writes ago (same
    incarnation, so its identity cannot tell). Its log is shorter than what it
    acknowledged: the same leader notices (a WARNING naming it and the indexes), resets
    its progress and sends it the entries again, without an election."""
    with LocalCluster(3, tmp_path) as cluster:
        cluster.start()
        leader = cluster.wait_for_leader(timeout_s=30)
        follower = next(n for n in cluster.ids if n != leader)
        kv = cluster.client()
        try:
            for i in range(20):
                kv.put(f"a{i}", b"x")
            cluster.stop(follower)
            backup = tmp_path / "backup"
            shutil.copytree(cluster.specs[follower].data_dir, backup)
            cluster.start_node(follower)
            for i in range(30):
                kv.put(f"b{i}", b"y")
            term = cluster.status(leader).term
            commit = cluster.status(leader).commit_index
            cluster.wait_until(lambda: (cluster.status(follower) or None) and
                               cluster.status(follower).applied_index >= commit or None,
                               30, f"{follower} to apply {commit}")
            cluster.kill(follower)
            shutil.rmtree(cluster.specs[follower].data_dir)
            shutil.copytree(backup, cluster.specs[follower].data_dir)
            cluster.start_node(follower)
            kv.put("after", b"z")
            target = cluster.status(leader).commit_index
            cluster.wait_until(lambda: (cluster.status(follower) or None) and
                               cluster.status(follower).applied_index >= target or None,
                               30, f"{follower} caught up again")
            assert cluster.leader() == leader and cluster.status(leader).term == term
            warnings = [line for line in
                        cluster.specs[leader].log_file.read_text().splitlines()
                        if "log went backwards" in line]
            assert warnings and f"follower {follower}" in warnings[0]
        finally:
            kv.close()


def test_a_welcome_counts_for_the_node_that_answered_not_for_the_address_asked(tmp_path) -> None:
    """n1's route to n2 leads to n3 (a stale --peers entry; in CI, a proxy that had taken
    n2's port). n3's welcome must not count twice: n1, which has heard from one other voter
    only, keeps its vote withheld and says which address answered for whom, while n2 and
    n3 confirm each other and elect a leader. Counted by address, n1 voted at once."""
    with LocalCluster(3, tmp_path) as cluster:
        n3_address = cluster.specs["n3"].address
        cluster.start_node("n1", ["--peers", f"n2={n3_address},n3={n3_address}"])
        cluster.start_node("n2")
        cluster.start_node("n3")
        cluster.wait_for_leader(timeout_s=30, among=["n2", "n3"])
        log_file = cluster.specs["n1"].log_file
        cluster.wait_until(
            lambda: "the address of n2, is answered by n3" in log_file.read_text() or None, 30,
            "n1 to report that n2's address is answered by n3")
        assert cluster.status("n1").vote_withheld.startswith("new data directory")
        assert "identity confirmed" not in log_file.read_text()


def test_a_node_started_with_join_before_member_add_sees_itself_promoted(tmp_path) -> None:
    """The order the store's own advice gives (start with --join, then `member add`, then
    `member promote`): once promoted, the new node's own view (its Status, what `member
    list` prints when it answers) names it a voter, as the committed configuration does."""
    with LocalCluster(4, tmp_path) as cluster:
        first_three = ["n1", "n2", "n3"]
        peers3 = ",".join(f"{n}={cluster.specs[n].address}" for n in first_three)
        for node_id in first_three:
            others = ",".join(f"{n}={cluster.specs[n].address}" for n in first_three
                              if n != node_id)
            cluster.start_node(node_id, ["--peers", others])
        cluster.wait_for_leader(timeout_s=30, among=first_three)
        with cluster.client() as kv:
            kv.put("k", b"v")
        cluster.start_node("n4", ["--peers", peers3, "--join"])
        cluster.wait_until(lambda: cluster.status("n4") is not None, 30, "n4 to answer")
        addresses = ",".join(cluster.specs[n].address for n in first_three)
        added = member_cli("add", "--cluster", addresses, "--id", "n4",
                           "--address", cluster.specs["n4"].address)
        assert added.returncode == 0, added.stderr
        promoted = member_cli("promote", "--cluster", addresses, "--id", "n4")
        assert promoted.returncode == 0, promoted.stderr
        assert "voters n1,n2,n3,n4" in promoted.stdout
        cluster.wait_until(
            lambda: (st := cluster.status("n4")) is not None and "n4" in st.voters,
            30, "n4 to list itself as a voter")
        st = cluster.status("n4")
        assert list(st.voters) == ["n1", "n2", "n3", "n4"] and list(st.learners) == []
        listed = member_cli("list", "--cluster", cluster.specs["n4"].address)
        assert f"n4 {cluster.specs['n4'].address} voter" in listed.stdout, listed.stdout
