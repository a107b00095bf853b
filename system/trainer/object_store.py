"""Object stores for checkpoint blobs in `object` mode: a local content-addressed
directory (the default) and S3 (through boto3; tests use a moto server on loopback).

A blob is named by its checksum ("sha256:<hex>"), so writing the same blob twice is
harmless and a reader can verify what it got. A checkpoint blob's name also carries the
lease version of the coordinator that wrote it ("lease-<n>-sha256:<hex>", `object_name`):
a new coordinator may then collect every unreferenced blob of a lower lease version — its
writer was fenced and can never commit it — and never touches a blob a live writer (its
own lease or a newer one) may still commit (checkpoint_store.collect_orphans). `put` returns only once the blob is
durable (fsync of the file and its directory; S3's PUT is durable when it answers);
only then may its metadata go through Raft.

S3 outages: a connection error, a 5xx answer or throttling is retried by `S3ObjectStore`
itself with bounded backoff (0.2 s doubling to 5 s), one `on_retry` line per retry (what
failed, the next wait), for up to `retry_for_s` (120 s) from the first failure; then
`ObjectStoreUnavailable`. botocore's own silent retries are switched off so that every
retry is said. Any other S3 error (no bucket, no credentials, access denied) is an
`ObjectStoreError` at once, and a missing object is `ObjectNotFound`, naming the key.

What it must never do: report a put before the bytes are durable, or return bytes whose
hash differs from the name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")


class ObjectStoreError(Exception):
    pass


class ObjectNotFound(ObjectStoreError):
    """No object of that name; `location` is where it was looked for (a path, an s3:// url)."""

    def __init__(self, name: str, location: str) -> None:
        super().__init__(f"object {name} not found at {location}")
        self.name, self.location = name, location


class ObjectStoreUnavailable(ObjectStoreError):
    """Transient failures (connection, 5xx, throttling) lasted longer than the retry budget."""


# S3 error codes that mean "try again later", besides any 5xx status (AWS's retry guide).
S3_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
    "PriorRequestNotComplete"})


def transient_s3_failure(exc: BaseException) -> str | None:
    """A one-line description of `exc` if it is an outage worth retrying, else None."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return f"{type(exc).__name__}: {_first_line(exc)}"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if status >= 500 or status == 429 or error.get("Code") in S3_TRANSIENT_CODES:
            return f"{error.get('Code') or status} (HTTP {status}): {error.get('Message') or ''}".rstrip(": ")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ObjectStore(Protocol):
    url: str

    def put(self, name: str, blob: bytes) -> None: ...
    def get(self, name: str) -> bytes: ...
    def delete(self, name: str) -> None: ...
    def names(self) -> list[str]: ...


def object_name(checksum: str, lease_version: int | None = None) -> str:
    return checksum if lease_version is None else f"lease-{lease_version}-{checksum}"


def parse_name(name: str) -> tuple[int | None, str]:
    """(lease version or None, checksum) of an object name."""
    match = re.fullmatch(r"lease-(\d+)-(.+)", name)
    return (int(match.group(1)), match.group(2)) if match else (None, name)


def _stem(name: str) -> str:
    """The name as a file name / S3 key: `<hex>` or `lease-<n>-<hex>`."""
    lease, checksum = parse_name(name)
    digest = checksum.partition(":")[2]
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ObjectStoreError(f"bad object name {name!r}")
    return digest if lease is None else f"lease-{lease}-{digest}"


def _from_stem(stem: str) -> str:
    lease, digest = parse_name(stem)
    return object_name(f"sha256:{digest}", lease)


def _check(name: str, blob: bytes) -> None:
    algorithm, _, digest = parse_name(name)[1].partition(":")
    if algorithm != "sha256" or hashlib.sha256(blob).hexdigest() != digest:
        raise ObjectStoreError(f"object {name} does not match its content")


class LocalObjectStore:
    """Files `<root>/<first two hex>/<hex>`; written to a temporary name, fsynced, renamed,
    directory fsynced (a crash leaves either no object or the whole one)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        stem = _stem(name)
        return self.root / parse_name(name)[1].partition(":")[2][:2] / stem

    def put(self, name: str, blob: bytes) -> None:
        _check(name, blob)
        path = self._path(name)
        if path.exists():
            return  # content-addressed: same name, same bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, name: str) -> bytes:
        try:
            blob = self._path(name).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(name, str(self._path(name))) from None
        _check(name, blob)
        return blob

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def names(self) -> list[str]:
        return sorted(_from_stem(p.name) for p in self.root.glob("??/*") if ".tmp-" not in p.name)


class S3ObjectStore:
    """Objects `s3://bucket/prefix/<hex>`. `endpoint_url` points at an S3-compatible
    server (moto in tests); credentials come from boto3's usual sources. `client` replaces
    the boto3 client (tests: a stubbed one); `sleep` and `clock` are injectable for the same
    reason. Outages are retried here (module docstring), each retry said through `on_retry`."""

    FIRST_WAIT_S = 0.2
    MAX_WAIT_S = 5.0

    def __init__(self, url: str, *, endpoint_url: str | None = None, client: object = None,
                 retry_for_s: float = 120.0, on_retry: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not url.startswith("s3://"):
            raise ObjectStoreError(f"not an s3:// url: {url!r}")
        bucket, _, prefix = url[5:].partition("/")
        self.url, self.bucket, self.prefix = url, bucket, prefix.strip("/")
        self.retry_for_s, self.on_retry = retry_for_s, on_retry or _say_on_stderr
        self.sleep, self.clock = sleep, clock
        if client is None:
            import boto3
            from botocore.config import Config

            endpoint_url = endpoint_url or os.environ.get("TRAINER_S3_ENDPOINT")
            # One attempt per call: the retries are ours, so that each one is said.
            client = boto3.client("s3", endpoint_url=endpoint_url,
                                  region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                                  config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                                connect_timeout=5, read_timeout=30))
        self.client = client

    def _key(self, name: str) -> str:
        stem = _stem(name)
        return f"{self.prefix}/{stem}" if self.prefix else stem

    def _call(self, what: str, call: Callable[[], T], name: str | None = None) -> T:
        """`call()`, retried through an outage for up to `retry_for_s` from its first
        failure; "no such key" is ObjectNotFound (for object `name`), any other S3 error one
        ObjectStoreError line."""
        from botocore.exceptions import BotoCoreError, ClientError

        first_failure_at: float | None = None
        wait_s = self.FIRST_WAIT_S
        retries = 0
        while True:
            try:
                return call()
            except (BotoCoreError, ClientError) as exc:
                failure = transient_s3_failure(exc)
                if failure is None:
                    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                    if name is not None and code in ("NoSuchKey", "404", "NotFound"):
                        raise ObjectNotFound(name, f"s3://{self.bucket}/{self._key(name)}") from None
                    raise ObjectStoreError(f"object store {self.url}: {what}: {_describe(exc)}") from None
                now = self.clock()
                first_failure_at = now if first_failure_at is None else first_failure_at
                if now + wait_s - first_failure_at > self.retry_for_s:
                    raise ObjectStoreUnavailable(
                        f"object store {self.url}: {what} kept failing for {now - first_failure_at:.0f} s "
                        f"({retries + 1} attempts, last: {failure}); check that the S3 endpoint is up, "
                        f"then run again (committed checkpoints stay where they are)") from None
                retries += 1
                self.on_retry(f"object store {self.url}: {what} failed ({failure}); "
                              f"retry {retries} in {wait_s:.1f} s "
                              f"(gives up {self.retry_for_s:g} s after the first failure)")
                self.sleep(wait_s)
                wait_s = min(wait_s * 2, self.MAX_WAIT_S)

    def put(self, name: str, blob: bytes) -> None:
        _check(name, blob)
        key = self._key(name)
        self._call(f"put {key}", lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=blob))

    def get(self, name: str) -> bytes:
        key = self._key(name)
        blob = self._call(f"get {key}", lambda: self.client.get_object(
            Bucket=self.bucket, Key=key)["Body"].read(), name=name)
        _check(name, blob)
        return blob

    def delete(self, name: str) -> None:
        key = self._key(name)
        self._call(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=key))

    def names(self) -> list[str]:
        def listing() -> list[str]:
            out = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self.prefix):
                out += [_from_stem(o["Key"].rsplit("/", 1)[-1]) for o in page.get("Contents", [])]
            return sorted(out)
        return self._call(f"list {self.url}", listing)


def _describe(exc: BaseException) -> str:
    """A botocore error as one line: `<code> (<status>): <message>` or the exception's text."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "?"
        return f"{error.get('Code') or type(exc).__name__} ({status}): {error.get('Message') or ''}".rstrip(": ")
    return f"{type(exc).__name__}: {_first_line(exc)}"


def open_object_store(spec: str, default_dir: Path,
                      on_retry: Callable[[str], None] | None = None) -> ObjectStore:
    """"object" -> local directory `default_dir`; "s3://bucket/prefix" -> S3 (`on_retry`
    hears each retry through an outage)."""
    if spec.startswith("s3://"):
        return S3ObjectStore(spec, on_retry=on_retry)
    return LocalObjectStore(default_dir if spec in ("object", "") else spec)
