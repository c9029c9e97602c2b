"""One process per Spark executor that keeps the Kafka sink's transactional producers.

A transactional producer belongs to its ``transactional.id`` (``<prefix>-<partition>``,
:mod:`lockgate.sinks.kafka`), and initialising a producer of an id fences every other
producer of that id. Spark gives a partition's task to whichever of the executor's Python
workers is idle, so producers kept in the workers fenced each other: with a state step and
a writer in each of two tasks, most batches of a partition landed on a worker whose kept
producer had been fenced, and paid a failed attempt and a new producer's
``init_transactions`` (60 ms; 500 ms when the broker was still completing the previous
transaction, librdkafka's fixed retry). The host keeps one producer per id for all the
workers of its executor, so a partition keeps its producer whichever worker runs it.

* **Protocol**: :mod:`multiprocessing.connection` over a Unix socket, authenticated with
  a key in a file only this user can read. A worker sends ``("write", writer, partition,
  arrow_ipc)`` (the batch's rows as an Arrow IPC stream); the host writes them exactly
  once with its own pools (``writer.write_exactly_once``) and answers ``("ok",
  written)`` or ``("error", message)``. Messages are pickled in transit only, never
  stored.
* **One per executor**: the socket is ``<tmp>/lockgate-kafka-<uid>/<pid>.sock`` with
  ``<pid>`` the worker's parent (the PySpark daemon, or the executor when there is none);
  the first worker that needs it starts it under a file lock.
* **Lifetime**: the host exits when that parent is gone, or after :data:`IDLE_EXIT_S`
  without a request. A host that dies fails the request, and so the task (Spark retries
  it); its open transaction is aborted by the next producer of the id, as for a worker
  that died. A request is sent again once on a new connection when the old one broke:
  writing a partition twice is still exactly once (the marker).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

IDLE_EXIT_S = 600.0
START_TIMEOUT_S = 30.0
WATCH_INTERVAL_S = 1.0

_conn: Any = None
_conn_lock = threading.Lock()
_producers_made = 0


def producer_made() -> None:
    """Count a transactional producer made by this process (each one an
    ``init_transactions``): what the host reports to its tests."""
    global _producers_made
    _producers_made += 1


def _directory() -> Path:
    uid = os.getuid()
    path = Path(tempfile.gettempdir()) / f"lockgate-kafka-{uid}"
    path.mkdir(mode=0o700, exist_ok=True)
    status = path.lstat()
    if status.st_uid != uid or status.st_mode & 0o077 or path.is_symlink():
        # Another user made it (to read the key, or to stand in for the host): refuse.
        raise RuntimeError(
            f"{path} is not a directory only this user (uid {uid}) can use; the Kafka "
            "sink keeps its producer host's socket and key there. Remove it, or set TMPDIR "
            "to a private directory."
        )
    return path


def available() -> bool:
    """Whether this platform can run a host (Unix sockets)."""
    import socket

    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def _paths(owner: int) -> tuple[Path, Path, Path]:
    base = _directory()
    return base / f"{owner}.sock", base / f"{owner}.key", base / f"{owner}.lock"


def _connect(socket_path: Path, key_path: Path) -> Any:
    from multiprocessing.connection import Client

    return Client(str(socket_path), family="AF_UNIX", authkey=key_path.read_bytes())


def _connection() -> Any:
    """This worker's connection to its executor's host, started when there is none."""
    import fcntl

    global _conn
    if _conn is not None:
        return _conn
    owner = os.getppid()
    socket_path, key_path, lock_path = _paths(owner)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _conn = _connect(socket_path, key_path)
            return _conn
        except (OSError, EOFError, ValueError):
            pass  # none yet, or one that died: start one
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        key_path.touch(mode=0o600)
        key_path.write_bytes(secrets.token_bytes(32))
        log = open(_directory() / f"{owner}.log", "ab")  # noqa: SIM115 - the host's stderr
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                __name__,
                "--socket",
                str(socket_path),
                "--key",
                str(key_path),
                "--watch",
                str(owner),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                _conn = _connect(socket_path, key_path)
                return _conn
            except (OSError, EOFError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"The Kafka sink's producer host did not start in {START_TIMEOUT_S:.0f} s "
                        f"(its log: {_directory() / f'{owner}.log'})"
                    ) from None
                time.sleep(0.05)


def request(message: tuple[Any, ...], timeout: float) -> Any:
    """Send ``message`` to this executor's host and return its answer's value; raises
    RuntimeError with the host's message when it failed."""
    global _conn
    with _conn_lock:
        for attempt in (1, 2):
            conn = _connection()
            try:
                conn.send(message)
                if not conn.poll(timeout):
                    raise TimeoutError(f"the Kafka sink's producer host did not answer in {timeout:.0f} s")
                status, value = conn.recv()
            except (OSError, EOFError) as exc:
                _conn = None
                with contextlib.suppress(OSError):
                    conn.close()
                if attempt == 2:
                    raise RuntimeError(f"The Kafka sink's producer host went away: {exc}") from exc
                continue
            except BaseException:
                _conn = None  # an answer may still come on this connection: never reuse it
                with contextlib.suppress(OSError):
                    conn.close()
                raise
            if status == "error":
                raise RuntimeError(value)
            return value
    raise AssertionError("unreachable")


# -- the host ---------------------------------------------------------------------------


class _Host:
    def __init__(self, watch: int) -> None:
        self._watch = watch
        self._last = time.monotonic()
        self._active = 0
        self._lock = threading.Lock()

    def serve(self, socket_path: Path, key_path: Path) -> None:
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import Listener

        self._socket_path, self._key_path = socket_path, key_path
        listener = Listener(str(socket_path), family="AF_UNIX", authkey=key_path.read_bytes())
        threading.Thread(target=self._watchdog, daemon=True).start()
        while True:
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError, EOFError) as exc:
                # a client with the wrong key, or one gone before the handshake ended
                logger.warning("Kafka producer host: a connection was refused: %s", exc)
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _watchdog(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                os.kill(self._watch, 0)
            except ProcessLookupError:
                # The executor's workers are gone, and no one will use these names again.
                lock, log = self._socket_path.with_suffix(".lock"), self._socket_path.with_suffix(".log")
                with contextlib.suppress(OSError):
                    if log.stat().st_size == 0:  # else kept: what went wrong
                        log.unlink()
                self._exit(self._socket_path, self._key_path, lock)
            except PermissionError:
                pass
            with self._lock:
                idle = self._active == 0 and time.monotonic() - self._last > IDLE_EXIT_S
            if idle:
                # A worker that comes later finds no socket and starts a new host (with a
                # new key, under the lock file, which stays).
                self._exit(self._socket_path)

    @staticmethod
    def _exit(*paths: Path) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink()
        os._exit(0)

    def _serve_one(self, conn: Any) -> None:
        with conn:
            while True:
                try:
                    message = conn.recv()
                except (OSError, EOFError):
                    return
                with self._lock:
                    self._active += 1
                try:
                    answer = ("ok", _handle(message))
                except Exception as exc:  # noqa: BLE001 - sent back to the task, which raises it
                    answer = ("error", f"{type(exc).__name__}: {exc}")
                finally:
                    with self._lock:
                        self._active -= 1
                        self._last = time.monotonic()
                try:
                    conn.send(answer)
                except (OSError, EOFError):
                    return


def _handle(message: tuple[Any, ...]) -> Any:
    kind = message[0]
    if kind == "write":
        import pyarrow as pa

        _, writer, partition, ipc = message
        rows = [row for batch in pa.ipc.open_stream(ipc) for row in writer.rows_of(batch)]
        return writer.write_exactly_once(partition, rows)
    if kind == "stats":
        return {"transactional_producers_made": _producers_made}
    raise ValueError(f"unknown request {kind!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lockgate's Kafka producer host (started by the sink)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--watch", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _Host(args.watch).serve(Path(args.socket), Path(args.key))


if __name__ == "__main__":
    # Run as lockgate.sinks.kafka_host, not as __main__: the sink imports this module by
    # that name, and its counters must be the ones the host reports.
    import importlib

    importlib.import_module("lockgate.sinks.kafka_host").main()
