"""MicroBatchExecution: the micro-batch engine.

Each trigger: find the latest offsets of every source, write them to the offsets log
(the write-ahead log) before touching any data, build the batch's DataFrame from the
plan, hand it to the sink, then write the commit log. After a crash the logs tell
exactly where to resume: a batch whose offsets are logged but not committed is run
again with the same offsets, batch timestamp and watermark.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation

from lockgate import interrupt
from lockgate.checkpoint import (
    CommitLog,
    CommitMetadata,
    OffsetSeq,
    OffsetSeqLog,
    OffsetSeqMetadata,
)
from lockgate.errors import CheckpointError, ConcurrentWriteError, OptionError
from lockgate.execution.conf import pin_confs
from lockgate.execution.faults import crash_point
from lockgate.execution.progress import (
    ProgressTracker,
    format_timestamp,
    query_progress,
    source_progress,
)
from lockgate.execution.stream import StreamExecution
from lockgate.execution.triggers import (
    AvailableNowTrigger,
    OnceTrigger,
    ProcessingTimeTrigger,
    Trigger,
)
from lockgate.execution.watermark import WatermarkTracker, propagate_watermark
from lockgate.options import Options, time_string_ms
from lockgate.plan.cache import PlanCache
from lockgate.plan.dedup import REPEATED_IN_BATCH
from lockgate.plan.incremental import (
    IncrementalExecution,
    ObservationRole,
    observation_name,
    observation_value,
    reusable,
    row_count,
)
from lockgate.plan.nodes import PlanNode, observed_nodes, source_relations, watermark_nodes
from lockgate.plan.pushdown import scans_per_source
from lockgate.plan.state_udf import TASKS_CONF, encode_params, property_key
from lockgate.plan.stateful import StatefulContext, state_task_count, stateful_operators
from lockgate.plan.template import NotReusable, PlanTemplate
from lockgate.sources.base import READ_ALL_AVAILABLE, ReadLimit, Source, SourceContext
from lockgate.state import host as state_host
from lockgate.state.metrics import DictSumParam
from lockgate.state.schema import check_operator_count, check_or_write

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lockgate.sinks.base import Sink

logger = logging.getLogger("lockgate.execution.MicroBatchExecution")

REUSE_CONF = "spark.lockgate.planReuse"


def _reuse_plans(spark: SparkSession) -> bool:
    """``spark.lockgate.planReuse`` (default true): whether batches reuse the analysed
    plan of an earlier batch of the same shape (:mod:`lockgate.plan.template`)."""
    raw = str(spark.conf.get(REUSE_CONF, "true") or "true").strip().lower()
    if raw not in ("true", "false"):
        raise OptionError(
            f"Invalid value '{raw}' for {REUSE_CONF}: use true or false.", option=REUSE_CONF
        )
    return raw == "true"


BACKGROUND_SNAPSHOT_CONF = "spark.lockgate.stateStore.backgroundSnapshotMinRows"
_BACKGROUND_SNAPSHOT_DEFAULT = 50_000


def _background_snapshot_min_rows(spark: SparkSession) -> int | None:
    """``spark.lockgate.stateStore.backgroundSnapshotMinRows``: a state partition of at
    least this many rows writes its snapshots in the background (-1: never)."""
    raw = spark.conf.get(BACKGROUND_SNAPSHOT_CONF, None)
    if raw is None or str(raw).strip() == "":
        return _BACKGROUND_SNAPSHOT_DEFAULT
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -2
    if value < -1:
        raise OptionError(
            f"{BACKGROUND_SNAPSHOT_CONF} must be a number of rows (0 or more), or -1 to "
            f"write every snapshot in its task; got {raw!r}.",
            option=BACKGROUND_SNAPSHOT_CONF,
        )
    return None if value == -1 else value


def _state_hosts(spark: SparkSession) -> str:
    """``spark.lockgate.stateHosts``: ``auto`` (the default), ``true`` or ``false``."""
    raw = str(spark.conf.get(state_host.ENABLED_CONF, "auto") or "auto").strip().lower()
    if raw not in ("auto", "true", "false"):
        raise OptionError(
            f"{state_host.ENABLED_CONF} must be auto, true or false, got {raw!r}. auto (the "
            "default) keeps the state partitions of an operator that updates many rows per "
            "batch in one process per executor and task slot; true does so for every "
            "operator; false keeps them in the Python workers.",
            option=state_host.ENABLED_CONF,
        )
    return raw


HOST_ABOVE_ROWS = 50_000
"""Under ``stateHosts=auto``, a batch that reads at least this many rows (when its sources
count them ahead) runs every state step in the state hosts, and an operator whose last
batch with data updated at least this many state rows does so from the next batch on ..."""
DEDUP_BY_ROW_BELOW = 0.25
"""A deduplication whose last batch had at most this share of duplicate rows sends the
next batch's rows to its state step as they are (``_choose_dedup_grouping``) ..."""
DEDUP_GROUPED_ABOVE = 0.5
"""... and grouped by key again once a batch has at least this share."""
DEDUP_MIN_ROWS = 1_000
"""After a batch of fewer rows the next goes row by row whatever its duplicates: shipping
a few hundred rows to the state step costs less than Spark's two aggregations and sorts
(a Kafka stream at 1,000 records/s has batches of a few hundred)."""

HOST_BELOW_ROWS = 10_000
"""... and back in the Python workers once a batch with data updates fewer than this.

A worker that finds its cached partition behind replays the batches it missed, a cost
that grows with the rows they updated; a host never replays, but a state step sent to it
costs two more hand-offs and a process that competes for the cores. Moving between the
two loads the partitions from files once, hence the gap between the two bounds."""


def _max_state_tasks(spark: SparkSession) -> int:
    """``spark.lockgate.stateTasks``, else the cores Spark runs tasks on."""
    raw = spark.conf.get(TASKS_CONF, None)
    if raw is None or str(raw).strip() == "":
        return max(1, int(spark.sparkContext.defaultParallelism))
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(
            f"{TASKS_CONF} must be a positive number of tasks, got {raw!r}. Unset it to "
            "run one state task per core, or set it to spark.sql.shuffle.partitions for "
            "one task per state partition.",
            option=TASKS_CONF,
        )
    return value


@dataclass
class _SourceSlot:
    index: int
    relation_id: int
    source: Source
    scans: int = 1
    """How many scans of the source Spark's plan has (``df.union(df)`` two, a self-join
    whose inputs are one shuffle one, :func:`~lockgate.plan.pushdown.scans_per_source`):
    its progress sums the rows of every scan in ``numInputRows``."""


class MicroBatchExecution(StreamExecution):
    """Runs a query as a sequence of micro-batches."""

    def __init__(
        self,
        *,
        plan: PlanNode,
        sink: Sink,
        trigger: Trigger,
        output_mode: str,
        user_spark: SparkSession,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.sink = sink
        self.trigger = trigger
        self.output_mode = output_mode
        self.user_spark = user_spark
        self.current_batch_id = -1
        self._constructed = False
        self._slots: list[_SourceSlot] = []
        self.available: list[str | None] = []
        self.committed: list[str | None] = []
        self.latest_reported: list[str | None] = []
        """Each source's :meth:`~lockgate.sources.base.Source.reportLatestOffset` at its
        last ``latestOffset`` (the progress's ``sources[].latestOffset``)."""
        self.offset_metadata = OffsetSeqMetadata()
        conf = self.spark.conf
        self.min_batches_to_retain = int(conf.get("spark.sql.streaming.minBatchesToRetain", "100") or 100)
        self.polling_delay_ms = time_string_ms(
            str(conf.get("spark.sql.streaming.pollingDelay", "10ms") or "10ms"),
            what="spark.sql.streaming.pollingDelay",
        )
        self.no_data_progress_interval_ms = time_string_ms(
            str(conf.get("spark.sql.streaming.noDataProgressEventInterval", "10000ms") or "10000ms"),
            what="spark.sql.streaming.noDataProgressEventInterval",
        )
        self.progress = ProgressTracker(
            int(conf.get("spark.sql.streaming.numRecentProgressUpdates", "100") or 100)
        )
        self._watermark_nodes = watermark_nodes(plan)
        self._observed_nodes = observed_nodes(plan)
        self.watermark_tracker = WatermarkTracker([w.delay_ms for w in self._watermark_nodes])
        self._last_batch: dict[str, Any] | None = None
        self._available_now_caps: dict[int, Any] | None = None
        self._backlog_start: dict[int, int] = {}
        """Trigger.AvailableNow: what each source had left when this run started."""
        self._backlog_batches = 0
        self.last_execution: IncrementalExecution | None = None
        self.plan_cache = PlanCache()
        self._reuse_plans = _reuse_plans(self.spark) and reusable(plan)
        self._templates: dict[Hashable, tuple[PlanTemplate, set[ObservationRole]] | None] = {}
        """Shape (empty sources) -> the analysed plan later batches of that shape reuse
        and its observations; None when it cannot be reused."""
        self._pushdown_probed: set[Hashable] = set()
        """Shapes whose first build was searched for filters Spark applies below an
        observation (:mod:`lockgate.plan.pushdown`)."""
        self.reused_plans = 0
        """How many batches of this run reused an earlier batch's plan (for tests)."""
        self._empty_frames: dict[int, DataFrame] = {}
        self._stateful_ops = stateful_operators(plan)
        self._op_ids = {id(node): i for i, node in enumerate(self._stateful_ops)}
        self._state_checked = False
        self._state_metrics: Any = None
        if self._stateful_ops:
            self._state_metrics = self.spark.sparkContext.accumulator({}, DictSumParam())
        self._last_state_progress: list[dict[str, Any]] = []
        # whether this run's last batch had its sink's row count (Spark's sinkCommitProgress,
        # a V2 write's): an idle progress then says 0 output rows, else -1
        self._sink_counted_rows = False
        self._max_state_tasks = _max_state_tasks(self.spark) if self._stateful_ops else None
        self._state_hosts = _state_hosts(self.spark) if self._stateful_ops else "false"
        self._hosted_ops: set[int] = set()
        self._dedups_by_row: set[int] = set()
        self._background_snapshot_min_rows = (
            _background_snapshot_min_rows(self.spark) if self._stateful_ops else None
        )
        root = self.checkpoint_root
        self.offset_log = OffsetSeqLog(self.fs, self.fs.join(root, "offsets"))
        self.commit_log = CommitLog(self.fs, self.fs.join(root, "commits"))

    # -- sources ---------------------------------------------------------------------
    def _init_sources(self) -> None:
        relations = source_relations(self.plan)
        self._source_names = _source_names(self.spark, relations)
        counted = scans_per_source(self.plan, self.spark)
        for index, relation in enumerate(relations):
            directory = str(index) if self._source_names is None else self._source_names[index]
            metadata_path = self.fs.join(self.checkpoint_root, "sources", directory)
            context = SourceContext(
                spark=self.spark,
                options=Options(dict(relation.options), owner=f"{relation.source_name} source option"),
                schema=relation.schema,
                metadata_path=metadata_path,
                fs=self.fs,
                clock=self.clock,
            )
            source = relation.provider.createSource(context)
            scans = counted.get(id(relation), 1)
            self._slots.append(_SourceSlot(index, id(relation), source, scans))
            self.plan_cache.scan_filters.setdefault(id(relation), [[] for _ in range(scans)])
        self.available = [None] * len(self._slots)
        self.committed = [None] * len(self._slots)
        self.latest_reported = [None] * len(self._slots)

    def stop_sources(self) -> None:
        for slot in self._slots:
            try:
                slot.source.stop()
            except Exception:
                logger.warning(
                    "Failed to stop streaming source: %s. Resources may have leaked.",
                    slot.source.description(),
                    exc_info=True,
                )
        try:
            self.sink.stop()
        except Exception:
            logger.warning("Failed to stop sink %s", self.sink.description(), exc_info=True)

    # -- the trigger loop --------------------------------------------------------------
    def run_activated_stream(self) -> None:
        self._init_sources()
        if isinstance(self.trigger, AvailableNowTrigger):
            self._prepare_available_now()
        interval = self.trigger.interval_ms if isinstance(self.trigger, ProcessingTimeTrigger) else 0
        while self.is_active and not self.stop_event.is_set():
            trigger_time = self.clock.get_time_millis()
            next_time = trigger_time if interval == 0 else (trigger_time // interval + 1) * interval
            keep_going = self._run_one_trigger()
            if interval > 0:
                elapsed = self.clock.get_time_millis() - trigger_time
                if elapsed > interval:
                    logger.warning(
                        "Current batch is falling behind. The trigger interval is %s "
                        "milliseconds, but spent %s milliseconds",
                        interval,
                        elapsed,
                    )
            if not keep_going:
                return
            if interval > 0:
                self.clock.wait_till_time(next_time, self.stop_event)

    def _prepare_available_now(self) -> None:
        # Sources without their own support are read up to the offset they report at
        # the first trigger, in one batch (Spark's AvailableNowDataStreamWrapper).
        self._available_now_caps = {}
        for slot in self._slots:
            if slot.source.supportsTriggerAvailableNow:
                slot.source.prepareForTriggerAvailableNow()

    def _backlog(self, slot: Any, end: Any) -> tuple[int, str] | None:
        try:
            return slot.source.availableNowBacklog(end)
        except Exception:  # progress logging must never fail a query
            logger.debug("Cannot tell the backlog of %s", slot.source.description(), exc_info=True)
            return None

    def _log_backlog(self) -> None:
        """Trigger.AvailableNow: after each batch, what each source has left to read, and
        about how many batches that is at this run's pace."""
        self._backlog_batches += 1
        for slot in self._slots:
            backlog = self._backlog(slot, self.available[slot.index])
            if backlog is None:
                continue
            left, unit = backlog
            read = self._backlog_start.get(slot.index, left) - left
            pace = ""
            if left and read > 0:
                batches = -(-left * self._backlog_batches // read)
                pace = f", about {batches} more batch{'es' if batches != 1 else ''}"
            logger.info(
                "Trigger.AvailableNow: batch %d done (%d this run); %s: %d %s read, %d left%s",
                self.current_batch_id,
                self._backlog_batches,
                slot.source.description(),
                read,
                unit,
                left,
                pace,
            )

    def _run_one_trigger(self) -> bool:
        """One trigger of the batch runner; returns whether to keep running."""
        self.progress.start_trigger(self.clock.get_time_millis())
        self.update_status(isTriggerActive=True)
        with self.progress.time("triggerExecution"):
            if self.current_batch_id < 0:
                self._populate_start_offsets()
                if isinstance(self.trigger, AvailableNowTrigger) and logger.isEnabledFor(logging.INFO):
                    self._backlog_start = {
                        slot.index: backlog[0]
                        for slot in self._slots
                        if (backlog := self._backlog(slot, self.committed[slot.index])) is not None
                    }
            # Constructing the batch and declaring "no new data" happen under the
            # progress lock, so processAllAvailable() cannot slip in between (Spark's
            # withProgressLocked).
            with self._await_progress:
                if not self._constructed:
                    self._constructed = self._construct_next_batch()
                if not self._constructed:
                    self._no_new_data = True
                    self._await_progress.notify_all()
            self.update_status(isDataAvailable=self._constructed)
            ran = self._constructed
            if ran:
                self.update_status("Processing new data")
                self._run_batch()
        self._finish_trigger(ran)
        # Only when it is logged: the file source walks its target's files to tell.
        if ran and isinstance(self.trigger, AvailableNowTrigger) and logger.isEnabledFor(logging.INFO):
            self._log_backlog()
        if ran:
            self.current_batch_id += 1
            self._constructed = False
            self.spark.sparkContext.setJobGroup(
                self.run_id, self.batch_description(str(self.current_batch_id)), interruptOnCancel=True
            )
        else:
            self.update_status("Waiting for data to arrive", isTriggerActive=False)
            if not isinstance(self.trigger, (OnceTrigger, AvailableNowTrigger)):
                self._wait_for_data()
        self.update_status("Waiting for next trigger", isTriggerActive=False)
        if isinstance(self.trigger, OnceTrigger):
            return False
        if isinstance(self.trigger, AvailableNowTrigger) and not ran:
            return False
        return self.is_active

    def _wait_for_data(self) -> None:
        """Sleep the polling delay after a trigger found no data, as Spark does; a stop or
        a processAllAvailable() call ends it early (Spark's does not end early: lockgate
        lists the sources sooner for a test that waits)."""
        self.wake_event.wait(self.polling_delay_ms / 1000.0)
        self.wake_event.clear()

    # -- recovery ----------------------------------------------------------------------
    def _populate_start_offsets(self) -> None:
        latest = self.offset_log.get_latest()
        if latest is None:
            logger.info("Starting new streaming query.")
            self.current_batch_id = 0
            self._pin_confs(None)
            return
        latest_batch_id, offset_seq = latest
        self._check_source_count(offset_seq, latest_batch_id)
        self.current_batch_id = latest_batch_id
        self._constructed = True
        self.available = offset_seq.in_order(self._source_names)
        self.offset_metadata = offset_seq.metadata
        self._pin_confs(offset_seq.metadata.conf)
        self.watermark_tracker.set_watermark(offset_seq.metadata.batchWatermarkMs)
        if latest_batch_id != 0:
            previous = self.offset_log.get(latest_batch_id - 1)
            if previous is None:
                raise CheckpointError(
                    f"batch {latest_batch_id - 1} doesn't exist in the offsets log "
                    f"{self.offset_log.path}: the checkpoint is incomplete.",
                    path=self.offset_log.path,
                )
            self.committed = previous.in_order(self._source_names)
        latest_commit = self.commit_log.get_latest()
        if latest_commit is not None:
            committed_id, commit_metadata = latest_commit
            if committed_id > latest_batch_id:
                # Spark would run batch latest_batch_id again, sink write included, and
                # then fail on the commit that exists (CONCURRENT_STREAM_LOG_UPDATE)
                raise CheckpointError(
                    f"The commit log {self.commit_log.path} has batch {committed_id} but the "
                    f"offsets log {self.offset_log.path} ends at batch {latest_batch_id}: "
                    f"offsets entries {latest_batch_id + 1}..{committed_id} are missing, so "
                    "the checkpoint is incomplete. Restore them from a backup of the "
                    "checkpoint, or start the query with a new checkpoint location.",
                    path=self.offset_log.path,
                )
            if committed_id == latest_batch_id:
                self.committed = list(self.available)
                # the later of the two logs' watermarks, as Spark's populateStartOffsets
                # (a commit written by another engine, or edited, may hold an earlier one)
                self.watermark_tracker.set_watermark(
                    max(offset_seq.metadata.batchWatermarkMs, commit_metadata.nextBatchWatermarkMs)
                )
                self.current_batch_id = latest_batch_id + 1
                self._constructed = False
            elif committed_id != latest_batch_id - 1:
                logger.warning(
                    "Batch completion log latest batch id is %s, which is not trailing "
                    "batchid %s by one",
                    committed_id,
                    latest_batch_id,
                )
        if self.current_batch_id == latest_batch_id and latest_batch_id > 0:
            self._check_unfinished_repartition(latest_batch_id)
        logger.info(
            "Resuming at batch %s with committed offsets %s and available offsets %s",
            self.current_batch_id,
            self.committed,
            self.available,
        )

    def _check_unfinished_repartition(self, batch_id: int) -> None:
        """Refuse to run an uncommitted batch that changes the state's partition count:
        only an offline repartition (``_streamingCheckpointManager.repartition``) plans
        one, and a repartition that stopped before its commit may have moved part of
        the state. Running the batch would read the old layout as the new one."""
        changed = self.offset_log.repartitioned(batch_id) if self._stateful_ops else None
        if changed is None:
            return
        before, after = changed
        raise CheckpointError(
            f"Batch {batch_id} of checkpoint {self.checkpoint_root} is an offline repartition "
            f"of the state from {before} to {after} partitions that never finished (it has no "
            "commit), so the state may be partly moved. Finish it with "
            f"_streamingCheckpointManager.repartition({self.checkpoint_root!r}, {after}), then "
            "start the query again.",
            path=self.offset_log.batch_path(batch_id),
        )

    def _check_source_count(self, offset_seq: OffsetSeq, batch_id: int) -> None:
        if offset_seq.names is not None and self._source_names is not None:
            return  # sources matched by name (source evolution)
        if len(offset_seq.offsets) != len(self._slots):
            raise CheckpointError(
                f"There are [{len(offset_seq.offsets)}] sources in the checkpoint offsets and "
                f"now there are [{len(self._slots)}] sources requested by the query. Cannot "
                f"continue. (checkpoint: {self.checkpoint_root}, batch {batch_id}) Use a new "
                "checkpoint location for a query with different sources.",
                path=self.offset_log.batch_path(batch_id),
            )

    def _pin_confs(self, recorded: dict[str, str] | None) -> None:
        conf = self.spark.conf
        pinned = pin_confs(conf, recorded, logger)
        self._pinned_conf = pinned
        if self._stateful_ops:
            # State steps run in fewer tasks than state partitions on a small machine
            # (lockgate.plan.state_udf.state_task_count); the batch's shuffles use that
            # many partitions, so an aggregation's own shuffle delivers each task its
            # state partitions. The offsets log keeps the state's partition count.
            partitions = int(pinned["spark.sql.shuffle.partitions"])
            tasks = state_task_count(partitions, self._max_state_tasks)
            if tasks != partitions:
                conf.set("spark.sql.shuffle.partitions", str(tasks))
        policy = pinned["spark.sql.streaming.multipleWatermarkPolicy"]
        self.watermark_tracker = WatermarkTracker(
            [w.delay_ms for w in self._watermark_nodes], policy
        )

    # -- constructing a batch ------------------------------------------------------------
    def _start_offset(self, slot: _SourceSlot, committed_json: str | None) -> Any:
        if committed_json is None:
            return slot.source.initialOffset()
        return slot.source.deserializeOffset(committed_json)

    def _read_limit(self, source: Source) -> ReadLimit:
        if isinstance(self.trigger, OnceTrigger):
            return READ_ALL_AVAILABLE
        return source.getDefaultReadLimit()

    def _construct_next_batch(self) -> bool:
        new_available = list(self.available)
        with self.progress.time("latestOffset"):
            for slot in self._slots:
                start_json = self.available[slot.index]
                start = self._start_offset(slot, start_json)
                caps = self._available_now_caps
                if caps is not None and not slot.source.supportsTriggerAvailableNow:
                    if slot.index not in caps:
                        caps[slot.index] = slot.source.latestOffset(start, READ_ALL_AVAILABLE)
                    latest = caps[slot.index]
                else:
                    latest = slot.source.latestOffset(start, self._read_limit(slot.source))
                reported = slot.source.reportLatestOffset()
                self.latest_reported[slot.index] = (
                    None if reported is None else slot.source.serializeOffset(reported)
                )
                if latest is not None:
                    new_available[slot.index] = slot.source.serializeOffset(latest)
        has_new_data = any(
            new_available[i] is not None and new_available[i] != self.committed[i]
            for i in range(len(self._slots))
        )
        if not has_new_data and not self._should_run_another_batch():
            return False
        self.available = new_available
        self.offset_metadata = OffsetSeqMetadata(
            batchWatermarkMs=self.watermark_tracker.current_watermark_ms,
            batchTimestampMs=self.clock.get_time_millis(),
            conf=dict(self._pinned_conf),
        )
        self.update_status("Writing offsets to log")
        with self.progress.time("walCommit"):
            try:
                self.offset_log.add(
                    self.current_batch_id,
                    OffsetSeq(tuple(self.available), self.offset_metadata, self._source_names),
                )
            except ConcurrentWriteError as exc:
                raise ConcurrentWriteError(
                    "Concurrent update to the log. Multiple streaming jobs detected for "
                    f"{self.current_batch_id}: {exc}",
                    path=exc.path,
                ) from exc
            logger.info(
                "Committed offsets for batch %s. Metadata %s", self.current_batch_id, self.offset_metadata
            )
            crash_point("after_wal", self.current_batch_id)
            if self.current_batch_id != 0:
                previous = self.offset_log.get(self.current_batch_id - 1)
                if previous is not None:
                    ends = previous.in_order(self._source_names)
                    for slot in self._slots:
                        end = ends[slot.index]
                        if end is not None:
                            slot.source.commit(slot.source.deserializeOffset(end))
            if self.min_batches_to_retain < self.current_batch_id:
                threshold = self.current_batch_id - self.min_batches_to_retain
                self.offset_log.purge(threshold)
                self.commit_log.purge(threshold)
        return True

    def _should_run_another_batch(self) -> bool:
        """A no-data batch is due when the watermark moved past what the last batch used
        and a stateful operator evicts or emits by it (Spark's shouldRunAnotherBatch).

        Spark asks the executed plan of the last batch *of this run*
        (``MicroBatchExecutionContext.previousContext``): a run's first trigger has none,
        so it never starts with a no-data batch, even when the last batch of the run
        before (a ``once`` trigger's, or one stopped right after it) left the watermark
        ahead of the one it ran with; the next batch with data evicts by it."""
        if self.last_execution is None:
            return False
        enabled = str(
            self.spark.conf.get("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        ).lower()
        if enabled != "true":
            return False
        has_watermark = bool(self._watermark_nodes)
        # Each operator by its own input watermark (Spark's watermark propagation).
        new = propagate_watermark(self.plan, self.watermark_tracker.current_watermark_ms)
        current = propagate_watermark(self.plan, self.offset_metadata.batchWatermarkMs)
        return any(
            op.should_run_another_batch(new[id(op)], current[id(op)] if has_watermark else None, self.output_mode)
            for op in self._stateful_ops
        )

    def _stateful_context(self, shape: Hashable, empty_sources: frozenset[int]) -> StatefulContext | None:
        if not self._stateful_ops:
            return None
        conf = self.spark.conf
        self._state_metrics.value = {}
        return StatefulContext(
            state_root=self.fs.join(self.checkpoint_root, "state"),
            num_partitions=int(self._pinned_conf["spark.sql.shuffle.partitions"]),
            output_mode=self.output_mode,
            batch_watermark_ms=(
                self.offset_metadata.batchWatermarkMs if self._watermark_nodes else None
            ),
            accumulator=self._state_metrics,
            session_timezone=str(conf.get("spark.sql.session.timeZone", "UTC")),
            snapshot_interval=int(
                conf.get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10") or 10
            ),
            min_versions_to_retain=self.min_batches_to_retain,
            late_events_watermark_ms=self._previous_batch_watermark() if self._watermark_nodes else None,
            checkpoint_id=self.id,
            cache=self.plan_cache,
            shape=shape,
            empty_sources=empty_sources,
            dedups_by_row=frozenset(self._dedups_by_row),
            operator_watermarks=self._operator_watermarks() if self._watermark_nodes else None,
            max_state_tasks=self._max_state_tasks,
            state_hosts=self._state_hosts != "false",
            background_snapshot_min_rows=self._background_snapshot_min_rows,
            batch_timestamp_ms=self.offset_metadata.batchTimestampMs,
        )

    def _operator_watermarks(self) -> dict[int, tuple[int, int]]:
        """Operator id -> (eviction, late-row) input watermark of this batch."""
        evict = propagate_watermark(self.plan, self.offset_metadata.batchWatermarkMs)
        late = propagate_watermark(self.plan, self._previous_batch_watermark())
        return {self._op_ids[key]: (evict[key], late[key]) for key in evict}

    def _previous_batch_watermark(self) -> int:
        if self.current_batch_id <= 0:
            return 0
        previous = self.offset_log.get(self.current_batch_id - 1)
        return previous.metadata.batchWatermarkMs if previous is not None else 0

    def _check_state_schemas(self, execution: IncrementalExecution) -> None:
        state_root = self.fs.join(self.checkpoint_root, "state")
        if not self._state_checked:
            if self.current_batch_id > 0 and execution.state_schemas and not self.fs.list_names(state_root):
                operators = ", ".join(
                    f"(OperatorId: {s.operator_id} -> OperatorName: {s.operator_name})"
                    for s in sorted(execution.state_schemas.values(), key=lambda s: s.operator_id)
                )
                raise CheckpointError(
                    "[STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY] Cannot restart "
                    "streaming query with stateful operators because the state directory is "
                    f"empty or missing.\nStateful operators in current batch: [{operators}].\n"
                    "This typically occurs when state files have been deleted or the "
                    "streaming query was previously run without stateful operators but "
                    "restarted with stateful operators.\nPlease remove the stateful operators, "
                    "use a new checkpoint location, or restore the missing state files. "
                    "SQLSTATE: 42K03",
                    path=state_root,
                )
            check_operator_count(self.fs, state_root, len(self._stateful_ops))
        check = str(self.spark.conf.get("spark.sql.streaming.stateStore.stateSchemaCheck", "true"))
        for schema in execution.state_schemas.values():
            if not self._state_checked:
                check_or_write(self.fs, state_root, schema, check_schemas=check.strip().lower() != "false")
        self._state_checked = True

    def _hosted_now(self, known_rows: int) -> list[int]:
        """The operators whose state steps run in the state hosts this batch, which reads
        at least ``known_rows`` rows (``stateHosts=auto``: every operator when that is
        :data:`HOST_ABOVE_ROWS` or more, as after a restart)."""
        everyone = list(range(len(self._stateful_ops)))
        if self._state_hosts == "true":
            return everyone
        if self._state_hosts == "false":
            return []
        return everyone if known_rows >= HOST_ABOVE_ROWS else sorted(self._hosted_ops)

    def _choose_hosted(self, progress: list[dict[str, Any]]) -> None:
        """After a batch with data: which operators run in the state hosts next
        (``stateHosts=auto``; :data:`HOST_ABOVE_ROWS`)."""
        for op_id, op in enumerate(progress):
            updated = int(op.get("numRowsUpdated") or 0)
            if updated >= HOST_ABOVE_ROWS:
                self._hosted_ops.add(op_id)
            elif updated < HOST_BELOW_ROWS:
                self._hosted_ops.discard(op_id)

    def _choose_dedup_grouping(self, metrics: dict[int, dict[str, int]]) -> None:
        """After a batch with data: which deduplications send their rows as they are
        next batch. Grouping a batch by key in Spark first (``lockgate.plan.dedup``)
        costs two aggregations and a shuffle more, and pays when keys repeat within a
        batch; over keys that are nearly all new (a guid per event), or that repeat only
        keys of earlier batches (which the state step drops either way), it only costs.
        Keys of a batch with at most :data:`DEDUP_BY_ROW_BELOW` of its rows repeating a
        key of the same batch, or of fewer than :data:`DEDUP_MIN_ROWS` rows, go row by
        row; at least :data:`DEDUP_GROUPED_ABOVE`, grouped again. ``metrics``: the
        batch's summed task metrics per operator id."""
        for op_id, op in enumerate(self._stateful_ops):
            if op.operator_name not in ("dedupe", "dedupeWithinWatermark"):
                continue
            m = metrics.get(op_id, {})
            rows = m.get("numDroppedDuplicateRows", 0) + m.get("numRowsUpdated", 0)
            duplicates = m.get(REPEATED_IN_BATCH, 0)
            if rows < DEDUP_MIN_ROWS or duplicates <= DEDUP_BY_ROW_BELOW * rows:
                self._dedups_by_row.add(op_id)
            elif duplicates >= DEDUP_GROUPED_ABOVE * rows:
                self._dedups_by_row.discard(op_id)

    def _operator_metrics(self) -> dict[int, dict[str, int]]:
        """The batch's state task metrics, summed over its tasks, per operator id."""
        per_operator: dict[int, dict[str, int]] = {}
        for name, value in dict(self._state_metrics.value or {}).items():
            op_id, _, metric = name.partition(".")
            if op_id.isdigit():
                per_operator.setdefault(int(op_id), {})[metric] = value
        return per_operator

    def _state_operator_progress(
        self, stateful: StatefulContext | None, metrics: dict[int, dict[str, int]]
    ) -> list[dict[str, Any]]:
        if stateful is None:
            return []
        return [
            op.progress(metrics.get(op_id, {}), stateful.num_partitions)
            for op_id, op in enumerate(self._stateful_ops)
        ]

    # -- running a batch ---------------------------------------------------------------
    def _on_stream_session(self, frame: DataFrame) -> DataFrame:
        """``frame`` on the query's own session (adaptive execution off).

        A source may build its batch on another session (a MemoryStream made with the
        user's session); a batch DataFrame keeps the session it was made on, and with
        adaptive execution on, Spark may drop the repartition state relies on.
        """
        from pyspark.sql import DataFrame as PySparkDataFrame

        if frame.sparkSession is self.spark:  # the sources' usual case: no round trip
            return frame
        own = self.spark._jsparkSession
        if frame._jdf.sparkSession().equals(own):
            return frame
        jvm = self.spark.sparkContext._jvm
        rehomed = jvm.org.apache.spark.sql.classic.Dataset.ofRows(own, frame._jdf.logicalPlan())
        return PySparkDataFrame(rehomed, self.spark)

    def _run_batch(self) -> None:
        spark = self.spark
        batch_id = self.current_batch_id
        sc = spark.sparkContext
        sc.setJobGroup(self.run_id, self.batch_description(str(batch_id)), interruptOnCancel=True)
        frames: dict[int, DataFrame] = {}
        counts: dict[int, int | None] = {}
        count_sources: set[int] = set()
        with self.progress.time("getBatch"):
            for slot in self._slots:
                end_json = self.available[slot.index]
                start_json = self.committed[slot.index]
                if end_json is None or end_json == start_json:
                    frames[slot.relation_id] = self._empty_frame(slot)
                    counts[slot.index] = 0
                    continue
                start = self._start_offset(slot, start_json)
                end = slot.source.deserializeOffset(end_json)
                frames[slot.relation_id] = self._on_stream_session(slot.source.getBatch(start, end))
                counts[slot.index] = slot.source.numRowsBetween(start, end)
                if counts[slot.index] is None:
                    count_sources.add(slot.index)
        with self.progress.time("queryPlanning"):
            empty_sources = frozenset(
                slot.relation_id for slot in self._slots if counts.get(slot.index) == 0
            )
            shape = (empty_sources, frozenset(self._dedups_by_row))
            stateful = self._stateful_context(shape, empty_sources)
            execution = IncrementalExecution(
                self.plan,
                frames,
                batch_id=batch_id,
                batch_timestamp_ms=self.offset_metadata.batchTimestampMs,
                watermark_index={id(n): i for i, n in enumerate(self._watermark_nodes)},
                observed_index={id(n): i for i, n in enumerate(self._observed_nodes)},
                source_index={slot.relation_id: slot.index for slot in self._slots},
                count_sources=count_sources,
                stateful=stateful,
                operator_ids=self._op_ids,
                cache=self.plan_cache,
                empty_sources=empty_sources,
            )
            result, output_obs = self._plan_batch(execution, frames, shape)
        self.last_execution = execution
        # A stop that came while the batch was planned ends it here, before its Spark job
        # starts, as Spark's interrupt ends the batch it lands in: stop() cancels only the
        # jobs already running, and the batch would otherwise run and commit after it.
        interrupt.check()
        params_key = property_key(self.id)
        if stateful is not None:
            known_rows = sum(c for c in counts.values() if c)
            sc.setLocalProperty(
                params_key, encode_params(stateful.batch_params, self._hosted_now(known_rows))
            )
        try:
            with self.progress.time("addBatch"):
                written = self.sink.addBatch(batch_id, result)
        finally:
            if stateful is not None:
                sc.setLocalProperty(params_key, None)  # type: ignore[arg-type]
        for index, obs in execution.observations.source_rows.items():
            value = observation_value(obs)
            counts[index] = int(value["rows"]) if value else 0  # of every scan
        one_scan = {slot.index for slot in self._slots if slot.index not in execution.observations.source_rows}
        event_stats = self._event_time_stats(execution)
        self.watermark_tracker.update(
            [stats["max"] if stats else None for stats in event_stats]
        )
        metrics = self._operator_metrics() if stateful is not None else {}
        self._last_state_progress = self._state_operator_progress(stateful, metrics)
        if any(counts.values()):
            self._choose_hosted(self._last_state_progress)
            self._choose_dedup_grouping(metrics)
        if output_obs is None:  # the sink counted them (Sink.counts_output_rows)
            num_output_rows = -1 if written is None else int(written)
        else:
            output = observation_value(output_obs)
            num_output_rows = int(output["rows"]) if output else -1
        self._last_batch = {
            "start_offsets": list(self.committed),
            "counts": counts,
            "one_scan": one_scan,  # counted by numRowsBetween: times the scans
            "event_stats": event_stats,
            "num_output_rows": num_output_rows,
            "observed": self._observed_metrics(execution),
        }
        crash_point("after_sink", batch_id)
        with self.progress.time("commitOffsets"):
            self.commit_log.add(batch_id, CommitMetadata(self.watermark_tracker.current_watermark_ms))
            self.committed = list(self.available)
        crash_point("after_commit", batch_id)
        logger.debug("batch %s committed", batch_id)

    def _empty_frame(self, slot: _SourceSlot) -> DataFrame:
        """The empty batch of ``slot``'s source: one DataFrame per run, as building it
        costs a few py4j calls and a plan to analyse."""
        frame = self._empty_frames.get(slot.index)
        if frame is None:
            frame = self._empty_frames[slot.index] = self.spark.createDataFrame([], slot.source.schema)
        return frame

    def _plan_batch(
        self, execution: IncrementalExecution, frames: dict[int, DataFrame], shape: Hashable
    ) -> tuple[DataFrame, Observation | None]:
        """The batch's DataFrame, observed for its output rows unless the sink counts
        them (None then): from the plan of an earlier batch of the same shape when there
        is one, else built node by node."""
        output: ObservationRole = ("output_rows", 0)
        batch_id = execution.batch_id
        reuse = self._templates.get(shape)
        if reuse is not None:
            template, roles = reuse
            names = {role: observation_name(role, batch_id) for role in roles}
            try:
                result, observed = template.instantiate(frames, names)
            except NotReusable as reason:  # a source's batch no longer fits the plan
                logger.debug("%s stops reusing its plan: %s", self.pretty_id_string, reason)
                self._templates[shape] = None
                return self._plan_batch(execution, frames, shape)
            execution.adopt(observed)  # state schemas were checked when the plan was built
            if execution.stateful is not None:
                execution.set_batch_params()
            self.reused_plans += 1
            return result, observed.get(output)
        result = execution.build()
        if shape not in self._pushdown_probed:
            # once per shape: the filters Spark applies below the observations (a filter
            # moved below withWatermark can then travel on to a source's row count)
            self._pushdown_probed.add(shape)
            for _ in range(3):
                if not execution.find_pushed_down(result):
                    break
                execution.reset()
                result = execution.build()
        if execution.stateful is not None:
            self._check_state_schemas(execution)
        output_obs = None
        if not self.sink.counts_output_rows:
            output_obs = Observation(observation_name(output, batch_id))
            result = self.plan_cache.observe(self, "output_rows", result, output_obs, lambda: [row_count()])
        if self._reuse_plans and shape not in self._templates:
            roles = execution.observation_roles()
            if output_obs is not None:
                roles[output_obs._name] = output
            try:
                template = PlanTemplate.capture(self.spark, result, frames, roles)
                self._templates[shape] = (template, set(roles.values()))
            except NotReusable as reason:
                logger.debug("batches of %s are planned one by one: %s", self.pretty_id_string, reason)
                self._templates[shape] = None
        return result, output_obs

    def _observed_metrics(self, execution: IncrementalExecution) -> dict[str, dict[str, Any]]:
        """The query's own ``observe`` metrics of the batch, by the names it gave them
        (progress ``observedMetrics``), with values as Spark's progress JSON has them."""
        found: dict[str, dict[str, Any]] = {}
        for index, node in enumerate(self._observed_nodes):
            obs = execution.observations.observed.get(index)
            value = observation_value(obs) if obs is not None else None
            if value is not None:
                found[node.metric_name] = {k: _json_value(v) for k, v in value.items()}
        return found

    def _event_time_stats(self, execution: IncrementalExecution) -> list[dict[str, Any] | None]:
        stats: list[dict[str, Any] | None] = []
        for index in range(len(self._watermark_nodes)):
            obs = execution.observations.event_time.get(index)
            value = observation_value(obs) if obs is not None else None
            if not value or not value.get("count"):
                stats.append(None)
                continue
            stats.append(
                {
                    "max": int(value["max"]) // 1000,
                    "min": int(value["min"]) // 1000,
                    "avg": float(value["avg"]) / 1000.0,
                    "count": int(value["count"]),
                }
            )
        return stats

    # -- progress ----------------------------------------------------------------------
    def _finish_trigger(self, ran: bool) -> None:
        now = self.clock.get_time_millis()
        tracker = self.progress
        if not ran:
            # As Spark 4: the first idle trigger of a run is recorded (without an event);
            # after that, one idle report and QueryIdleEvent per
            # spark.sql.streaming.noDataProgressEventInterval since the last report.
            first = tracker.last_no_data_event_ms < 0
            if first or now - tracker.last_no_data_event_ms >= self.no_data_progress_interval_ms:
                tracker.last_no_data_event_ms = now
                tracker.record(self._idle_progress())
                if not first:
                    self.manager.query_idle(self, now)
            tracker.last_trigger_start_ms = tracker.trigger_start_ms
            return
        tracker.last_no_data_event_ms = now
        assert self._last_batch is not None
        batch = self._last_batch
        trigger_ms = tracker.durations.get("triggerExecution", 0)
        input_secs = (
            (tracker.trigger_start_ms - tracker.last_trigger_start_ms) / 1000.0
            if tracker.last_trigger_start_ms >= 0
            else 0.0
        )
        process_secs = trigger_ms / 1000.0
        sources = [
            source_progress(
                slot.source.description(),
                batch["start_offsets"][slot.index],
                self.available[slot.index],
                int(batch["counts"].get(slot.index) or 0)
                * (slot.scans if slot.index in batch["one_scan"] else 1),
                input_secs,
                process_secs,
                self.latest_reported[slot.index],
            )
            for slot in self._slots
        ]
        event_time: dict[str, str] | None = None
        if self._watermark_nodes:
            event_time = {}
            known = [s for s in batch["event_stats"] if s]
            if known:
                count = sum(s["count"] for s in known)
                event_time["avg"] = format_timestamp(int(sum(s["avg"] * s["count"] for s in known) / count))
                event_time["max"] = format_timestamp(max(s["max"] for s in known))
                event_time["min"] = format_timestamp(min(s["min"] for s in known))
            event_time["watermark"] = format_timestamp(self.offset_metadata.batchWatermarkMs)
        progress = query_progress(
            query_id=self.id,
            run_id=self.run_id,
            name=self.name,
            timestamp_ms=tracker.trigger_start_ms,
            batch_id=self.current_batch_id,
            batch_duration_ms=trigger_ms,
            durations=tracker.durations,
            input_secs=input_secs,
            process_secs=process_secs,
            event_time=event_time,
            state_operators=self._last_state_progress,
            sources=sources,
            sink_description=self.sink.description(),
            output_rows=batch["num_output_rows"],
            observed=batch["observed"],
        )
        self._sink_counted_rows = batch["num_output_rows"] >= 0
        tracker.last_trigger_start_ms = tracker.trigger_start_ms
        parsed = tracker.record(progress)
        self.manager.query_progress(self, parsed)

    def _idle_progress(self) -> dict[str, Any]:
        tracker = self.progress
        event_time = None
        if self._watermark_nodes:
            event_time = {"watermark": format_timestamp(self.offset_metadata.batchWatermarkMs)}
        return query_progress(
            query_id=self.id,
            run_id=self.run_id,
            name=self.name,
            timestamp_ms=tracker.trigger_start_ms,
            batch_id=self.current_batch_id,
            batch_duration_ms=tracker.durations.get("triggerExecution", 0),
            durations=tracker.durations,
            input_secs=0.0,
            process_secs=0.0,
            event_time=event_time,
            state_operators=[dict(op, numRowsUpdated=0) for op in self._last_state_progress],
            sources=[
                source_progress(
                    slot.source.description(),
                    self.committed[slot.index],
                    self.available[slot.index],
                    0,
                    0.0,
                    0.0,
                    self.latest_reported[slot.index],
                )
                for slot in self._slots
            ],
            sink_description=self.sink.description(),
            output_rows=0 if self._sink_counted_rows else -1,
        )

    def last_progress(self) -> Any:
        return self.progress.last()

    def recent_progress(self) -> list[Any]:
        return list(self.progress.recent)


def _json_value(value: Any) -> Any:
    """An observed metric's value for the progress JSON: numbers, strings, booleans and
    nulls as they are, other values (timestamps, decimals) as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _source_names(spark: Any, relations: list[Any]) -> tuple[str, ...] | None:
    """With source evolution on, the sources' names (``readStream.name``), which key the
    offsets log (v2) and ``sources/<name>``; None when it is off: sources are keyed by
    position."""
    from lockgate.plan.nodes import check_sources_named

    return check_sources_named(spark, relations)
