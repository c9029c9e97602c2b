"""State hosts: one process per Spark executor and state task slot that keeps the state.

A stateful operator's state step runs in a Python task, and the state partitions it
serves are cached in the memory of the process that ran it (``store._cache``): the next
batch finds them there and reads no file. But Spark gives a task to whichever of the
executor's Python workers is idle, so with two workers and two state tasks, task ``t``
lands on the other worker about every other batch, whose copy of its partitions is a
batch or more behind; the worker then catches it up from the deltas the other one wrote
(a Python dict update per changed key), and holds a second copy of the state. At 250,000
changed keys per partition and batch, that was ~500 ms per batch, and the memory doubled.

A host keeps the partitions of one task slot instead: the state step of task ``t``
(of any query and operator of this executor) is sent to host ``t``, which runs it as the
worker would have, so the partitions stay in one process whichever worker Spark picks.

* **Protocol**: :mod:`multiprocessing.connection` over a Unix socket, authenticated with
  a key in a file only this user can read. A worker sends ``("run", payload)``, the
  payload being the state function, the partitions and their input batches, and the
  task's context (stage, partition, attempt, local properties), pickled by PySpark's
  cloudpickle; the host runs the function under a :class:`pyspark.TaskContext` with the
  same values and answers ``("ok", (output batches, accumulator updates))`` or
  ``("error", exception)``. Messages are pickled in transit only, never stored.
* **One per executor and slot**: the socket is ``<tmp>/lockgate-state-<uid>/<pid>-<t>.sock``
  with ``<pid>`` the worker's parent (the PySpark daemon); the first worker that needs it
  starts it under a file lock. A host runs one state step at a time.
* **Lifetime**: the host exits when that parent is gone (checked every second, also in
  the middle of a step: nothing it has not committed is kept), or after
  :data:`IDLE_EXIT_S` without a request. A host that dies fails the request, and so the
  task: Spark runs it again, as for a worker that died, and the state step is made to be
  run again (a version written twice is written with the same content).

The state a host holds is a cache like a worker's: it is dropped for queries that stop
(``store.retain_cached``) and never needed for correctness (every version is in files).
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

ENABLED_CONF = "spark.lockgate.stateHosts"
"""``true`` (the default): built-in stateful operators run their state steps in the
executor's state hosts; ``false``: in the Python worker that runs the task."""
IDLE_EXIT_S = 600.0
START_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 1.0

_conns: dict[int, Any] = {}
_conns_lock = threading.Lock()


def available() -> bool:
    """Whether this platform can run hosts (Unix sockets), and this process is a Spark
    Python worker whose parent outlives it (the daemon that forked it)."""
    import socket

    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def _directory() -> Path:
    uid = os.getuid()
    path = Path(tempfile.gettempdir()) / f"lockgate-state-{uid}"
    path.mkdir(mode=0o700, exist_ok=True)
    status = path.lstat()
    if status.st_uid != uid or status.st_mode & 0o077 or path.is_symlink():
        # Another user made it (to read the key, or to stand in for the host): refuse.
        raise RuntimeError(
            f"{path} is not a directory only this user (uid {uid}) can use; lockgate keeps "
            "its state hosts' sockets and keys there. Remove it, or set TMPDIR to a private "
            "directory."
        )
    return path


def _paths(owner: int, slot: int) -> tuple[Path, Path, Path]:
    base = _directory() / f"{owner}-{slot}"
    return base.with_suffix(".sock"), base.with_suffix(".key"), base.with_suffix(".lock")


def _connect(socket_path: Path, key_path: Path) -> Any:
    from multiprocessing.connection import Client

    return Client(str(socket_path), family="AF_UNIX", authkey=key_path.read_bytes())


def _connection(slot: int) -> Any:
    """This worker's connection to host ``slot`` of its executor, started when there is none."""
    import fcntl

    conn = _conns.get(slot)
    if conn is not None:
        return conn
    owner = os.getppid()
    socket_path, key_path, lock_path = _paths(owner, slot)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            conn = _conns[slot] = _connect(socket_path, key_path)
            return conn
        except (OSError, EOFError, ValueError):
            pass  # none yet, or one that died: start one
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        key_path.touch(mode=0o600)
        key_path.write_bytes(secrets.token_bytes(32))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from lockgate.state.host import main; main()",
                "--socket",
                str(socket_path),
                "--key",
                str(key_path),
                "--watch",
                str(owner),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None,  # the worker's: its warnings go to the executor's log
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                conn = _conns[slot] = _connect(socket_path, key_path)
                return conn
            except (OSError, EOFError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"lockgate's state host {slot} did not start in {START_TIMEOUT_S:.0f} s "
                        f"(see the executor's log); set {ENABLED_CONF}=false to run state "
                        "steps in the Python workers"
                    ) from None
                time.sleep(0.02)


def request(slot: int, message: tuple[Any, ...]) -> Any:
    """Send ``message`` to host ``slot`` and return its answer's value; raises the host's
    exception when the step failed there.

    A host that went away (killed, or out of memory) is replaced and the message sent
    again once: a state step may run again, as when Spark retries its task (it commits
    the same version with the same content)."""
    payload = _dumps(message)
    with _conns_lock:
        for attempt in (1, 2):
            conn = _connection(slot)
            try:
                conn.send_bytes(payload)
                status, value = _loads(conn.recv_bytes())
            except (OSError, EOFError) as exc:
                _forget(slot, conn)
                if attempt == 2:
                    raise RuntimeError(
                        f"lockgate's state host {slot} went away twice while running a "
                        f"state step ({exc!r}); see the executor's log."
                    ) from exc
                logger.warning("lockgate state host %d went away (%r): starting another", slot, exc)
                continue
            except BaseException:
                # an interrupted wait: an answer may still come on this connection
                _forget(slot, conn)
                raise
            if status == "error":
                raise value
            return value
    raise AssertionError("unreachable")


def host_stats() -> dict[int, dict[str, Any]]:
    """Slot -> what each running host of this executor holds (its pid and the query ids
    of its cached state partitions); starts none."""
    from multiprocessing.connection import Client

    owner = os.getppid()
    stats = {}
    for sock in sorted(_directory().glob(f"{owner}-*.sock")):
        slot = int(sock.stem.rsplit("-", 1)[1])
        try:
            with Client(
                str(sock), family="AF_UNIX", authkey=sock.with_suffix(".key").read_bytes()
            ) as conn:
                conn.send_bytes(_dumps(("stats",)))
                status, value = _loads(conn.recv_bytes())
        except (OSError, EOFError):
            continue
        if status == "ok":
            stats[slot] = value
    return stats


def _forget(slot: int, conn: Any) -> None:
    """Never use ``conn`` again."""
    _conns.pop(slot, None)
    with contextlib.suppress(OSError):
        conn.close()


def _dumps(value: Any) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps(value)  # type: ignore[no-any-return]


def _loads(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)  # from our own authenticated peer, in transit only


# -- in the task ----------------------------------------------------------------------------


def run_in_host(slot: int, function: Any, inputs: dict[int, list[Any]]) -> list[Any]:
    """Run ``function(partition, batches)`` for each of ``inputs`` in host ``slot`` under
    this task's context; the output batches, with the accumulator updates the function
    made there added to this task's accumulators."""
    from pyspark import TaskContext
    from pyspark.accumulators import _accumulatorRegistry

    ctx = TaskContext.get()
    assert ctx is not None
    context = {
        "stageId": ctx.stageId(),
        "partitionId": ctx.partitionId(),
        "attemptNumber": ctx.attemptNumber(),
        "taskAttemptId": ctx.taskAttemptId(),
        "cpus": ctx.cpus(),
        "localProperties": dict(ctx._localProperties or {}),
    }
    out, updates = request(slot, ("run", function, inputs, context))
    for aid, value in updates:
        accumulator = _accumulatorRegistry.get(aid)
        if accumulator is not None:
            accumulator.add(value)
    return out  # type: ignore[no-any-return]


# -- the host ---------------------------------------------------------------------------


class _Host:
    def __init__(self, watch: int) -> None:
        self._watch = watch
        self._last = time.monotonic()
        self._active = 0
        self._lock = threading.Lock()
        self._step = threading.Lock()

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
                logger.warning("lockgate state host: a connection was refused: %s", exc)
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _watchdog(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                os.kill(self._watch, 0)
            except ProcessLookupError:
                # The executor's workers are gone (the executor too): stop now, even in the
                # middle of a step, as its worker would have been stopped.
                sock = self._socket_path
                self._exit(sock, self._key_path, sock.with_suffix(".lock"))
            except PermissionError:
                pass
            with self._lock:
                idle = self._active == 0 and time.monotonic() - self._last > IDLE_EXIT_S
            if idle:
                # A worker that comes later finds no socket and starts a new host.
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
                    with self._step:
                        answer: tuple[str, Any] = ("ok", _handle(_loads(data)))
                except Exception as exc:  # noqa: BLE001 - sent back to the task, which raises it
                    answer = ("error", exc)
                finally:
                    with self._lock:
                        self._active -= 1
                        self._last = time.monotonic()
                try:
                    conn.send_bytes(_answer_bytes(answer))
                except (OSError, EOFError):
                    return


def _answer_bytes(answer: tuple[str, Any]) -> bytes:
    """``answer`` pickled; an exception the task could not unpickle is sent as a
    RuntimeError with its type and message."""
    status, value = answer
    if status == "error":
        logger.debug("lockgate state host: a state step failed", exc_info=value)
        try:
            payload = _dumps(answer)
            _loads(payload)
            return payload
        except Exception as exc:  # noqa: BLE001 - an exception that does not round-trip
            value = RuntimeError(f"{type(value).__name__}: {value} (sent from a state host: {exc})")
    return _dumps((status, value))


def _handle(message: tuple[Any, ...]) -> Any:
    kind = message[0]
    if kind == "run":
        return _run(*message[1:])
    if kind == "stats":
        from lockgate.state.store import cached_queries

        return {"pid": os.getpid(), "cached_queries": sorted(cached_queries())}
    raise ValueError(f"unknown request {kind!r}")


def _run(function: Any, inputs: dict[int, list[Any]], context: dict[str, Any]) -> Any:
    from pyspark import TaskContext
    from pyspark.accumulators import _accumulatorRegistry

    TaskContext._setTaskContext(None)
    TaskContext(**context)
    try:
        out = [
            batch
            for partition, batches in inputs.items()
            for batch in function(partition, iter(batches))
        ]
        updates = [(aid, acc._value) for aid, acc in _accumulatorRegistry.items()]
    finally:
        TaskContext._setTaskContext(None)
        # the function's accumulators were registered when the message was unpickled
        _accumulatorRegistry.clear()
    return out, updates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lockgate's state host (started by a state task)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--watch", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _Host(args.watch).serve(Path(args.socket), Path(args.key))
