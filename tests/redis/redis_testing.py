"""Helpers of the Redis tests: a redis-server process on a free loopback port.

Without ``redis-server`` on PATH (Debian: ``apt-get install redis-server``) the tests
are skipped, except with ``CI=true`` in the environment, where they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"
START_TIMEOUT_S = 20.0


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_redis() -> str:
    """The redis-server binary; skip (fail under CI) when it or redis-py is missing."""
    binary = shutil.which("redis-server")
    problem = None
    if binary is None:
        problem = (
            "redis-server is not on PATH: install it (Debian/Ubuntu: sudo apt-get install -y "
            "redis-server; macOS: brew install redis); .ci/run installs it in CI"
        )
    else:
        try:
            import redis  # noqa: F401
        except ImportError:
            problem = "redis-py is not installed: .venv/bin/python -m pip install 'redis>=5'"
    if problem is not None:
        if in_ci():
            pytest.fail(f"CI=true and the Redis tests cannot run: {problem}", pytrace=False)
        pytest.skip(f"Redis tests skipped: {problem} (with CI=true this fails)")
    assert binary is not None
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process on a loopback port, in its own directory.

    ``persistent`` turns on the append-only file (fsync always), so what was
    acknowledged before :meth:`stop` is there again after :meth:`start`.
    """

    def __init__(self, binary: str, directory: Path, *, persistent: bool = False) -> None:
        self.binary = binary
        self.directory = directory
        self.persistent = persistent
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def options(self) -> dict[str, str]:
        """Connection options for lockgate's source and sink."""
        return {"host": HOST, "port": str(self.port)}

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--dir",
            str(self.directory),
        ]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_for_ping()

    def _wait_for_ping(self) -> None:
        import redis

        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis(host=HOST, port=self.port, socket_connect_timeout=1)
        try:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")
                    raise RuntimeError(f"redis-server exited at start; log:\n{log[-2000:]}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def client(self) -> Any:
        import redis

        return redis.Redis(host=HOST, port=self.port, decode_responses=True)


def add(r: Any, stream: str, ids: list[str]) -> None:
    """Entries ``ids`` in ``stream``, each with the field ``n`` naming it."""
    for entry_id in ids:
        r.xadd(stream, {"n": f"{stream}/{entry_id}"}, id=entry_id)
