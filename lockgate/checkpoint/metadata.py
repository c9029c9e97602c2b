"""``<checkpoint>/metadata``: the query id that survives restarts (Spark's StreamMetadata)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from lockgate.checkpoint.checksum import ChecksumMismatchError, read_checked, write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError, ConcurrentWriteError


@dataclass(frozen=True)
class StreamMetadata:
    id: str

    @classmethod
    def read(cls, fs: CheckpointFileSystem, path: str) -> StreamMetadata | None:
        try:
            raw = read_checked(fs, path)
        except FileNotFoundError:
            return None
        except ChecksumMismatchError as exc:
            raise ChecksumMismatchError(
                f"{exc} The query id in it cannot be trusted: restore the file from a backup or "
                "use a new checkpoint location.",
                path=path,
            ) from exc
        text = raw.decode("utf-8", errors="replace").strip()
        try:
            data = json.loads(text.split("\n", 1)[0])
            return cls(str(uuid.UUID(str(data["id"]))))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"Checkpoint metadata file {path} is corrupt ({text[:80]!r}): expected "
                '{"id":"<uuid>"}. Restore it or use a new checkpoint location.',
                path=path,
            ) from exc

    @classmethod
    def read_or_create(cls, fs: CheckpointFileSystem, path: str) -> StreamMetadata:
        existing = cls.read(fs, path)
        if existing is not None:
            return existing
        created = cls(str(uuid.uuid4()))
        try:
            write_checked(
                fs,
                path, json.dumps({"id": created.id}, separators=(",", ":")).encode("utf-8")
            )
        except ConcurrentWriteError:
            again = cls.read(fs, path)
            assert again is not None
            return again
        return created
