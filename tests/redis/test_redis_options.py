"""Entry IDs, option parsing, retries and error messages of the Redis source and sink (no Spark)."""

from __future__ import annotations

import pytest
import redis
from redis_testing import free_port

from lockgate.errors import OptionError, SinkError
from lockgate.options import Options
from lockgate.sinks.redis import RedisSinkOptions, translate_task_error
from lockgate.sources.redis import (
    EntryId,
    RedisAuthenticationError,
    RedisCommandError,
    RedisConnection,
    RedisConnectionConfig,
    RedisSourceOptions,
    RedisUnavailableError,
)
from lockgate.sources.redis.offsets import (
    LATEST,
    MAX_PART,
    ZERO,
    offsets_from_json,
    parse_starting_offsets,
    parse_streams,
)

# -- entry IDs -----------------------------------------------------------------------------


def test_entry_ids_parse_order_and_next():
    assert EntryId.parse("1700000000000-3") == EntryId(1700000000000, 3)
    assert EntryId.parse(b"5-0") == EntryId(5, 0)
    assert EntryId.parse("5-1") < EntryId.parse("10-0") < EntryId.parse("10-1")
    assert str(EntryId.parse("5-1").next()) == "5-2"
    assert EntryId(7, MAX_PART).next() == EntryId(8, 0)
    assert str(ZERO) == "0-0"


@pytest.mark.parametrize("text", ["", "5", "5-", "-1-0", "a-b", "5-0-0", f"{2**64}-0"])
def test_entry_id_rejects(text):
    with pytest.raises(ValueError, match="entry ID"):
        EntryId.parse(text)


def test_offsets_from_json():
    assert offsets_from_json({"a": "1-0", "b": "0-0"}) == {"a": EntryId(1, 0), "b": ZERO}
    with pytest.raises(TypeError):
        offsets_from_json(["1-0"])


# -- source options ------------------------------------------------------------------------


def test_streams_option():
    assert parse_streams(" a, b ,c") == ("a", "b", "c")
    with pytest.raises(OptionError, match="'streams' is required") as info:
        parse_streams(None)
    assert info.value.option == "streams"
    with pytest.raises(OptionError, match="empty"):
        parse_streams("a,,b")
    with pytest.raises(OptionError, match="a listed more than once"):
        parse_streams("a,b,a")


def test_starting_offsets_option():
    streams = ("a", "b")
    assert parse_starting_offsets(None, streams) == {"a": ZERO, "b": ZERO}
    assert parse_starting_offsets("EARLIEST", streams) == {"a": ZERO, "b": ZERO}
    assert parse_starting_offsets("latest", streams) == {"a": LATEST, "b": LATEST}
    assert parse_starting_offsets('{"a": "5-1", "b": "latest"}', streams) == {
        "a": EntryId(5, 1),
        "b": LATEST,
    }
    assert parse_starting_offsets('{"a": -2, "b": -1}', streams) == {"a": ZERO, "b": LATEST}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("newest", "expected 'earliest', 'latest' or a JSON object"),
        ("[1]", "expected 'earliest', 'latest' or a JSON object"),
        ('{"a": "5-1"}', r"every stream .* \(missing b\)"),
        ('{"a": "5-1", "b": "1-0", "c": "1-0"}', "not in option 'streams': c"),
        ('{"a": "5", "b": "1-0"}', "'5' for stream 'a' is not an entry ID"),
        ('{"a": 5, "b": "1-0"}', "5 for stream 'a' is not an entry ID"),
    ],
)
def test_starting_offsets_errors(value, message):
    with pytest.raises(OptionError, match=message) as info:
        parse_starting_offsets(value, ("a", "b"))
    assert info.value.option == "startingOffsets"


def test_source_options_typed():
    parsed = RedisSourceOptions.parse(
        Options({"streams": "a,b", "maxEntriesPerTrigger": "10", "pageSize": 5, "port": 7000})
    )
    assert parsed.streams == ("a", "b")
    assert parsed.max_entries_per_trigger == 10
    assert parsed.page_size == 5
    assert parsed.connection.address == "localhost:7000"
    with pytest.raises(OptionError, match="maxEntriesPerTrigger") as info:
        RedisSourceOptions.parse(Options({"streams": "a", "maxEntriesPerTrigger": "0"}))
    assert info.value.option == "maxEntriesPerTrigger"


# -- connection options --------------------------------------------------------------------


def test_connection_defaults_and_parsing():
    config = RedisConnectionConfig.from_options(Options({}))
    assert (config.host, config.port, config.db, config.ssl) == ("localhost", 6379, 0, False)
    assert (config.timeout_ms, config.retries, config.retry_backoff_ms) == (5000, 3, 100)
    config = RedisConnectionConfig.from_options(
        Options(
            {
                "host": "redis.example",
                "port": "6380",
                "db": "2",
                "password": "secret",
                "ssl": "true",
                "sslCertReqs": "none",
                "timeout": "2 seconds",
                "retries": "5",
                "retryBackoff": "50ms",
                "retryMaxBackoff": "300ms",
            }
        )
    )
    assert config.address == "redis.example:6380"
    assert config.ssl and config.ssl_cert_reqs == "none"
    assert config.timeout_ms == 2000
    assert "secret" not in repr(config)
    assert [config.backoff_ms(i) for i in range(5)] == [50, 100, 200, 300, 300]


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"port": "0"}, "port"),
        ({"port": "70000"}, "port"),
        ({"port": "x"}, "port"),
        ({"db": "-1"}, "db"),
        ({"timeout": "0"}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"retries": "-1"}, "retries"),
        ({"ssl": "maybe"}, "ssl"),
        ({"sslCertReqs": "always"}, "sslCertReqs"),
        ({"retryBackoff": "1s", "retryMaxBackoff": "10ms"}, "retryMaxBackoff"),
    ],
)
def test_connection_option_errors(options, option):
    with pytest.raises(OptionError) as info:
        RedisConnectionConfig.from_options(Options(options))
    assert option in str(info.value)


# -- retries -------------------------------------------------------------------------------


def _connection(port: int, **options: str) -> tuple[RedisConnection, list[float]]:
    sleeps: list[float] = []
    config = RedisConnectionConfig.from_options(
        Options({"host": "127.0.0.1", "port": str(port), **options})
    )
    return RedisConnection(config, sleep=sleeps.append), sleeps


def test_unreachable_server_is_retried_with_backoff_then_named():
    port = free_port()  # nothing listens there
    connection, sleeps = _connection(port, retries="3", retryBackoff="100ms")
    with pytest.raises(RedisUnavailableError) as info:
        connection.run("read the last entry IDs", lambda c: c.ping())
    assert sleeps == [0.1, 0.2, 0.4]
    message = str(info.value)
    assert f"Cannot reach Redis at 127.0.0.1:{port} to read the last entry IDs" in message
    assert "4 attempts" in message
    assert "redis-server is running" in message and "option 'retries' (now 3)" in message
    assert info.value.address == f"127.0.0.1:{port}"
    assert isinstance(info.value, ConnectionError)


def test_transient_failures_are_retried_until_success():
    connection, sleeps = _connection(6379, retries="5", retryBackoff="10ms")
    calls = []

    def flaky(client):
        calls.append(client)
        if len(calls) < 3:
            raise redis.exceptions.ConnectionError("Connection reset by peer")
        return "ok"

    assert connection.run("do it", flaky) == "ok"
    assert sleeps == [0.01, 0.02]


def test_loading_server_is_retried():
    connection, sleeps = _connection(6379, retries="1", retryBackoff="10ms")
    attempts = []

    def loading(client):
        attempts.append(1)
        if len(attempts) == 1:
            raise redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")
        return 1

    assert connection.run("read", loading) == 1
    assert sleeps == [0.01]


def test_auth_and_command_errors_are_not_retried():
    connection, sleeps = _connection(6379, retries="5")

    def auth(client):
        raise redis.exceptions.AuthenticationError("invalid username-password pair")

    with pytest.raises(RedisAuthenticationError, match="'password'"):
        connection.run("read", auth)

    def wrong_type(client):
        raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key")

    with pytest.raises(RedisCommandError, match="127.0.0.1:6379 failed to read: WRONGTYPE"):
        connection.run("read", wrong_type)
    assert sleeps == []


def test_server_errors_reach_the_caller(redis_server, r, names):
    r.set(names("plain"), "x")
    config = RedisConnectionConfig.from_options(Options(redis_server.options))
    with pytest.raises(RedisCommandError, match="WRONGTYPE"):
        RedisConnection(config).run("read", lambda c: c.xrange(names("plain")))


# -- sink options --------------------------------------------------------------------------


def test_sink_mode_defaults_to_the_output_mode():
    assert RedisSinkOptions.parse(Options({"stream": "s"}), "append").mode == "stream"
    assert RedisSinkOptions.parse(Options({"keyColumn": "k"}), "update").mode == "hash"
    assert RedisSinkOptions.parse(Options({"keyColumn": "k"}), "complete").mode == "hash"
    explicit = RedisSinkOptions.parse(Options({"mode": "HASH", "keyColumn": "a, b"}), "append")
    assert (explicit.mode, explicit.key_columns) == ("hash", ("a", "b"))
    # At validate() time the output mode is not known yet.
    assert RedisSinkOptions.parse(Options({}), None).mode == "stream"


@pytest.mark.parametrize(
    ("options", "output_mode", "option", "message"),
    [
        ({}, "append", "stream", "'stream' is required for mode 'stream' .the default in append"),
        (
            {},
            "update",
            "keyColumn",
            "'keyColumn' is required for mode 'hash' .the default in update",
        ),
        ({"mode": "hash"}, None, "keyColumn", "'keyColumn' is required for mode 'hash':"),
        ({"mode": "list", "stream": "s"}, "append", "mode", "one of 'stream', 'hash'"),
        ({"stream": "s", "markerTtl": "0"}, "append", "markerTtl", "positive duration"),
        ({"stream": "s", "minBatchesToRetain": "0"}, "append", "minBatchesToRetain", ">= 1"),
    ],
)
def test_sink_option_errors(options, output_mode, option, message):
    with pytest.raises(OptionError, match=message) as info:
        RedisSinkOptions.parse(Options(options), output_mode)
    assert info.value.option == option


def test_task_errors_are_translated():
    text = (
        "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
        '  File "x.py", line 1\nlockgate.sources.redis.errors.RedisUnavailableError: Cannot '
        "reach Redis at 127.0.0.1:1234 to write partition 0 of batch 3: refused\n"
    )
    error = translate_task_error(RuntimeError(text))
    assert isinstance(error, RedisUnavailableError)
    assert error.address == "127.0.0.1:1234"
    assert str(error).startswith("Cannot reach Redis at 127.0.0.1:1234 to write partition 0")
    sink_error = translate_task_error(RuntimeError("lockgate.errors.SinkError: Key 'x' holds"))
    assert isinstance(sink_error, SinkError)
    assert translate_task_error(RuntimeError("ZeroDivisionError: division by zero")) is None
