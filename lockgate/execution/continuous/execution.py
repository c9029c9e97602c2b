"""ContinuousExecution: ``trigger(continuous="1 second")``.

One Spark job per run, one long-running task per source partition (see
:mod:`lockgate.execution.continuous.task`). The stream execution thread is the *epoch
update thread*: every trigger interval it starts a new epoch at the coordinator and
checks whether the source needs reconfiguring. The coordinator calls back
:meth:`add_offset` (every reader reported an epoch: ``offsets/<epoch>``) and
:meth:`commit_epoch` (every writer committed it: sink commit, ``commits/<epoch>``,
source commit, purge, progress). The checkpoint layout is micro-batch's.

Restart resumes from the offsets of the latest committed epoch; rows of later,
uncommitted epochs are read again (at-least-once, as Spark documents).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from lockgate.checkpoint import (
    CommitLog,
    CommitMetadata,
    OffsetSeq,
    OffsetSeqLog,
    OffsetSeqMetadata,
)
from lockgate.errors import AnalysisError, CheckpointError
from lockgate.execution.conf import pin_confs
from lockgate.execution.continuous.coordinator import CoordinatorServer, EpochCoordinator
from lockgate.execution.continuous.task import TaskSpec, run_partition
from lockgate.execution.progress import (
    ProgressTracker,
    query_progress,
    source_progress,
)
from lockgate.execution.stream import QueryState, StreamExecution
from lockgate.options import Options
from lockgate.plan.row_expressions import Program
from lockgate.sinks.continuous import output_rows
from lockgate.sources.base import SourceContext

if TYPE_CHECKING:
    from lockgate.plan.nodes import StreamingRelation
    from lockgate.sinks.base import ContinuousSink
    from lockgate.sources.base import ContinuousStream

logger = logging.getLogger("lockgate.execution.ContinuousExecution")


class _Reconfigure(Exception):
    pass


class ContinuousExecution(StreamExecution):
    def __init__(
        self,
        *,
        relation: StreamingRelation,
        program: Program,
        sink: ContinuousSink,
        interval_ms: int,
        plan_text: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan_text = plan_text
        self.relation = relation
        self.program = program
        self.sink = sink
        self.interval_ms = interval_ms
        self.source: ContinuousStream | None = None
        self.current_batch_id = -1
        self.last_execution = None
        conf = self.spark.conf
        self.min_batches_to_retain = int(
            conf.get("spark.sql.streaming.minBatchesToRetain", "100") or 100
        )
        self.poll_interval_ms = int(
            conf.get("spark.sql.streaming.continuous.executorPollIntervalMs", "100") or 100
        )
        self.progress = ProgressTracker(
            int(conf.get("spark.sql.streaming.numRecentProgressUpdates", "100") or 100)
        )
        root = self.checkpoint_root
        self.offset_log = OffsetSeqLog(self.fs, self.fs.join(root, "offsets"))
        self.commit_log = CommitLog(self.fs, self.fs.join(root, "commits"))
        self._coordinator: EpochCoordinator | None = None
        self._server: CoordinatorServer | None = None
        self._job_thread: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._wake = threading.Event()
        self._committed_offset: str | None = None
        self._epoch_offsets: dict[int, tuple[str, int]] = {}
        self._last_commit_ms = -1
        self._conf: dict[str, str] = {}
        self._quiet_epoch = -1

    # -- sources and sinks ----------------------------------------------------------------
    def _init_source(self) -> ContinuousStream:
        relation = self.relation
        context = SourceContext(
            spark=self.spark,
            options=Options(dict(relation.options), owner=f"{relation.source_name} source option"),
            schema=relation.schema,
            metadata_path=self.fs.join(self.checkpoint_root, "sources", "0"),
            fs=self.fs,
            clock=self.clock,
        )
        return relation.provider.createContinuousStream(context)

    def stop_sources(self) -> None:
        if self.source is not None:
            try:
                self.source.stop()
            except Exception:
                logger.warning(
                    "Failed to stop continuous source %s", self.source.description(), exc_info=True
                )
        try:
            self.sink.stop()
        except Exception:
            logger.warning("Failed to stop sink %s", self.sink.description(), exc_info=True)

    # -- the run ----------------------------------------------------------------------------
    def run_activated_stream(self) -> None:
        self.source = self._init_source()
        while self.is_active and not self.stop_event.is_set():
            try:
                self._run_continuous()
            except _Reconfigure:
                logger.info(
                    "Source %s needs reconfiguration; restarting the tasks",
                    self.source.description(),
                )
                if not self._transition(QueryState.RECONFIGURING, QueryState.ACTIVE):
                    return
                continue
            return

    def _start_offsets(self) -> tuple[Any, int]:
        """(start offset, first epoch) from the latest committed epoch, as Spark's getStartOffsets."""
        assert self.source is not None
        latest = self.commit_log.get_latest()
        if latest is None:
            self.offset_log.purge_after(-1)
            self._pin_confs(None)
            return self.source.initialOffset(), 0
        epoch, _ = latest
        offsets = self.offset_log.get(epoch)
        if offsets is None:
            raise CheckpointError(
                f"Epoch {epoch} is committed but offsets/{epoch} is missing from "
                f"{self.offset_log.path}: the checkpoint is damaged.",
                path=self.offset_log.path,
            )
        if len(offsets.offsets) != 1:
            raise CheckpointError(
                f"The checkpoint {self.checkpoint_root} has {len(offsets.offsets)} sources; a "
                "continuous query reads exactly one. Use a new checkpoint location.",
                path=self.offset_log.path,
            )
        # Later epochs were never committed: their rows are read again from here.
        self.offset_log.purge_after(epoch)
        self._pin_confs(offsets.metadata.conf)
        text = offsets.offsets[0]
        assert text is not None
        self._committed_offset = text
        return self.source.deserializeOffset(text), epoch + 1

    def _pin_confs(self, recorded: dict[str, str] | None) -> None:
        self._conf = pin_confs(self.spark.conf, recorded)

    def _run_continuous(self) -> None:
        assert self.source is not None
        self.update_status("Initializing sources")
        start, first_epoch = self._start_offsets()
        self.current_batch_id = first_epoch
        partitions = self.source.planInputPartitions(start)
        self._check_slots(len(partitions))
        coordinator = EpochCoordinator(self, first_epoch)
        for name, handler in self.source.coordinatorHandlers().items():
            coordinator.register(name, handler)
        coordinator.handle({"type": "SetReaderPartitions", "numPartitions": len(partitions)})
        coordinator.handle({"type": "SetWriterPartitions", "numPartitions": len(partitions)})
        server = CoordinatorServer(coordinator, _driver_host(self.spark))
        self._coordinator, self._server = coordinator, server
        spec = TaskSpec(
            host=server.host,
            port=server.port,
            secret=server.secret,
            start_epoch=first_epoch,
            poll_interval_ms=self.poll_interval_ms,
            partitions=tuple(partitions),
            reader_factory=self.source.createReaderFactory(),
            writer_factory=self.sink.createWriterFactory(),
            program=self.program,
        )
        self._job_error = None
        self._wake.clear()
        self._job_thread = threading.Thread(
            target=self._run_job,
            args=(spec, len(partitions)),
            name=f"continuous job for {self.id}",
            daemon=True,
        )
        self._last_commit_ms = self.clock.get_time_millis()
        self._job_thread.start()
        self.update_status("Running", isDataAvailable=True, isTriggerActive=True)
        try:
            self._epoch_loop(coordinator)
        finally:
            self._end_job(coordinator, server)

    def _check_slots(self, tasks: int) -> None:
        cores = _task_slots(self.spark)
        if tasks > cores:
            raise AnalysisError(
                f"This continuous query needs {tasks} task slots (one long-running task per "
                f"source partition) but Spark has {cores} cores, so some tasks would never "
                "start. Lower the source's numPartitions, or give Spark more cores. Note that "
                "while the tasks run they hold their cores: other Spark jobs need cores left over."
            )

    def _run_job(self, spec: TaskSpec, tasks: int) -> None:
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(
                self.run_id, f"continuous query {self.pretty_id_string}", interruptOnCancel=True
            )
            sc.setLocalProperty("sql.streaming.queryId", self.id)
            # The tasks run until told to stop; nothing comes back but their end.
            sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
                lambda index, _rows: [run_partition(spec, index)]
            ).count()
        except BaseException as exc:  # noqa: BLE001 - reported to the stream thread
            self._job_error = exc
        finally:
            self._wake.set()

    def _epoch_loop(self, coordinator: EpochCoordinator) -> None:
        assert self.source is not None
        interval = max(1, self.interval_ms)
        while True:
            now = self.clock.get_time_millis()
            target = (now // interval + 1) * interval
            self.clock.wait_till_time(target, self._wake)
            if coordinator.failure is not None:
                raise coordinator.failure
            if self.stop_event.is_set() or not self.is_active:
                return
            if self._job_error is not None or not self._job_thread.is_alive():  # type: ignore[union-attr]
                if self.stop_event.is_set():
                    return
                if self._job_error is not None:
                    raise self._job_error
                raise RuntimeError("The continuous tasks ended without being stopped")
            if self.source.needsReconfiguration() and self._transition(
                QueryState.ACTIVE, QueryState.RECONFIGURING
            ):
                self.update_status("Reconfiguring")
                raise _Reconfigure()
            reply, _ = coordinator.handle({"type": "IncrementAndGetEpoch"})
            logger.debug("New epoch %s is starting.", reply["epoch"])

    def _end_job(self, coordinator: EpochCoordinator, server: CoordinatorServer) -> None:
        coordinator.handle({"type": "StopContinuousExecutionWrites"})
        thread = self._job_thread
        if thread is not None:
            thread.join(10.0)
            if thread.is_alive():
                logger.warning("Continuous tasks did not stop within 10 s; cancelling their job")
                try:
                    self.spark.sparkContext.cancelJobGroup(self.run_id)
                except Exception:
                    logger.debug("cancelJobGroup failed", exc_info=True)
                thread.join(30.0)
        server.close()

    def stop(self) -> None:
        """Stop the query: tasks end at their next poll; the job's cancel is the fallback."""
        self.stop_event.set()
        self._transition(None, QueryState.TERMINATED)
        self._wake.set()
        if threading.current_thread() is not self.stream_thread and self.stream_thread.is_alive():
            self.stream_thread.join(45.0)
        super().stop()

    # -- coordinator callbacks --------------------------------------------------------------
    def add_offset(self, epoch: int, partition_offsets: list[Any], rows: int) -> None:
        assert self.source is not None
        merged = self.source.mergeOffsets(partition_offsets)
        text = self.source.serializeOffset(merged)
        metadata = OffsetSeqMetadata(0, self.clock.get_time_millis(), dict(self._conf))
        self.offset_log.add(epoch, OffsetSeq((text,), metadata))
        self._epoch_offsets[epoch] = (text, rows)

    def commit_epoch(self, epoch: int, messages: list[tuple[dict[str, Any], bytes | None]]) -> None:
        assert self.source is not None
        if not self.stream_thread.is_alive():
            return
        self.update_status(f"Committing epoch {epoch}")
        started = time.perf_counter()
        self.sink.commit(epoch, messages)
        self.commit_log.add(epoch, CommitMetadata(0))
        text, rows = self._epoch_offsets.pop(epoch)
        previous = self._committed_offset
        self.source.commit(self.source.deserializeOffset(text))
        self._committed_offset = text
        self.current_batch_id = epoch + 1
        threshold = epoch - self.min_batches_to_retain + 1
        if threshold > 0:
            self.offset_log.purge(threshold)
            self.commit_log.purge(threshold)
        commit_ms = int((time.perf_counter() - started) * 1000)
        self._report_progress(epoch, previous, text, rows, messages, commit_ms)
        self.update_status("Running")
        with self._await_progress:
            if previous == text:
                self._quiet_epoch = epoch
            self._await_progress.notify_all()

    def process_all_available(self) -> None:
        """Wait for an epoch that started after this call and committed with no new data:
        its readers looked for data only after the call, so everything added before the
        call is committed."""
        if threading.current_thread() is self.stream_thread:
            raise RuntimeError(
                "Cannot wait for a query state from the same thread that is running the query"
            )
        if self.stream_death_cause is not None:
            raise self.stream_death_cause
        coordinator = self._coordinator
        with self._await_progress:
            current = (
                coordinator.current_epoch if coordinator is not None else self.current_batch_id
            )
            while self.is_active and self._quiet_epoch <= current:
                self._await_progress.wait(10.0)
                if self.stream_death_cause is not None:
                    break
        if self.stream_death_cause is not None:
            raise self.stream_death_cause

    def _report_progress(
        self,
        epoch: int,
        start: str | None,
        end: str,
        rows: int,
        messages: list[tuple[dict[str, Any], bytes | None]],
        commit_ms: int,
    ) -> None:
        assert self.source is not None
        now = self.clock.get_time_millis()
        seconds = max(0, now - self._last_commit_ms) / 1000.0
        started = self._last_commit_ms
        self._last_commit_ms = now
        progress = query_progress(
            query_id=self.id,
            run_id=self.run_id,
            name=self.name,
            timestamp_ms=started,
            batch_id=epoch,
            batch_duration_ms=now - started,
            durations={"commitOffsets": commit_ms, "triggerExecution": now - started},
            input_secs=seconds,
            process_secs=seconds,
            event_time=None,
            state_operators=[],
            sources=[source_progress(self.source.description(), start, end, rows, seconds, seconds)],
            sink_description=self.sink.description(),
            output_rows=output_rows(messages),
        )
        parsed = self.progress.record(progress)
        self.manager.query_progress(self, parsed)

    def explain_string(self) -> str:
        """What ``StreamingQuery.explain()`` shows: the continuous write over Spark's
        analyzed plan of the operators the tasks evaluate."""
        lines = [
            (f"WriteToContinuousDataSource {self.sink.description()}, epoch interval "
            f"{self.interval_ms} ms, source {self.relation.source_name}")
        ]
        lines += ["+- " + self.plan_text.replace("\n", "\n   ")] if self.plan_text else []
        return "\n".join(lines)

    def last_progress(self) -> Any:
        return self.progress.last()

    def recent_progress(self) -> list[Any]:
        return list(self.progress.recent)


def _task_slots(spark: Any) -> int:
    """How many tasks can run at once now (Spark's maxNumConcurrentTasks); defaultParallelism
    when the scheduler cannot tell (e.g. no executor registered yet)."""
    sc = spark.sparkContext
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        slots = int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - an internal API; fall back to the public figure
        slots = 0
    return slots if slots > 0 else int(sc.defaultParallelism)


def _driver_host(spark: Any) -> str:
    master = str(spark.sparkContext.master)
    if master.startswith("local"):
        return "127.0.0.1"
    return str(spark.conf.get("spark.driver.host", "127.0.0.1"))
