"""One local 3-node store shared by the trainer tests that need one (each test uses its own
job name, so they do not see each other's keys). Closed, every process killed, at the end."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

_jobs = itertools.count(1)


@pytest.fixture(scope="session")
def kv_cluster() -> Iterator[object]:
    from nemesis.platforms.local_cluster import LocalCluster

    with LocalCluster(3) as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=30)
        yield cluster


@pytest.fixture
def job(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:40].replace('/', '_').replace('[', '_').replace(']', '')}-{next(_jobs)}"
