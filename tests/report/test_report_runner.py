"""The runner writes report.html (and JUnit XML with --junit) after every run, a crashed one
included, and a report that cannot be written never changes the run's exit code. Driven
with an in-memory platform and a scripted workload: no cluster, a couple of seconds."""

from __future__ import annotations

import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nemesis"))
from test_nemesis_schedule import FakePlatform  # noqa: E402

from nemesis import runner  # noqa: E402
from workloads.base import RunContext, Workload  # noqa: E402


class ScriptedWorkload(Workload):
    """Two writes and a read of one key, recorded at start; nothing in flight."""

    def start(self, ctx: RunContext) -> None:
        for n in (1, 2):
            i = ctx.history.invoke(n, "put", "k", f"v{n}")
            ctx.history.complete(i, "ok", f"v{n}", version=n, applied=True, node="n1")
            self.counts.add("put", "ok")
        i = ctx.history.invoke(3, "get", "k", None)
        ctx.history.complete(i, "ok", "v2", version=2, node="n2")
        self.counts.add("get", "ok")

    def join(self, timeout_s: float) -> bool:
        return True

    def final_reads(self, ctx: RunContext, timeout_s: float) -> dict[str, Any]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {"name": "kv", "model": "versioned-kv"}


def _config(tmp_path: Path) -> runner.RunConfig:
    return runner.RunConfig(
        argv=["python", "-m", "nemesis", "run"], platform="local", platform_reason="test",
        faults=["none"], duration_s=0.3, interval_s=10.0, nodes=3, workload="kv", seed=5,
        store=tmp_path / "store", concurrency=1, rate=0, op_timeout_s=1.0,
        read_consistency="linearizable", unsafe=None, check_budget_s=5.0,
        junit=tmp_path / "junit.xml")


@pytest.fixture()
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> FakePlatform:
    platform = FakePlatform(3)
    monkeypatch.setattr(runner, "make_platform", lambda config, run_id, run_dir, **_: platform)
    monkeypatch.setattr(runner, "make_workload", lambda config: ScriptedWorkload())
    return platform


def test_a_run_ends_with_its_report_and_junit(tmp_path: Path, fake_cluster: FakePlatform) -> None:
    out = io.StringIO()
    assert runner.run(_config(tmp_path), out=out) == 0
    run_dir = (tmp_path / "store" / "latest").resolve()
    page = (run_dir / "report.html").read_text()
    assert "VALID: 3 operations" in page
    assert (run_dir / "latency.png").exists() and (run_dir / "rate.png").exists()
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("tests") == "7"  # + replicas, replays, stale states, crashes, reports
    last = out.getvalue().rstrip().splitlines()[-1]
    assert last.startswith("report: ") and "/report.html; junit: " in last
    assert last.endswith(str(tmp_path / "junit.xml"))


def test_a_run_that_never_elected_a_leader_still_gets_a_report(
        tmp_path: Path, fake_cluster: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "LEADER_TIMEOUT_S", 0.2)
    monkeypatch.setattr(type(fake_cluster), "leader", lambda self: None)
    assert runner.run(_config(tmp_path), out=io.StringIO()) == 3
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert "CRASHED: the harness did not finish the run (no leader with every node up" in (
        run_dir / "report.html").read_text()
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.find("testcase").get("name") == "harness" and suite.get("errors") == "1"


def test_a_report_failure_does_not_change_the_exit_code(
        tmp_path: Path, fake_cluster: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> None:
    import nemesis.report as report

    def broken(run_dir: Path) -> Path:
        raise OSError("disk full")

    monkeypatch.setattr(report, "write_report", broken)
    out = io.StringIO()
    assert runner.run(_config(tmp_path), out=out) == 0
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert "report: not written (OSError: disk full" in out.getvalue()
    assert "report.html could not be written" in (run_dir / "harness.log").read_text()


def _docker_config(tmp_path: Path) -> runner.RunConfig:
    config = _config(tmp_path)
    config.platform = "docker"
    return config


def test_the_run_folder_is_made_once_the_node_image_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder was named by the time before a first image build (minutes): it is made,
    and named, once the platform is ready, and the platform gets the image built."""
    import nemesis.platforms.image as image

    store = tmp_path / "store"
    built: list[bool] = []

    def ensure_image() -> str:
        built.append((store / "kv").exists() and any((store / "kv").iterdir()))
        return "mao-node:test"

    given: dict[str, Any] = {}

    def make_platform(config, run_id, run_dir, image=None, **_):  # noqa: ANN001, ANN202
        given.update(run_dir=run_dir, image=image)
        return FakePlatform(3)

    monkeypatch.setattr(image, "ensure_image", ensure_image)
    monkeypatch.setattr(runner, "make_platform", make_platform)
    monkeypatch.setattr(runner, "make_workload", lambda config: ScriptedWorkload())
    out = io.StringIO()
    assert runner.run(_docker_config(tmp_path), out=out) == 0
    assert built == [False], "a run folder existed while the image was being built"
    assert given["image"] == "mao-node:test"
    assert given["run_dir"] == (store / "latest").resolve()


@pytest.mark.parametrize("error,line", [
    ("unavailable", "harness error: docker platform: debootstrap failed (exit 1) (no run was "
                    "started, no run folder made)"),
    ("engine", "harness error: docker platform: preparing it failed: RuntimeError: 500 Server "
               "Error (no run was started, no run folder made)"),
])
def test_an_image_build_that_fails_leaves_no_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str, line: str) -> None:
    import nemesis.platforms.image as image
    from nemesis.platforms.base import PlatformUnavailable

    def ensure_image() -> str:
        if error == "unavailable":
            raise PlatformUnavailable("debootstrap failed (exit 1)")
        raise RuntimeError("500 Server Error")  # as the SDK's APIError would

    monkeypatch.setattr(image, "ensure_image", ensure_image)
    monkeypatch.setattr(runner, "make_workload", lambda config: ScriptedWorkload())
    out = io.StringIO()
    assert runner.run(_docker_config(tmp_path), out=out) == 3
    assert out.getvalue().splitlines() == [line]
    assert not (tmp_path / "store").exists()
