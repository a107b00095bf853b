"""Bad flags get one line and exit 3 before anything starts; stored runs are re-checked
from their history alone (valid, invalid, unknown, unreadable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from histories.write import HistoryWriter
from nemesis import cli
from nemesis.store import write_json

REPO = Path(__file__).resolve().parents[2]


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nemesis", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("args, says", [
    (["--faults", "partition,explode"], "unknown fault 'explode'"),
    (["--faults", ""], "--faults is empty"),
    (["--faults", "none,kill"], "cannot be combined"),
    (["--duration", "-5"], "must be positive"),
    (["--duration", "abc"], "is not a number"),
    (["--nodes", "2", "--faults", "partition"], "needs at least 3 nodes"),
    (["--nodes", "0"], "must be positive"),
    (["--platform", "vmware"], "invalid choice"),
    (["--unsafe", "no-such-canary"], "invalid choice"),
    # A broken Raft core needs MAO_ALLOW_UNSAFE=1 as well as its name (_run_cli's
    # environment has none).
    (["--unsafe", "votes-twice"], "refusing --unsafe votes-twice"),
    (["--platform", "sim", "--unsafe", "commits-old-term-entries"],
     "set MAO_ALLOW_UNSAFE=1"),
    (["--rate", "-1"], "--rate must be >= 0"),
    (["--workload", "bank"], "invalid choice"),
    (["--store", "/proc/no-such-store"], "cannot keep runs under --store /proc/no-such-store"),
    (["--store", "/dev/null"], "/dev/null/kv: Not a directory"),
])
def test_bad_flags_exit_3_with_one_line_and_start_nothing(tmp_path: Path, args: list[str],
                                                          says: str) -> None:
    result = _run_cli(["run", "--platform", "local", "--store", str(tmp_path / "store"), *args]
                      if "--platform" not in args else ["run", "--store", str(tmp_path / "store"), *args],
                      tmp_path)
    assert result.returncode == 3, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "store").exists()  # nothing was started or written


def _stored_run(tmp_path: Path, records: list[tuple]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json(run_dir / "test.json", {"workload": {"name": "kv", "model": "versioned-kv"}})
    with HistoryWriter(run_dir / "history.jsonl") as h:
        for process, f, key, value, outcome, fields in records:
            i = h.invoke(process, f, key, value if f == "put" else None)
            h.complete(i, outcome, value, **fields)
    return run_dir


def test_check_valid_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _stored_run(tmp_path, [
        (0, "put", "k", "a", "ok", {"version": 1, "applied": True}),
        (1, "get", "k", "a", "ok", {"version": 1}),
    ])
    assert cli.main(["check", str(run_dir)]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["operations"]["put"]["ok"] == 1


def test_check_lost_write_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _stored_run(tmp_path, [
        (0, "put", "k", "a", "ok", {"version": 1, "applied": True}),
        (1, "get", "k", None, "ok", {"version": 0}),  # acknowledged write gone
    ])
    assert cli.main(["check", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "lost-write" in out
    assert (run_dir / "timeline.html").exists()


def test_check_without_a_read_after_the_last_acknowledged_write_is_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The final reads failed (or never ran): a write lost at the very end would not show.
    run_dir = _stored_run(tmp_path, [
        (0, "put", "k", "a", "ok", {"version": 1, "applied": True}),
        (1, "get", "k", "a", "ok", {"version": 1}),
        (0, "put", "k", "b", "ok", {"version": 2, "applied": True}),
        (1, "get", "k", None, "fail", {"error": "unavailable"}),
    ])
    assert cli.main(["check", str(run_dir)]) == 2
    out = capsys.readouterr().out
    assert "were never read after it ('k')" in out, out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] == "unknown" and results["unverified_keys"] == 1


def test_check_of_a_cut_off_history_says_so_and_does_not_call_it_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _stored_run(tmp_path, [
        (0, "put", "k", "a", "ok", {"version": 1, "applied": True}),
        (1, "get", "k", "a", "ok", {"version": 1}),
        (0, "put", "k", "b", "ok", {"version": 2, "applied": True}),
        (1, "get", "k", "b", "ok", {"version": 2}),
    ])
    history = run_dir / "history.jsonl"
    text = history.read_text()
    history.write_text(text[: text.rindex('{"index"') + 20])  # the final read's answer cut mid-line
    assert cli.main(["check", str(run_dir)]) == 2
    out = capsys.readouterr().out
    assert "last line was cut off" in out and "UNKNOWN" in out, out
    assert json.loads((run_dir / "results.json").read_text())["history_truncated"] is True


def test_check_of_an_interrupted_run_keeps_saying_it_was_interrupted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _stored_run(tmp_path, [(0, "put", "k", "a", "ok", {"version": 1, "applied": True})])
    write_json(run_dir / "results.json", {"harness_error": "interrupted"})
    assert cli.main(["check", str(run_dir)]) == 2
    assert "the run did not finish (interrupted)" in capsys.readouterr().out


def test_check_empty_history_is_never_valid(tmp_path: Path) -> None:
    run_dir = _stored_run(tmp_path, [])
    assert cli.main(["check", str(run_dir)]) == 2


def test_check_refuses_a_folder_without_history(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", str(tmp_path)]) == 3
    assert "has no history.jsonl" in capsys.readouterr().err


def test_check_garbage_history_is_a_harness_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "history.jsonl").write_text('{"index": 0, "process": 1, "type": "ok"}\n[1,2\n')
    assert cli.main(["check", str(tmp_path)]) == 3
    assert "cannot read the history" in capsys.readouterr().err


def test_the_reproduce_line_runs_as_printed() -> None:
    from nemesis.runner import RunConfig

    def config(**changes) -> RunConfig:
        base = dict(argv=[], platform="local", platform_reason="", faults=["kill"], duration_s=60,
                    interval_s=10, nodes=5, workload="kv", seed=3, store=Path("store"),
                    concurrency=10, rate=100.0, op_timeout_s=3.0, read_consistency="linearizable",
                    unsafe=None, check_budget_s=60.0)
        return RunConfig(**{**base, **changes})

    assert "--concurrency 10 --rate 100" in config().reproduce()
    trainer = config(workload="trainer").reproduce()
    assert "--rate" not in trainer and "--concurrency" not in trainer  # meaningless there
    canary = config(unsafe="stale-read").reproduce()
    assert canary.startswith("MAO_ALLOW_UNSAFE=1 python -m nemesis run") and canary.endswith(
        "--unsafe stale-read")  # refused without the variable: the line must carry it


def test_check_passes_the_wall_budget_to_the_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from nemesis import check

    seen = {}
    real = check.check_linearizable

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(check, "check_linearizable", spy)
    run_dir = _stored_run(tmp_path, [
        (0, "put", "k", "a", "ok", {"version": 1, "applied": True}),
        (1, "get", "k", "a", "ok", {"version": 1}),
    ])
    assert cli.main(["check", str(run_dir), "--budget-s", "7", "--wall-budget-s", "30"]) == 0
    assert seen["budget_s"] == 7 and seen["wall_budget_s"] == 30
    assert cli.main(["check", str(run_dir)]) == 0
    assert seen["wall_budget_s"] is None  # off unless asked for


def test_run_takes_a_wall_budget_for_its_check() -> None:
    args = cli.build_parser().parse_args(["run", "--check-wall-budget-s", "45"])
    assert args.check_wall_budget_s == 45 and args.check_budget_s == 60
    assert cli.build_parser().parse_args(["run"]).check_wall_budget_s is None
