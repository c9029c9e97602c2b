"""The join of one batch's left rows with its right rows, in Arrow.

An inner join's task pairs a batch's right rows with the left rows of the same batch
(the left side goes first: its rows are in the state when the right side probes it).
When neither side has single-side conditions, those pairs are a hash join of the two
sides' Arrow columns on the join key, and the join condition a vectorized filter over
them: no Python object per row, and none per pair. The rows probing the rows of earlier
batches still go through the state's index in Python (:mod:`lockgate.plan.join.task`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lockgate.plan.join.condition import LEFT

ArrowExpr = Callable[[pa.Table], Any]
"""An expression over a table of pairs (``__l<i>`` and ``__r<i>`` columns): an Arrow
array, or a scalar for a literal."""

_CMP = {
    "=": pc.equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _comparable(t: pa.DataType) -> bool:
    """Types Arrow compares as the task compares their Python values (not floats: the
    task orders NaN above every number and -0.0 as 0.0, as Spark does)."""
    return (
        pa.types.is_integer(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
    )


def compile_arrow(
    expr: tuple[Any, ...], types: tuple[list[pa.DataType], list[pa.DataType]]
) -> ArrowExpr | None:
    """:func:`~lockgate.plan.join.condition.compile_expr` over whole columns of pairs:
    SQL's three-valued logic as Arrow's Kleene kernels; None for an expression it does
    not cover (the task evaluates those row by row). ``types`` are each side's column
    types."""
    tag = expr[0]
    if tag == "attr":
        _, side, index, kind = expr
        t = types[side][index]
        if not _comparable(t) or (kind == "ts") != pa.types.is_timestamp(t):
            return None
        name = f"__{'lr'[side]}{index}"
        if kind == "ts":
            return lambda table: table.column(name).cast(pa.int64())
        return lambda table: table.column(name)
    if tag == "lit":
        value, kind = expr[1], expr[2]
        if kind not in ("ts", "interval", "other") or isinstance(value, float):
            return None
        scalar = pa.scalar(value, pa.int64()) if kind in ("ts", "interval") else pa.scalar(value)
        return lambda table: scalar
    if tag == "cmp":
        op, a, b = expr[1], compile_arrow(expr[2], types), compile_arrow(expr[3], types)
        if a is None or b is None or op not in _CMP:
            return None
        fn = _CMP[op]
        return lambda table: fn(a(table), b(table))
    if tag in ("and", "or"):
        a, b = compile_arrow(expr[1], types), compile_arrow(expr[2], types)
        if a is None or b is None:
            return None
        kleene = pc.and_kleene if tag == "and" else pc.or_kleene
        return lambda table: kleene(a(table), b(table))
    if tag == "not":
        a = compile_arrow(expr[1], types)
        return None if a is None else (lambda table: pc.invert(a(table)))
    if tag == "tadd":
        a, b = compile_arrow(expr[1], types), compile_arrow(expr[2], types)
        if a is None or b is None:
            return None
        return lambda table: pc.add(a(table), b(table))
    return None


def compile_condition(
    terms: tuple[Any, ...], types: tuple[list[pa.DataType], list[pa.DataType]]
) -> Callable[[pa.Table], pa.Array] | None:
    """The mask of the pairs meeting every term (null counts as not met, as
    :func:`~lockgate.plan.join.condition.all_true` has it); None if a term is not
    covered by :func:`compile_arrow`."""
    fns = [compile_arrow(term, types) for term in terms]
    if any(f is None for f in fns):
        return None

    def mask(table: pa.Table) -> pa.Array:
        result = pa.array([True] * table.num_rows, pa.bool_())
        for f in fns:
            assert f is not None
            value = f(table)
            if isinstance(value, pa.Scalar):
                value = pa.array([value.as_py()] * table.num_rows, pa.bool_())
            result = pc.and_(result, pc.fill_null(value, False))
        return result

    return mask


def key_joinable(t: pa.DataType) -> bool:
    """A join key type whose Arrow hash join matches exactly the keys the state's dict
    matches (no floats: the task's keys are Spark's normalized floats; no nested
    types)."""
    return _comparable(t) and not pa.types.is_boolean(t)


def batch_pairs(
    left: pa.Table, right: pa.Table, key_names: list[str], widths: tuple[int, int]
) -> pa.Table:
    """Every (left row, right row) of one batch with equal join keys (no null key
    matches): the ``__l<i>``/``__r<i>`` columns and each row's position in its side
    (``__lpos``, ``__rpos``), in the order of the right rows, then of the left."""
    lcols = key_names + [f"__l{i}" for i in range(widths[LEFT])]
    rcols = key_names + [f"__r{i}" for i in range(widths[1 - LEFT])]
    lt = left.select(lcols).append_column("__lpos", pa.array(range(left.num_rows), pa.int64()))
    rt = right.select(rcols).append_column("__rpos", pa.array(range(right.num_rows), pa.int64()))
    joined = lt.join(rt, keys=key_names, join_type="inner", use_threads=False)
    if joined.num_rows > 1:
        joined = joined.take(
            pc.sort_indices(joined, [("__rpos", "ascending"), ("__lpos", "ascending")])
        )
    return joined
