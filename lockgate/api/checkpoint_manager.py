"""``ls._streamingCheckpointManager``: PySpark 4.2+'s ``StreamingCheckpointManager`` for
lockgate's checkpoints (offline state repartitioning).

Spark's own manager (``spark._streamingCheckpointManager``) runs its
``OfflineStateRepartitionRunner`` in the JVM, which reads state through Spark's state
data source: it cannot read lockgate's state files (Arrow IPC, ``docs/state-store.md``)
and fails with ``STDS_FAILED_TO_READ_STATE_SCHEMA``. This manager repartitions a
checkpoint whose state lockgate wrote, as Spark does: if the last committed batch is
``N``, it writes batch ``N + 1`` (the offsets of batch ``N``, with
``spark.sql.shuffle.partitions`` set to the new count, and a commit), and state version
``N + 2`` of every stateful operator as one snapshot per new partition, each key in
partition ``pmod(hash(key columns), numPartitions)`` as lockgate's batches place it. The
next run of the query starts at batch ``N + 2``.

Checkpoints without lockgate state, and invalid arguments, go to Spark's manager (its
``STATE_REPARTITION_INVALID_*`` errors).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lockgate.checkpoint.checksum import write_checked
from lockgate.checkpoint.commits import CommitLog
from lockgate.checkpoint.fs import CheckpointFileSystem, resolve_filesystem
from lockgate.checkpoint.offsets import OffsetSeq, OffsetSeqLog, OffsetSeqMetadata
from lockgate.errors import CheckpointError, NotSupportedYetError
from lockgate.state.operator_metadata import OperatorMetadata, write_operator_metadata
from lockgate.state.schema import (
    SESSION_WINDOW_NAME,
    STREAM_JOIN_NAME,
    TRANSFORM_WITH_STATE_NAMES,
    read_schema_file,
    stored_schema,
)
from lockgate.state.store import StateStoreConf, read_state_table, write_snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_NOT_YET = (STREAM_JOIN_NAME, SESSION_WINDOW_NAME, *TRANSFORM_WITH_STATE_NAMES)


def _operator_ids(fs: CheckpointFileSystem, state_root: str) -> list[int]:
    if not fs.exists(state_root):
        return []
    return sorted(int(n) for n in fs.list_names(state_root) if n.isdigit())


def _read_partitions(old: StateStoreConf, version: int, out: pa.Schema, batches: Any) -> Any:
    """The rows of the old partitions a task is given (runs on an executor)."""
    for batch in batches:
        for pid in batch.column(0).to_pylist():
            table = read_state_table(old, int(pid), version)
            yield from table.rename_columns(out.names).cast(out).to_batches()


def _write_partitions(new: StateStoreConf, version: int, batches: Any) -> Any:
    """Each new partition's rows (all of them in this task: the rows are partitioned by
    their new partition id) as one snapshot at ``version`` (runs on an executor); yields
    the partitions written."""
    rows = [b for b in batches if b.num_rows]
    written: list[int] = []
    if rows:
        table = pa.Table.from_batches(rows)
        pids = table.column(table.num_columns - 1)
        data = table.select(list(range(table.num_columns - 1)))
        data = data.rename_columns([f.name for f in new.key_schema] + [f.name for f in new.value_schema])
        target = pa.schema(list(new.key_schema) + list(new.value_schema))
        for pid in pc.unique(pids).to_pylist():
            part = data.filter(pc.equal(pids, pid)).cast(target)
            write_snapshot(new, int(pid), version, part)
            written.append(int(pid))
    yield pa.RecordBatch.from_pydict({"pid": pa.array(written, pa.int32())})


def _move_state(
    spark: SparkSession, old: StateStoreConf, new: StateStoreConf, read_version: int, write_version: int
) -> None:
    """The state of ``old`` at ``read_version`` written as ``new``'s at ``write_version``,
    each key in partition ``pmod(hash(key columns), new partitions)`` as lockgate's
    batches place it: Spark jobs, the rows read and written by the executors. A new
    partition no key falls in gets an empty snapshot."""
    from functools import partial

    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from lockgate.state.arrow_types import schema_to_arrow
    from lockgate.state.reader import arrow_field_to_spark

    stored = pa.schema(list(old.key_schema) + list(old.value_schema))
    columns = [f"c{i}" for i in range(len(stored))]
    spark_schema = StructType([arrow_field_to_spark(f.with_name(c)) for f, c in zip(stored, columns)])
    out = schema_to_arrow(spark_schema, str(spark.conf.get("spark.sql.session.timeZone", "UTC")))
    ids = spark.range(0, old.num_partitions, 1, old.num_partitions).selectExpr("cast(id as int) as id")
    rows = ids.mapInArrow(partial(_read_partitions, old, read_version, out), spark_schema)
    keys = [F.col(c) for c in columns[: len(old.key_schema)]]
    pid = F.pmod(F.hash(*keys), F.lit(new.num_partitions)).cast("int").alias("__pid")
    spread = rows.select(*columns, pid).repartition(new.num_partitions, "__pid")
    done = spread.mapInArrow(partial(_write_partitions, new, write_version), "pid int")
    written = {r.pid for r in done.collect()}
    empty = pa.Table.from_batches([], schema=pa.schema(list(new.key_schema) + list(new.value_schema)))
    for p in range(new.num_partitions):
        if p not in written:
            write_snapshot(new, p, write_version, empty)


class StreamingCheckpointManager:
    """What ``spark._streamingCheckpointManager`` is, for a lockgate session."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def _spark_manager(self) -> Any:
        return self._spark._streamingCheckpointManager

    def repartition(
        self, checkpoint_location: str, num_partitions: int, enforce_exactly_once_sink: bool = True
    ) -> None:
        if (
            not isinstance(checkpoint_location, str)
            or not checkpoint_location.strip()
            or not isinstance(num_partitions, int)
            or num_partitions <= 0
        ):
            # Spark's STATE_REPARTITION_INVALID_PARAMETER.*
            return self._spark_manager().repartition(checkpoint_location, num_partitions, enforce_exactly_once_sink)
        fs, root = resolve_filesystem(checkpoint_location)
        state_root = fs.join(root, "state")
        operators = {
            op: meta
            for op in _operator_ids(fs, state_root)
            if (meta := read_schema_file(fs, fs.join(state_root, str(op), "_metadata", "schema"), op)) is not None
        }
        commits = CommitLog(fs, fs.join(root, "commits"))
        offsets = OffsetSeqLog(fs, fs.join(root, "offsets"))
        last = commits.get_latest_batch_id()
        if not operators or last is None or offsets.get(last) is None:
            # not lockgate's state, or Spark's NO_COMMITTED_BATCH / NO_BATCH_FOUND
            return self._spark_manager().repartition(checkpoint_location, num_partitions, enforce_exactly_once_sink)
        latest_offsets = offsets.get_latest_batch_id()
        # A repartition that planned batch last + 1 and stopped before its commit is
        # finished by doing it again: the old partitions' files at the version it reads
        # are untouched, an operator whose schema file has the new count was moved
        # whole (the schema file is written after its state), the others' snapshots
        # are written again.
        changed = offsets.repartitioned(last + 1)
        unfinished = None if changed is None else changed[1]
        if unfinished is not None and unfinished != num_partitions:
            raise CheckpointError(
                f"Cannot repartition checkpoint {checkpoint_location} to {num_partitions} "
                f"partitions: a repartition to {unfinished} partitions stopped before it "
                f"finished. Run repartition(..., {unfinished}) to finish it first.",
                path=root,
            )
        if unfinished is None and latest_offsets is not None and latest_offsets > last and enforce_exactly_once_sink:
            raise CheckpointError(
                f"Cannot repartition checkpoint {checkpoint_location}: batch {latest_offsets} "
                f"was planned but never committed (the last committed batch is {last}). Run "
                "the query once to finish it, or pass enforce_exactly_once_sink=False to "
                "drop it.",
                path=root,
            )
        entry = offsets.get(last)
        assert entry is not None
        old_partitions = int(entry.metadata.conf.get(SHUFFLE_PARTITIONS, "0") or 0)
        for op, meta in operators.items():
            if meta.get("operatorName") in _NOT_YET:
                raise NotSupportedYetError(
                    f"Repartitioning the state of a {meta.get('operatorName')} operator",
                    f"stateful operator {op} of checkpoint {checkpoint_location} keeps its "
                    "state in several stores or by session; lockgate repartitions "
                    "aggregations, deduplications and applyInPandasWithState.",
                )
        if old_partitions == num_partitions:
            raise CheckpointError(
                f"Cannot repartition checkpoint {checkpoint_location}: its state already has "
                f"{num_partitions} partitions.",
                path=root,
            )

        new_batch = last + 1
        read_version, write_version = last + 1, new_batch + 1
        plans: list[tuple[int, dict[str, Any], StateStoreConf, tuple[StateStoreConf, StateStoreConf] | None]] = []
        for op, meta in operators.items():
            key_schema, value_schema = stored_schema(meta, "key"), stored_schema(meta, "value")
            stored_partitions = int(meta["numPartitions"])
            keyed = len(key_schema) > 0 and stored_partitions == old_partitions
            old = StateStoreConf(
                root=state_root, operator_id=op, num_partitions=stored_partitions,
                key_schema=key_schema, value_schema=value_schema,
            )
            if not keyed:
                plans.append((op, meta, old, None))  # one partition whatever the count
                continue
            new = StateStoreConf(
                root=state_root, operator_id=op, num_partitions=num_partitions,
                key_schema=key_schema, value_schema=value_schema,
            )
            parts = (old, new)
            plans.append((op, meta, new, parts))

        # batch N + 1: batch N's offsets under the new partition count
        conf = dict(entry.metadata.conf)
        conf[SHUFFLE_PARTITIONS] = str(num_partitions)
        metadata = OffsetSeqMetadata(entry.metadata.batchWatermarkMs, entry.metadata.batchTimestampMs, conf)
        offsets.purge_after(last)
        offsets.add(new_batch, OffsetSeq(entry.offsets, metadata, entry.names))
        for op, meta, store, parts in plans:
            if parts is not None:
                _move_state(self._spark, parts[0], parts[1], read_version, write_version)
                meta = dict(meta, numPartitions=num_partitions)
                schema_path = fs.join(state_root, str(op), "_metadata", "schema")
                write_checked(fs, schema_path, json.dumps(meta, indent=1).encode("utf-8"), overwrite=True)
            write_operator_metadata(
                fs, state_root, OperatorMetadata(op, str(meta.get("operatorName")), num_partitions)
            )
        previous = commits.get(last)
        assert previous is not None
        commits.add(new_batch, previous)
        return None


__all__ = ["StreamingCheckpointManager"]
