"""Exceptions of the Redis source and sink.

Both talk to Redis through :mod:`lockgate.sources.redis.connection`, which translates
redis-py's exceptions into these at the boundary. Each carries the server's
``host:port`` so a failing query says which server it could not use.
"""

from __future__ import annotations

from lockgate.errors import LockgateError


class RedisError(LockgateError):
    """Talking to Redis failed; ``address`` is the server's ``host:port``."""

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


class RedisUnavailableError(RedisError, ConnectionError):
    """The server could not be reached (refused, timed out, loading) within the retries."""

    def __init__(self, message: str, *, address: str | None = None, attempts: int = 0) -> None:
        super().__init__(message, address=address)
        self.attempts = attempts


class RedisAuthenticationError(RedisError, PermissionError):
    """The server refused the credentials (``username``/``password`` options)."""


class RedisCommandError(RedisError):
    """The server answered a command with an error, e.g. a key of the wrong type."""
