"""The file source log (Spark's ``FileStreamSourceLog``) and its :class:`FileEntry`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import CheckpointError


@dataclass(frozen=True)
class FileEntry:
    """One logged file: Spark's ``FileEntry(path, timestamp, batchId)``."""

    path: str
    timestamp: int
    batchId: int

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
        ids = sorted(i for i in names if i >= start)
        # Entries are numbered from 0 and never deleted after the last compaction (Spark
        # deletes only the entries a compaction holds): a gap is an entry lost, whose
        # files would be read again as new. Spark's restore() fails on it too ("... doesn't
        # exist (latestId: ..., compactInterval: ...)").
        missing = sorted(set(range(start, ids[-1] + 1)) - set(ids)) if ids else []
        if missing:
            path = self.batch_path(missing[0])
            raise CheckpointError(
                f"File source log entry {path} doesn't exist (latestId: {ids[-1]}): the "
                "files it listed would be read again. The checkpoint is corrupt; restore the "
                "entry from a backup or start the query with a new checkpoint location.",
                path=path,
            )
        for batch_id in ids:
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
