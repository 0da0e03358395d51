"""Fixtures the partitioned-queue tests share: a client of each deployment a partitioned
queue runs on (a standalone server, the real 3-master Cluster). Import them by name."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

import emqfast

from cluster_util import start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """The local 3-master Cluster, one per test module."""
    c = start_cluster(3)
    yield c
    c.stop()


@pytest.fixture(params=["standalone", "cluster"])
def client(request: Any, redis_url: str) -> Iterator[Any]:
    """A client of each deployment the queue runs on."""
    if request.param == "standalone":
        c = emqfast.connect(redis_url)
    else:
        c = emqfast.connect(request.getfixturevalue("cluster").url)
    yield c
    c.close()
