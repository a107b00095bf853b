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


def test_a_head_naming_a_missing_object_stops_the_run_with_one_line_not_a_restart_loop(
        kv_cluster, job, tmp_path) -> None:
    import argparse

    import numpy as np

    from system.kv.client import KVClient
    from system.trainer import checkpoint as codec
    from system.trainer.checkpoint_store import CheckpointStore
    from system.trainer.cli import add_run_arguments, config_from_args
    from system.trainer.object_store import LocalObjectStore

    kv = ",".join(kv_cluster.addresses)
    args = ["--kv", kv, "--object-dir", str(tmp_path / "objects"), "--job", job, "--dataset",
            "breast_cancer", "--workers", "2", "--standbys", "1", "--checkpoint-every", "50",
            "--checkpoint-store", "object", "--steps", "150", "--run-dir", str(tmp_path / "run")]
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    config = config_from_args(parser.parse_args(args))
    # A committed checkpoint at step 50 whose blob has since been lost from the object store.
    objects = LocalObjectStore(tmp_path / "objects")
    checkpoint = codec.Checkpoint(50, np.zeros((31, 1)), np.zeros((31, 1)), config.config_hash(),
                                  [(0, 50), (0, 50)], {"seed": 0}, done=False)
    meta = codec.Metadata(step=50, mode="", size=0, checksum="", config_hash=config.config_hash(),
                          coordinator_id=f"{job}-c1", lease_version=1, request_id=f"{job}-c1:step-50")
    with KVClient(kv_cluster.addresses) as client:
        CheckpointStore(client, job, "object", objects=objects).write(
            codec.encode(checkpoint), meta, 0, None, None)
    objects.delete(meta.pointer)

    result = trainer("run", *args, "--timeout-s", "120", timeout_s=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "checkpoint step 50" in lines[0] and f"object {meta.pointer} at {tmp_path / 'objects'}" in lines[0]
    # Each coordinator stopped once (exit 2); none was restarted in a loop.
    assert len(list((tmp_path / "run").glob("c*.log"))) == 2


def test_kill_coordinator_at_step_ends_bit_for_bit_equal_to_the_reference(kv_cluster, job) -> None:
    """The local form of `run --hosts`'s check: --kill-coordinator-at-step and
    --compare-reference (tests/trainer/test_trainer_hosts.py shows the comparison catches
    a planted difference)."""
    result = trainer("run", "--kv", ",".join(kv_cluster.addresses), "--job", job,
                     "--dataset", "breast_cancer", "--workers", "2", "--steps", "300",
                     "--checkpoint-every", "25", "--lease-s", "1.5",
                     "--kill-coordinator-at-step", "100", "--compare-reference")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("  ")[0]: line.split("  ")[-1].strip() for line in result.stdout.splitlines()}
    assert rows["vs one-process reference"] == "bit-for-bit equal", result.stdout
    assert rows["coordinator takeovers"] == "1", result.stdout
    assert rows["coordinator killed"].split()[0].startswith("c"), result.stdout
