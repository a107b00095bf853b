"""An S3 outage and a missing object, without a network: botocore's Stubber answers for S3
(5xx, throttling, no such key), a fake client raises the connection errors, and the clock
and sleep are the test's own (no real waiting).

The rules (object_store.py, checkpoint_store.py; docs/trainer.md, "object store outages"):
an outage is retried with bounded backoff, one line per retry saying what failed and the
next wait, up to a budget; a missing object is one CheckpointError naming the checkpoint
and the object, raised at once rather than retried or crashed on."""

from __future__ import annotations

from pathlib import Path

import pytest

import system.trainer  # noqa: F401
from system.trainer import checkpoint as codec
from system.trainer.checkpoint_store import CheckpointStore
from system.trainer.object_store import (
    LocalObjectStore,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    S3ObjectStore,
    object_name,
)

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError  # noqa: E402
from botocore.stub import ANY, Stubber  # noqa: E402

BLOB = b"model bytes"
NAME = object_name(codec.blob_checksum(BLOB), 2)
KEY = f"job/lease-2-{codec.blob_checksum(BLOB)[7:]}"


class FakeTime:
    """sleep() moves the clock; nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def stubbed_store(retry_for_s: float = 120.0) -> tuple[S3ObjectStore, Stubber, FakeTime, list[str]]:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    stubber = Stubber(client)
    fake, lines = FakeTime(), []
    store = S3ObjectStore("s3://checkpoints/job", client=client, retry_for_s=retry_for_s,
                          on_retry=lines.append, sleep=fake.sleep, clock=fake.clock)
    return store, stubber, fake, lines


def test_an_outage_of_5xx_and_throttling_is_retried_with_backoff_and_said_each_time() -> None:
    store, stubber, fake, lines = stubbed_store()
    put = {"Bucket": "checkpoints", "Key": KEY, "Body": ANY}
    stubber.add_client_error("put_object", "ServiceUnavailable", "Service Unavailable", 503,
                             expected_params=put)
    stubber.add_client_error("put_object", "SlowDown", "Please reduce your request rate.", 503,
                             expected_params=put)
    stubber.add_client_error("put_object", "InternalError", "We encountered an internal error.", 500,
                             expected_params=put)
    stubber.add_response("put_object", {}, expected_params=put)
    with stubber:
        store.put(NAME, BLOB)
    stubber.assert_no_pending_responses()
    assert fake.sleeps == [0.2, 0.4, 0.8]  # doubling backoff
    assert len(lines) == 3
    assert f"put {KEY} failed (ServiceUnavailable (HTTP 503)" in lines[0] and "retry 1 in 0.2 s" in lines[0]
    assert "SlowDown" in lines[1] and "retry 2 in 0.4 s" in lines[1]
    assert "InternalError" in lines[2] and "retry 3 in 0.8 s" in lines[2]


class FlakyClient:
    """A client whose calls raise connection errors `failures` times, then answer."""

    def __init__(self, failures: list[Exception], blob: bytes) -> None:
        self.failures, self.blob, self.calls = failures, blob, 0

    def get_object(self, **kw: object) -> dict:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {"Body": type("Body", (), {"read": lambda _self: self.blob})()}


def test_connection_errors_are_retried_and_the_wait_stays_bounded() -> None:
    failures: list[Exception] = [EndpointConnectionError(endpoint_url="http://s3.local/")] * 6
    failures.append(ReadTimeoutError(endpoint_url="http://s3.local/"))
    fake, lines = FakeTime(), []
    client = FlakyClient(failures, BLOB)
    store = S3ObjectStore("s3://checkpoints/job", client=client, on_retry=lines.append,
                          sleep=fake.sleep, clock=fake.clock)
    assert store.get(NAME) == BLOB
    assert client.calls == 8 and len(lines) == 7
    assert fake.sleeps == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]  # capped at 5 s
    assert "EndpointConnectionError: Could not connect to the endpoint URL" in lines[0]
    assert "ReadTimeoutError" in lines[-1]


def test_an_outage_longer_than_the_budget_is_one_error_saying_so() -> None:
    fake, lines = FakeTime(), []
    client = FlakyClient([EndpointConnectionError(endpoint_url="http://s3.local/")] * 1000, BLOB)
    store = S3ObjectStore("s3://checkpoints/job", client=client, retry_for_s=30, on_retry=lines.append,
                          sleep=fake.sleep, clock=fake.clock)
    with pytest.raises(ObjectStoreUnavailable) as caught:
        store.get(NAME)
    assert sum(fake.sleeps) <= 30 and len(lines) == len(fake.sleeps) >= 5
    message = str(caught.value)
    assert "\n" not in message and f"get {KEY} kept failing" in message and "EndpointConnectionError" in message


def test_a_refusal_is_not_retried() -> None:
    store, stubber, fake, lines = stubbed_store()
    stubber.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
    with stubber, pytest.raises(ObjectStoreError) as caught:
        store.put(NAME, BLOB)
    assert not isinstance(caught.value, ObjectStoreUnavailable)
    assert fake.sleeps == [] and lines == []
    assert "AccessDenied (403): Access Denied" in str(caught.value)


def test_a_missing_s3_object_is_object_not_found_naming_the_key() -> None:
    store, stubber, fake, lines = stubbed_store()
    stubber.add_client_error("get_object", "NoSuchKey", "The specified key does not exist.", 404)
    with stubber, pytest.raises(ObjectNotFound) as caught:
        store.get(NAME)
    assert caught.value.location == f"s3://checkpoints/{KEY}" and fake.sleeps == []


class FakeKV:
    """Just enough of KVClient for reading a head: one key, a fixed version."""

    def __init__(self, key: str, value: bytes, version: int) -> None:
        self.key, self.value, self.version, self.reads = key, value, version, 0

    def get(self, key: str, consistency: str = "linearizable"):  # noqa: ANN201
        self.reads += 1
        assert key == self.key
        return type("Got", (), {"value": self.value, "version": self.version})()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_head_naming_a_missing_object_is_one_error_naming_the_checkpoint_and_the_object(
        tmp_path: Path, where: str) -> None:
    meta = codec.Metadata(step=40, mode="object", size=len(BLOB), checksum=codec.blob_checksum(BLOB),
                          config_hash="cfg", coordinator_id="c1-abc", lease_version=2,
                          request_id="c1-abc:step-40", pointer=NAME)
    kv = FakeKV("trainer/job/checkpoint", codec.encode_head(meta, None), 7)
    if where == "local":
        objects = LocalObjectStore(tmp_path)
        location = str(tmp_path / KEY.split("-")[-1][:2] / KEY.split("/")[1])
    else:
        objects, stubber, _, _ = stubbed_store()
        for _ in range(3):
            stubber.add_client_error("get_object", "NoSuchKey", "The specified key does not exist.", 404)
        stubber.activate()
        location = f"s3://checkpoints/{KEY}"
    store = CheckpointStore(kv, "job", "object", objects=objects)  # type: ignore[arg-type]
    with pytest.raises(codec.CheckpointError) as caught:
        store.read_latest("cfg")
    message = str(caught.value)
    assert "\n" not in message
    assert "checkpoint step 40" in message and "version 7" in message and "lease 2" in message
    assert f"object {NAME} at {location}" in message
    assert kv.reads == 2  # the head read again once (a collected blob means a newer head), then no more
