"""``<checkpoint>/state/<operatorId>/_metadata/metadata``: Spark's operator metadata.

Spark's stateful operators write this file (``OperatorStateMetadataV1``) when a query
runs; Spark's ``state-metadata`` source, its state data source and its offline state
tools read it, and refuse a checkpoint without it
(``STATE_REWRITER_INVALID_CHECKPOINT.MISSING_OPERATOR_METADATA``). lockgate writes the
same file, in Spark's format (a version line ``v1``, then one JSON object), beside its
own state schema file, once per run, so that those tools see the same operators in a
lockgate checkpoint as in a native one of the same query.

The file describes Spark's state stores, not lockgate's files: a stream-stream join is
listed with Spark's four stores (``left-keyToNumValues``, ...) although lockgate keeps
one store per side, because that is what Spark's readers expect of ``symmetricHashJoin``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lockgate.checkpoint.checksum import read_checked, write_checked
from lockgate.checkpoint.fs import CheckpointFileSystem

VERSION_LINE = "v1"

_JOIN_STORES = tuple(
    f"{side}-{kind}" for side in ("left", "right") for kind in ("keyToNumValues", "keyWithIndexToValue")
)
# Spark's session window store keys its rows by (grouping keys, session start) and
# scans by the grouping keys: one prefix column in its metadata.
_PREFIX_KEY_COLUMNS = {"sessionWindowStateStoreSaveExec": 1}


@dataclass(frozen=True)
class OperatorMetadata:
    """What Spark's ``OperatorStateMetadataV1`` holds for one stateful operator."""

    operator_id: int
    operator_name: str
    num_partitions: int

    def store_names(self) -> tuple[str, ...]:
        return _JOIN_STORES if self.operator_name == "symmetricHashJoin" else ("default",)

    def to_bytes(self) -> bytes:
        prefix = _PREFIX_KEY_COLUMNS.get(self.operator_name, 0)
        body = {
            "operatorInfo": {"operatorId": self.operator_id, "operatorName": self.operator_name},
            "stateStoreInfo": [
                {"storeName": name, "numColsPrefixKey": prefix, "numPartitions": self.num_partitions}
                for name in self.store_names()
            ],
        }
        return f"{VERSION_LINE}\n{json.dumps(body, separators=(',', ':'))}".encode()


def metadata_path(fs: CheckpointFileSystem, state_root: str, operator_id: int) -> str:
    return fs.join(state_root, str(operator_id), "_metadata", "metadata")


def write_operator_metadata(fs: CheckpointFileSystem, state_root: str, metadata: OperatorMetadata) -> None:
    """Write the operator's metadata file (atomically, with its ``.crc``) unless it
    already holds exactly this content, as Spark rewrites it on each run."""
    path = metadata_path(fs, state_root, metadata.operator_id)
    data = metadata.to_bytes()
    try:
        if read_checked(fs, path) == data:
            return
    except (OSError, ValueError):
        # missing, unreadable or failing its checksum: it is ours to rewrite, since
        # nothing of lockgate's reads it back
        pass
    write_checked(fs, path, data, overwrite=True)
