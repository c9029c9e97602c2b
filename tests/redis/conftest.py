"""Fixtures of the Redis tests: a redis-server of their own, on a free loopback port.

The session's server runs without persistence (``--save '' --appendonly no``) in a
temporary directory and is killed at the end; tests keep apart by using unique key
names. Tests that restart a server make their own :class:`RedisServer` with an
append-only file, so data survives the restart.

Without ``redis-server`` on PATH (Debian: ``apt-get install redis-server``) the tests
are skipped, except with ``CI=true`` in the environment, where they fail.
"""

from __future__ import annotations

import uuid

import pytest
from redis_testing import RedisServer, require_redis


@pytest.fixture(scope="session")
def redis_binary() -> str:
    return require_redis()


@pytest.fixture(scope="session")
def redis_server(redis_binary: str, tmp_path_factory: pytest.TempPathFactory):
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis-server"))
    server.start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def r(redis_server: RedisServer):
    """A client of the session's server that returns strings."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def names():
    """Unique key names for one test: ``names("in")`` -> ``"in-<random>"``."""
    token = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{token}"
