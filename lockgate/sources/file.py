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

* Files are listed recursively; names starting with ``_`` (unless they contain ``=``,
  i.e. partition directories) or ``.``, and names ending in ``._COPYING_``, are skipped,
  as by Spark's ``InMemoryFileIndex``. Hadoop glob patterns (``*``, ``?``, ``[ab]``,
  ``[^ab]``, ``{a,b}``, ``\\`` escapes) are expanded on local and on ``pyarrow.fs``
  filesystems; glob matches with hidden names are skipped too, so a glob never picks up
  a file sink's ``_spark_metadata`` or staging directories.
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
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat as stat_module
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from lockgate.checkpoint.fs import ArrowFileSystem, CheckpointFileSystem, LocalFileSystem
from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import (
    AnalysisError,
    CheckpointError,
    ConcurrentWriteError,
    OptionError,
    SourceError,
)
from lockgate.sources.base import ReadLimit, Source, SourceContext, SourceProvider

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from lockgate.options import Options

logger = logging.getLogger(__name__)

SCHEMA_NOT_SPECIFIED = (
    "Schema must be specified when creating a streaming source DataFrame. If some files "
    "already exist in the directory, then depending on the file format you may be able to "
    "create a static DataFrame on that directory with 'spark.read.load(directory)' and "
    "infer schema from it."
)

# Options the source itself consumes; every other option goes to ``spark.read``.
_STREAM_ONLY_OPTIONS = frozenset(
    name.lower()
    for name in (
        "path",
        "maxFilesPerTrigger",
        "maxBytesPerTrigger",
        "latestFirst",
        "fileNameOnly",
        "maxFileAge",
        "cleanSource",
        "sourceArchiveDir",
        "maxCachedFiles",
        "discardCachedInputRatio",
    )
)


# ======================================================================================
# Paths, URIs and globs (shared with lockgate.sinks.file)
# ======================================================================================

# Characters Hadoop's ``Path.toUri`` leaves unquoted in a path (RFC 3986 pchar and "/"),
# so logged paths look like the ones Spark writes.
_URI_SAFE = "/:@!$&'()*+,;=-._~"
_GLOB_CHARS = frozenset("{}[]*?\\")
_GLOB_ESCAPE = re.compile(r"([\\{}\[\]*?])")


def is_hidden_path_name(name: str) -> bool:
    """Spark's ``shouldFilterOutPathName``: names readers skip.

    ``_x`` and ``.x`` are hidden, except ``_x=y`` (a partition directory); so are files
    still being copied (``x._COPYING_``).
    """
    exclude = (
        (name.startswith("_") and "=" not in name)
        or name.startswith(".")
        or name.endswith("._COPYING_")
    )
    include = name.startswith("_common_metadata") or name.startswith("_metadata")
    return exclude and not include


def has_glob(text: str) -> bool:
    """Hadoop's ``isGlobPath``: any of ``{}[]*?\\`` makes a path a pattern."""
    return any(c in _GLOB_CHARS for c in text)


def escape_glob(path: str) -> str:
    """Escape Hadoop glob characters, so Spark's readers take ``path`` literally."""
    return _GLOB_ESCAPE.sub(r"\\\1", path)


def expand_braces(pattern: str) -> list[str]:
    """Expand Hadoop's ``{a,b}`` alternatives (nested allowed), as ``GlobExpander`` does."""
    depth = 0
    start = -1
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                head, tail = pattern[:start], pattern[i + 1 :]
                out: list[str] = []
                for alternative in _split_alternatives(pattern[start + 1 : i]):
                    out.extend(expand_braces(head + alternative + tail))
                return out
        i += 1
    if depth:
        raise OptionError(
            f"Illegal file pattern: Unclosed group near index {start} in {pattern!r}; "
            "close every '{' with '}' or escape it as '\\{'.",
            option="path",
        )
    return [pattern]


def _split_alternatives(inner: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    i = 0
    while i < len(inner):
        c = inner[i]
        if c == "\\" and i + 1 < len(inner):
            current += inner[i : i + 2]
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
        i += 1
    parts.append(current)
    return parts


def glob_to_regex(component: str) -> re.Pattern[str]:
    """Compile one path component of a Hadoop glob (no ``{}`` left) to a regex."""
    out = []
    i = 0
    n = len(component)
    while i < n:
        c = component[i]
        if c == "\\" and i + 1 < n:
            out.append(re.escape(component[i + 1]))
            i += 2
        elif c == "*":
            out.append(".*")
            i += 1
        elif c == "?":
            out.append(".")
            i += 1
        elif c == "[":
            end = component.find("]", i + 2 if component[i + 1 : i + 2] in ("^", "!") else i + 1)
            if end == -1:
                raise OptionError(
                    f"Illegal file pattern: Unclosed character class in {component!r}; "
                    "close '[' with ']' or escape it as '\\['.",
                    option="path",
                )
            body = component[i + 1 : end]
            negate = body[:1] in ("^", "!")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("]", "\\]").replace("[", "\\[")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _unescape_glob(component: str) -> str:
    return re.sub(r"\\(.)", r"\1", component)


@dataclass(frozen=True)
class FileStatus:
    """One listed file: its logged URI, backend path, size and mtime in epoch millis."""

    uri: str
    path: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class _Entry:
    name: str
    path: str
    is_dir: bool
    size: int
    mtime_ms: int


class DataBackend(ABC):
    """Listing, moving and naming files of one filesystem holding data (not checkpoints)."""

    fs: CheckpointFileSystem

    @abstractmethod
    def list_dir(self, path: str) -> list[_Entry]:
        """Entries directly inside ``path``; empty when it is missing or not a directory."""

    @abstractmethod
    def stat(self, path: str) -> _Entry | None: ...

    @abstractmethod
    def to_uri(self, path: str) -> str:
        """The percent-encoded URI logged for ``path`` (``file:///a/b``)."""

    @abstractmethod
    def to_spark(self, path: str) -> str:
        """The path string handed to Spark (Hadoop ``Path`` syntax, not encoded)."""

    @abstractmethod
    def from_uri(self, uri: str) -> str:
        """The backend path of a logged URI; raises ``ValueError`` for another filesystem."""

    @property
    @abstractmethod
    def identity(self) -> str:
        """Scheme and authority; two paths are on one filesystem when these are equal."""


class LocalBackend(DataBackend):
    def __init__(self) -> None:
        self.fs = LocalFileSystem()

    def list_dir(self, path: str) -> list[_Entry]:
        entries = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        st = e.stat()  # follows symlinks, like Hadoop's local listing
                    except FileNotFoundError:
                        continue  # removed while listing
                    entries.append(
                        _Entry(
                            e.name,
                            e.path,
                            stat_module.S_ISDIR(st.st_mode),
                            st.st_size,
                            st.st_mtime_ns // 1_000_000,
                        )
                    )
        except (FileNotFoundError, NotADirectoryError):
            return []
        return entries

    def stat(self, path: str) -> _Entry | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _Entry(
            os.path.basename(path),
            path,
            stat_module.S_ISDIR(st.st_mode),
            st.st_size,
            st.st_mtime_ns // 1_000_000,
        )

    def to_uri(self, path: str) -> str:
        return "file://" + quote(path, safe=_URI_SAFE)

    def to_spark(self, path: str) -> str:
        return "file:" + path

    def from_uri(self, uri: str) -> str:
        if uri.startswith("file://"):
            rest = uri[len("file://") :]
            authority, _, tail = rest.partition("/")
            if authority not in ("", "localhost"):
                raise ValueError(f"{uri!r} is not a local file URI")
            return unquote("/" + tail)
        if uri.startswith("file:"):
            return unquote(uri[len("file:") :])
        if uri.startswith("/"):
            return uri
        raise ValueError(f"{uri!r} is not a local file URI")

    @property
    def identity(self) -> str:
        return "file://"


class ArrowBackend(DataBackend):
    """A :mod:`pyarrow.fs` filesystem (``s3://``, ``gs://``, ``hdfs://``, ...)."""

    def __init__(self, pa_fs: Any, scheme: str, netloc: str, rooted: bool) -> None:
        import pyarrow.fs as pafs

        self._pafs = pafs
        self._pa_fs = pa_fs
        self.fs = ArrowFileSystem(pa_fs)
        self.scheme = scheme
        self.netloc = netloc
        # pyarrow names HDFS files "/dir/f" but object-store files "bucket/dir/f".
        self.rooted = rooted

    def _entry(self, info: Any) -> _Entry:
        mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
        return _Entry(
            info.base_name,
            info.path,
            info.type == self._pafs.FileType.Directory,
            int(info.size or 0),
            mtime,
        )

    def list_dir(self, path: str) -> list[_Entry]:
        try:
            infos = self._pa_fs.get_file_info(self._pafs.FileSelector(path, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [self._entry(i) for i in infos if i.type != self._pafs.FileType.NotFound]

    def stat(self, path: str) -> _Entry | None:
        info = self._pa_fs.get_file_info(path)
        if info.type == self._pafs.FileType.NotFound:
            return None
        return self._entry(info)

    def _prefix(self) -> str:
        return f"{self.scheme}://{self.netloc}" if self.rooted else f"{self.scheme}://"

    def to_uri(self, path: str) -> str:
        return self._prefix() + quote(path, safe=_URI_SAFE)

    def to_spark(self, path: str) -> str:
        return self._prefix() + path

    def from_uri(self, uri: str) -> str:
        scheme, sep, rest = uri.partition("://")
        if not sep or scheme != self.scheme:
            raise ValueError(f"{uri!r} is not on {self.identity}")
        netloc, _, tail = rest.partition("/")
        if netloc != self.netloc:
            raise ValueError(f"{uri!r} is not on {self.identity}")
        return unquote("/" + tail) if self.rooted else unquote(f"{netloc}/{tail}")

    @property
    def identity(self) -> str:
        return f"{self.scheme}://{self.netloc}"


class DataLocation:
    """A user-given data path or glob, split into a filesystem and path components.

    ``/data/in``, ``relative/dir`` and ``file:///data/in`` are local; other schemes go
    through :func:`pyarrow.fs.FileSystem.from_uri` on the part before the first glob.
    """

    def __init__(
        self,
        raw: str,
        backend: DataBackend,
        base: str,
        pattern: tuple[str, ...],
        qualified: str,
    ) -> None:
        self.raw = raw
        self.backend = backend
        self.base = base
        """Backend path of the longest prefix without glob characters."""
        self.pattern = pattern
        """The remaining, globbed components (empty for a plain path)."""
        self.qualified = qualified
        """Spark's ``makeQualified`` form, for messages: ``file:/data/in``."""

    @property
    def is_glob(self) -> bool:
        return bool(self.pattern)

    @classmethod
    def parse(cls, raw: str, *, allow_glob: bool = True) -> DataLocation:
        if raw.startswith("file:") or "://" not in raw:
            if raw.startswith("file://"):
                local = raw[len("file://") :]
                authority, slash, tail = local.partition("/")
                if authority not in ("", "localhost"):
                    raise OptionError(
                        f"Invalid path {raw!r}: file URIs cannot name a host ({authority!r}); "
                        "use file:///absolute/path.",
                        option="path",
                    )
                local = slash + tail
            elif raw.startswith("file:"):
                local = raw[len("file:") :]
            else:
                local = raw
            local = os.path.abspath(os.path.expanduser(local))
            backend: DataBackend = LocalBackend()
            parts = [p for p in local.split("/") if p]
            glob_at = _first_glob(parts) if allow_glob else len(parts)
            base = "/" + "/".join(parts[:glob_at])
            return cls(raw, backend, base, tuple(parts[glob_at:]), "file:" + local)

        scheme, _, rest = raw.partition("://")
        netloc, _, tail = rest.partition("/")
        parts = [p for p in tail.split("/") if p]
        glob_at = _first_glob(parts) if allow_glob else len(parts)
        prefix_uri = f"{scheme}://{netloc}/" + "/".join(parts[:glob_at])
        import pyarrow.fs as pafs

        try:
            pa_fs, base = pafs.FileSystem.from_uri(prefix_uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses
            raise OptionError(
                f"Cannot open path {raw!r}: {exc}. Use a local path or a URI that "
                "pyarrow.fs supports (s3://, gs://, hdfs://).",
                option="path",
            ) from exc
        backend = ArrowBackend(pa_fs, scheme, netloc, rooted=base.startswith("/"))
        return cls(raw, backend, base.rstrip("/") or base, tuple(parts[glob_at:]), raw)

    # -- listing -------------------------------------------------------------------------
    def roots(self) -> list[str]:
        """Backend paths the pattern matches now (just the base for a plain path)."""
        if not self.pattern:
            return [self.base]
        seen: dict[str, None] = {}
        for expanded in expand_braces("/".join(self.pattern)):
            for match in self._match(self.base, [p for p in expanded.split("/") if p]):
                seen.setdefault(match, None)
        return sorted(seen)

    def _match(self, directory: str, components: list[str]) -> Iterator[str]:
        if not components:
            yield directory
            return
        head, rest = components[0], components[1:]
        if not has_glob(head):
            child = self.backend.fs.join(directory, _unescape_glob(head))
            entry = self.backend.stat(child)
            if entry is not None and (entry.is_dir or not rest):
                yield from self._match(child, rest)
            return
        regex = glob_to_regex(head)
        for entry in sorted(self.backend.list_dir(directory), key=lambda e: e.name):
            if is_hidden_path_name(entry.name) or not regex.fullmatch(entry.name):
                continue
            if rest and not entry.is_dir:
                continue
            yield from self._match(entry.path, rest)

    def list_files(self, name_filter: re.Pattern[str] | None = None) -> list[FileStatus]:
        """Every data file under the matched roots, recursively, minus hidden names."""
        out: list[FileStatus] = []
        for root in self.roots():
            entry = self.backend.stat(root)
            if entry is None:
                continue
            if entry.is_dir:
                out.extend(self._walk(root, name_filter))
            elif not is_hidden_path_name(entry.name) and (
                name_filter is None or name_filter.fullmatch(entry.name)
            ):
                out.append(self._status(entry))
        return out

    def _walk(self, root: str, name_filter: re.Pattern[str] | None) -> Iterator[FileStatus]:
        stack = [root]
        while stack:
            directory = stack.pop()
            for entry in self.backend.list_dir(directory):
                if is_hidden_path_name(entry.name):
                    continue
                if entry.is_dir:
                    stack.append(entry.path)
                elif name_filter is None or name_filter.fullmatch(entry.name):
                    yield self._status(entry)

    def _status(self, entry: _Entry) -> FileStatus:
        return FileStatus(self.backend.to_uri(entry.path), entry.path, entry.size, entry.mtime_ms)

    def exists(self) -> bool:
        return self.backend.stat(self.base) is not None


def _first_glob(parts: list[str]) -> int:
    for i, part in enumerate(parts):
        if has_glob(part):
            return i
    return len(parts)


# ======================================================================================
# Options
# ======================================================================================


@dataclass(frozen=True)
class FileStreamOptions:
    """The options Spark's ``FileStreamOptions`` reads, parsed and checked."""

    max_files_per_trigger: int | None
    max_bytes_per_trigger: int | None
    latest_first: bool
    file_name_only: bool
    max_file_age_ms: int
    clean_source: str
    """``"off"``, ``"archive"`` or ``"delete"``."""
    source_archive_dir: str | None

    @classmethod
    def parse(cls, options: Options) -> FileStreamOptions:
        max_files = _positive_int(options, "maxFilesPerTrigger")
        max_bytes = _positive_int(options, "maxBytesPerTrigger")
        if max_files is not None and max_bytes is not None:
            raise OptionError(
                "Options 'maxFilesPerTrigger' and 'maxBytesPerTrigger' can't be both set at "
                "the same time",
                option="maxBytesPerTrigger",
            )
        max_age = options.get_duration_ms("maxFileAge", 7 * 86_400_000)
        assert max_age is not None
        if max_age < 0:
            raise OptionError(
                f"Invalid value {options.get_str('maxFileAge')!r} for option 'maxFileAge': "
                "it must not be negative.",
                option="maxFileAge",
            )
        archive_dir = options.get_str("sourceArchiveDir")
        raw_mode = options.get_str("cleanSource", "off") or "off"
        mode = raw_mode.strip().lower()
        if mode not in ("off", "archive", "delete"):
            raise OptionError(
                f"Invalid mode for clean source option {raw_mode}. Must be one of "
                "ARCHIVE,DELETE,OFF",
                option="cleanSource",
            )
        if mode == "archive" and not archive_dir:
            raise OptionError(
                "Archive mode must be used with 'sourceArchiveDir' option.",
                option="sourceArchiveDir",
            )
        return cls(
            max_files_per_trigger=max_files,
            max_bytes_per_trigger=max_bytes,
            latest_first=options.get_bool("latestFirst", False),
            file_name_only=options.get_bool("fileNameOnly", False),
            max_file_age_ms=max_age,
            clean_source=mode,
            source_archive_dir=archive_dir,
        )


def _positive_int(options: Options, key: str) -> int | None:
    raw = options.get_str(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(
            f"Invalid value {raw!r} for option {key!r}, must be a positive integer",
            option=key,
        )
    return value


def reader_options(options: Options) -> dict[str, str]:
    """The options passed on to ``spark.read`` (format options such as ``mode``)."""
    return {k: v for k, v in options.as_dict().items() if k.lower() not in _STREAM_ONLY_OPTIONS}


def _require_path(options: Options) -> str:
    path = options.get_str("path")
    if not path:
        raise OptionError("'path' is not specified", option="path")
    return path


# ======================================================================================
# The source log (Spark's FileStreamSourceLog)
# ======================================================================================


@dataclass(frozen=True)
class FileEntry:
    """One logged file: Spark's ``FileEntry(path, timestamp, batchId)``."""

    path: str
    timestamp: int
    batchId: int  # noqa: N815 - Spark's JSON field name

    def to_json(self) -> str:
        return json.dumps(
            {"path": self.path, "timestamp": self.timestamp, "batchId": self.batchId},
            separators=(",", ":"),
        )


class FileStreamSourceLog(MetadataLog[list[FileEntry]]):
    """``<checkpoint>/sources/<i>/N``: the files of log entry ``N``, one JSON line each.

    Entries are written as plain files. ``N.compact`` files, which Spark writes every
    ``spark.sql.streaming.fileSource.log.compactInterval`` entries and which hold all
    entries up to ``N``, are read too, so a checkpoint started by Spark can be resumed.
    """

    def serialize(self, entry: list[FileEntry]) -> str:
        return "\n".join(e.to_json() for e in entry)

    def deserialize(self, body: str, path: str) -> list[FileEntry]:
        entries = []
        for number, line in enumerate(body.split("\n"), start=2):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                entries.append(
                    FileEntry(
                        path=_require_type(data["path"], str),
                        timestamp=_require_type(data["timestamp"], int),
                        batchId=_require_type(data["batchId"], int),
                    )
                )
            except (ValueError, TypeError, KeyError) as exc:
                raise CheckpointError(
                    f"File source log file {path} is corrupt: line {number} is not a file "
                    f"entry ({exc.__class__.__name__}: {exc}): {line[:200]!r}. Restore the "
                    "checkpoint from a backup or start the query with a new checkpoint "
                    "location.",
                    path=path,
                ) from exc
        return entries

    def _names(self) -> dict[int, bool]:
        return self.entry_files()

    def batch_ids(self) -> list[int]:
        return sorted(self._names())

    def _read(self, path: str) -> list[FileEntry] | None:
        return self.read_path(path)

    def get(self, batch_id: int) -> list[FileEntry] | None:
        plain = self._read(self.batch_path(batch_id))
        if plain is not None:
            return plain
        # A compaction file holds every entry up to its id; pick out this entry's files.
        for compact_id in sorted(i for i, c in self._names().items() if c and i >= batch_id):
            entries = self._read(self.entry_path(compact_id, True))
            if entries is not None:
                return [e for e in entries if e.batchId == batch_id]
        return None

    def get_range(self, first: int, last: int) -> list[FileEntry]:
        """The files of entries ``first..last``; every entry must exist."""
        files: list[FileEntry] = []
        for batch_id in range(first, last + 1):
            entries = self.get(batch_id)
            if entries is None:
                raise CheckpointError(
                    f"File source log entry {self.batch_path(batch_id)} is missing: entries "
                    f"{first} to {last} are needed for this batch. The checkpoint is "
                    "corrupt; restore it from a backup or start with a new checkpoint "
                    "location.",
                    path=self.batch_path(batch_id),
                )
            files.extend(entries)
        return files

    def all_entries(self) -> list[FileEntry]:
        """Every logged file (Spark's ``restore()``)."""
        names = self._names()
        compacts = [i for i, c in names.items() if c]
        start = max(compacts) if compacts else 0
        entries: list[FileEntry] = []
        for batch_id in sorted(i for i in names if i >= start):
            if names[batch_id]:
                got = self._read(self.entry_path(batch_id, True))
            else:
                got = self._read(self.batch_path(batch_id))
            entries.extend(got or [])
        return entries


def _require_type(value: Any, kind: type) -> Any:
    # bool is an int in Python; a JSON true is no timestamp.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


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
        self._location = location
        self._opts = opts
        self._read_options = dict(read_options)
        if not location.is_glob and "basepath" not in {k.lower() for k in read_options}:
            # Like Spark: partition directories below the source path become columns.
            root = location.backend.stat(location.base)
            if root is not None and root.is_dir:
                self._read_options["basePath"] = location.backend.to_spark(location.base)
        glob_filter = next(
            (v for k, v in read_options.items() if k.lower() == "pathglobfilter"), None
        )
        self._name_filter = (
            _any_of([glob_to_regex(p) for p in expand_braces(glob_filter)]) if glob_filter else None
        )
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

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadLimit(
            max_files=self._opts.max_files_per_trigger,
            max_bytes=self._opts.max_bytes_per_trigger,
        )

    def latestOffset(self, start: Any, limit: ReadLimit) -> Any:  # noqa: N802
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

    def getBatch(self, start: Any, end: Any) -> DataFrame:  # noqa: N802
        first = -1 if start is None else log_offset(start)
        last = log_offset(end)
        if first > last:
            raise SourceError(
                f"Invalid file source batch range: start {start!r} is after end {end!r}."
            )
        files = self._log.get_range(first + 1, last)
        logger.info("Processing %d files from %d:%d", len(files), first + 1, last)
        if not files:
            return self._spark.createDataFrame([], self._schema)
        backend = self._location.backend
        paths = []
        for f in files:
            try:
                paths.append(escape_glob(backend.to_spark(backend.from_uri(f.path))))
            except ValueError:
                paths.append(escape_glob(f.path))  # another filesystem: hand Spark the URI
        df = (
            self._spark.read.format(self._format)
            .schema(self._schema)
            .options(**self._read_options)
            .load(paths)
        )
        if df.columns != self._schema.fieldNames():
            # Partition directories the schema does not name would add columns.
            quoted = ["`" + name.replace("`", "``") + "`" for name in self._schema.fieldNames()]
            df = df.select(*quoted)
        return df

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

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        with self._lock:
            self._available_now = self.fetch_all_files()

    def description(self) -> str:
        return f"FileStreamSource[{self._location.qualified}]"

    # -- listing -------------------------------------------------------------------------
    def fetch_all_files(self) -> list[FileStatus]:
        """Every file now in the source path, oldest first (newest first with latestFirst)."""
        if self._has_sink_metadata is None:
            if self._sink_metadata_dir() is not None:
                self._has_sink_metadata = True
            else:
                files = self._location.list_files(self._name_filter)
                # Decide once files exist; check again so a sink that wrote its log just
                # after the first check is not missed.
                if files:
                    self._has_sink_metadata = self._sink_metadata_dir() is not None
                if not self._has_sink_metadata:
                    return self._sorted(files)
        if self._has_sink_metadata:
            return self._sorted(self._files_from_sink_log())
        return self._sorted(self._location.list_files(self._name_filter))

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
        from lockgate.sinks.file import FileStreamSinkLog

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
        location = DataLocation.parse(_require_path(options))
        opts = FileStreamOptions.parse(options)
        _SourceCleaner.create(location, opts)  # checks sourceArchiveDir
        return location, opts

    def sourceSchema(  # noqa: N802
        self, spark: SparkSession, options: Options, user_schema: StructType | None
    ) -> StructType:
        from pyspark.sql.types import StringType, StructField, StructType

        location, _ = self._validate(options)
        # Like Spark: a missing directory is an error unless the path is a pattern, which
        # may only match once upstream starts writing.
        if not location.is_glob and not location.exists():
            raise AnalysisError(f"[PATH_NOT_FOUND] Path does not exist: {location.qualified}.")
        if self.name == "text":
            if user_schema is None:
                return StructType([StructField("value", StringType(), True)])
            if len(user_schema.fields) != 1 or not isinstance(
                user_schema.fields[0].dataType, StringType
            ):
                raise AnalysisError(
                    "Text data source supports only a single column of string type, and the "
                    f"given schema is {user_schema.simpleString()}."
                )
            return _as_nullable(user_schema)
        if user_schema is not None:
            schema = user_schema
        else:
            inference = spark.conf.get("spark.sql.streaming.schemaInference", "false")
            if (inference or "false").strip().lower() != "true":
                raise AnalysisError(SCHEMA_NOT_SPECIFIED)
            read_opts = reader_options(options)
            schema = (
                spark.read.format(self.name)
                .options(**read_opts)
                .load(location.backend.to_spark(location.base) + _glob_suffix(location))
                .schema
            )
        # spark.sql.streaming.fileSource.schema.forceNullable (default true): files may
        # lack any column, so every column is nullable.
        force = spark.conf.get("spark.sql.streaming.fileSource.schema.forceNullable", "true")
        return _as_nullable(schema) if (force or "true").lower() == "true" else schema

    def createSource(self, context: SourceContext) -> Source:  # noqa: N802
        location, opts = self._validate(context.options)
        return FileStreamSource(context, self.name, location, opts, reader_options(context.options))


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


__all__ = [
    "CsvFileSourceProvider",
    "DataLocation",
    "FileEntry",
    "FileSourceProvider",
    "FileStreamOptions",
    "FileStreamSource",
    "FileStreamSourceLog",
    "JsonFileSourceProvider",
    "OrcFileSourceProvider",
    "ParquetFileSourceProvider",
    "TextFileSourceProvider",
]
