"""One run at a time per checkpoint, across driver processes.

A run holds an exclusive ``flock`` on ``<checkpoint>/.lockgate-run.lock`` from just
before its stream thread starts (before it writes anything under the checkpoint or
cleans a sink's staging folders) until it terminates. The kernel drops the lock when the
process dies, so a killed driver never blocks the next run. The lock file stays empty.
``<checkpoint>/.lockgate-run`` (JSON, written atomically) names the holder: run id,
process id and host. An error that refuses a second run quotes it.

Runs of one application (its sessions) are handled before this, by the query manager
(``spark.sql.streaming.stopActiveRunOnRestart``). Checkpoints on object stores (any
non-local filesystem) have no lock: there, as with Spark, run one query per checkpoint
at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket

from lockgate.checkpoint.fs import CheckpointFileSystem, LocalFileSystem
from lockgate.errors import ConcurrentWriteError

LOCK_NAME = ".lockgate-run.lock"
HOLDER_NAME = ".lockgate-run"


class CheckpointRunLock:
    """The lock one run holds on its checkpoint; :meth:`release` when the run ends."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, fs: CheckpointFileSystem, root: str, run_id: str, query: str) -> CheckpointRunLock:
        """Take the lock, or raise :class:`~lockgate.errors.ConcurrentWriteError`
        naming the run that holds it."""
        if not isinstance(fs, LocalFileSystem):
            return cls(None)
        import fcntl

        fs.mkdirs(root)
        path = os.path.join(root, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = os.path.join(root, HOLDER_NAME)
            try:
                other = json.loads(fs.read_bytes(holder).decode("utf-8"))
                who = f"run {other.get('runId')} (process {other.get('pid')} on {other.get('host')})"
            except (OSError, ValueError):
                who = "another run"
            raise ConcurrentWriteError(
                f"Cannot start {query}: another run is writing to this checkpoint: {who} "
                f"holds {path}. Only one run of a query may use a checkpoint location at a "
                "time: stop the other run (or wait for it to end), or give this query its own "
                "checkpoint location.",
                path=root,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        info = {"runId": run_id, "pid": os.getpid(), "host": socket.gethostname()}
        fs.write_atomic(
            os.path.join(root, HOLDER_NAME), json.dumps(info).encode("utf-8"), overwrite=True
        )
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops the flock
