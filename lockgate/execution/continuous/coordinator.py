"""EpochCoordinator: the driver's single point that turns task reports into epochs.

Tasks reach it over TCP on the driver's address; every connection must first present
the run's secret (a random token handed to the tasks with their description) or it is
closed. Messages are Spark's:

* ``SetReaderPartitions`` / ``SetWriterPartitions``: how many tasks report per epoch;
* ``GetCurrentEpoch``: tasks poll it to learn that their epoch ended (and of ``stop``);
* ``IncrementAndGetEpoch``: the epoch update thread starts the next epoch;
* ``ReportPartitionOffset``: a reader reached the end of an epoch at this offset; once
  every reader has, the engine writes ``offsets/<epoch>``;
* ``CommitPartitionEpoch``: a writer committed its part of an epoch; once every writer
  has, the offsets are known and the previous epoch is committed, the engine commits the
  sink, writes ``commits/<epoch>`` and commits the source. Epochs commit in order.
* ``StopContinuousExecutionWrites``: tasks end at their next poll.

All messages are handled under one lock, as Spark's single-threaded RPC endpoint does.
Sources fed from the driver (MemoryStream) add their own message types.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any, Protocol

from lockgate.execution.continuous.protocol import ProtocolError, recv_frame, send_frame

logger = logging.getLogger("lockgate.execution.continuous.EpochCoordinator")

Handler = Callable[[dict[str, Any], bytes | None], tuple[dict[str, Any], bytes | None]]


class EpochListener(Protocol):
    """What the coordinator calls on the engine (ContinuousExecution)."""

    def add_offset(self, epoch: int, partition_offsets: list[Any], rows: int) -> None: ...

    def commit_epoch(
        self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]
    ) -> None: ...


class EpochCoordinator:
    def __init__(self, engine: EpochListener, start_epoch: int) -> None:
        self._engine = engine
        self._lock = threading.RLock()
        self.current_epoch = start_epoch
        self.last_committed_epoch = start_epoch - 1
        self.stopping = False
        self.num_readers = 0
        self.num_writers = 0
        self._offsets: dict[int, dict[int, Any]] = {}
        self._rows: dict[int, int] = {}
        self._commits: dict[int, dict[int, tuple[dict[str, Any], bytes | None]]] = {}
        self._offsets_added: set[int] = set()
        self._waiting: set[int] = set()
        self._extra: dict[str, Handler] = {}
        self.failure: BaseException | None = None

    def register(self, message_type: str, handler: Handler) -> None:
        self._extra[message_type] = handler

    # -- message handling ----------------------------------------------------------------
    def handle(
        self, message: dict[str, Any], payload: bytes | None = None
    ) -> tuple[dict[str, Any], bytes | None]:
        kind = message.get("type")
        extra = self._extra.get(str(kind))
        if extra is not None:
            return extra(message, payload)  # driver-fed sources synchronise themselves
        with self._lock:
            if kind == "GetCurrentEpoch":
                return {"epoch": self.current_epoch, "stop": self.stopping}, None
            if kind == "IncrementAndGetEpoch":
                self.current_epoch += 1
                return {"epoch": self.current_epoch}, None
            if kind == "SetReaderPartitions":
                self.num_readers = int(message["numPartitions"])
                return {"ok": True}, None
            if kind == "SetWriterPartitions":
                self.num_writers = int(message["numPartitions"])
                return {"ok": True}, None
            if kind == "StopContinuousExecutionWrites":
                self.stopping = True
                return {"ok": True}, None
            if kind in ("ReportPartitionOffset", "CommitPartitionEpoch") and self.stopping:
                # As Spark's queryWritesStopped: a task of a run being stopped (a
                # reconfiguration, a stop) must not commit into the next run's epochs.
                return {"ok": True}, None
            if kind == "ReportPartitionOffset":
                self._report_offset(
                    int(message["partition"]),
                    int(message["epoch"]),
                    message["offset"],
                    int(message.get("rows", 0)),
                )
                return {"ok": True}, None
            if kind == "CommitPartitionEpoch":
                self._commit_partition(
                    int(message["partition"]),
                    int(message["epoch"]),
                    message.get("message") or {},
                    payload,
                )
                return {"ok": True}, None
        raise ProtocolError(f"unknown message type {kind!r}")

    def _report_offset(self, partition: int, epoch: int, offset: Any, rows: int) -> None:
        offsets = self._offsets.setdefault(epoch, {})
        if partition in offsets:
            return
        offsets[partition] = offset
        self._rows[epoch] = self._rows.get(epoch, 0) + rows
        if len(offsets) == self.num_readers and epoch not in self._offsets_added:
            ordered = [offsets[p] for p in sorted(offsets)]
            self._engine.add_offset(epoch, ordered, self._rows.get(epoch, 0))
            self._offsets_added.add(epoch)
            self._resolve(epoch)

    def _commit_partition(
        self, partition: int, epoch: int, meta: dict[str, Any], payload: bytes | None
    ) -> None:
        commits = self._commits.setdefault(epoch, {})
        if partition in commits:
            return
        commits[partition] = (meta, payload)
        self._resolve(epoch)

    def _resolve(self, epoch: int) -> None:
        commits = self._commits.get(epoch, {})
        if len(commits) != self.num_writers or epoch not in self._offsets_added:
            return
        if self.last_committed_epoch != epoch - 1:
            self._waiting.add(epoch)
            return
        self._commit(epoch)
        while self.last_committed_epoch + 1 in self._waiting:
            following = self.last_committed_epoch + 1
            self._waiting.discard(following)
            self._commit(following)

    def _commit(self, epoch: int) -> None:
        commits = self._commits.pop(epoch, {})
        messages = [commits[p] for p in sorted(commits)]
        self._engine.commit_epoch(epoch, messages)
        self.last_committed_epoch = epoch
        self._offsets.pop(epoch, None)
        self._rows.pop(epoch, None)
        self._offsets_added.discard(epoch)


class CoordinatorServer:
    """Serves an :class:`EpochCoordinator` on ``host``; connections must know the secret."""

    def __init__(self, coordinator: EpochCoordinator, host: str) -> None:
        self.coordinator = coordinator
        self.secret = secrets.token_hex(32)
        self.refused = 0
        server = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request)

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = _Server((host, 0), _Handler)
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"epoch coordinator {host}:{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello, _ = recv_frame(sock)
            offered = str(hello.get("secret", ""))
            if hello.get("type") != "Hello" or not hmac.compare_digest(offered, self.secret):
                self.refused += 1
                logger.warning(
                    "Refused a connection to the epoch coordinator without the run's secret"
                )
                send_frame(sock, {"ok": False, "error": "unauthorized"})
                return
            send_frame(sock, {"ok": True})
            while True:
                try:
                    message, payload = recv_frame(sock)
                except (ProtocolError, OSError):
                    return
                try:
                    reply, data = self.coordinator.handle(message, payload)
                except Exception as exc:
                    logger.exception("Epoch coordinator failed on %s", message.get("type"))
                    if self.coordinator.failure is None:
                        self.coordinator.failure = exc
                    send_frame(sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                    return
                send_frame(sock, reply, data)
        except (ProtocolError, OSError, ValueError):
            logger.debug("epoch coordinator connection ended", exc_info=True)
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
