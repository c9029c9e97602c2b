"""The file sink's log, ``<path>/_spark_metadata``, in the format of Spark's
``FileStreamSinkLog`` (see :mod:`lockgate.sinks.file` for how the sink writes it).
The file sink writes it; the file source reads it to see only committed files of a
directory a sink writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lockgate.checkpoint.checksum import write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.checkpoint.log import MetadataLog
from lockgate.errors import CheckpointError, OptionError

METADATA_DIR = "_spark_metadata"
COMPACT_SUFFIX = ".compact"
DEFAULT_COMPACT_INTERVAL = 10
COMPACT_INTERVAL_CONF = "spark.sql.streaming.fileSink.log.compactInterval"


@dataclass(frozen=True)
class SinkFileStatus:
    """One committed file: Spark's ``SinkFileStatus``."""

    path: str
    size: int
    isDir: bool
    modificationTime: int
    blockReplication: int = 1
    blockSize: int = 33554432
    action: str = "add"

    def to_json(self) -> str:
        return json.dumps(
            {
                "path": self.path,
                "size": self.size,
                "isDir": self.isDir,
                "modificationTime": self.modificationTime,
                "blockReplication": self.blockReplication,
                "blockSize": self.blockSize,
                "action": self.action,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_dict(cls, data: Any) -> SinkFileStatus:
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {data!r}")
        path = data["path"]
        if not isinstance(path, str):
            raise TypeError(f"'path' must be a string, got {path!r}")
        action = data.get("action", "add")
        if action not in ("add", "delete"):
            raise ValueError(f"unknown action {action!r}")
        return cls(
            path=path,
            size=_as_int(data.get("size", 0)),
            isDir=bool(data.get("isDir", False)),
            modificationTime=_as_int(data.get("modificationTime", 0)),
            blockReplication=_as_int(data.get("blockReplication", 1)),
            blockSize=_as_int(data.get("blockSize", 33554432)),
            action=action,
        )


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def derive_compact_interval(default_interval: int, latest_compact_id: int) -> int:
    """Spark's ``CompactibleFileStreamLog.deriveCompactInterval`` (SPARK-18187).

    With one compaction file, pick an interval compatible with it (a divisor of
    ``latest_compact_id + 1``) that is at least the configured one where possible.
    """
    n = latest_compact_id + 1
    if n <= default_interval:
        return n
    if default_interval < n // 2:
        for candidate in range(default_interval, n // 2 + 1):
            if n % candidate == 0:
                return candidate
        return n
    return n


class FileStreamSinkLog(MetadataLog[list[SinkFileStatus]]):
    """``<path>/_spark_metadata``: which files each batch committed."""

    def __init__(
        self,
        fs: CheckpointFileSystem,
        path: str,
        default_compact_interval: int = DEFAULT_COMPACT_INTERVAL,
        *,
        create: bool = True,
    ) -> None:
        if create:
            super().__init__(fs, path)
        else:
            # Readers must not create the directory: its presence is what tells Spark's
            # readers that the directory is a sink's output.
            self.fs = fs
            self.path = path
        if default_compact_interval <= 0:
            raise OptionError(
                f"{COMPACT_INTERVAL_CONF} must be positive, got {default_compact_interval!r}.",
                option=COMPACT_INTERVAL_CONF,
            )
        self.default_compact_interval = default_compact_interval

    # -- format --------------------------------------------------------------------------
    def serialize(self, entry: list[SinkFileStatus]) -> str:
        return "\n".join(s.to_json() for s in entry)

    def deserialize(self, body: str, path: str) -> list[SinkFileStatus]:
        out = []
        for number, line in enumerate(body.split("\n"), start=2):
            if not line.strip():
                continue
            try:
                out.append(SinkFileStatus.from_dict(json.loads(line)))
            except (ValueError, TypeError, KeyError) as exc:
                raise CheckpointError(
                    f"File sink log file {path} is corrupt: line {number} is not a file "
                    f"status ({exc.__class__.__name__}: {exc}): {line[:200]!r}. Restore it "
                    "from a backup; the output directory cannot be read reliably without it.",
                    path=path,
                ) from exc
        return out

    # -- files ---------------------------------------------------------------------------
    def _names(self) -> dict[int, bool]:
        return self.entry_files()

    def batch_ids(self) -> list[int]:
        return sorted(self._names())

    def _file(self, batch_id: int, compact: bool) -> str:
        return self.entry_path(batch_id, compact)

    def _read(self, path: str) -> list[SinkFileStatus] | None:
        return self.read_path(path)

    def get(self, batch_id: int) -> list[SinkFileStatus] | None:
        """The statuses stored for ``batch_id`` (everything up to it, for a compaction)."""
        compact = self._read(self._file(batch_id, True))
        return compact if compact is not None else self._read(self._file(batch_id, False))

    @cached_property
    def compact_interval(self) -> int:
        """Spark's ``compactInterval``: from existing compaction files, else the default."""
        compacts = sorted((i for i, c in self._names().items() if c), reverse=True)
        if len(compacts) >= 2:
            return compacts[0] - compacts[1]
        if len(compacts) == 1:
            return derive_compact_interval(self.default_compact_interval, compacts[0])
        return self.default_compact_interval

    def is_compaction_batch(self, batch_id: int) -> bool:
        return (batch_id + 1) % self.compact_interval == 0

    def all_files(self, up_to: int | None = None) -> list[SinkFileStatus]:
        """The live files of batches ``0..up_to`` (all batches by default)."""
        names = self._names()
        ids = sorted(i for i in names if up_to is None or i <= up_to)
        if not ids:
            return []
        latest = ids[-1]
        compacts = [i for i in ids if names[i]]
        start = compacts[-1] if compacts else 0
        statuses: list[SinkFileStatus] = []
        for batch_id in range(start, latest + 1):
            got = self._read(self._file(batch_id, names.get(batch_id, False)))
            if got is None:
                path = self._file(batch_id, False)
                raise CheckpointError(
                    f"File sink log entry {path} doesn't exist (latestId: {latest}): the "
                    f"sink's {METADATA_DIR} directory is incomplete. Restore it from a backup.",
                    path=path,
                )
            statuses.extend(got)
        deleted = {s.path for s in statuses if s.action == "delete"}
        return [s for s in statuses if s.action == "add" and s.path not in deleted]

    def add_batch(self, batch_id: int, statuses: list[SinkFileStatus]) -> None:
        """Commit ``batch_id``; as ``N.compact`` with all earlier files on a compaction batch."""
        compact = self.is_compaction_batch(batch_id)
        if compact and batch_id > 0:
            content = self.all_files(up_to=batch_id - 1) + statuses
        else:
            content = statuses
        text = f"v{self.VERSION}\n{self.serialize(content)}"
        write_checked(self.fs, self._file(batch_id, compact), text.encode("utf-8"))
