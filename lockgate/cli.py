"""``lockgate``: look into a query's checkpoint from the shell.

::

    lockgate checkpoint DIR [--format table|json]
    lockgate state DIR [--operator N] [--batch N] [--join-side left|right]
                       [--state-var-name NAME] [--read-registered-timers]
                       [--no-flatten-collection-types]
                       [--format table|json|parquet] [--output PATH] [--limit N]

``checkpoint`` reads the files alone (no Spark): query id, the latest offsets of each
source, the last committed batch and its watermark, the batches written to the
offsets log but not committed yet, each stateful operator (name, partitions, state
versions, files and bytes on disk) and the confs pinned in the offsets log.

``state`` starts a local SparkSession and shows what ``ls.read.state`` returns
(columns ``key``, ``value``, ``partition_id``): a table (Spark's ``show``), JSON lines
(one row per line, as ``DataFrame.toJSON``), or Parquet files written to ``--output``.

Exit codes: 0 done, 2 bad arguments or a checkpoint that cannot be read (missing,
corrupt, of an unknown version), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lockgate.checkpoint import CommitLog, OffsetSeqLog, StreamMetadata, resolve_filesystem
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError

EXIT_USAGE = 2


@dataclass
class OperatorSummary:
    operator_id: int
    name: str | None
    partitions: int | None
    stores: list[str]
    min_version: int | None
    max_version: int | None
    delta_files: int
    snapshot_files: int
    bytes_on_disk: int


@dataclass
class CheckpointSummary:
    location: str
    query_id: str | None
    latest_batch: int | None
    latest_offsets: list[Any]
    source_dirs: list[str]
    batch_timestamp_ms: int | None
    batch_watermark_ms: int | None
    last_committed: int | None
    next_watermark_ms: int | None
    pending: list[int]
    operators: list[OperatorSummary] = field(default_factory=list)
    conf: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "id": self.query_id,
            "latestBatchId": self.latest_batch,
            "sources": [
                {"index": i, "latestOffset": offset} for i, offset in enumerate(self.latest_offsets)
            ],
            "batchTimestampMs": self.batch_timestamp_ms,
            "batchWatermarkMs": self.batch_watermark_ms,
            "lastCommittedBatchId": self.last_committed,
            "nextBatchWatermarkMs": self.next_watermark_ms,
            "pendingBatchIds": self.pending,
            "stateOperators": [
                {
                    "operatorId": op.operator_id,
                    "operatorName": op.name,
                    "numPartitions": op.partitions,
                    "stores": op.stores,
                    "minVersion": op.min_version,
                    "maxVersion": op.max_version,
                    "deltaFiles": op.delta_files,
                    "snapshotFiles": op.snapshot_files,
                    "bytesOnDisk": op.bytes_on_disk,
                }
                for op in self.operators
            ],
            "conf": self.conf,
        }


def summarize_checkpoint(location: str) -> CheckpointSummary:
    """What a person needs to know about a checkpoint, from its files alone."""
    fs, root = resolve_filesystem(location)
    if not fs.is_dir(root):
        raise CheckpointError(
            f"{location!r} is not a directory: give the checkpointLocation of a query.", path=root
        )
    names = set(fs.list_names(root))
    if not names & {"metadata", "offsets", "commits"}:
        raise CheckpointError(
            f"{location!r} is not a streaming checkpoint: it has no metadata, offsets or "
            "commits. Give the checkpointLocation of a query.",
            path=root,
        )
    metadata = StreamMetadata.read(fs, fs.join(root, "metadata"))
    offsets = OffsetSeqLog(fs, fs.join(root, "offsets"))
    commits = CommitLog(fs, fs.join(root, "commits"))
    latest = offsets.get_latest() if fs.is_dir(fs.join(root, "offsets")) else None
    committed = commits.get_latest() if fs.is_dir(fs.join(root, "commits")) else None
    latest_offsets: list[Any] = []
    if latest is not None:
        latest_offsets = [_parsed(o) for o in latest[1].offsets]
    offset_ids = offsets.batch_ids() if fs.is_dir(fs.join(root, "offsets")) else []
    last_committed = committed[0] if committed is not None else None
    pending = [b for b in offset_ids if last_committed is None or b > last_committed]
    sources_dir = fs.join(root, "sources")
    source_dirs = sorted(fs.list_names(sources_dir), key=_numeric) if fs.is_dir(sources_dir) else []
    summary = CheckpointSummary(
        location=location,
        query_id=metadata.id if metadata is not None else None,
        latest_batch=latest[0] if latest is not None else None,
        latest_offsets=latest_offsets,
        source_dirs=source_dirs,
        batch_timestamp_ms=latest[1].metadata.batchTimestampMs if latest is not None else None,
        batch_watermark_ms=latest[1].metadata.batchWatermarkMs if latest is not None else None,
        last_committed=last_committed,
        next_watermark_ms=committed[1].nextBatchWatermarkMs if committed is not None else None,
        pending=pending,
        conf=dict(sorted(latest[1].metadata.conf.items())) if latest is not None else {},
    )
    state_dir = fs.join(root, "state")
    if fs.is_dir(state_dir):
        for name in sorted(fs.list_names(state_dir), key=_numeric):
            if name.isdigit():
                summary.operators.append(_operator_summary(fs, fs.join(state_dir, name), int(name)))
    return summary


def _operator_summary(fs: CheckpointFileSystem, path: str, operator_id: int) -> OperatorSummary:
    schema_path = fs.join(path, "_metadata", "schema")
    meta: dict[str, Any] = {}
    if fs.exists(schema_path):
        try:
            meta = json.loads(fs.read_bytes(schema_path).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"State schema file {schema_path} is corrupt ({exc}). Restore it from a copy "
                "of the checkpoint or start the query on a new checkpoint location.",
                path=schema_path,
            ) from exc
    versions: list[int] = []
    deltas = snapshots = size = 0
    stores: set[str] = set()
    for directory in _walk_dirs(fs, path):
        for name in fs.list_names(directory):
            full = fs.join(directory, name)
            stem, _, suffix = name.partition(".")
            if suffix in ("delta", "snapshot") and stem.isdigit():
                versions.append(int(stem))
                deltas += suffix == "delta"
                snapshots += suffix == "snapshot"
                size += fs.size_and_mtime(full)[0]
                store = directory[len(path) :].strip("/").partition("/")[2]
                stores.add(store or "default")
            elif not fs.is_dir(full):
                size += fs.size_and_mtime(full)[0]
    partitions = meta.get("numPartitions")
    return OperatorSummary(
        operator_id=operator_id,
        name=meta.get("operatorName"),
        partitions=int(partitions) if partitions is not None else None,
        stores=sorted(stores),
        min_version=min(versions) if versions else None,
        max_version=max(versions) if versions else None,
        delta_files=deltas,
        snapshot_files=snapshots,
        bytes_on_disk=size,
    )


def _walk_dirs(fs: CheckpointFileSystem, path: str) -> list[str]:
    out = [path]
    for name in fs.list_names(path):
        full = fs.join(path, name)
        if fs.is_dir(full):
            out.extend(_walk_dirs(fs, full))
    return out


def _numeric(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def _parsed(offset: str | None) -> Any:
    if offset is None:
        return None
    try:
        return json.loads(offset)
    except ValueError:
        return offset


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    from lockgate.execution.progress import format_timestamp

    return f"{ms} ({format_timestamp(ms)})"


def render_checkpoint(summary: CheckpointSummary) -> str:
    from tabulate import tabulate

    lines = [f"checkpoint   {summary.location}", f"query id     {summary.query_id or '- (no metadata file)'}"]
    lines.append(
        f"last batch   {summary.latest_batch if summary.latest_batch is not None else '- (no batch yet)'}"
        f" in the offsets log, batch timestamp {_ms(summary.batch_timestamp_ms)},"
        f" watermark {_ms(summary.batch_watermark_ms)}"
    )
    lines.append(
        f"committed    {summary.last_committed if summary.last_committed is not None else '- (none)'}"
        + (f", next watermark {_ms(summary.next_watermark_ms)}" if summary.last_committed is not None else "")
    )
    pending = ", ".join(str(b) for b in summary.pending) or "none"
    lines.append(f"pending      {pending} (in the offsets log, not committed: run again on restart)")
    lines.append("")
    lines.append("sources (latest offsets)")
    rows = [
        [i, json.dumps(o) if not isinstance(o, str) else o, "yes" if str(i) in summary.source_dirs else ""]
        for i, o in enumerate(summary.latest_offsets)
    ]
    lines.append(tabulate(rows, headers=["source", "latest offset", "sources/<i>"], tablefmt="simple") if rows else "  none")
    lines.append("")
    lines.append("stateful operators")
    ops = [
        [
            op.operator_id,
            op.name or "?",
            op.partitions if op.partitions is not None else "?",
            ", ".join(op.stores) or "-",
            "-" if op.min_version is None else f"{op.min_version}..{op.max_version}",
            op.delta_files,
            op.snapshot_files,
            op.bytes_on_disk,
        ]
        for op in summary.operators
    ]
    headers = ["operator", "name", "partitions", "stores", "versions", "deltas", "snapshots", "bytes"]
    lines.append(tabulate(ops, headers=headers, tablefmt="simple") if ops else "  none")
    lines.append("")
    lines.append("confs pinned in the offsets log")
    confs = [[k, v] for k, v in summary.conf.items()]
    lines.append(tabulate(confs, headers=["conf", "value"], tablefmt="simple") if confs else "  none")
    return "\n".join(lines)


# -- commands ------------------------------------------------------------------------------
def _checkpoint(args: argparse.Namespace) -> int:
    summary = summarize_checkpoint(args.dir)
    if args.format == "json":
        print(json.dumps(summary.as_json(), indent=2))
    else:
        print(render_checkpoint(summary))
    return 0


def _state(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        raise _UsageError("--format parquet writes files: give --output PATH")
    # The checkpoint must exist before a SparkSession is started for it.
    summarize_checkpoint(args.dir)
    import lockgate

    spark = _local_spark()
    try:
        df = lockgate.session(spark).read.state(
            args.dir,
            operatorId=args.operator,
            batchId=args.batch,
            joinSide=args.join_side,
            stateVarName=args.state_var_name,
            readRegisteredTimers=args.read_registered_timers,
            flattenCollectionTypes=not args.no_flatten_collection_types,
        )
        if args.format == "parquet":
            df.write.mode("error").parquet(args.output)
            print(f"wrote the state of operator {args.operator} to {args.output}")
        elif args.format == "json":
            rows = df.orderBy("partition_id", "key").toJSON()
            out = rows.collect() if args.limit is None else rows.take(args.limit)
            for line in out:
                print(line)
        else:
            df.orderBy("partition_id", "key").show(n=args.limit or 20, truncate=False)
    finally:
        spark.stop()
    return 0


def _local_spark() -> Any:
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from lockgate.api.session import spark_conf

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("lockgate-cli")
        .config("spark.ui.enabled", "false")
        .config(map=spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class _UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lockgate", description="Look into the checkpoint of a lockgate (or Spark) streaming query."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cp = commands.add_parser(
        "checkpoint", help="query id, offsets, commits, pending batches, state operators, pinned confs"
    )
    cp.add_argument("dir", help="the query's checkpointLocation (a path or a URI)")
    cp.add_argument("--format", choices=["table", "json"], default="table")
    cp.set_defaults(run=_checkpoint)
    st = commands.add_parser("state", help="the state of a stateful operator, as ls.read.state returns it")
    st.add_argument("dir", help="the query's checkpointLocation (a path or a URI)")
    st.add_argument("--operator", type=int, default=0, help="operator id (default 0)")
    st.add_argument("--batch", type=int, default=None, help="batch id (default: the last committed)")
    st.add_argument("--join-side", choices=["left", "right"], default=None, help="a stream-stream join's side")
    st.add_argument("--state-var-name", default=None, help="a transformWithState operator's state variable")
    st.add_argument(
        "--read-registered-timers", action="store_true", help="a transformWithState operator's timers"
    )
    st.add_argument(
        "--no-flatten-collection-types",
        action="store_true",
        help="a list or map state as one row per key (Spark's flattenCollectionTypes=false)",
    )
    st.add_argument("--format", choices=["table", "json", "parquet"], default="table")
    st.add_argument("--output", help="where --format parquet writes (must not exist)")
    st.add_argument("--limit", type=int, default=None, help="rows to print (table: 20 by default; json: all)")
    st.set_defaults(run=_state)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except _UsageError as exc:
        parser.error(str(exc))
    except (CheckpointError, ValueError) as exc:
        print(f"lockgate {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
