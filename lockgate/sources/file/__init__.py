"""File streaming sources: Spark's ``FileStreamSource`` for json, csv, parquet, text and orc.

A file source watches a directory (or a glob pattern) and turns every new file into
input of exactly one micro-batch. Which files went into which batch is recorded in the
source's own log, ``<checkpoint>/sources/<i>/<N>``, in the format of Spark's
``FileStreamSourceLog``::

    v1
    {"path":"file:///data/in/a.json","timestamp":1700000000000,"batchId":0}
    {"path":"file:///data/in/b.json","timestamp":1700000000123,"batchId":0}

The source offset is the number of the last log entry, as Spark's
``FileStreamSourceOffset``: ``{"logOffset": N}``. Batch ``(start, end]`` reads the files
of entries ``start+1 .. end``; because the log entry is written before the offset is
returned, a batch replayed after a crash reads exactly the same files.

Behaviour follows Spark (``FileStreamSource``, ``FileStreamOptions``):

* Which files are read follows Spark's ``InMemoryFileIndex.allFiles`` over the path
  (:meth:`~lockgate.sources.file.paths.DataLocation.list_files`): the path, or each
  match of a Hadoop glob (``*``, ``?``, ``[ab]``, ``[^ab]``, ``{a,b}``, ``\\`` escapes;
  a glob matches hidden names too, as Hadoop's), is a root. Files directly in a root
  directory are read; files in its plain subdirectories are not, unless some directory
  is a ``key=value`` partition directory (then every file below is listed, partition
  columns come after the data columns, typed as Spark infers them or as the user schema
  says, and inconsistent layouts fail with Spark's ``CONFLICTING_DIRECTORY_STRUCTURES``
  / ``CONFLICTING_PARTITION_COLUMN_NAMES``) or ``recursiveFileLookup`` is true (every
  file below, no partition columns). Below a root, names starting with ``_`` (unless
  they contain ``=``) or ``.``, and names ending in ``._COPYING_``, are skipped; so are
  ``_metadata``/``_common_metadata`` files. ``pathGlobFilter`` keeps the files whose
  name matches. The partition columns are fixed when the query is defined; a batch
  whose files read as other columns fails, as Spark's ("Invalid batch").
* A file seen once is never read again, even when it is rewritten (the seen map is
  keyed by path, or by file name with ``fileNameOnly``). The seen map is rebuilt from
  the log at start, so a restarted query never re-reads logged files.
* ``maxFileAge`` (default ``7d``) is measured from the newest file seen, not from the
  current time, and does not apply before the first batch. It is ignored altogether when
  ``latestFirst`` is set together with ``maxFilesPerTrigger`` or ``maxBytesPerTrigger``
  (SPARK-19813), since old unread files must stay eligible then.
* When the directory is the output of a file sink (it has ``_spark_metadata``), the
  files come from the sink's log instead of a listing, so uncommitted files of a crashed
  sink batch are never read.
* ``cleanSource`` (``archive``/``delete``) acts in :meth:`FileStreamSource.commit`, on
  the files of log entries up to the committed offset; failures are logged, not raised.

Not implemented: Spark's cache of listed-but-unread files (``maxCachedFiles``,
``discardCachedInputRatio``; each trigger lists again instead, which changes no
result) and compaction of the source log (``N.compact`` files written by Spark are
read, but lockgate writes one plain file per entry).

The package is split by concept: :mod:`.paths` (hidden names, globs, data filesystem
backends, :class:`DataLocation`), :mod:`.log` (the source log), :mod:`.options`
(:class:`FileStreamOptions`) and :mod:`.source` (:class:`FileStreamSource` and the
providers). Everything other modules use is re-exported here.
"""

from __future__ import annotations

from lockgate.sources.file.log import FileEntry, FileStreamSourceLog
from lockgate.sources.file.options import FileStreamOptions, reader_options
from lockgate.sources.file.paths import (
    ArrowBackend,
    DataBackend,
    DataLocation,
    FileStatus,
    LocalBackend,
    escape_glob,
    expand_braces,
    glob_to_regex,
    has_glob,
    is_hidden_path_name,
)
from lockgate.sources.file.source import (
    SCHEMA_NOT_SPECIFIED,
    CsvFileSourceProvider,
    FileSourceProvider,
    FileStreamSource,
    JsonFileSourceProvider,
    OrcFileSourceProvider,
    ParquetFileSourceProvider,
    TextFileSourceProvider,
    log_offset,
)

__all__ = [
    "SCHEMA_NOT_SPECIFIED",
    "ArrowBackend",
    "CsvFileSourceProvider",
    "DataBackend",
    "DataLocation",
    "FileEntry",
    "FileSourceProvider",
    "FileStatus",
    "FileStreamOptions",
    "FileStreamSource",
    "FileStreamSourceLog",
    "JsonFileSourceProvider",
    "LocalBackend",
    "OrcFileSourceProvider",
    "ParquetFileSourceProvider",
    "TextFileSourceProvider",
    "escape_glob",
    "expand_braces",
    "glob_to_regex",
    "has_glob",
    "is_hidden_path_name",
    "log_offset",
    "reader_options",
]
