"""Paths, URIs and globs of file sources (shared with :mod:`lockgate.sinks.file`).

Holds Spark's hidden-name filter (:func:`is_hidden_path_name`), Hadoop glob expansion,
escaping and matching (:func:`expand_braces`, :func:`escape_glob`, :func:`glob_to_regex`),
:class:`FileStatus`, the data filesystem backends (:class:`LocalBackend`,
:class:`ArrowBackend`) and :class:`DataLocation`, a user-given path or glob.
"""

from __future__ import annotations

import os
import re
import stat as stat_module
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from lockgate.checkpoint.fs import ArrowFileSystem, CheckpointFileSystem, LocalFileSystem
from lockgate.errors import OptionError, SourceError

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
    include = name.startswith(("_common_metadata", "_metadata"))
    return exclude and not include


def is_data_file_name(name: str) -> bool:
    """Whether a listed file is data: not hidden, and not Parquet's ``_metadata`` or
    ``_common_metadata`` summary (which :func:`is_hidden_path_name` keeps, for Parquet)."""
    return not (
        (name.startswith("_") and "=" not in name)
        or name.startswith(".")
        or name.endswith("._COPYING_")
    )


def _unescape_path_name(text: str) -> str:
    """Spark's ``unescapePathName``: ``%XX`` (two hex digits) is the character XX."""
    return re.sub(r"%([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def parse_partition_column(name: str) -> tuple[str, str] | None:
    """``key=value`` -> ``(key, raw value)``; ``None`` for a directory name without ``=``.

    Raises Spark's ``EMPTY_PARTITION_COLUMN_NAME`` / ``EMPTY_PARTITION_COLUMN_VALUE``.
    """
    at = name.find("=")
    if at == -1:
        return None
    key = _unescape_path_name(name[:at])
    if not key:
        raise SourceError(
            f"[EMPTY_PARTITION_COLUMN_NAME] Found an empty partition column name in the path "
            f"segment '{name}'. Each partition directory must have a non-empty column name "
            "before the '=' sign (e.g., 'col=value')."
        )
    value = name[at + 1 :]
    if not value:
        raise SourceError(
            f"[EMPTY_PARTITION_COLUMN_VALUE] Found an empty partition column value in the path "
            f"segment '{name}'. Each partition directory must have a non-empty value after "
            "the '=' sign (e.g., 'col=value')."
        )
    return key, value


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
class Listing:
    """What a file stream source reads now: :meth:`DataLocation.list_files`."""

    files: list[FileStatus]
    partition_columns: tuple[str, ...]
    """Partition column names found in ``key=value`` directories (empty if none)."""


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
        # Hadoop's globber applies no hidden-name filter: ``dir/*`` matches ``_x`` too.
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
            if not regex.fullmatch(entry.name):
                continue
            if rest and not entry.is_dir:
                continue
            yield from self._match(entry.path, rest)

    def list_files(
        self,
        name_filter: re.Pattern[str] | None = None,
        *,
        recursive: bool = False,
        base_path: str | None = None,
        case_sensitive: bool = False,
    ) -> Listing:
        """The files a file stream source reads now, by Spark's rules.

        As Spark's ``FileStreamSource`` (an ``InMemoryFileIndex`` over the globbed paths,
        then ``allFiles``): every root (the path, or each glob match; a glob matches hidden
        names too) is listed recursively, skipping hidden directories and non-data files
        and keeping the files ``name_filter`` (``pathGlobFilter``) matches. Then

        * with ``recursive`` (``recursiveFileLookup``), every listed file;
        * when some directory holding files is a ``key=value`` partition directory (below
          ``base_path``, or else below the root), every listed file, after Spark's checks
          that the partition directories agree (``CONFLICTING_DIRECTORY_STRUCTURES``,
          ``CONFLICTING_PARTITION_COLUMN_NAMES``);
        * otherwise only the root files and the files directly inside a root directory:
          files in plain subdirectories are not read.

        One recursive listing per call; the partition checks work on the directory names.
        """
        files: list[tuple[str, FileStatus]] = []  # (parent directory, file)
        top: list[FileStatus] = []
        roots: list[str] = []
        seen: set[str] = set()
        for root in self.roots():
            entry = self.backend.stat(root)
            if entry is None:
                continue
            if entry.is_dir:
                roots.append(root)
                for parent, status in self._walk(root, name_filter):
                    if status.path not in seen:
                        seen.add(status.path)
                        files.append((parent, status))
                        if parent == root:
                            top.append(status)
            elif is_data_file_name(entry.name) and (
                name_filter is None or name_filter.fullmatch(entry.name)
            ):
                parent = _parent(root) or root
                roots.append(parent)
                if root not in seen:
                    seen.add(root)
                    status = self._status(entry)
                    files.append((parent, status))
                    top.append(status)
        if recursive:
            return Listing([f for _, f in files], ())
        bases = {_strip(base_path)} if base_path else set(roots)
        columns_by_dir: dict[str, list[str]] = {}
        discovered: set[str] = set()
        for leaf in sorted({parent for parent, _ in files}):
            columns, base = self._parse_partition(leaf, bases)
            if base is not None:
                discovered.add(self.backend.to_spark(base))
            if columns:
                columns_by_dir[leaf] = columns
        if not columns_by_dir:
            return Listing(top, ())
        if len({d.lower() for d in discovered}) > 1:
            paths = "".join(f"\n\t{d}" for d in sorted(discovered))
            raise SourceError(
                "[CONFLICTING_DIRECTORY_STRUCTURES] Conflicting directory structures detected.\n"
                f"Suspicious paths:\n{paths}\n\n"
                'If provided paths are partition directories, please set "basePath" in the '
                "options of the data source to specify the root directory of the table.\n"
                "If there are multiple root directories, please load them separately and "
                "then union them."
            )
        lists: dict[tuple[str, ...], list[str]] = {}
        for leaf, columns in columns_by_dir.items():
            key = tuple(columns if case_sensitive else (c.lower() for c in columns))
            lists.setdefault(key, []).append(leaf)
        if len(lists) > 1:
            names = "".join(
                f"\n\tPartition column name list #{i}: {', '.join(k)}" for i, k in enumerate(lists)
            )
            suspicious = "".join(
                f"\n\t{self.backend.to_spark(d)}" for k in sorted(lists, key=len) for d in lists[k]
            )
            raise SourceError(
                "[CONFLICTING_PARTITION_COLUMN_NAMES] Conflicting partition column names "
                f"detected:\n{names}\n\n"
                "For partitioned table directories, data files should only live in leaf "
                "directories.\nAnd directories at the same level should have the same "
                "partition column name.\nPlease check the following directories for "
                f"unexpected files or inconsistent partition column names:\n{suspicious}"
            )
        first = next(iter(columns_by_dir.values()))
        return Listing([f for _, f in files], tuple(first))

    def _parse_partition(self, leaf: str, bases: set[str]) -> tuple[list[str], str | None]:
        """Spark's ``parsePartition`` on a directory holding files: its partition column
        names (innermost last) and the directory partition discovery stopped at.

        Walks up from ``leaf`` until a base path, or until a plain directory above some
        ``key=value`` ones; a ``_temporary`` directory on the way makes it no partition
        and no base. Without any ``key=value`` directory the base is ``leaf`` itself.
        """
        columns: list[str] = []
        current = leaf
        while True:
            name = current.rstrip("/").rsplit("/", 1)[-1]
            if name.lower() == "_temporary":
                return [], None
            if current in bases:
                break
            column = parse_partition_column(name)
            if column is not None:
                columns.append(column[0])
            parent = _parent(current)
            if (column is None and columns) or parent is None:
                break
            current = parent
        if not columns:
            return [], leaf
        columns.reverse()
        return columns, current

    def _walk(
        self, root: str, name_filter: re.Pattern[str] | None
    ) -> Iterator[tuple[str, FileStatus]]:
        stack = [root]
        while stack:
            directory = stack.pop()
            for entry in self.backend.list_dir(directory):
                if entry.is_dir:
                    if not is_hidden_path_name(entry.name):
                        stack.append(entry.path)
                elif is_data_file_name(entry.name) and (
                    name_filter is None or name_filter.fullmatch(entry.name)
                ):
                    yield directory, self._status(entry)

    def _status(self, entry: _Entry) -> FileStatus:
        return FileStatus(self.backend.to_uri(entry.path), entry.path, entry.size, entry.mtime_ms)

    def exists(self) -> bool:
        return self.backend.stat(self.base) is not None


def _strip(path: str) -> str:
    return path.rstrip("/") or path


def _parent(path: str) -> str | None:
    """The parent of a backend path; ``None`` at the top (``/``, or a bucket)."""
    head, sep, _ = path.rstrip("/").rpartition("/")
    if not sep:
        return None
    return head or "/"


def _first_glob(parts: list[str]) -> int:
    for i, part in enumerate(parts):
        if has_glob(part):
            return i
    return len(parts)
