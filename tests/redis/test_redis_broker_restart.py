"""A Redis server that restarts under a running query (source and sink on the same server).

The server here keeps an append-only file (fsync always), so what it acknowledged is
there after the restart. With retries the query rides out the restart; without, it
fails with an error naming the server, and a restart of the query from its checkpoint
completes the output. Either way every input entry is in the output stream once.
"""

from __future__ import annotations

import logging
import time

import pytest
from pyspark.sql import functions as F
from redis_testing import RedisServer


@pytest.fixture
def server(redis_binary, tmp_path):
    server = RedisServer(redis_binary, tmp_path / "redis", persistent=True)
    server.start()
    yield server
    server.stop(kill=True)


def _start(ls, server: RedisServer, source: str, out: str, checkpoint: str, **options):
    return (
        ls.readStream.format("redis")
        .options(**server.options, **options)
        .option("streams", source)
        .load()
        .select(F.col("id").alias("source_id"), F.col("fields")["n"].alias("n"))
        .writeStream.format("redis")
        .options(**server.options, **options)
        .option("stream", out)
        .option("checkpointLocation", checkpoint)
        .start()
    )


def _add(server: RedisServer, stream: str, numbers: range) -> None:
    client = server.client()
    for n in numbers:
        client.xadd(stream, {"n": str(n)})
    client.close()


def _output(server: RedisServer, out: str) -> list[int]:
    client = server.client()
    try:
        return sorted(int(fields["n"]) for _, fields in client.xrange(out))
    finally:
        client.close()


def _wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_query_with_retries_survives_a_restart(ls, server, names, tmp_path, caplog):
    source, out = names("in"), names("out")
    caplog.set_level(logging.WARNING, logger="lockgate.sources.redis.connection")
    q = _start(
        ls,
        server,
        source,
        out,
        str(tmp_path / "ck"),
        retries="100",
        retryBackoff="20ms",
        retryMaxBackoff="500ms",
    )
    _add(server, source, range(5))
    q.processAllAvailable()
    server.stop()
    # The query polls for new entries all the time: wait until it has hit the outage.
    _wait_for(lambda: any("unavailable" in rec.getMessage() for rec in caplog.records))
    server.start()
    _add(server, source, range(5, 10))
    q.processAllAvailable()
    assert q.isActive and q.exception() is None
    q.stop()
    assert _output(server, out) == list(range(10))


def test_query_without_retries_fails_clearly_and_recovers(ls, server, names, tmp_path):
    source, out = names("in"), names("out")
    checkpoint = str(tmp_path / "ck")
    q = _start(ls, server, source, out, checkpoint, retries="0")
    _add(server, source, range(5))
    q.processAllAvailable()
    server.stop()
    with pytest.raises(Exception, match=f"Cannot reach Redis at 127.0.0.1:{server.port}") as info:
        q.awaitTermination(60)
    assert "option 'retries' (now 0)" in str(info.value)
    server.start()
    _add(server, source, range(5, 10))
    q = _start(ls, server, source, out, checkpoint)
    q.processAllAvailable()
    q.stop()
    assert _output(server, out) == list(range(10))
