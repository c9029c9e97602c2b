"""Host processes: long-lived Python processes of an executor that lockgate's tasks hand
work to, so that what a host keeps stays in one process whichever Python worker Spark
gives a task (it gives a task to whichever worker is idle).

Two kinds use it: the Kafka sink's producer host (:mod:`lockgate.sinks.kafka_host`, one
per executor: a transactional id's producer) and the state hosts
(:mod:`lockgate.state.host`, one per executor and task slot: the slot's state partitions).

* **Protocol**: :mod:`multiprocessing.connection` over a Unix socket, authenticated with
  a key in a file only this user can read. A message and its answer are pickled (by
  PySpark's cloudpickle, which also carries functions) in transit only, never stored. The
  answer is ``("ok", value)`` or ``("error", value)``, the host's ``error`` hook's value
  for the exception its handler raised.
* **One per executor and name**: the socket is ``<tmp>/lockgate-<kind>-<uid>/<name>.sock``,
  where the name starts with the pid of the worker's parent (the PySpark daemon, or the
  executor when there is none); the first worker that needs the host starts it under a
  file lock. Its stderr is the worker's, so its warnings reach the executor's log.
* **Lifetime**: a host exits when that parent is gone (checked every second, also in the
  middle of a request: the executor is gone), or after :data:`IDLE_EXIT_S` without a
  request. A request is sent again once, to a new host, when the connection broke or the
  host did not answer in time: the work a host does is made to be done again (the Kafka
  sink's marker, the state's versions).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

IDLE_EXIT_S = 600.0
START_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 1.0


def available() -> bool:
    """Whether this platform can run hosts (Unix sockets)."""
    import socket

    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def private_directory(kind: str) -> Path:
    """``<tmp>/lockgate-<kind>-<uid>``, made if missing; refused unless only this user
    can use it (another user could read the keys, or stand in for a host)."""
    uid = os.getuid()
    path = Path(tempfile.gettempdir()) / f"lockgate-{kind}-{uid}"
    path.mkdir(mode=0o700, exist_ok=True)
    status = path.lstat()
    if status.st_uid != uid or status.st_mode & 0o077 or path.is_symlink():
        raise RuntimeError(
            f"{path} is not a directory only this user (uid {uid}) can use; lockgate keeps "
            "its host processes' sockets and keys there. Remove it, or set TMPDIR to a "
            "private directory."
        )
    return path


def dumps(value: Any) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps(value)  # type: ignore[no-any-return]


def loads(data: bytes) -> Any:
    return pickle.loads(data)  # from our own authenticated peer, in transit only


# -- in a worker ----------------------------------------------------------------------------


class HostClient:
    """A worker's connections to the hosts of one kind of its executor."""

    def __init__(self, kind: str, module: str, what: str) -> None:
        self.kind = kind
        self.module = module
        """The module whose ``main()`` runs the host (:func:`serve`)."""
        self.what = what
        """The host's name in messages, e.g. "the Kafka sink's producer host"."""
        self._conns: dict[str, Any] = {}
        self._lock = threading.Lock()

    def request(
        self, message: Any, timeout: float | None = None, slot: int | None = None
    ) -> tuple[str, Any]:
        """Send ``message`` to this executor's host (of ``slot``, for a kind with one per
        slot) and return its answer, ``(status, value)``; starts the host when there is
        none. Raises RuntimeError when the host went away twice, or did not answer in
        ``timeout`` seconds twice."""
        name = str(os.getppid()) if slot is None else f"{os.getppid()}-{slot}"
        payload = dumps(message)
        with self._lock:
            for attempt in (1, 2):
                conn = self._connection(name)
                try:
                    conn.send_bytes(payload)
                    if timeout is not None and not conn.poll(timeout):
                        raise TimeoutError(f"{self.what} did not answer in {timeout:.0f} s")
                    return loads(conn.recv_bytes())  # type: ignore[no-any-return]
                except (OSError, EOFError) as exc:
                    self._forget(name, conn)
                    if attempt == 2:
                        raise RuntimeError(f"{self.what} went away: {exc!r}") from exc
                    logger.warning("%s went away (%r): starting another", self.what, exc)
                except BaseException:
                    # an interrupted wait: an answer may still come on this connection
                    self._forget(name, conn)
                    raise
        raise AssertionError("unreachable")

    def ask_running(self, message: Any) -> dict[str, Any]:
        """Name -> value of the answer of each running host of this kind of this
        executor to ``message``; starts none."""
        from multiprocessing.connection import Client

        owner = str(os.getppid())
        answers = {}
        for sock in sorted(private_directory(self.kind).glob(f"{owner}*.sock")):
            if sock.stem != owner and not sock.stem.startswith(owner + "-"):
                continue
            try:
                with Client(
                    str(sock), family="AF_UNIX", authkey=sock.with_suffix(".key").read_bytes()
                ) as conn:
                    conn.send_bytes(dumps(message))
                    status, value = loads(conn.recv_bytes())
            except (OSError, EOFError):
                continue
            if status == "ok":
                answers[sock.stem] = value
        return answers

    def _forget(self, name: str, conn: Any) -> None:
        self._conns.pop(name, None)
        with contextlib.suppress(OSError):
            conn.close()

    def _connection(self, name: str) -> Any:
        import fcntl

        conn = self._conns.get(name)
        if conn is not None:
            return conn
        base = private_directory(self.kind) / name
        socket_path, key_path = base.with_suffix(".sock"), base.with_suffix(".key")
        with open(base.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                conn = self._conns[name] = _connect(socket_path, key_path)
                return conn
            except (OSError, EOFError, ValueError):
                pass  # none yet, or one that died: start one
            with contextlib.suppress(FileNotFoundError):
                socket_path.unlink()
            key_path.touch(mode=0o600)
            key_path.write_bytes(secrets.token_bytes(32))
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"from {self.module} import main; main()",
                    "--socket",
                    str(socket_path),
                    "--key",
                    str(key_path),
                    "--watch",
                    name.split("-", 1)[0],
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,  # the worker's: the host's warnings go to the executor's log
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
                start_new_session=True,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    conn = self._conns[name] = _connect(socket_path, key_path)
                    return conn
                except (OSError, EOFError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{self.what} did not start in {START_TIMEOUT_S:.0f} s (see the "
                            "executor's log)"
                        ) from None
                    time.sleep(0.02)


def _connect(socket_path: Path, key_path: Path) -> Any:
    from multiprocessing.connection import Client

    return Client(str(socket_path), family="AF_UNIX", authkey=key_path.read_bytes())


# -- the host ---------------------------------------------------------------------------


def serve(
    handle: Callable[[Any], Any],
    error: Callable[[Exception], Any],
    one_at_a_time: bool,
    description: str,
    argv: list[str] | None = None,
) -> None:
    """Run a host (``--socket``, ``--key``, ``--watch`` from ``argv``) until its watched
    process is gone or it idles: each message is answered ``("ok", handle(message))`` or
    ``("error", error(exception))``; with ``one_at_a_time``, one message is handled at a
    time whatever the connections."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--watch", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _Host(args.watch, handle, error, one_at_a_time).serve(Path(args.socket), Path(args.key))


class _Host:
    def __init__(
        self,
        watch: int,
        handle: Callable[[Any], Any],
        error: Callable[[Exception], Any],
        one_at_a_time: bool,
    ) -> None:
        self._watch = watch
        self._handle = handle
        self._error = error
        self._last = time.monotonic()
        self._active = 0
        self._lock = threading.Lock()
        self._one = threading.Lock() if one_at_a_time else contextlib.nullcontext()

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
                logger.warning("lockgate host %s: a connection was refused: %s", socket_path, exc)
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _watchdog(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                os.kill(self._watch, 0)
            except ProcessLookupError:
                # The executor's workers are gone, and no one will use these names again:
                # stop now, even in the middle of a request.
                sock = self._socket_path
                self._exit(sock, self._key_path, sock.with_suffix(".lock"))
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
                    data = conn.recv_bytes()
                except (OSError, EOFError):
                    return
                with self._lock:
                    self._active += 1
                try:
                    with self._one:
                        answer: tuple[str, Any] = ("ok", self._handle(loads(data)))
                except Exception as exc:  # noqa: BLE001 - sent back to the task, which raises it
                    answer = ("error", self._error(exc))
                finally:
                    with self._lock:
                        self._active -= 1
                        self._last = time.monotonic()
                try:
                    conn.send_bytes(dumps(answer))
                except (OSError, EOFError):
                    return
