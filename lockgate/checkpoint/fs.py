"""One filesystem abstraction for everything written under a checkpoint.

Local paths go straight to ``os`` (the fast path: an atomic write with fsync costs well
under a millisecond); any other URI (``s3://``, ``gs://``, ``hdfs://``, ...) goes through
:mod:`pyarrow.fs`, so checkpoints can live on storage shared by a cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from urllib.parse import urlparse

from lockgate.errors import CheckpointError, ConcurrentWriteError


class CheckpointFileSystem(ABC):
    """The operations the checkpoint logs and state stores need, with atomic writes."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abstractmethod
    def mkdirs(self, path: str) -> None: ...

    @abstractmethod
    def list_names(self, path: str) -> list[str]:
        """Names of the entries directly inside ``path`` (empty when it does not exist)."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes: ...

    @abstractmethod
    def write_atomic(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        """Write ``data`` so readers see all of it or nothing.

        Without ``overwrite``, an existing file is never replaced: a second writer of the
        same path gets :class:`~lockgate.errors.ConcurrentWriteError`.
        """

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file; a missing file is not an error."""

    @abstractmethod
    def delete_recursive(self, path: str) -> None: ...

    @abstractmethod
    def rename(self, src: str, dst: str) -> None: ...

    @abstractmethod
    def size_and_mtime(self, path: str) -> tuple[int, int]:
        """Size in bytes and modification time in epoch millis."""

    def join(self, *parts: str) -> str:
        return "/".join(p.rstrip("/") if i == 0 else p.strip("/") for i, p in enumerate(parts))


class LocalFileSystem(CheckpointFileSystem):
    """A local (or locally mounted shared) directory tree."""

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def mkdirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def list_names(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_atomic(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                try:
                    # link() refuses an existing target: the no-overwrite check and the
                    # publish are one atomic step, so two writers cannot both win.
                    os.link(tmp, path)
                except FileExistsError:
                    raise ConcurrentWriteError(
                        f"{path} already exists: another query run is writing to this "
                        "checkpoint concurrently. Make sure only one run of a query uses "
                        "a checkpoint location at a time.",
                        path=path,
                    ) from None
                os.unlink(tmp)
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def delete_recursive(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def rename(self, src: str, dst: str) -> None:
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        os.replace(src, dst)

    def size_and_mtime(self, path: str) -> tuple[int, int]:
        st = os.stat(path)
        return st.st_size, int(st.st_mtime * 1000)


class ArrowFileSystem(CheckpointFileSystem):
    """Any filesystem :mod:`pyarrow.fs` reaches (object stores, HDFS).

    Object stores have no atomic rename-if-absent: a new file is written under a
    temporary name and moved into place after checking that the target is absent.
    Run one query per checkpoint at a time, as Spark also requires on such stores.
    """

    def __init__(self, fs: object) -> None:
        import pyarrow.fs as pafs

        self._pafs = pafs
        self._fs: pafs.FileSystem = fs  # type: ignore[assignment]

    def _info(self, path: str):  # type: ignore[no-untyped-def]
        return self._fs.get_file_info(path)

    def exists(self, path: str) -> bool:
        return self._info(path).type != self._pafs.FileType.NotFound

    def is_dir(self, path: str) -> bool:
        return self._info(path).type == self._pafs.FileType.Directory

    def mkdirs(self, path: str) -> None:
        self._fs.create_dir(path, recursive=True)

    def list_names(self, path: str) -> list[str]:
        if not self.is_dir(path):
            return []
        selector = self._pafs.FileSelector(path, recursive=False)
        return [info.base_name for info in self._fs.get_file_info(selector)]

    def read_bytes(self, path: str) -> bytes:
        with self._fs.open_input_stream(path) as f:
            return f.read()

    def write_atomic(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        directory, name = path.rsplit("/", 1)
        self._fs.create_dir(directory, recursive=True)
        tmp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
        with self._fs.open_output_stream(tmp) as f:
            f.write(data)
        if not overwrite and self.exists(path):
            self.delete(tmp)
            raise ConcurrentWriteError(
                f"{path} already exists: another query run is writing to this checkpoint "
                "concurrently.",
                path=path,
            )
        self._fs.move(tmp, path)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(path)

    def delete_recursive(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(path)

    def rename(self, src: str, dst: str) -> None:
        if "/" in dst:
            self._fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
        self._fs.move(src, dst)

    def size_and_mtime(self, path: str) -> tuple[int, int]:
        info = self._info(path)
        mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
        return int(info.size or 0), mtime


_LOCAL = LocalFileSystem()


def resolve_filesystem(location: str) -> tuple[CheckpointFileSystem, str]:
    """Return the filesystem for ``location`` and the path to use with it.

    ``/tmp/ck``, ``relative/dir`` and ``file:///tmp/ck`` are local; every other scheme
    is handed to :func:`pyarrow.fs.FileSystem.from_uri`.
    """
    if not location:
        raise CheckpointError("Checkpoint location must not be empty.", path=location)
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = parsed.path if parsed.scheme == "file" else location
        return _LOCAL, os.path.abspath(os.path.expanduser(path))
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(location)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise CheckpointError(
            f"Cannot open checkpoint location {location!r}: {exc}. Use a local path or a "
            "URI that pyarrow.fs supports (s3://, gs://, hdfs://).",
            path=location,
        ) from exc
    return ArrowFileSystem(fs), path


def qualified_uri(fs: CheckpointFileSystem, path: str) -> str:
    """A path Spark's readers accept for files under ``path``."""
    if isinstance(fs, LocalFileSystem):
        return "file://" + path
    return path
