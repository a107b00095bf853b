"""Test-only UNSAFE coordinator behaviour: the canary that proves the fencing test can fail.

Every line of deliberately wrong trainer code lives here. A coordinator runs it only when
started with `--unsafe NAME` AND its environment has `MAO_ALLOW_UNSAFE=1`; otherwise it
refuses to start (exit 2).

Canaries:
- `no-fencing`: the checkpoint head is written with a plain put, ignoring the version the
  coordinator believes current. A coordinator paused past its lease then overwrites its
  successor's checkpoint: the "deposed coordinator never writes" check must report it.

What it must never do: be reachable without both the flag and the environment variable.
"""

from __future__ import annotations

import os

from system.kv.client import KVClient

CANARIES = ("no-fencing",)


class UnsafeRefused(Exception):
    pass


def check_unsafe(name: str) -> str:
    """The canary's name if it may run, "" for none; UnsafeRefused otherwise."""
    if not name:
        return ""
    if name not in CANARIES:
        raise UnsafeRefused(f"unknown unsafe mode {name!r}; known: {', '.join(CANARIES)}")
    if os.environ.get("MAO_ALLOW_UNSAFE") != "1":
        raise UnsafeRefused(f"--unsafe {name} needs MAO_ALLOW_UNSAFE=1 in the environment (test only)")
    return name


def write_head_without_cas(kv: KVClient, key: str, value: bytes, request_id: str) -> int:
    """WRONG ON PURPOSE (`no-fencing`): no expected_version, so no fence."""
    return kv.put(key, value, request_id=request_id).version
