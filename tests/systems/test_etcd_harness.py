"""`python -m nemesis run --system etcd` (issue 23): a short faulted run of etcd under the
harness is VALID on the local platform and on Docker, the run folder names etcd and its
version, and the verdict is not vacuous: the same history with one acknowledged read's
value changed is caught by the checker. etcd's refusal of damaged data is told from its
other fatal exits by its log line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemesis.platforms.docker import docker_available
from nemesis.systems.etcd.node import SETUP_HINT, etcd_binary

REPO = Path(__file__).resolve().parents[2]
DOCKER, DOCKER_REASON = docker_available()
RUN_TIMEOUT_S = 300  # start, 15 s of workload, heal, final reads, check: on a busy 2-core box
needs_etcd = pytest.mark.skipif(etcd_binary() is None, reason=SETUP_HINT)


def _run(store: Path, *args: str) -> tuple[int, str, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "nemesis", "run", "--system", "etcd", "--store", str(store),
         "--nodes", "3", "--duration", "15", "--interval", "3",
         "--faults", "partition,kill,pause", *args],
        cwd=store.parent, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout + proc.stderr, (store / "latest").resolve()


def _assert_valid_etcd_run(code: int, out: str, run_dir: Path) -> dict:
    assert code == 0, out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True, out
    assert results["system"] == {"name": "etcd", "version": "3.4.23"}
    assert sum(results["faults"].values()) >= 2, results["faults"]
    assert sum(row["ok"] for row in results["operations"].values()) > 100, results["operations"]
    assert "--system etcd" in out  # the reproduce line keeps it
    return results


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    if etcd_binary() is None:
        pytest.skip(SETUP_HINT)
    return _run(tmp_path_factory.mktemp("etcd-local") / "store", "--platform", "local",
                "--seed", "23")


@pytest.mark.integration
@pytest.mark.slow
@needs_etcd
def test_a_local_etcd_run_under_faults_is_valid(local_run: tuple[int, str, Path]) -> None:
    _assert_valid_etcd_run(*local_run)


@pytest.mark.integration
@pytest.mark.slow
@needs_etcd
def test_a_changed_read_in_the_etcd_history_is_caught(local_run: tuple[int, str, Path],
                                                       tmp_path: Path) -> None:
    """Plant one anomaly in the real etcd history: an acknowledged linearizable read of
    a written key now reports a value nobody wrote at that version."""
    from nemesis.check import check_run

    _, _, run_dir = local_run
    planted = tmp_path / "planted"
    planted.mkdir()
    shutil.copy(run_dir / "test.json", planted / "test.json")
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        record = json.loads(line)
        if (record.get("type") == "ok" and record.get("f") == "get"
                and record.get("value") is not None and record.get("version", 0) >= 1):
            record["value"] = "planted-never-written"
            lines[i] = json.dumps(record)
            break
    else:
        pytest.fail("the etcd history has no ok read of a written key to change")
    (planted / "history.jsonl").write_text("\n".join(lines) + "\n")
    assert check_run(run_dir)["valid"] is True  # the history as recorded
    assert check_run(planted)["valid"] is False


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not DOCKER, reason=f"no Docker engine: {DOCKER_REASON}")
def test_a_docker_etcd_run_under_faults_is_valid(tmp_path: Path) -> None:
    _assert_valid_etcd_run(*_run(tmp_path / "store", "--platform", "docker", "--seed", "23"))


def test_etcd_refusing_its_data_is_told_from_other_fatal_exits() -> None:
    from nemesis.systems import get_system

    etcd = get_system("etcd")
    crc = ('{"level":"fatal","ts":"2026-12-03T14:00:00Z","caller":"etcdserver/storage.go:95",'
           '"msg":"failed to read WAL","error":"walpb: crc mismatch"}')
    bootstrapped = ('{"level":"fatal","msg":"discovery failed","error":'
                    '"member n2 has already been bootstrapped"}')
    port = ('{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:2380: '
            'bind: address already in use"}')
    assert etcd.refuses_data(1, crc)
    assert etcd.refuses_data(1, bootstrapped)
    undecodable = ('{"level":"fatal","caller":"etcdmain/etcd.go:271","msg":"discovery failed",'
                   '"error":"proto: Record: illegal tag 0 (wire type 0)"}')
    assert etcd.refuses_data(1, undecodable)
    assert not etcd.refuses_data(1, port)
    assert not etcd.refuses_data(2, crc)  # another panic is a crash, not a refusal
    lost = ("panic: tocommit(1021) is out of range [lastIndex(1017)]. Was the raft log "
            "corrupted, truncated, or lost?")
    assert etcd.refuses_data(2, lost)
    assert not etcd.refuses_data(2, "panic: runtime error: index out of range [3] with length 3")


def test_a_member_added_back_starts_as_joining_the_members_etcd_listed(tmp_path: Path) -> None:
    """Every member is listed at the one peer URL it advertises; after an add, the node's
    next command line joins (`existing`) with the members as etcd had them then."""
    from nemesis.systems import get_system
    from nemesis.systems.base import NodeSetup

    etcd = get_system("etcd")
    setup = NodeSetup("n1", "127.0.0.1:1001", "127.0.0.1:2001", {"n2": "127.0.0.1:1002"},
                      {"n2": "127.0.0.1:3002"}, tmp_path / "n1", tmp_path / "n1.log", None,
                      "local", peer_advertise="127.0.0.1:3001")
    argv = etcd.node_command(setup)
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert flag("--listen-peer-urls") == "http://127.0.0.1:2001"
    assert flag("--initial-advertise-peer-urls") == "http://127.0.0.1:3001"
    assert flag("--initial-cluster") == "n1=http://127.0.0.1:3001,n2=http://127.0.0.1:3002"
    assert flag("--initial-cluster-state") == "new"
    etcd._joining["n1"] = {"n2": "127.0.0.1:3002", "n1": "127.0.0.1:3001"}  # what add found
    argv = etcd.node_command(setup)
    assert flag("--initial-cluster-state") == "existing"
    assert flag("--initial-cluster") == "n2=http://127.0.0.1:3002,n1=http://127.0.0.1:3001"


def test_a_directed_cut_on_one_peer_url_per_member_cuts_the_pair(tmp_path: Path) -> None:
    """etcd's messages from a to b travel on connections b dials to a (stream readers) as
    well as on a's own: a cut a -> b must refuse both, and the pair stays cut until
    neither direction is."""
    from nemesis.platforms.local_cluster import SourceLinks
    from nemesis.platforms.tcp_proxy import ProxyMode
    from system.kv.local_cluster import NodeSpec

    specs = {n: NodeSpec(n, f"127.0.0.1:{1000 + i}", f"127.0.0.1:{2000 + i}", tmp_path,
                         tmp_path / f"{n}.log", tmp_path / f"{n}.err")
             for i, n in enumerate(("a", "b", "c"))}
    links = SourceLinks(specs, dict)
    try:
        cut = lambda x, y: (links.proxies[y].mode(x), links.proxies[x].mode(y))  # noqa: E731
        links.link("a", "b").set_mode(ProxyMode.CUT)
        assert cut("a", "b") == (ProxyMode.CUT, ProxyMode.CUT)
        assert cut("a", "c") == (ProxyMode.FORWARD, ProxyMode.FORWARD)
        links.link("b", "a").set_mode(ProxyMode.CUT)
        links.link("a", "b").set_mode(ProxyMode.FORWARD)
        assert cut("a", "b") == (ProxyMode.CUT, ProxyMode.CUT)  # b -> a still cut
        links.link("b", "a").set_mode(ProxyMode.FORWARD)
        assert cut("a", "b") == (ProxyMode.FORWARD, ProxyMode.FORWARD)
    finally:
        links.close()
