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

What it must never do: report a put before the bytes are durable, or return bytes whose
hash differs from the name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Protocol


class ObjectStoreError(Exception):
    pass


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
            raise ObjectStoreError(f"object {name} not found in {self.root}") from None
        _check(name, blob)
        return blob

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def names(self) -> list[str]:
        return sorted(_from_stem(p.name) for p in self.root.glob("??/*") if ".tmp-" not in p.name)


class S3ObjectStore:
    """Objects `s3://bucket/prefix/<hex>`. `endpoint_url` points at an S3-compatible
    server (moto in tests); credentials come from boto3's usual sources."""

    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        import boto3

        if not url.startswith("s3://"):
            raise ObjectStoreError(f"not an s3:// url: {url!r}")
        bucket, _, prefix = url[5:].partition("/")
        self.url, self.bucket, self.prefix = url, bucket, prefix.strip("/")
        endpoint_url = endpoint_url or os.environ.get("TRAINER_S3_ENDPOINT")
        self.client = boto3.client("s3", endpoint_url=endpoint_url,
                                   region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))

    def _key(self, name: str) -> str:
        stem = _stem(name)
        return f"{self.prefix}/{stem}" if self.prefix else stem

    def put(self, name: str, blob: bytes) -> None:
        _check(name, blob)
        self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=blob)

    def get(self, name: str) -> bytes:
        try:
            blob = self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise ObjectStoreError(f"object {name} not found in {self.url}") from None
        _check(name, blob)
        return blob

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def names(self) -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix):
            out += [_from_stem(o["Key"].rsplit("/", 1)[-1]) for o in page.get("Contents", [])]
        return sorted(out)


def open_object_store(spec: str, default_dir: Path) -> ObjectStore:
    """"object" -> local directory `default_dir`; "s3://bucket/prefix" -> S3."""
    if spec.startswith("s3://"):
        return S3ObjectStore(spec)
    return LocalObjectStore(default_dir if spec in ("object", "") else spec)
