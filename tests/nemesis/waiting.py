"""Waiting on a condition with a deadline, for the platform tests (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float, what: str,
               describe: Callable[[], str] = lambda: "", poll_s: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy; AssertionError naming `what` and
    `describe()` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; {describe()}")
        time.sleep(poll_s)
