"""Errors of a node's durable storage, written for the operator who must act on them."""

from __future__ import annotations

from pathlib import Path


class CorruptStorage(Exception):
    """A file in the data directory is damaged somewhere other than a torn last record.

    The node must refuse to start: serving from a damaged log could return or replicate
    data that was never written. Attributes name the file, the byte offset and the problem.
    """

    def __init__(self, path: Path | str, offset: int, problem: str) -> None:
        self.path = Path(path)
        self.offset = offset
        self.problem = problem
        super().__init__(
            f"{self.path}: corrupt at byte offset {offset}: {problem}. The node refuses to "
            f"start rather than serve damaged data"
        )


class StorageFailed(Exception):
    """An earlier write or fsync failed, so what is on disk is unknown; the node must stop
    (and restart, which recovers). Retrying an fsync after a failure is unsafe: the kernel
    may already have dropped the dirty pages."""


class StorageLocked(Exception):
    """Another process holds this data directory."""
