"""The checkpoint codec: a checkpoint blob and the small metadata record that names it.

A blob holds everything a standby needs to continue exactly where the writer was:
parameters, the momentum buffer, the step, each worker's data cursor, the RNG
description, the configuration hash and the format version. Its SHA-256 is the checksum
and, in object mode, its name.

The metadata record (the value of the head key `trainer/<job>/checkpoint` in the store)
is one JSON line: step, mode, size, checksum, config hash, writer, lease version, request
id, where the blob is (inline after the line, a list of chunk keys, or an object
pointer) and a bounded history of earlier checkpoints for `inspect`.

What it must never do: return a checkpoint whose checksum or config hash does not match
(CheckpointError says which).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = 1
MAGIC = b"MAOCKPT1"
HISTORY_LIMIT = 50  # entries of earlier checkpoints kept in the head record


class CheckpointError(Exception):
    """A checkpoint that cannot be used (corrupt, other configuration, unknown format)."""


@dataclass
class Checkpoint:
    step: int
    params: np.ndarray
    velocity: np.ndarray
    config_hash: str
    cursors: list[tuple[int, int]]  # per worker: (epoch, position) of its next batch
    rng: dict  # how batches are drawn: a keyed generator, so the seed is the whole state
    done: bool = False
    format_version: int = FORMAT_VERSION


def _array_header(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "dtype": a.dtype.str}


def encode(ckpt: Checkpoint) -> bytes:
    header = {
        "format_version": ckpt.format_version, "step": ckpt.step, "config_hash": ckpt.config_hash,
        "cursors": [list(c) for c in ckpt.cursors], "rng": ckpt.rng, "done": ckpt.done,
        "params": _array_header(ckpt.params), "velocity": _array_header(ckpt.velocity),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return b"".join([MAGIC, struct.pack(">I", len(head)), head,
                     np.ascontiguousarray(ckpt.params).tobytes(),
                     np.ascontiguousarray(ckpt.velocity).tobytes()])


def decode(blob: bytes, *, checksum: str | None = None, config_hash: str | None = None) -> Checkpoint:
    if checksum is not None and blob_checksum(blob) != checksum:
        raise CheckpointError(f"checkpoint checksum mismatch: expected {checksum}, "
                              f"blob hashes to {blob_checksum(blob)}")
    if blob[:8] != MAGIC:
        raise CheckpointError("not a trainer checkpoint (bad magic)")
    (n,) = struct.unpack(">I", blob[8:12])
    header = json.loads(blob[12:12 + n])
    if header["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint format {header['format_version']} is not supported "
                              f"(this trainer reads format {FORMAT_VERSION})")
    if config_hash is not None and header["config_hash"] != config_hash:
        raise CheckpointError(
            f"the checkpoint was written by configuration {header['config_hash']}, this run is "
            f"{config_hash}; run with the same settings or another --job")
    offset = 12 + n
    arrays = []
    for name in ("params", "velocity"):
        spec = header[name]
        dtype = np.dtype(spec["dtype"])
        size = int(np.prod(spec["shape"])) * dtype.itemsize
        arrays.append(np.frombuffer(blob[offset:offset + size], dtype=dtype)
                      .reshape(spec["shape"]).copy())
        offset += size
    return Checkpoint(header["step"], arrays[0], arrays[1], header["config_hash"],
                      [tuple(c) for c in header["cursors"]], header["rng"], header["done"],
                      header["format_version"])


def blob_checksum(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass
class Metadata:
    """The head record. `chunks` (inline, large), `pointer` (object) or neither (the blob
    follows the JSON line in the same value)."""

    step: int
    mode: str  # "inline" or "object"
    size: int
    checksum: str
    config_hash: str
    coordinator_id: str
    lease_version: int
    request_id: str
    done: bool = False
    chunks: list[str] | None = None
    pointer: str | None = None
    history: list[dict] = field(default_factory=list)  # oldest first, without their history
    kind: str = "checkpoint"  # "checkpoint", or "resume" for a takeover's fencing rewrite

    def summary(self, version: int | None = None) -> dict:
        return {"step": self.step, "mode": self.mode, "size": self.size, "checksum": self.checksum,
                "coordinator_id": self.coordinator_id, "lease_version": self.lease_version,
                "request_id": self.request_id, "kind": self.kind, "version": version,
                "chunks": self.chunks, "pointer": self.pointer}


def encode_head(meta: Metadata, inline_blob: bytes | None = None) -> bytes:
    line = json.dumps(meta.__dict__, sort_keys=True).encode()
    return line + b"\n" + (inline_blob or b"")


def decode_head(value: bytes) -> tuple[Metadata, bytes | None]:
    line, _, rest = value.partition(b"\n")
    try:
        meta = Metadata(**json.loads(line))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"unreadable checkpoint metadata record: {exc}") from None
    inline = rest if meta.mode == "inline" and not meta.chunks else None
    return meta, inline
