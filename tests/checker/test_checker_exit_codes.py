"""Exit codes of `python -m checker check`: 0 valid, 1 invalid, 2 unknown, 3 bad input or error.

The rule these tests hold: a crash, an unreadable value or an output file that cannot be
written is never 1 (the code CI reads as "invalid") nor 0, and an empty history is never
"valid" by accident. Every message names the file (and the line where there is one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checker.cli
from checker.cli import EXIT_ERROR, EXIT_INVALID, EXIT_VALID, main


def _record(index: int, process: int, type: str, f: str, value: object = None) -> str:
    return json.dumps({"index": index, "process": process, "type": type, "f": f, "key": "k", "value": value})


def _valid_lines() -> list[str]:
    return [
        _record(0, 0, "invoke", "write", 1),
        _record(1, 0, "ok", "write", 1),
        _record(2, 1, "invoke", "read"),
        _record(3, 1, "ok", "read", 1),
    ]


def _file(tmp_path: Path, text: str, name: str = "history.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main(["check", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("name", "text"), [("history.jsonl", ""), ("history.edn", "  \n\n "), ("h.edn", "[]"), ("h.edn", "; only a comment\n")])
def test_an_empty_or_blank_history_is_exit_3_unless_allowed(tmp_path: Path, capsys, name: str, text: str) -> None:
    path = _file(tmp_path, text, name)
    code, out, err = _run(capsys, path)
    assert code == EXIT_ERROR and out == ""
    assert "no operations" in err and str(path) in err
    code, out, _ = _run(capsys, path, "--allow-empty")
    assert code == EXIT_VALID and out.startswith("VALID")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "Infinity"),
        ("1e999", "not finite"),
        ("1" * 5000, "unreadable value"),  # past CPython's 4,300-digit int conversion limit
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_values_that_cannot_be_compared_are_exit_3_with_the_line(tmp_path: Path, capsys, value: str, reason: str) -> None:
    lines = _valid_lines()
    lines[2] = lines[2].replace('"value": null', f'"value": {value}')
    path = _file(tmp_path, "\n".join(lines) + "\n")
    code, out, err = _run(capsys, path)
    assert code == EXIT_ERROR and out == ""
    assert reason in err and f"{path}:3:" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{:process 0 :type :invoke :f :write :value " + "1" * 5000 + "}\n", "EDN"),
        ("{:process 0 :type :invoke :f :write :value " + "[" * 100_000 + "}\n", "nested"),
        ("{:process 0 :type :invoke :f :write :value 1e999}\n", "not finite"),
    ],
)
def test_edn_values_that_cannot_be_read_are_exit_3(tmp_path: Path, capsys, text: str, reason: str) -> None:
    path = _file(tmp_path, text, "history.edn")
    code, out, err = _run(capsys, path)
    assert code == EXIT_ERROR and out == ""
    assert reason in err and str(path) in err


@pytest.mark.parametrize("option", ["--html", "--json"])
def test_an_output_that_cannot_be_written_is_exit_3_and_no_verdict_is_printed(tmp_path: Path, capsys, option: str) -> None:
    path = _file(tmp_path, "\n".join(_valid_lines()) + "\n")
    code, out, err = _run(capsys, path, option, tmp_path / "missing-folder" / "out")
    assert code == EXIT_ERROR
    assert "VALID" not in out and "cannot write" in err and "missing-folder" in err


def test_the_verdict_line_comes_after_the_files_are_written(tmp_path: Path, capsys) -> None:
    path = _file(tmp_path, "\n".join(_valid_lines()) + "\n")
    html, report = tmp_path / "t.html", tmp_path / "r.json"
    code, out, _ = _run(capsys, path, "--html", html, "--json", report)
    assert code == EXIT_VALID and out.startswith("VALID")
    assert html.stat().st_size > 0 and json.loads(report.read_text())["valid"] is True


@pytest.mark.parametrize(
    "option",
    [["--budget-s", "-1"], ["--max-memory-mb", "-5"], ["--max-memo", "-1"], ["--budget-s", "nan"], ["--budget-s", "inf"], ["--wall-budget-s", "-1"], ["--wall-budget-s", "nan"], ["--bogus"]],
)
def test_bad_options_are_exit_3_not_argparse_2(tmp_path: Path, capsys, option: list[str]) -> None:
    path = _file(tmp_path, "\n".join(_valid_lines()) + "\n")
    code, out, err = _run(capsys, path, *option)
    assert code == EXIT_ERROR and out == ""
    assert "error" in err


def test_an_internal_error_is_exit_3_never_1(tmp_path: Path, capsys, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise KeyError("a bug in the checker")

    monkeypatch.setattr(checker.cli, "check_linearizable", broken)
    path = _file(tmp_path, "\n".join(_valid_lines()) + "\n")
    code, out, err = _run(capsys, path)
    assert code == EXIT_ERROR and out == ""
    assert "INTERNAL ERROR" in err and str(path) in err and "KeyError" in err


_NASTY = st.sampled_from(["NaN", "1e999", "9" * 4400, "[" * 3000, "{", '"', "\x00", "\n", "null", "-0", "{}"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_histories_never_crash_into_a_verdict_code(tmp_path: Path, capsys, data) -> None:
    """Cut, splice or overwrite a valid history anywhere: the answer is a verdict the
    checker printed (0/1/2 with the verdict line) or exit 3 with one line naming the file."""
    text = "\n".join(_valid_lines()) + "\n"
    at = data.draw(st.integers(0, len(text)))
    edit = data.draw(st.sampled_from(["cut", "insert", "replace"]))
    nasty = data.draw(_NASTY)
    if edit == "cut":
        text = text[:at]
    elif edit == "insert":
        text = text[:at] + nasty + text[at:]
    else:
        text = text[:at] + nasty + text[at + len(nasty) :]
    path = _file(tmp_path, text)
    code, out, err = _run(capsys, path)
    if code == EXIT_ERROR:
        assert out == "" and str(path) in err and len(err.strip().splitlines()) == 1
    else:
        assert code in (EXIT_VALID, EXIT_INVALID, 2)
        assert out.split(":")[0] in ("VALID", "INVALID", "UNKNOWN")
