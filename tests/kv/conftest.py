"""Fixtures shared by the store's tests."""

from __future__ import annotations

import pytest

from nemesis.platforms.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A 3-node cluster of real processes with default settings, one per test module, with
    a leader elected (a module that needs other settings defines its own `cluster`)."""
    with LocalCluster(3, tmp_path_factory.mktemp("cluster")) as c:
        c.start()
        # Three interpreters importing grpc at load 10+ can take most of 20 s to serve.
        c.wait_for_leader(timeout_s=60)
        yield c
