"""The file stream source: :class:`FileStreamSource` and its providers.

Also holds the seen-files map (Spark's ``SeenFilesMap``), the ``cleanSource`` cleaner
(Spark's ``FileStreamSourceCleaner``) and the source offset helper :func:`log_offset`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from lockgate.errors import (
    AnalysisError,
    CheckpointError,
    ConcurrentWriteError,
    OptionError,
    SourceError,
)
from lockgate.jvm import DataSources
from lockgate.sinks.file_log import FileStreamSinkLog
from lockgate.sources.base import ReadLimit, Source, SourceContext, SourceProvider
from lockgate.sources.file.log import FileEntry, FileStreamSourceLog
from lockgate.sources.file.options import FileStreamOptions, reader_options, require_path
from lockgate.sources.file.paths import (
    DataLocation,
    FileStatus,
    Listing,
    escape_glob,
    expand_braces,
    glob_to_regex,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from lockgate.options import Options

# The package's name, as before it was split into modules.
logger = logging.getLogger("lockgate.sources.file")

SCHEMA_NOT_SPECIFIED = (
    "Schema must be specified when creating a streaming source DataFrame. If some files "
    "already exist in the directory, then depending on the file format you may be able to "
    "create a static DataFrame on that directory with 'spark.read.load(directory)' and "
    "infer schema from it."
)


# ======================================================================================
# The seen-files map (Spark's SeenFilesMap)
# ======================================================================================


class _SeenFilesMap:
    """Files already logged, with their mtimes, aged out ``max_age_ms`` behind the newest.

    ``max_age_ms=None`` keeps every file forever (``latestFirst`` with a read limit).
    """

    def __init__(self, max_age_ms: int | None, file_name_only: bool) -> None:
        self._max_age_ms = max_age_ms
        self._file_name_only = file_name_only
        self._map: dict[str, int] = {}
        self._latest = 0
        self._last_purge = -(1 << 62)

    def _key(self, uri: str) -> str:
        # Spark writes "file:/a" where lockgate writes "file:///a": compare decoded paths.
        scheme, sep, rest = uri.partition(":")
        if not sep:
            scheme, rest = "file", uri
        if rest.startswith("//"):
            authority, _, tail = rest[2:].partition("/")
            rest = "/" + tail
        else:
            authority = ""
        path = unquote(rest)
        if self._file_name_only:
            return path.rstrip("/").rsplit("/", 1)[-1]
        if scheme == "file" and authority == "localhost":
            authority = ""
        return f"{scheme}://{authority}{path}"

    def add(self, uri: str, timestamp: int) -> None:
        self._map[self._key(uri)] = timestamp
        self._latest = max(self._latest, timestamp)

    def is_new(self, uri: str, timestamp: int) -> bool:
        # Compared with the last purge, not the newest file: a file older than the age
        # limit but not purged yet must still count as seen.
        return timestamp >= self._last_purge and self._key(uri) not in self._map

    def purge(self) -> int:
        if self._max_age_ms is None:
            return 0
        self._last_purge = self._latest - self._max_age_ms
        old = [k for k, ts in self._map.items() if ts < self._last_purge]
        for k in old:
            del self._map[k]
        return len(old)

    def __len__(self) -> int:
        return len(self._map)


# ======================================================================================
# cleanSource (Spark's FileStreamSourceCleaner)
# ======================================================================================


class _SourceCleaner:
    def __init__(self, location: DataLocation, mode: str, archive: DataLocation | None) -> None:
        self._location = location
        self._mode = mode
        self._archive = archive

    @classmethod
    def create(cls, location: DataLocation, opts: FileStreamOptions) -> _SourceCleaner | None:
        if opts.clean_source == "off":
            return None
        if opts.clean_source == "delete":
            return cls(location, "delete", None)
        assert opts.source_archive_dir is not None
        archive = DataLocation.parse(opts.source_archive_dir, allow_glob=False)
        if archive.backend.identity != location.backend.identity:
            raise OptionError(
                "Base archive path is located on a different file system than the source "
                f"files. source path: {location.qualified} / base archive path: "
                f"{archive.qualified}",
                option="sourceArchiveDir",
            )
        if _archive_matches_source(location, archive):
            raise OptionError(
                "Base archive path cannot be set to the path where archived path can possibly "
                "match with source pattern. Ensure the base archive path doesn't match with "
                "source pattern in depth, where the depth is minimum of depth on both paths. "
                f"source path: {location.qualified} / base archive path: {archive.qualified}",
                option="sourceArchiveDir",
            )
        return cls(location, "archive", archive)

    def clean(self, entry: FileEntry) -> None:
        backend = self._location.backend
        try:
            src = backend.from_uri(entry.path)
        except ValueError:
            logger.warning(
                "Cannot clean %s: not on the source's file system; skipping.", entry.path
            )
            return
        if self._mode == "delete":
            try:
                logger.debug("Removing completed file %s", src)
                if backend.stat(src) is None:
                    logger.warning("Failed to remove %s / skip removing file.", src)
                    return
                backend.fs.delete(src)
            except Exception:
                logger.warning("Failed to remove %s / skip removing file.", src, exc_info=True)
            return
        assert self._archive is not None
        # As Spark: the archived file keeps its full path below the archive directory.
        src_path = backend.to_uri(src).partition("://")[2]
        if not src_path.startswith("/"):
            src_path = "/" + src_path.partition("/")[2]
        dst = self._archive.backend.from_uri(
            self._archive.backend.to_uri(self._archive.base).rstrip("/") + src_path
        )
        try:
            logger.debug("Archiving completed file %s to %s", src, dst)
            if backend.stat(src) is None:
                logger.warning("Fail to move %s to %s / skip moving file.", src, dst)
                return
            parent = dst.rsplit("/", 1)[0]
            if parent:
                backend.fs.mkdirs(parent)
            backend.fs.rename(src, dst)
        except Exception:
            logger.warning("Fail to move %s to %s / skip moving file.", src, dst, exc_info=True)


def _archive_matches_source(source: DataLocation, archive: DataLocation) -> bool:
    """Spark's ``isBaseArchivePathMatchedAgainstSourcePattern``.

    Compare both paths cut to the smaller depth; if the archive path matches the source
    pattern there, archived files could be picked up again as new input.
    """
    archive_parts = [p for p in archive.base.split("/") if p]
    source_parts = [p for p in source.base.split("/") if p]
    if source.pattern:
        expanded = expand_braces("/".join(source.pattern))
        patterns = [source_parts + [p for p in e.split("/") if p] for e in expanded]
    else:
        patterns = [source_parts]
    for parts in patterns:
        depth = min(len(parts), len(archive_parts))
        if all(
            glob_to_regex(pattern).fullmatch(actual)
            for pattern, actual in zip(parts[:depth], archive_parts[:depth], strict=True)
        ):
            return True
    return False


# ======================================================================================
# The source
# ======================================================================================


def log_offset(offset: Any) -> int:
    """``{"logOffset": N}`` (or Spark's legacy plain ``N``) -> ``N``."""
    value = offset
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, dict) and "logOffset" in value:
        value = value["logOffset"]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise SourceError(
        f"Invalid file source offset {offset!r}: expected {{'logOffset': N}}. Was the "
        "checkpoint written by a different kind of source?"
    )


class _Relations:
    """Spark's ``DataSource(paths, schema, format, options).resolveRelation(checkFilesExist
    = false)``, the relation its FileStreamSource reads a batch's files with, as a
    DataFrame (JVM objects made once per source)."""

    def __init__(self, spark: SparkSession, format_name: str, schema: StructType, options: dict[str, str]) -> None:
        self._spark = spark
        self._format = format_name
        self._data_sources = DataSources(spark)
        self._schema = self._data_sources.schema(schema)
        self._options = spark.sparkContext._jvm.PythonUtils.toScalaMap(options)  # type: ignore[union-attr]
        self._resolve([])  # fails here, not in a batch, on another Spark's signatures

    def _resolve(self, paths: list[str]) -> Any:
        source = self._data_sources.new(self._format, paths=paths, schema=self._schema, options=self._options)
        # resolveRelation(checkFilesExist, readOnly, isStreaming)'s defaults but the first
        return source.resolveRelation(
            False, getattr(source, "resolveRelation$default$2")(), getattr(source, "resolveRelation$default$3")()
        )

    def read(self, paths: list[str]) -> DataFrame:
        from pyspark.sql import DataFrame

        relation = self._resolve(paths)
        return DataFrame(self._spark._jsparkSession.baseRelationToDataFrame(relation), self._spark)


class FileStreamSource(Source):
    """Reads files appearing under a directory or glob; see the module docstring."""

    supportsTriggerAvailableNow = True

    def __init__(
        self,
        context: SourceContext,
        format_name: str,
        location: DataLocation,
        opts: FileStreamOptions,
        read_options: dict[str, str],
    ) -> None:
        self._spark = context.spark
        self._schema = context.schema
        self._format = format_name
        self._empty: DataFrame | None = None
        """The empty batch, made once (a listing of an empty directory on the driver)."""
        self._relations: _Relations | bool | None = None
        """How batches are read (:meth:`_read`): None until the first batch, False for
        DataFrameReader."""
        self._location = location
        self._opts = opts
        self._listing_options = _ListingOptions.parse(context.spark, location, read_options)
        # As Spark's getBatch: a plain source path is the batch reads' basePath (in place
        # of the user's), so partition directories below it become columns.
        self._read_options = {k: v for k, v in read_options.items() if k.lower() != "basepath"}
        root = location.backend.stat(location.base) if not location.is_glob else None
        if root is not None and root.is_dir:
            self._read_options["basePath"] = location.backend.to_spark(location.base)
        else:
            self._read_options = dict(read_options)
        self._log = FileStreamSourceLog(context.fs, context.metadata_path)
        latest = self._log.get_latest_batch_id()
        self._current = -1 if latest is None else latest
        has_limit = opts.max_files_per_trigger is not None or opts.max_bytes_per_trigger is not None
        if opts.latest_first:
            logger.warning(
                "'latestFirst' is true. New files will be processed first, which may affect "
                "the watermark value. In addition, 'maxFileAge' will be ignored."
                if has_limit
                else "'latestFirst' is true. New files will be processed first, which may "
                "affect the watermark value."
            )
        if opts.file_name_only:
            logger.warning(
                "'fileNameOnly' is enabled. Make sure your file names are unique (e.g. using "
                "UUID), otherwise, files with the same name but under different paths will be "
                "considered the same and causes data lost."
            )
        max_age = None if opts.latest_first and has_limit else opts.max_file_age_ms
        self._seen = _SeenFilesMap(max_age, opts.file_name_only)
        for entry in self._log.all_entries():
            self._seen.add(entry.path, entry.timestamp)
        self._seen.purge()
        self._cleaner = _SourceCleaner.create(location, opts)
        self._last_cleaned: int | None = None
        self._available_now: list[FileStatus] | None = None
        self._has_sink_metadata: bool | None = None
        self._lock = threading.Lock()
        logger.info(
            "maxFilesPerBatch = %s, maxBytesPerBatch = %s, maxFileAgeMs = %s",
            opts.max_files_per_trigger,
            opts.max_bytes_per_trigger,
            max_age,
        )

    # -- Source API ----------------------------------------------------------------------
    @property
    def schema(self) -> StructType:
        return self._schema

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadLimit(
            max_files=self._opts.max_files_per_trigger,
            max_bytes=self._opts.max_bytes_per_trigger,
        )

    def latestOffset(self, start: Any, limit: ReadLimit) -> Any:
        with self._lock:
            if start is not None and log_offset(start) > self._current:
                raise CheckpointError(
                    f"The file source log in {self._log.path} ends at entry {self._current}, "
                    f"but the query has already processed up to entry {log_offset(start)}: "
                    "the source log was lost or truncated. Restore the checkpoint from a "
                    "backup or start with a new checkpoint location.",
                    path=self._log.path,
                )
            candidates = (
                self._available_now if self._available_now is not None else self.fetch_all_files()
            )
            new_files = [f for f in candidates if self._seen.is_new(f.uri, f.mtime_ms)]
            batch = _take_within(new_files, limit)
            if batch:
                next_offset = self._current + 1
                self._write_log_entry(
                    next_offset, [FileEntry(f.uri, f.mtime_ms, next_offset) for f in batch]
                )
                self._current = next_offset
                for f in batch:
                    self._seen.add(f.uri, f.mtime_ms)
                logger.info("Log offset set to %d with %d new files", next_offset, len(batch))
            self._seen.purge()
            # The current log offset, not ``start``: an entry logged by a run that crashed
            # before writing its offsets is read by the next batch, not lost.
            return None if self._current < 0 else {"logOffset": self._current}

    def getBatch(self, start: Any, end: Any) -> DataFrame:
        first = -1 if start is None else log_offset(start)
        last = log_offset(end)
        if first > last:
            raise SourceError(
                f"Invalid file source batch range: start {start!r} is after end {end!r}."
            )
        files = self._log.get_range(first + 1, last)
        logger.info("Processing %d files from %d:%d", len(files), first + 1, last)
        if not files:
            if self._empty is None:
                self._empty = empty_file_frame(self._spark, self._format, self._schema)
            return self._empty
        backend = self._location.backend
        paths = []
        for f in files:
            try:
                paths.append(escape_glob(backend.to_spark(backend.from_uri(f.path))))
            except ValueError:
                paths.append(escape_glob(f.path))  # another filesystem: hand Spark the URI
        df = self._read(paths)
        if df.columns != self._schema.fieldNames():
            # Spark fails such a batch too ("Invalid batch"): the schema was fixed when the
            # query was defined, and the partition directories changed since.
            raise SourceError(
                f"The files of this batch read as columns {df.columns}, but the file source "
                f"{self._location.qualified} was defined with columns "
                f"{self._schema.fieldNames()}: partition directories (key=value) appeared "
                "in or vanished from the source directory after the query was defined, or "
                "the batch holds only files outside the partition directories. Keep one "
                "directory layout for a source path, or define the query again (its schema "
                "is taken from the directories when it is defined)."
            )
        return df

    def _read(self, paths: list[str]) -> DataFrame:
        """The batch's files as a DataFrame. As Spark's FileStreamSource reads them: the
        format's relation resolved without checking that the files exist (a file of the
        log deleted since is skipped, as there), and none of DataFrameReader's analysis of
        an unresolved data source. Another Spark without that constructor reads them
        with ``spark.read``."""
        if self._relations is None:
            try:
                self._relations = _Relations(self._spark, self._format, self._schema, self._read_options)
            except Exception as exc:  # noqa: BLE001 - another Spark: DataFrameReader
                logger.info("file source: Spark's DataSource relation is not available (%s)", exc)
                self._relations = False
        if self._relations:
            return self._relations.read(paths)
        return self._spark.read.format(self._format).schema(self._schema).options(**self._read_options).load(paths)

    def commit(self, end: Any) -> None:
        if self._cleaner is None:
            return
        last = log_offset(end)
        # Entries up to ``end`` are fully processed. Without a record of earlier cleaning
        # (a fresh run) only ``end``'s own files are cleaned, as in Spark.
        first = last if self._last_cleaned is None else self._last_cleaned + 1
        for batch_id in range(max(first, 0), last + 1):
            try:
                entries = self._log.get(batch_id) or []
            except CheckpointError:
                logger.warning(
                    "Cannot read file source log entry %d to clean it", batch_id, exc_info=True
                )
                continue
            for entry in entries:
                if entry.batchId == batch_id:
                    self._cleaner.clean(entry)
        self._last_cleaned = max(last, self._last_cleaned if self._last_cleaned is not None else -1)

    def prepareForTriggerAvailableNow(self) -> None:
        with self._lock:
            self._available_now = self.fetch_all_files()

    def availableNowBacklog(self, end: Any) -> tuple[int, str] | None:
        # The files of the target not yet logged for a batch (end is always the last one).
        with self._lock:
            if self._available_now is None:
                return None
            return sum(1 for f in self._available_now if self._seen.is_new(f.uri, f.mtime_ms)), "files"

    def description(self) -> str:
        return f"FileStreamSource[{self._location.qualified}]"

    # -- listing -------------------------------------------------------------------------
    def fetch_all_files(self) -> list[FileStatus]:
        """Every file now in the source path, oldest first (newest first with latestFirst)."""
        if self._has_sink_metadata is None:
            if self._sink_metadata_dir() is not None:
                self._has_sink_metadata = True
            else:
                files = self._list_files()
                # Decide once files exist; check again so a sink that wrote its log just
                # after the first check is not missed.
                if files:
                    self._has_sink_metadata = self._sink_metadata_dir() is not None
                if not self._has_sink_metadata:
                    return self._sorted(files)
        if self._has_sink_metadata:
            return self._sorted(self._files_from_sink_log())
        return self._sorted(self._list_files())

    def _list_files(self) -> list[FileStatus]:
        return self._listing_options.list(self._location).files

    def _sorted(self, files: list[FileStatus]) -> list[FileStatus]:
        if self._opts.latest_first:
            return sorted(files, key=lambda f: (-f.mtime_ms, f.uri))
        return sorted(files, key=lambda f: (f.mtime_ms, f.uri))

    def _sink_metadata_dir(self) -> str | None:
        if self._location.is_glob:
            return None
        path = self._location.backend.fs.join(self._location.base, "_spark_metadata")
        entry = self._location.backend.stat(path)
        return path if entry is not None and entry.is_dir else None

    def _files_from_sink_log(self) -> list[FileStatus]:
        metadata = self._sink_metadata_dir()
        if metadata is None:
            return []
        log = FileStreamSinkLog(self._location.backend.fs, metadata, create=False)
        out = []
        backend = self._location.backend
        for status in log.all_files():
            if status.isDir:
                continue
            try:
                path = backend.from_uri(status.path)
            except ValueError:
                path = status.path
            out.append(FileStatus(status.path, path, status.size, status.modificationTime))
        return out

    def _write_log_entry(self, batch_id: int, entries: list[FileEntry]) -> None:
        try:
            self._log.add(batch_id, entries)
        except ConcurrentWriteError as exc:
            # The same entry written before (a retried call) is fine; anything else means
            # another query run is using this checkpoint.
            existing = self._log.get(batch_id)
            if existing is not None and [e.path for e in existing] == [e.path for e in entries]:
                return
            raise ConcurrentWriteError(
                "Concurrent update to the log. Multiple streaming jobs detected for "
                f"{batch_id}: {exc}",
                path=exc.path,
            ) from exc


class _ListingOptions:
    """The reader options that decide which files a source lists (see
    :meth:`DataLocation.list_files`): ``pathGlobFilter``, ``recursiveFileLookup``,
    ``basePath``, and ``spark.sql.caseSensitive`` for partition column names."""

    def __init__(
        self,
        name_filter: re.Pattern[str] | None,
        recursive: bool,
        base_path: str | None,
        case_sensitive: bool,
    ) -> None:
        self.name_filter = name_filter
        self.recursive = recursive
        self.base_path = base_path
        self.case_sensitive = case_sensitive

    @classmethod
    def parse(
        cls, spark: SparkSession, location: DataLocation, read_options: dict[str, str]
    ) -> _ListingOptions:
        lower = {k.lower(): v for k, v in read_options.items()}
        glob_filter = lower.get("pathglobfilter")
        name_filter = (
            _any_of([glob_to_regex(p) for p in expand_braces(glob_filter)]) if glob_filter else None
        )
        raw_recursive = (lower.get("recursivefilelookup") or "false").strip().lower()
        if raw_recursive not in ("true", "false"):
            raise OptionError(
                f"Invalid value {lower.get('recursivefilelookup')!r} for option "
                "'recursiveFileLookup': use 'true' or 'false'.",
                option="recursiveFileLookup",
            )
        base_path = None
        if lower.get("basepath"):
            base = DataLocation.parse(lower["basepath"], allow_glob=False)
            if base.backend.identity == location.backend.identity:
                base_path = base.base
        case_sensitive = (
            spark.conf.get("spark.sql.caseSensitive", "false") or "false"
        ).strip().lower() == "true"
        return cls(name_filter, raw_recursive == "true", base_path, case_sensitive)

    def list(self, location: DataLocation) -> Listing:
        return location.list_files(
            self.name_filter,
            recursive=self.recursive,
            base_path=self.base_path,
            case_sensitive=self.case_sensitive,
        )


def _any_of(patterns: list[re.Pattern[str]]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p.pattern})" for p in patterns), re.DOTALL)


def _take_within(files: list[FileStatus], limit: ReadLimit) -> list[FileStatus]:
    """The head of ``files`` within ``limit`` (Spark's ``ReadMaxFiles``/``ReadMaxBytes``)."""
    if limit.max_files is not None:
        files = files[: max(limit.max_files, 0)]
    if limit.max_bytes is not None:
        taken: list[FileStatus] = []
        total = 0
        for f in files:
            # The first file always goes in, however big, or a large file would stall
            # the stream; then stop at the first file that would pass the limit.
            if taken and total + f.size > limit.max_bytes:
                break
            taken.append(f)
            total += f.size
        files = taken
    return files


# ======================================================================================
# Providers
# ======================================================================================


class FileSourceProvider(SourceProvider):
    """``readStream.format(<file format>)``: creates :class:`FileStreamSource` instances."""

    def __init__(self, format_name: str) -> None:
        self.name = format_name

    def _validate(self, options: Options) -> tuple[DataLocation, FileStreamOptions]:
        location = DataLocation.parse(require_path(options))
        opts = FileStreamOptions.parse(options)
        _SourceCleaner.create(location, opts)  # checks sourceArchiveDir
        return location, opts

    def sourceSchema(
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        from pyspark.sql.types import StringType, StructField, StructType

        location, _ = self._validate(options)
        # Like Spark: a missing directory is an error unless the path is a pattern, which
        # may only match once upstream starts writing.
        if not location.is_glob and not location.exists():
            raise AnalysisError(f"[PATH_NOT_FOUND] Path does not exist: {location.qualified}.")
        read_opts = reader_options(options)
        # As Spark's DataSource.sourceSchema: partition columns are found now, in the
        # key=value directories the source would list, and come after the data columns.
        listing = _ListingOptions.parse(spark, location, read_opts).list(location)
        partitions = {c.lower() for c in listing.partition_columns}
        if self.name == "text" and user_schema is not None:
            data = [f for f in user_schema.fields if f.name.lower() not in partitions]
            if len(data) != 1 or not isinstance(data[0].dataType, StringType):
                raise AnalysisError(
                    "Text data source supports only a single column of string type, and the "
                    f"given schema is {user_schema.simpleString()}."
                )
        if user_schema is None and self.name != "text":
            inference = spark.conf.get("spark.sql.streaming.schemaInference", "false")
            if (inference or "false").strip().lower() != "true":
                raise AnalysisError(SCHEMA_NOT_SPECIFIED)
        if user_schema is None and self.name == "text":
            user_schema = StructType([StructField("value", StringType(), True)])
            if not partitions:
                return user_schema
        roots = location.roots()
        if user_schema is not None and not (partitions and roots):
            schema = user_schema
        else:
            reader = spark.read.format(self.name).options(**read_opts)
            if user_schema is not None:
                reader = reader.schema(user_schema)
            if roots:
                backend = location.backend
                schema = reader.load([escape_glob(backend.to_spark(r)) for r in roots]).schema
            else:  # a glob matching nothing yet: Spark's own error
                schema = reader.load(
                    location.backend.to_spark(location.base) + _glob_suffix(location)
                ).schema
        # spark.sql.streaming.fileSource.schema.forceNullable (default true): files may
        # lack any column, so every column is nullable.
        force = spark.conf.get("spark.sql.streaming.fileSource.schema.forceNullable", "true")
        return _as_nullable(schema) if (force or "true").lower() == "true" else schema

    def createSource(self, context: SourceContext) -> Source:
        location, opts = self._validate(context.options)
        return FileStreamSource(context, self.name, location, opts, reader_options(context.options))

    def emptyFrame(self, spark: SparkSession, schema: StructType) -> DataFrame:
        return empty_file_frame(spark, self.name, schema)


_empty_directory: str | None = None
_empty_directory_lock = threading.Lock()


def empty_file_frame(spark: SparkSession, fmt: str, schema: StructType) -> DataFrame:
    """No rows of ``schema``, read by Spark's file source of ``fmt`` from an empty
    directory, so that it holds Spark's hidden ``_metadata`` column (``file_path``,
    ``file_name``, ...) as a batch of files does: what a query defines over the stream
    and what an empty batch gives. A schema the format cannot read (text with partition
    columns) gets a plain empty DataFrame."""
    global _empty_directory
    with _empty_directory_lock:
        if _empty_directory is None or not os.path.isdir(_empty_directory):
            _empty_directory = tempfile.mkdtemp(prefix="lockgate-empty-")
            atexit.register(shutil.rmtree, _empty_directory, True)
        directory = _empty_directory
    try:
        return spark.read.format(fmt).schema(schema).load(directory)
    except Exception:  # noqa: BLE001 - Spark's own reader refuses the schema: no _metadata then
        return spark.createDataFrame([], schema)


def _glob_suffix(location: DataLocation) -> str:
    return "/" + "/".join(location.pattern) if location.pattern else ""


def _as_nullable(schema: StructType) -> StructType:
    from pyspark.sql.types import StructType

    result = _nullable_type(schema)
    assert isinstance(result, StructType)
    return result


def _nullable_type(data_type: DataType) -> DataType:
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType(
            [
                StructField(f.name, _nullable_type(f.dataType), True, f.metadata)
                for f in data_type.fields
            ]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable_type(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(data_type.keyType, _nullable_type(data_type.valueType), True)
    return data_type


class JsonFileSourceProvider(FileSourceProvider):
    def __init__(self) -> None:
        super().__init__("json")


class CsvFileSourceProvider(FileSourceProvider):
    def __init__(self) -> None:
        super().__init__("csv")


class ParquetFileSourceProvider(FileSourceProvider):
    def __init__(self) -> None:
        super().__init__("parquet")


class TextFileSourceProvider(FileSourceProvider):
    def __init__(self) -> None:
        super().__init__("text")


class OrcFileSourceProvider(FileSourceProvider):
    def __init__(self) -> None:
        super().__init__("orc")
