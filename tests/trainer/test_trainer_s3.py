"""Object mode against a real S3-compatible server process: moto's standalone server on
127.0.0.1, started and stopped by this module (its process group is killed at the end)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import system.trainer  # noqa: F401
from system.ports import free_ports
from system.trainer import checkpoint as codec
from system.trainer.local import train_local
from system.trainer.object_store import ObjectStoreError, S3ObjectStore
from system.trainer.run import TrainerRun

pytestmark = pytest.mark.integration
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_ports(1)[0]
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "TRAINER_S3_ENDPOINT": endpoint}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the trainer's child processes inherit these
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="checkpoints")
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # polling for the server to accept connections
        yield endpoint
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_s3_store_round_trip_and_refuses_mismatched_content(s3_endpoint: str) -> None:
    store = S3ObjectStore("s3://checkpoints/unit")
    blob = b"model bytes"
    name = codec.blob_checksum(blob)
    store.put(name, blob)
    assert store.get(name) == blob and store.names() == [name]
    store.delete(name)
    with pytest.raises(ObjectStoreError):
        store.get(name)


def test_training_with_s3_checkpoints_survives_a_coordinator_kill(s3_endpoint: str, kv_cluster, job) -> None:
    from system.trainer.config import TrainConfig

    config = TrainConfig(dataset="breast_cancer", workers=2, steps=200, batch_size=16,
                         learning_rate=0.05, checkpoint_every=20, job=job)
    with TrainerRun(config, standbys=1, kv=kv_cluster.addresses, lease_s=1.5,
                    checkpoint_store=f"s3://checkpoints/{job}") as run:
        run.start()
        st = run.wait_until(lambda: (s if (s := run.status()) and s.step >= 80 else None), 60, "step 80")
        run.kill(st.coordinator_id)
        latest = run.wait_finished(90)
    assert latest.meta.pointer and latest.meta.mode == "object"
    assert latest.checkpoint.params.tobytes() == train_local(config).params.tobytes()
    names = S3ObjectStore(f"s3://checkpoints/{job}").names()
    assert latest.meta.pointer in names
    assert len(names) <= 4  # superseded blobs are collected (current + 2 kept + 1 in flight at most)
