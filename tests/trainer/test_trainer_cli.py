"""`python -m system.trainer run|inspect` as a user runs them: a table at the end, a
one-line error and a non-zero exit for bad configuration, the checkpoint history."""

from __future__ import annotations

import subprocess
import sys

import pytest

from system.trainer.procs import REPO_ROOT

pytestmark = pytest.mark.integration


def trainer(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "system.trainer", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize("args,message", [
    (["--dataset", "mnist"], "unknown dataset 'mnist'"),
    (["--dataset", "breast_cancer", "--workers", "500"], "500 workers but only 427 training rows"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--kv", "127.0.0.1:1"], "cannot reach the store at 127.0.0.1:1"),
    (["--dataset", "breast_cancer", "--workers", "1", "--checkpoint-store", "object",
      "--object-dir", "/proc/no-such-dir"], "cannot use the object store"),
])
def test_bad_configuration_is_one_line_and_non_zero(args: list[str], message: str) -> None:
    result = trainer("run", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_run_prints_a_table_inspect_shows_history_other_config_is_refused(kv_cluster, job,
                                                                         tmp_path) -> None:
    kv = ",".join(kv_cluster.addresses)
    common = ["--kv", kv, "--object-dir", str(tmp_path / "objects"), "--job", job, "--dataset", "breast_cancer", "--workers", "2",
              "--standbys", "1", "--checkpoint-every", "50", "--checkpoint-store", "object"]
    result = trainer("run", *common, "--steps", "150")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "held-out accuracy" in result.stdout and "checkpoints committed" in result.stdout
    accuracy = float(next(line for line in result.stdout.splitlines() if "accuracy" in line).split()[-1])
    assert accuracy > 0.95

    shown = trainer("inspect", "--kv", kv, "--job", job)
    assert shown.returncode == 0, shown.stderr
    assert ":step-50" in shown.stdout and ":step-150" in shown.stdout and "done" in shown.stdout

    refused = trainer("run", *common, "--steps", "151")
    assert refused.returncode == 2
    assert "written by configuration" in refused.stderr.strip().splitlines()[-1]
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # Nothing written is lost: the finished checkpoint is still the head.
    assert ":step-150" in trainer("inspect", "--kv", kv, "--job", job).stdout
