"""Checksum files beside every file lockgate writes under a checkpoint.

The format is Spark 4's (``spark.sql.streaming.checkpoint.fileChecksum.enabled``,
``ChecksumCheckpointFileManager``): beside ``<file>`` a ``<file>.crc`` holding one JSON
object::

    {"algorithm":"CRC32C","value":-1559108125,"mainFileSize":412,
     "timestampMs":1764130000000,"creator":{"executorId":"","taskInfo":"lockgate"}}

``value`` is the checksum of the whole main file as a signed 32-bit integer (Java's
``int``), ``mainFileSize`` its length in bytes. Files Spark may read (the offsets and
commit logs, ``metadata``, a file sink's ``_spark_metadata``) use ``CRC32C``, the
algorithm Spark verifies with, so a Spark with checksums on accepts them, and one with
checksums off ignores the ``.crc`` files (its logs list only numbered files). State
files, which only lockgate reads, use ``CRC32`` (zlib's, much faster in Python); a
reader checks with the algorithm the file names.

A file without a ``.crc`` (a checkpoint written before lockgate wrote them) is read
unverified, as Spark does, with a debug log line.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from dataclasses import dataclass

from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError

logger = logging.getLogger(__name__)

CHECKSUM_SUFFIX = ".crc"
CRC32C = "CRC32C"
CRC32 = "CRC32"


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as ``java.util.zip.CRC32C``; unsigned."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def compute(data: bytes, algorithm: str) -> int:
    """The checksum of ``data`` as Spark stores it (a signed 32-bit int)."""
    if algorithm == CRC32C:
        return _signed(crc32c(data))
    if algorithm == CRC32:
        return _signed(zlib.crc32(data))
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


_FIX = (
    " Restore the file and its checksum file from a backup, or delete the checksum file if"
    " you know the file is right (it is then read unverified), or start the query with a"
    " new checkpoint location."
)


class ChecksumMismatchError(CheckpointError):
    """A checkpoint file does not match its checksum file: it was changed or damaged
    after it was written (Spark's CHECKPOINT_FILE_CHECKSUM_VERIFICATION_FAILED)."""


@dataclass(frozen=True)
class Checksum:
    algorithm: str
    value: int
    main_file_size: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "algorithm": self.algorithm,
                "value": self.value,
                "mainFileSize": self.main_file_size,
                "timestampMs": int(time.time() * 1000),
                "creator": {"executorId": "", "taskInfo": "lockgate"},
            },
            separators=(",", ":"),
        )


def checksum_path(path: str) -> str:
    return path + CHECKSUM_SUFFIX


def is_checksum_file(name: str) -> bool:
    return name.endswith(CHECKSUM_SUFFIX)


def write_checked(
    fs: CheckpointFileSystem,
    path: str,
    data: bytes,
    *,
    overwrite: bool = False,
    algorithm: str = CRC32C,
) -> None:
    """Write ``path`` atomically, then its ``.crc``.

    An overwrite deletes the old ``.crc`` first: a crash between the two writes leaves
    a file without a checksum (read unverified), never a file beside a stale checksum.
    A refused no-overwrite write (another writer) writes no checksum.
    """
    crc = checksum_path(path)
    if overwrite:
        fs.delete(crc)
    fs.write_atomic(path, data, overwrite=overwrite)
    checksum = Checksum(algorithm, compute(data, algorithm), len(data))
    fs.write_atomic(crc, checksum.to_json().encode("utf-8"), overwrite=True)


def verify(path: str, data: bytes, checksum_bytes: bytes) -> None:
    """Raise :class:`ChecksumMismatchError` unless ``data`` matches ``checksum_bytes``."""
    try:
        stored = json.loads(checksum_bytes.decode("utf-8"))
        algorithm = str(stored.get("algorithm", CRC32C))
        expected_value = int(stored["value"])
        expected_size = int(stored["mainFileSize"])
        computed = compute(data, algorithm)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ChecksumMismatchError(
            f"Checksum verification failed, the file may be corrupted. File: {path}. Its "
            f"checksum file {checksum_path(path)} is unreadable ({exc}), so the file cannot "
            "be verified." + _FIX,
            path=path,
        ) from exc
    if computed != expected_value or len(data) != expected_size:
        raise ChecksumMismatchError(
            "Checksum verification failed, the file may be corrupted. File: "
            f"{path}. Expected (file size: {expected_size}, checksum: {expected_value}), "
            f"Computed (file size: {len(data)}, checksum: {computed})." + _FIX,
            path=path,
        )


def read_checked(fs: CheckpointFileSystem, path: str) -> bytes:
    """The bytes of ``path``, verified against its ``.crc`` when there is one.

    Raises ``FileNotFoundError`` when ``path`` does not exist and
    :class:`ChecksumMismatchError` when it does not match its checksum.
    """
    data = fs.read_bytes(path)
    try:
        checksum_bytes = fs.read_bytes(checksum_path(path))
    except FileNotFoundError:
        logger.debug("No checksum file found for %s, hence no checksum verification.", path)
        return data
    verify(path, data, checksum_bytes)
    return data


def delete_checked(fs: CheckpointFileSystem, path: str) -> None:
    """Delete ``path`` and its ``.crc``, the checksum first as Spark does (a crash
    between leaves a file read unverified, never a checksum without its file)."""
    fs.delete(checksum_path(path))
    fs.delete(path)


__all__ = [
    "CHECKSUM_SUFFIX",
    "CRC32",
    "CRC32C",
    "Checksum",
    "ChecksumMismatchError",
    "checksum_path",
    "compute",
    "crc32c",
    "delete_checked",
    "is_checksum_file",
    "read_checked",
    "verify",
    "write_checked",
]
