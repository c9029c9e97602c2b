"""Connections to Redis: typed connection options, retries with backoff, error translation.

The Redis source and sink share these options::

    host            server host name                              "localhost"
    port            server port                                    6379
    db              database number                                0
    username        ACL user (Redis 6+)                            none
    password        password (AUTH)                                none
    ssl             connect with TLS                               false
    sslCaCerts      CA bundle to verify the server with            system default
    sslCertReqs     none | optional | required                     required
    timeout         connect and command timeout                    "5 seconds"
    retries         attempts after the first one on a connection   3
                    failure, per command or per task write
    retryBackoff    wait before the first retry; doubled per retry "100 ms"
    retryMaxBackoff cap of the wait                                "10 seconds"

A :class:`RedisConnection` is made on the driver (by the source, for offsets, and by
the sink, for marker cleanup) and inside every Spark task that reads or writes (the
config is pickled with the task; the client is not). redis-py's own retries are turned
off, so the ``retries`` option is the only retry policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from lockgate.errors import OptionError
from lockgate.sources.redis.errors import (
    RedisAuthenticationError,
    RedisCommandError,
    RedisUnavailableError,
)

if TYPE_CHECKING:
    import redis

    from lockgate.options import Options

logger = logging.getLogger(__name__)

T = TypeVar("T")

SSL_CERT_REQS = ("none", "optional", "required")


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError(
            "The Redis source and sink need the redis-py package: pip install 'redis>=5'"
        ) from exc
    return redis


@dataclass(frozen=True)
class RedisConnectionConfig:
    """Where the server is and how hard to try; parsed once from the string options."""

    host: str = "localhost"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str = "required"
    timeout_ms: int = 5000
    retries: int = 3
    retry_backoff_ms: int = 100
    retry_max_backoff_ms: int = 10_000

    @classmethod
    def from_options(cls, options: Options) -> RedisConnectionConfig:
        """Parse the connection options, raising :class:`OptionError` naming a bad one."""
        host = (options.get_str("host") or "localhost").strip()
        if not host:
            raise OptionError(
                "Invalid value '' for option 'host': expected a host name such as "
                "'localhost' or 'redis.example.com'.",
                option="host",
            )
        port = options.get_int("port", 6379, minimum=1)
        assert port is not None
        if port > 65535:
            raise OptionError(
                f"Invalid value {options.get_str('port')!r} for option 'port': expected a "
                "TCP port between 1 and 65535 (Redis listens on 6379 by default).",
                option="port",
            )
        db = options.get_int("db", 0, minimum=0)
        timeout_ms = _positive_duration(options, "timeout", 5000)
        retries = options.get_int("retries", 3, minimum=0)
        backoff_ms = _positive_duration(options, "retryBackoff", 100)
        max_backoff_ms = _positive_duration(options, "retryMaxBackoff", 10_000)
        if max_backoff_ms < backoff_ms:
            raise OptionError(
                f"Option 'retryMaxBackoff' ({max_backoff_ms} ms) is smaller than "
                f"'retryBackoff' ({backoff_ms} ms); raise 'retryMaxBackoff' or lower "
                "'retryBackoff'.",
                option="retryMaxBackoff",
            )
        cert_reqs = options.get_choice("sslCertReqs", SSL_CERT_REQS, "required")
        assert db is not None and retries is not None
        return cls(
            host=host,
            port=port,
            db=db,
            username=options.get_str("username"),
            password=options.get_str("password"),
            ssl=options.get_bool("ssl", False),
            ssl_ca_certs=options.get_str("sslCaCerts"),
            ssl_cert_reqs=cert_reqs,
            timeout_ms=timeout_ms,
            retries=retries,
            retry_backoff_ms=backoff_ms,
            retry_max_backoff_ms=max_backoff_ms,
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def backoff_ms(self, retry: int) -> int:
        """The wait before retry number ``retry`` (0-based): doubled each time, capped."""
        return min(self.retry_max_backoff_ms, self.retry_backoff_ms * (2 ** min(retry, 32)))

    def make_client(self) -> redis.Redis:
        redis_mod = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.timeout_ms / 1000.0,
            "socket_connect_timeout": self.timeout_ms / 1000.0,
            # Our retry loop is the only one: its attempts and backoff are the options'.
            "retry": Retry(NoBackoff(), 0),
        }
        if self.ssl:
            kwargs.update(ssl=True, ssl_cert_reqs=self.ssl_cert_reqs)
            if self.ssl_ca_certs:
                kwargs["ssl_ca_certs"] = self.ssl_ca_certs
        return redis_mod.Redis(**kwargs)


def _positive_duration(options: Options, key: str, default_ms: int) -> int:
    value = options.get_duration_ms(key, default_ms)
    assert value is not None
    if value <= 0:
        raise OptionError(
            f"Invalid value {options.get_str(key)!r} for option {key!r}: expected a positive "
            "duration such as '500 ms' or '5 seconds'.",
            option=key,
        )
    return value


def _classify(exc: BaseException) -> str:
    """``retry``, ``auth``, ``command`` or ``other`` for an exception from redis-py."""
    from redis import exceptions as rex

    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)):
        return "auth"
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, rex.TryAgainError)):
        # ConnectionError includes BusyLoadingError: a restarted server loading its data.
        return "retry"
    if isinstance(exc, rex.RedisError):
        return "command"
    return "other"


class RedisConnection:
    """A lazily opened client and the retry policy around every use of it.

    Parameters
    ----------
    config : RedisConnectionConfig
    sleep, monotonic : callables, optional
        Injected time, so tests can check the backoff without waiting.
    """

    def __init__(
        self,
        config: RedisConnectionConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._sleep = sleep
        self._monotonic = monotonic
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = self.config.make_client()
        return self._client

    def run(self, what: str, fn: Callable[[redis.Redis], T]) -> T:
        """``fn(client)``, retried on connection failures with exponential backoff.

        ``fn`` must be safe to run again from the start after a failure (every caller
        makes it so: reads are replayable, writes check their batch marker first).

        Raises
        ------
        RedisUnavailableError
            The server was unreachable on every attempt.
        RedisAuthenticationError, RedisCommandError
            The server refused the credentials or the command; never retried.
        """
        config = self.config
        started = self._monotonic()
        retry = 0
        while True:
            try:
                return fn(self.client)
            except Exception as exc:
                kind = _classify(exc)
                if kind == "auth":
                    raise RedisAuthenticationError(
                        f"Redis at {config.address} refused the credentials while trying to "
                        f"{what}: {exc}. Set options 'password' (and 'username' for an ACL "
                        "user) to what the server expects.",
                        address=config.address,
                    ) from exc
                if kind == "command":
                    raise RedisCommandError(
                        f"Redis at {config.address} failed to {what}: {exc}",
                        address=config.address,
                    ) from exc
                if kind != "retry":
                    raise
                self.reset()
                if retry >= config.retries:
                    elapsed = self._monotonic() - started
                    raise RedisUnavailableError(
                        unavailable_message(config, what, exc, retry + 1, elapsed),
                        address=config.address,
                        attempts=retry + 1,
                    ) from exc
                delay_ms = config.backoff_ms(retry)
                retry += 1
                logger.warning(
                    "Redis at %s unavailable to %s (%s); retry %d of %d in %d ms",
                    config.address,
                    what,
                    exc,
                    retry,
                    config.retries,
                    delay_ms,
                )
                self._sleep(delay_ms / 1000.0)

    def reset(self) -> None:
        """Drop the client's connections, so the next use reconnects."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                logger.debug("Ignoring an error while closing a Redis client", exc_info=True)

    close = reset


def unavailable_message(
    config: RedisConnectionConfig, what: str, exc: BaseException, attempts: int, elapsed_s: float
) -> str:
    return (
        f"Cannot reach Redis at {config.address} to {what}: {exc} ({attempts} "
        f"attempt{'s' if attempts != 1 else ''} over {elapsed_s:.1f} s). Check that "
        f"redis-server is running and reachable at {config.address} from the Spark driver "
        "and executors (options 'host' and 'port'); to ride out a server restart, raise "
        f"option 'retries' (now {config.retries}) or 'retryBackoff' (now "
        f"{config.retry_backoff_ms} ms)."
    )


CONNECTION_OPTIONS = (
    "host",
    "port",
    "db",
    "username",
    "password",
    "ssl",
    "sslCaCerts",
    "sslCertReqs",
    "timeout",
    "retries",
    "retryBackoff",
    "retryMaxBackoff",
)
"""Option names shared by the Redis source and sink."""
