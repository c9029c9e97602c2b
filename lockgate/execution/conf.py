"""Conf pinning: the confs a query records in its offsets log on the first batch and
restores on restart, so a restarted query keeps the layout its checkpoint was written with
(Spark's ``OffsetSeqMetadata.relevantSQLConfs``). Micro-batch and continuous execution
both pin through :func:`pin_confs`."""

from __future__ import annotations

import logging
from typing import Any

from lockgate.state.provider import LOCKGATE_PROVIDER

PINNED_CONFS = {
    "spark.sql.shuffle.partitions": "200",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.stateStore.providerClass": LOCKGATE_PROVIDER,
    "spark.sql.streaming.aggregation.stateFormatVersion": "2",
    "spark.sql.streaming.join.stateFormatVersion": "2",
    # Spark reads a checkpoint without it as written with source evolution off, and would
    # then key the sources by position, not find the named ones' offsets and read their
    # input again from the start
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": "false",
}

# Recorded as lockgate's own value, neither restored from the checkpoint nor taken from
# the session: lockgate's state store wrote the state files, whatever the session asks.
ENGINE_OWNED = frozenset({"spark.sql.streaming.stateStore.providerClass"})


def pin_confs(
    conf: Any, recorded: dict[str, str] | None, logger: logging.Logger | None = None
) -> dict[str, str]:
    """Set each pinned conf to its value in ``recorded`` (the offsets log's metadata; None
    on a first start) and return the value of every pinned conf now, its default when unset.
    ``logger`` (if given) notes each value restored that differs from the session's."""
    pinned: dict[str, str] = {}
    for key, default in PINNED_CONFS.items():
        if key in ENGINE_OWNED:
            # what wrote the files, never the session's wish (lockgate.state.provider)
            pinned[key] = default
            continue
        if recorded is not None and key in recorded:
            value = recorded[key]
            if logger is not None and str(conf.get(key, default)) != value:
                logger.info("Restoring %s=%s from the checkpoint", key, value)
            conf.set(key, value)
        pinned[key] = str(conf.get(key, default))
    return pinned
