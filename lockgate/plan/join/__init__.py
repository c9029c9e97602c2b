"""Stream-stream joins: Spark's symmetric hash join (StreamingSymmetricHashJoinExec).

Each batch, both sides' new rows are filtered as Spark's optimizer filters them below
the join (single-side conjuncts pushed to a non-preserved side, and the inferred
``isnotnull`` of keys and of columns used by null-intolerant conjuncts; Spark evaluates
them, ``StreamJoin.pushdown``), tagged with their side, hash-partitioned together by the
join keys into the state's partitions, and one ``mapInArrow`` task per partition:

1. processes the new **left** rows: drops late rows (event time <= the previous batch's
   watermark, counted as ``numRowsDroppedByWatermark``), joins each with the right state
   rows of its key that pass the condition (marking them matched), and buffers it in the
   left state (left semi: only when it matched nothing);
2. processes the new **right** rows the same way against the left state, which now holds
   this batch's left rows too (so each new pair is produced exactly once); a right row is
   buffered unless the state watermark would evict it at once (and, for right/full
   outer, it matched);
3. evicts state rows at or below each side's state watermark; for outer joins the
   evicted rows of the preserved side(s) that never matched are emitted with nulls.

The join condition is read from Spark's analysed plan of the same join on the
templates, so column resolution and types are Spark's. The non-equality part is
evaluated in Python for a documented subset of expressions (see docs/stream-joins.md);
anything else is refused when the join is defined.

The package holds :mod:`.condition` (the join condition and its supported subset),
:mod:`.task` (the per-partition join task run on executors) and :mod:`.planner`
(:class:`StreamJoin` and its planning); names used elsewhere are re-exported here.
"""

from __future__ import annotations

from lockgate.plan.join.planner import (
    StreamJoin,
    build_stream_join,
    check_stream_join,
    make_stream_join,
)

__all__ = [
    "StreamJoin",
    "build_stream_join",
    "check_stream_join",
    "make_stream_join",
]
