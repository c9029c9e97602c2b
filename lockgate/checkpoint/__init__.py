"""The checkpoint: metadata, offsets write-ahead log, commit log, on one filesystem abstraction.

Layout and formats are Spark's, so a person (or Spark's tooling) can read them::

    <checkpoint>/metadata          {"id": "<query id>"}
    <checkpoint>/offsets/<N>       v1 / {"batchWatermarkMs":..,"batchTimestampMs":..,"conf":{..}} / one line per source
    <checkpoint>/commits/<N>       v1 / {"nextBatchWatermarkMs":..}
    <checkpoint>/sources/<i>/...   owned by source i
    <checkpoint>/state/...         owned by the stateful operators
"""

from lockgate.checkpoint.commits import CommitLog, CommitMetadata
from lockgate.checkpoint.fs import CheckpointFileSystem, resolve_filesystem
from lockgate.checkpoint.log import MetadataLog
from lockgate.checkpoint.metadata import StreamMetadata
from lockgate.checkpoint.offsets import OffsetSeq, OffsetSeqLog, OffsetSeqMetadata

__all__ = [
    "CheckpointFileSystem",
    "CommitLog",
    "CommitMetadata",
    "MetadataLog",
    "OffsetSeq",
    "OffsetSeqLog",
    "OffsetSeqMetadata",
    "StreamMetadata",
    "resolve_filesystem",
]
