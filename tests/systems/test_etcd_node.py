"""The etcd member's command line and data files (nemesis/systems/etcd/node.py): pure,
no etcd needed."""

from __future__ import annotations

from pathlib import Path

from nemesis.systems.etcd import node
from nemesis.systems.etcd.members import Member, initial_cluster
from system.kv.tls import TlsFiles


def _flags(argv: list[str]) -> dict[str, str]:
    flags, i = {}, 1
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]] = argv[i + 1]
            i += 2
        else:
            flags[argv[i]] = ""
            i += 1
    return flags


def test_command_of_a_new_plaintext_member(tmp_path):
    m = node.EtcdMember("e1", tmp_path / "e1", "127.0.0.1:2379", "127.0.0.1:2380",
                        {"e1": "127.0.0.1:2380", "e2": "127.0.0.1:2390"},
                        listen_client="0.0.0.0:2379")
    f = _flags(m.command("/usr/bin/etcd"))
    assert f["--name"] == "e1" and f["--data-dir"] == str(tmp_path / "e1")
    assert f["--listen-client-urls"] == "http://0.0.0.0:2379"
    assert f["--advertise-client-urls"] == "http://127.0.0.1:2379"
    assert f["--initial-cluster"] == "e1=http://127.0.0.1:2380,e2=http://127.0.0.1:2390"
    assert f["--initial-cluster-state"] == "new"
    assert "--client-cert-auth" not in f


def test_command_of_a_joining_tls_member(tmp_path):
    tls = TlsFiles(tmp_path / "e3.crt", tmp_path / "e3.key", tmp_path / "ca.crt")
    m = node.EtcdMember("e3", tmp_path / "e3", "127.0.0.1:1", "127.0.0.1:2",
                        {"e1": "127.0.0.1:3", "e3": "127.0.0.1:2"}, new=False, tls=tls)
    f = _flags(m.command())
    assert f["--initial-cluster-state"] == "existing"
    assert f["--listen-peer-urls"] == "https://127.0.0.1:2"
    assert f["--initial-cluster"] == "e1=https://127.0.0.1:3,e3=https://127.0.0.1:2"
    for prefix in ("", "peer-"):
        assert f[f"--{prefix}cert-file"] == str(tls.cert)
        assert f[f"--{prefix}key-file"] == str(tls.key)
        assert f[f"--{prefix}trusted-ca-file"] == str(tls.ca)
        assert f"--{prefix}client-cert-auth" in f


def test_initial_cluster_for_a_learner_names_the_nameless_newcomer():
    members = [Member(1, "e1", ("http://a:1",), (), False),
               Member(2, "", ("http://d:4",), (), True)]
    assert initial_cluster(members, "e4", "http://d:4") == "e1=http://a:1,e4=http://d:4"


def test_data_files_follow_etcds_layout(tmp_path):
    (tmp_path / "member" / "wal").mkdir(parents=True)
    (tmp_path / "member" / "snap").mkdir()
    for name in ("member/wal/0000000000000000-0000000000000000.wal",
                 "member/snap/0000000000000002-0000000000000010.snap", "member/snap/db"):
        (tmp_path / name).write_bytes(b"x")
    files = node.data_files(tmp_path)
    assert [p.name for p in files["wal"]] == ["0000000000000000-0000000000000000.wal"]
    assert [p.name for p in files["snap"]] == ["0000000000000002-0000000000000010.snap"]
    assert files["db"] == [tmp_path / "member/snap/db"]
    assert node.data_files(tmp_path / "none") == {"wal": [], "snap": [], "db": []}


def test_missing_etcd_says_how_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not node.installed()
    assert node.version() == "unknown"
    try:
        node.require_installed()
    except FileNotFoundError as exc:
        assert "bash benchmarks/setup_kv_bench.sh" in str(exc)
    else:
        raise AssertionError("require_installed() did not refuse")
    assert Path(node.SNAP_DIR) / "db" == Path(node.DB_FILE)
