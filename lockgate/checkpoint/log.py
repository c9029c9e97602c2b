"""A directory of numbered, atomically written log files (Spark's HDFSMetadataLog).

Each batch ``N`` is one file named ``N`` whose first line is the format version
(``v1``). Files are never overwritten: writing a batch that exists already means
another writer is active, which is refused.
"""

from __future__ import annotations

import logging
from typing import Generic, TypeVar

from lockgate.checkpoint.checksum import (
    ChecksumMismatchError,
    delete_checked,
    read_checked,
    write_checked,
)
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def parse_version_line(text: str, max_supported: int, path: str) -> tuple[int, str]:
    """Split ``"v1\\nrest"``; reject a missing, malformed or newer version line."""
    if not text:
        raise CheckpointError(
            f"Log file {path} is empty: the checkpoint is corrupt. Restore it from a "
            "backup or start the query with a new checkpoint location.",
            path=path,
        )
    first, _, rest = text.partition("\n")
    if not first.startswith("v") or not first[1:].isdigit():
        raise CheckpointError(
            f"Log file was malformed: failed to read correct log version from {first!r} "
            f"in {path}.",
            path=path,
        )
    version = int(first[1:])
    if version <= 0:
        raise CheckpointError(
            f"Log file was malformed: failed to read correct log version from {first!r} "
            f"in {path}.",
            path=path,
        )
    if version > max_supported:
        raise CheckpointError(
            f"UnsupportedLogVersion: maximum supported log version is v{max_supported}, "
            f"but encountered v{version} in {path}. The log file was produced by a newer "
            "version and cannot be read by this version of lockgate. Please upgrade.",
            path=path,
        )
    return version, rest


COMPACT_SUFFIX = ".compact"
CORRUPT_LOG_FIX = (
    "Restore the file (and its .crc) from a backup, or start the query with a new "
    "checkpoint location."
)


class MetadataLog(Generic[T]):
    """Numbered log files under one directory. Subclasses define the format.

    Besides plain ``N`` files, a directory may hold ``N.compact`` files (Spark's
    CompactibleFileStreamLog, used by the file source and sink logs), each holding every
    entry up to ``N``; :meth:`entry_files` and :meth:`read_path` see both.
    """

    VERSION = 1

    def __init__(self, fs: CheckpointFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        fs.mkdirs(path)

    # -- format, defined by subclasses -------------------------------------------------
    def serialize(self, entry: T) -> str:
        raise NotImplementedError

    def deserialize(self, body: str, path: str) -> T:
        raise NotImplementedError

    # -- log operations -----------------------------------------------------------------
    def batch_path(self, batch_id: int) -> str:
        return self.fs.join(self.path, str(batch_id))

    def add(self, batch_id: int, entry: T) -> None:
        """Write entry ``batch_id``; refuse when it exists (a concurrent writer)."""
        text = f"v{self.version_of(entry)}\n{self.serialize(entry)}"
        write_checked(self.fs, self.batch_path(batch_id), text.encode("utf-8"))

    def read_path(self, path: str) -> T | None:
        """Read and parse one log file; None when it does not exist."""
        try:
            raw = read_checked(self.fs, path)
        except FileNotFoundError:
            return None
        except ChecksumMismatchError as exc:
            # the checksum error names the fix already
            raise ChecksumMismatchError(f"Log file {path} is corrupt: {exc}", path=path) from exc
        except OSError as exc:
            raise CheckpointError(f"Cannot read log file {path}: {exc}.", path=path) from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(
                f"Log file {path} is not UTF-8 text: it is corrupt. {CORRUPT_LOG_FIX}", path=path
            ) from exc
        version, body = parse_version_line(text, self.VERSION, path)
        return self.deserialize_version(version, body, path)

    def version_of(self, entry: T) -> int:
        """The format version ``entry`` is written in (at most ``VERSION``)."""
        return self.VERSION

    def deserialize_version(self, version: int, body: str, path: str) -> T:
        """Parse the body of a file written in format ``version`` (at most ``VERSION``)."""
        return self.deserialize(body, path)

    def get(self, batch_id: int) -> T | None:
        return self.read_path(self.batch_path(batch_id))

    def entry_files(self) -> dict[int, bool]:
        """Batch id -> whether it is stored as ``N.compact``."""
        out: dict[int, bool] = {}
        for name in self.fs.list_names(self.path):
            if name.isdigit():
                out.setdefault(int(name), False)
            elif name.endswith(COMPACT_SUFFIX) and name[: -len(COMPACT_SUFFIX)].isdigit():
                out[int(name[: -len(COMPACT_SUFFIX)])] = True
        return out

    def entry_path(self, batch_id: int, compact: bool) -> str:
        return self.batch_path(batch_id) + (COMPACT_SUFFIX if compact else "")

    def batch_ids(self) -> list[int]:
        ids = []
        for name in self.fs.list_names(self.path):
            if name.isdigit():
                ids.append(int(name))
        return sorted(ids)

    def get_latest(self) -> tuple[int, T] | None:
        for batch_id in reversed(self.batch_ids()):
            entry = self.get(batch_id)
            if entry is not None:
                return batch_id, entry
        return None

    def get_latest_batch_id(self) -> int | None:
        ids = self.batch_ids()
        return ids[-1] if ids else None

    def purge(self, threshold_batch_id: int) -> None:
        """Delete every entry below ``threshold_batch_id``."""
        for batch_id in self.batch_ids():
            if batch_id < threshold_batch_id:
                delete_checked(self.fs, self.batch_path(batch_id))

    def purge_after(self, batch_id: int) -> None:
        """Delete every entry above ``batch_id``."""
        for other in self.batch_ids():
            if other > batch_id:
                delete_checked(self.fs, self.batch_path(other))
