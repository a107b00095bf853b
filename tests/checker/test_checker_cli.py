"""`python -m checker check`: verdict, table, counterexample, HTML, JSON and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checker.cli import EXIT_INVALID, EXIT_UNKNOWN, EXIT_UNREADABLE, EXIT_VALID, main
from checker.corpus import find_shared_data
from histories.write import HistoryWriter

DATA = find_shared_data()
needs_corpus = pytest.mark.skipif(DATA is None, reason="shared corpus not found (MAO_SHARED_DATA)")


def _history(tmp_path: Path, stale: bool) -> Path:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        i = writer.invoke(0, "put", "k", "a")
        writer.complete(i, "ok", "a", version=1, applied=True)
        i = writer.invoke(1, "put", "k", "b", expected_version=1)
        writer.complete(i, "ok", "b", version=2, applied=True)
        i = writer.invoke(2, "get", "k")
        writer.complete(i, "ok", "a" if stale else "b", version=1 if stale else 2)
    return path


def test_valid_jsonl_history_exits_0(tmp_path: Path, capsys) -> None:
    assert main(["check", str(_history(tmp_path, stale=False))]) == EXIT_VALID
    out = capsys.readouterr().out
    assert out.startswith("VALID") and "versioned-kv" in out


def test_invalid_history_prints_the_counterexample_and_writes_html_and_json(tmp_path: Path, capsys) -> None:
    html_path, json_path = tmp_path / "t.html", tmp_path / "r.json"
    code = main(["check", str(_history(tmp_path, stale=True)), "--html", str(html_path), "--json", str(json_path)])
    assert code == EXIT_INVALID
    out = capsys.readouterr().out
    assert out.startswith("INVALID")
    assert "cannot place" in out and "get('k') -> 'a' @v1" in out
    assert "lost-write" in out  # the lost-write checker names the same anomaly its own way
    page = html_path.read_text()
    assert "class='bar blocking'" in page and "NOT linearizable" in page
    payload = json.loads(json_path.read_text())
    assert payload["valid"] is False
    assert payload["linearizable"]["keys"][0]["counterexample"]["blocking"]["op"]["f"] == "get"
    assert payload["lost_writes"]["counts"]["lost_writes"] == 1


def test_truncated_history_exits_3_with_the_reason(tmp_path: Path, capsys) -> None:
    path = _history(tmp_path, stale=False)
    path.write_bytes(path.read_bytes()[:-9])  # the harness died mid-line
    assert main(["check", str(path)]) == EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert "UNREADABLE" in err and "truncated last line" in err and ":6:" in err


def test_missing_file_and_wrong_model_exit_3(tmp_path: Path, capsys) -> None:
    assert main(["check", str(tmp_path / "nope.jsonl")]) == EXIT_UNREADABLE
    history = str(_history(tmp_path, stale=False))
    assert main(["check", history, "--model", "etcd"]) == EXIT_UNREADABLE
    assert "no operation 'put'" in capsys.readouterr().err
    assert main(["check", history, "--model", "cas-register", "--init", "[1"]) == EXIT_UNREADABLE
    assert "--init" in capsys.readouterr().err


@needs_corpus
def test_budget_exhausted_is_unknown_exit_2(capsys) -> None:
    path = DATA / "porcupine" / "kv" / "c50-ok.txt"  # every key needs thousands of configurations
    assert main(["check", str(path), "--budget-s", "0"]) == EXIT_UNKNOWN
    out = capsys.readouterr().out
    assert out.startswith("UNKNOWN") and "time budget ran out" in out


@needs_corpus
def test_wall_budget_exhausted_is_unknown_exit_2_with_a_clear_line(capsys) -> None:
    path = DATA / "porcupine" / "kv" / "c50-ok.txt"  # every key needs thousands of configurations
    # A CPU budget that cannot run out first: only the wall-clock one can stop it.
    assert main(["check", str(path), "--budget-s", "600", "--wall-budget-s", "0"]) == EXIT_UNKNOWN
    out = capsys.readouterr().out
    assert out.startswith("UNKNOWN")
    assert "the wall-clock budget (--wall-budget-s) ran out before a verdict" in out
    assert "wall-clock budget of 0 s ran out (--wall-budget-s); 9 keys not checked" in out


def test_generous_wall_budget_keeps_the_verdict(tmp_path: Path, capsys) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "stale").mkdir()
    assert main(["check", str(_history(tmp_path / "ok", stale=False)), "--wall-budget-s", "600"]) == EXIT_VALID
    assert main(["check", str(_history(tmp_path / "stale", stale=True)), "--wall-budget-s", "600"]) == EXIT_INVALID
    assert "wall-clock" not in capsys.readouterr().out


@needs_corpus
def test_edn_with_init_value(capsys) -> None:
    good = DATA / "knossos" / "cas-register" / "good" / "memstress3-0.edn"
    bad = DATA / "knossos" / "cas-register" / "bad" / "rethink-fail-minimal.edn"
    assert main(["check", str(good), "--init", "0"]) == EXIT_VALID
    assert main(["check", str(bad), "--init", "0", "--model", "cas-register", "--format", "edn"]) == EXIT_INVALID


@needs_corpus
def test_memory_budget_gives_unknown_per_key_not_a_guess(capsys) -> None:
    # Porcupine's c50-bad: with every key checked, the hard keys stop at the memory budget.
    path = DATA / "porcupine" / "kv" / "c50-bad.txt"
    code = main(["check", str(path), "--all-keys", "--max-memory-mb", "8", "--budget-s", "20"])
    out = capsys.readouterr().out
    assert code == EXIT_INVALID  # some keys are certainly invalid
    assert "memory budget" in out and "unknown" in out and "INVALID" in out


def test_module_entry_point_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "checker", "check", str(_history(tmp_path, stale=False))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
