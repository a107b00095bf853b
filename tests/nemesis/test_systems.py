"""The system interface (nemesis/systems): the registry, the store as its implementation,
the outcome mapping the kv workload relies on, the data layout the file faults use, and
which system ran in test.json, the report and JUnit. No cluster here (see the slow test at
the end for one node run through a system object)."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from histories.write import HistoryWriter
from nemesis.cli import main
from nemesis.platforms import disk_damage
from nemesis.platforms.base import ClusterConfig, PlatformError
from nemesis.platforms.local_cluster import LocalCluster
from nemesis.report.data import load_run
from nemesis.report.junit import render
from nemesis.systems import SYSTEMS, UnknownSystem, get_system
from nemesis.systems.base import Fail, KvResult, System, Unknown, VersionMismatch
from nemesis.systems.store import StoreKvClient, StoreSystem
from system.kv import client as kv_client
from tests.report.conftest import make_run
from workloads.kv import KVWorkload, PlannedOp, ReplayBook


@pytest.fixture
def valid_run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "store", "run1", stale_read=False)

# ----- the registry -------------------------------------------------------------------


def test_an_unknown_system_is_one_line_listing_the_choices() -> None:
    with pytest.raises(UnknownSystem) as info:
        get_system("cassandra")
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "'cassandra'" in text and all(name in text for name in SYSTEMS)


def test_run_refuses_an_unknown_system_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--platform", "local", "--system", "cassandra",
                 "--store", str(tmp_path / "store")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown system 'cassandra'" in err, err
    assert "store" in err  # the choices
    assert not (tmp_path / "store").exists()


USER_MODULE = """
from nemesis.systems.store import StoreSystem


class MyStore(StoreSystem):
    name = "mystore"


NOT_A_SYSTEM = 3
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's, outside the project, holding a System subclass."""
    (tmp_path / "user_systems").mkdir()
    (tmp_path / "user_systems" / "mydb.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "user_systems"))
    return "mydb"


def test_a_users_own_system_is_named_by_module_and_class(user_module: str) -> None:
    system = get_system(f"{user_module}:MyStore")
    assert isinstance(system, StoreSystem) and system.name == "mystore"


@pytest.mark.parametrize("spec, says", [
    ("no_such_module_here:MyDb", "cannot import 'no_such_module_here'"),
    ("mydb:Missing", "mydb.Missing is no such name"),
    ("mydb:NOT_A_SYSTEM", "mydb.NOT_A_SYSTEM is a int, not a subclass"),
])
def test_a_wrong_module_class_is_one_line_saying_what_is_wrong(user_module: str, spec: str,
                                                               says: str) -> None:
    with pytest.raises(UnknownSystem) as info:
        get_system(spec)
    assert len(str(info.value).splitlines()) == 1 and says in str(info.value)


def test_a_run_of_a_users_own_system_records_it_and_reproduces_with_it(
        user_module: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert main(["run", "--platform", "sim", "--system", f"{user_module}:MyStore",
                 "--duration", "5", "--seed", "7", "--store", str(store)]) == 0
    test = json.loads((store / "latest" / "test.json").read_text())
    assert test["system"]["name"] == "mystore"
    assert f"--system {user_module}:MyStore" in test["reproduce"]


class _OtherSystem(StoreSystem):
    """The store under another name that the simulator does not hold."""

    name = "other"
    simulated = False


def test_the_sim_platform_refuses_a_system_it_does_not_simulate(tmp_path: Path) -> None:
    from nemesis.platforms.sim import SimPlatform

    config = ClusterConfig(nodes=3, run_id="t", work_dir=tmp_path, system=_OtherSystem())
    with pytest.raises(PlatformError, match="simulates our store only, not other"):
        SimPlatform(config, seed=1)


# ----- the store's command line --------------------------------------------------------


def test_the_store_system_starts_a_node_with_the_command_line_it_had(tmp_path: Path) -> None:
    """LocalCluster with the store's System builds the line system/kv's cluster builds."""
    args = ("--snapshot-entries", "200")
    with LocalCluster(3, tmp_path / "a", node_args=args, proxy_peer_links=True) as plain, \
            LocalCluster(3, tmp_path / "a", node_args=args, proxy_peer_links=True,
                         system=StoreSystem()) as through:
        # Same specs (directories, ports) for both: compare through the same object,
        # then give `through` its own proxies back, so that closing it closes them.
        own = through.specs, through.link_proxies
        through.specs, through.link_proxies = plain.specs, plain.link_proxies
        try:
            for node in plain.specs:
                assert through.command(node) == plain.command(node)
        finally:
            through.specs, through.link_proxies = own


def test_with_tls_the_node_gets_its_certificate_on_both_ports(tmp_path: Path) -> None:
    cluster = LocalCluster(3, tmp_path, tls_dir=tmp_path / "tls", system=StoreSystem())
    try:
        line = cluster.command("n2")
    finally:
        cluster.close()
    for flag in ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file",
                 "--peer-key-file", "--peer-trusted-ca-file"):
        assert line[line.index(flag) + 1].startswith(str(tmp_path / "tls")), flag
    assert "--client-cert-auth" in line
    assert line[line.index("--cert-file") + 1].endswith("n2.crt")


# ----- outcomes ------------------------------------------------------------------------


class _Raising:
    """A stand-in for the store's KVClient whose every call raises `exc`."""

    node_addresses = {"n1": "127.0.0.1:1"}

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def new_request_id(self) -> str:
        return "rid"

    def put(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise self.exc

    delete = get = put

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("raised", "becomes"), [
    (kv_client.Unavailable("no node"), Fail),
    (kv_client.InvalidArgument("too large"), Fail),
    (kv_client.Indeterminate("timed out", "rid"), Unknown),
    (kv_client.CasMismatch("k", 1, 4, "n2"), VersionMismatch),
    (kv_client.DeleteVersionMismatch("k", 1, 0, "n2"), VersionMismatch),
])
def test_the_store_clients_errors_map_onto_the_harness_outcomes(raised: Exception,
                                                                 becomes: type) -> None:
    client = StoreKvClient(_Raising(raised))
    with pytest.raises(becomes):
        client.put("k", b"v", expected_version=1)
    with pytest.raises(becomes):
        client.delete("k", expected_version=1)


def test_a_read_the_store_could_not_serve_is_a_fail_and_an_absent_key_is_version_0() -> None:
    with pytest.raises(Fail):
        StoreKvClient(_Raising(kv_client.Indeterminate("timed out", "rid"))).get("k")
    assert StoreKvClient(_Raising(kv_client.NotFound("k", "n3"))).get("k") == KvResult(
        version=0, node="n3")


class _Scripted:
    """A KvClient of some other system: answers from a list, in order."""

    node_addresses = {"n1": "10.0.0.1:2379"}

    def __init__(self, answers: list) -> None:
        self.answers = answers

    def new_request_id(self) -> str:
        return "r1"

    def _next(self, *args, **kwargs) -> KvResult:  # noqa: ANN002, ANN003
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    put = delete = get = _next

    def close(self) -> None:
        pass


def test_the_kv_workload_records_each_outcome_of_any_system(tmp_path: Path) -> None:
    workload = KVWorkload(concurrency=1, rate=10, op_timeout_s=1.0)
    client = _Scripted([KvResult(version=1, node="n1", term=2), VersionMismatch(3, "n2"),
                        Fail("refused"), KvResult(version=0), Fail("no leader"),
                        KvResult(version=1, node="n1", term=2), Unknown("timed out")])
    seen: dict[str, int] = {}
    book = ReplayBook(itertools.count())
    with HistoryWriter(tmp_path / "h.jsonl") as history:
        assert not workload._one(history, client, 0, PlannedOp("k", "put", "0-1"), seen, book)
        assert not workload._one(history, client, 0, PlannedOp("k", "cas", "0-2", "right"), seen,
                                 book)
        assert seen["k"] == 3  # the version the mismatch reported
        assert not workload._one(history, client, 0, PlannedOp("k", "put", "0-3"), seen, book)
        assert not workload._one(history, client, 0, PlannedOp("k", "get", ""), seen, book)
        assert not workload._one(history, client, 0, PlannedOp("k", "get", ""), seen, book)
        # the first acknowledged write again, with its request id (offset 0 picks it)
        assert not workload._one(history, client, 0, PlannedOp("k", "replay", "", offset=0),
                                 seen, book)
        assert workload._one(history, client, 0, PlannedOp("k", "delete", ""), seen, book)  # retires
    records = [json.loads(line) for line in (tmp_path / "h.jsonl").read_text().splitlines()]
    done = [r for r in records if r["type"] != "invoke"]
    assert [d["type"] for d in done] == ["ok", "ok", "fail", "ok", "fail", "ok", "info"]
    assert done[1]["applied"] is False and done[1]["version"] == 3
    assert done[3]["value"] is None and done[3]["version"] == 0
    assert "applied_index" not in done[3]  # the system did not say
    replay = next(r for r in records if r["f"] == "replay" and r["type"] == "invoke")
    assert (replay["replay_of"], replay["replayed"], replay["value"]) == (0, "put", "0-1")
    assert seen["k"] == 0  # the last read saw it absent; the replay (v1) is old news, not seen


# ----- file faults ---------------------------------------------------------------------


def test_the_file_faults_follow_the_systems_data_layout(tmp_path: Path) -> None:
    """An etcd-like layout: WAL segments in member/wal, snapshots in member/snap."""
    data = tmp_path / "n1"
    (data / "member" / "wal").mkdir(parents=True)
    (data / "member" / "snap").mkdir(parents=True)
    (data / "member" / "wal" / "0000000000000000-0000000000000000.wal").write_bytes(b"x" * 100)
    (data / "member" / "snap" / "0000000000000002-0000000000000010.snap").write_bytes(b"y" * 40)
    (data / "member" / "snap" / "db").write_bytes(b"z" * 10)  # not a snapshot by suffix
    layout = {"wal": ["member/wal", ".wal"], "snapshots": ["member/snap", ".snap"],
              "preallocated": False}
    found = disk_damage.handle({"op": "list", "dirs": {"n1": str(data)}, "layout": layout})
    assert found == {"n1": {"member/wal/0000000000000000-0000000000000000.wal": 100,
                            "member/snap/0000000000000002-0000000000000010.snap": 40}}
    done = disk_damage.handle({"op": "damage", "dirs": {"n1": str(data)}, "layout": layout,
                               "damage": {"n1": [{"kind": "remove-wal"}]}})
    assert done["n1"][0]["bytes"] == 100
    assert not (data / "member" / "wal").exists() and (data / "member" / "snap").exists()


def test_the_store_layout_is_what_the_file_faults_always_used() -> None:
    assert StoreSystem().data_layout().as_request() == disk_damage.STORE_LAYOUT


# ----- which system ran ------------------------------------------------------------------


def test_test_json_the_report_and_junit_name_the_system_and_its_version(
        valid_run: Path, tmp_path: Path) -> None:
    from nemesis import runner

    config = runner.RunConfig(
        argv=["t"], platform="local", platform_reason="t", faults=["none"], duration_s=1.0,
        interval_s=1.0, nodes=3, workload="kv", seed=1, store=tmp_path, concurrency=1,
        rate=1.0, op_timeout_s=1.0, read_consistency="linearizable", unsafe=None,
        check_budget_s=1.0)
    test = runner.test_map(config, "r", runner.make_workload(config))
    assert test["system"] == {"name": "store", "version": StoreSystem().version()}
    assert "--system" not in config.reproduce()  # the default is left out
    config.system = "other"
    assert "--system other" in config.reproduce()

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("history.jsonl", "results.json"):
        (run_dir / name).write_bytes((valid_run / name).read_bytes())
    test = json.loads((valid_run / "test.json").read_text())
    test["system"] = {"name": "etcd", "version": "3.4.23"}
    (run_dir / "test.json").write_text(json.dumps(test))
    data = load_run(run_dir)
    assert data.system == ("etcd", "3.4.23")
    suite = ET.fromstring(render(data)).find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert (props["system"], props["system_version"]) == ("etcd", "3.4.23")
    from nemesis.report.html import _overview

    assert "<th>system</th><td>etcd 3.4.23</td>" in _overview(data)


def test_a_run_folder_from_before_systems_reads_as_the_store_at_its_commit(valid_run: Path) -> None:
    data = load_run(valid_run)  # its test.json has no "system"
    assert data.system == ("store", "test")


# ----- what a platform asks of the system ------------------------------------------------


def test_the_trainer_refuses_a_system_other_than_the_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.trainer import TrainerWorkload

    with pytest.raises(ValueError, match="needs our store"):
        TrainerWorkload(system=_Bare())
    monkeypatch.setitem(SYSTEMS, "bare", f"{__name__}:_Bare")
    assert main(["run", "--platform", "local", "--system", "bare", "--workload", "trainer",
                 "--store", str(tmp_path / "store")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--workload trainer needs our store" in err, err


class _Bare(System):
    """Only what the interface requires (the store's node and client underneath): no
    trainer client, no canaries, no membership changes, no data layout."""

    name = "bare"

    def __init__(self) -> None:
        self.store = StoreSystem()

    def version(self) -> str:
        return "0"

    def node_command(self, setup):  # noqa: ANN001, ANN201
        return self.store.node_command(setup)

    def status(self, address, *, timeout_s, tls):  # noqa: ANN001, ANN201
        return self.store.status(address, timeout_s=timeout_s, tls=tls)

    def kv_client(self, addresses, **kwargs):  # noqa: ANN001, ANN003, ANN201
        return self.store.kv_client(addresses, **kwargs)


def test_a_store_canary_is_refused_for_a_system_without_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SYSTEMS, "bare", f"{__name__}:_Bare")
    assert main(["run", "--platform", "local", "--system", "bare", "--unsafe", "stale-read",
                 "--store", str(tmp_path / "store")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the bare system has none by that name" in err, err


class _Recording(StoreSystem):
    """The store, counting what the platform asks of its System."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []
        self.statuses = 0

    def node_command(self, setup):  # noqa: ANN001, ANN201
        self.commands.append(setup.node_id)
        return super().node_command(setup)

    def node_env(self, setup):  # noqa: ANN001, ANN201
        return {"MAO_TEST_NODE_ENV": setup.node_id}

    def status(self, address, *, timeout_s, tls):  # noqa: ANN001, ANN201
        self.statuses += 1
        return super().status(address, timeout_s=timeout_s, tls=tls)


@pytest.mark.slow
def test_the_local_platform_runs_and_asks_nodes_through_the_system(tmp_path: Path) -> None:
    from nemesis.platforms.local import LocalPlatform
    from tests.nemesis.waiting import wait_until

    system = _Recording()
    platform = LocalPlatform(ClusterConfig(nodes=3, run_id="sys", work_dir=tmp_path,
                                           system=system))
    try:
        platform.start()
        assert sorted(system.commands) == ["n1", "n2", "n3"]
        leader = wait_until(platform.ready, 30.0, "a leader with every node up")
        assert system.statuses > 0 and leader in platform.node_ids
        for node, proc in platform.cluster.processes.items():
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            assert f"MAO_TEST_NODE_ENV={node}".encode() in environ
        voters, learners = platform.membership()
        assert voters == {"n1", "n2", "n3"} and not learners
        platform.kill(leader)
        platform.start_node(leader)
        assert system.commands.count(leader) == 2  # a restart asks again
    finally:
        platform.close()
    assert not system._probes  # closed with the platform


def test_a_system_without_membership_makes_the_platform_say_so(tmp_path: Path) -> None:
    from nemesis.platforms.local import LocalPlatform

    platform = LocalPlatform(ClusterConfig(nodes=3, run_id="bare", work_dir=tmp_path,
                                           system=_Bare()))
    try:
        assert not platform.supports_membership()
        assert not platform.supports_file_faults()
        with pytest.raises(Exception, match="no membership changes"):
            platform.membership()
        # Refused before any node starts, in one line each.
        from nemesis.runner import HarnessError, check_platform

        with pytest.raises(HarnessError, match="member needs membership changes; the bare"):
            check_platform(["kill", "member"], platform)
        with pytest.raises(HarnessError, match="running bare cannot"):
            check_platform(["truncate"], platform)
        check_platform(["kill", "partition", "pause"], platform)
    finally:
        platform.close()


# ----- faults that need our store's Raft status ----------------------------------------


@pytest.mark.parametrize("fault", ["election", "rollback", "restore-majority", "hold", "reorder"])
def test_etcd_refuses_the_faults_it_cannot_take_in_one_line(
        fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--platform", "local", "--system", "etcd", "--faults", fault,
                 "--store", str(tmp_path / "store")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--faults {fault}" in err and "store" in err, err
    assert not (tmp_path / "store").exists()


def test_faults_all_on_etcd_leaves_them_out_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import nemesis.runner

    configs = []
    monkeypatch.setattr(nemesis.runner, "run", lambda config: configs.append(config) or 0)
    assert main(["run", "--platform", "local", "--system", "etcd", "--faults", "all",
                 "--store", str(tmp_path / "store")]) == 0
    [config] = configs
    assert not {"election", "rollback", "restore-majority", "hold", "reorder"} & set(config.faults)
    assert "partition" in config.faults and "member" in config.faults
    out = capsys.readouterr().out
    assert "leaves out" in out and "election, rollback" in out and "reorder, hold (" in out, out
    configs.clear()
    assert main(["run", "--platform", "local", "--faults", "all",
                 "--store", str(tmp_path / "store")]) == 0
    assert {"election", "rollback", "restore-majority", "hold", "reorder"} <= set(configs[0].faults)  # the store runs them


def test_restore_majority_needs_a_workload_that_can_hold_its_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import nemesis.runner

    assert main(["run", "--platform", "local", "--workload", "trainer", "--faults",
                 "restore-majority", "--store", str(tmp_path / "store")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "kv workload" in err, err
    configs = []
    monkeypatch.setattr(nemesis.runner, "run", lambda config: configs.append(config) or 0)
    assert main(["run", "--platform", "local", "--workload", "trainer", "--faults", "all",
                 "--store", str(tmp_path / "store")]) == 0
    assert "restore-majority" not in configs[0].faults and "rollback" in configs[0].faults
    assert "restore-majority (it holds the clients" in capsys.readouterr().out
