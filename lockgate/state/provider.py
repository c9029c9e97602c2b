"""Which state store provider wrote a checkpoint's state, and what lockgate does with
``spark.sql.streaming.stateStore.providerClass``.

lockgate has one state store (Arrow delta and snapshot files, ``docs/state-store.md``)
and cannot run Spark's providers (they are JVM classes run by Spark's own stateful
operators). So:

* a session whose ``providerClass`` names another provider (RocksDB, as native
  ``transformWithState`` users set it, or Spark's HDFS-backed default set explicitly)
  gets a warning at ``start()``, and lockgate writes its own files anyway;
* the offsets log records :data:`LOCKGATE_PROVIDER`, the provider that wrote the files,
  never the session's value: Spark's providers cannot read lockgate's files, so naming
  one there would make native Spark misread them as corrupt;
* a checkpoint whose state Spark's own engine wrote is refused at ``start()`` with
  :class:`SparkStateCheckpointError`, naming the checkpoint, the provider and the options.
"""

from __future__ import annotations

import logging
from typing import Any

from lockgate.checkpoint.fs import CheckpointFileSystem
from lockgate.errors import CheckpointError

logger = logging.getLogger(__name__)

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
LOCKGATE_PROVIDER = "lockgate.state.ArrowDeltaStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"

_SPARK_STATE_SUFFIXES = (".delta", ".snapshot", ".zip", ".changelog", ".sst")


class SparkStateCheckpointError(CheckpointError):
    """The checkpoint's state was written by native Spark's state store, which lockgate
    cannot read."""


def warn_unhonoured_provider(conf: Any, query: str) -> str | None:
    """Log one warning when the session asks for a state store provider other than
    lockgate's; return the value asked for (None when unset or lockgate's)."""
    try:
        asked = conf.get(PROVIDER_CONF, None)
    except Exception:  # noqa: BLE001 - a conf we cannot read is a conf we cannot honour
        return None
    if asked is None or str(asked).strip() in ("", LOCKGATE_PROVIDER):
        return None
    logger.warning(
        "%s: %s=%s is not honoured: lockgate keeps stateful operators' state in its own "
        "store (Arrow delta and snapshot files, %s), which it records in the checkpoint; "
        "Spark's state store providers run only in Spark's own streaming engine. See "
        "docs/state-store.md.",
        query,
        PROVIDER_CONF,
        asked,
        LOCKGATE_PROVIDER,
    )
    return str(asked)


def check_state_written_by_lockgate(
    fs: CheckpointFileSystem, checkpoint_root: str, recorded_provider: str | None
) -> None:
    """Refuse a checkpoint whose state native Spark wrote.

    lockgate's state has its schema file ``state/<op>/_metadata/schema`` (lockgate's
    JSON) beside the partitions; Spark keeps its schema per partition
    (``state/<op>/<partition>/_metadata/schema``) or under ``_stateSchema`` and has no such
    file. An operator directory with Spark's state files and no lockgate schema file is
    Spark's. ``recorded_provider`` is the provider class of the offsets log's last entry.
    """
    state_root = fs.join(checkpoint_root, "state")
    if not fs.is_dir(state_root):
        return
    for op in sorted(n for n in fs.list_names(state_root) if n.isdigit()):
        op_dir = fs.join(state_root, op)
        schema = fs.join(op_dir, "_metadata", "schema")
        if fs.exists(schema):
            continue
        if _has_spark_state(fs, op_dir):
            if recorded_provider == LOCKGATE_PROVIDER:
                # lockgate wrote this state (Spark's engine never records lockgate's
                # provider): its schema file was lost, not Spark's state found
                raise CheckpointError(
                    f"State schema file {schema} of stateful operator {op} is missing, "
                    "though the offsets log records that lockgate's state store wrote the "
                    "state beside it: the checkpoint is incomplete. Restore the file (with "
                    "its .crc) from a backup, or start the query with a new checkpoint "
                    "location.",
                    path=schema,
                )
            raise _spark_state_error(checkpoint_root, op, recorded_provider)


def _has_spark_state(fs: CheckpointFileSystem, op_dir: str) -> bool:
    for name in fs.list_names(op_dir):
        if name == "_stateSchema":
            return True
        if not name.isdigit():
            continue
        partition = fs.join(op_dir, name)
        if not fs.is_dir(partition):
            continue
        names = fs.list_names(partition)
        if "_metadata" in names or any(n.endswith(_SPARK_STATE_SUFFIXES) for n in names):
            return True
    return False


def _spark_state_error(checkpoint_root: str, op: str, recorded: str | None) -> SparkStateCheckpointError:
    provider = recorded or f"default provider ({HDFS_PROVIDER})"
    return SparkStateCheckpointError(
        f"Checkpoint {checkpoint_root} holds state written by native Spark Structured "
        f"Streaming's state store ({provider}; stateful operator {op}, "
        f"{checkpoint_root}/state/{op}), which lockgate cannot read: lockgate keeps state in "
        "its own files (docs/state-store.md). Options: keep running this query with "
        "spark.readStream (native Spark) on this checkpoint; or start the lockgate query "
        "with a new checkpoint location (its state starts empty, so set the sources' "
        "starting offsets to where the native query stopped and expect aggregates to "
        "restart from there); or, to move the state over, let the native query finish its "
        "windows (e.g. a final availableNow run after the input stops) before switching.",
        path=checkpoint_root,
    )
