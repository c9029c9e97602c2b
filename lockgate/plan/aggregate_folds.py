"""Spark's own buffers of some aggregate functions, computed exactly over one batch, and
the functions lockgate replays after the state step.

* **Moment folds.** stddev, variance, skewness, kurtosis, covar_pop, covar_samp, corr
  and Spark's regr_sxx, regr_syy, regr_sxy, regr_slope,
  regr_intercept and regr_r2 keep the buffers of CentralMomentAgg, Covariance and
  PearsonCorrelation (n, means, sums of squared deviations), updated row by row. A
  buffer recovered from another function's result (``var_pop(x) * count(x)``) can be
  an ulp off Spark's, and the ulp shows in the result; so each batch's buffer here is
  Spark's own update expressions folded over the batch's pairs in their order
  (:func:`moment_partials`, :func:`co_moment_partials`, :func:`regression_partials`),
  the same double operations Spark performs. A group's
  rows that a batch reads from several input partitions are folded as one sequence,
  where Spark folds each partition and merges the partial buffers.
* **count_min_sketch.** Merging two of Spark's count-min sketches adds their counters,
  whatever the order; :func:`merge_count_min_sketches` does so on the serialized form.
* **Replayed functions.** listagg/string_agg and mode keep, in state, their inputs in
  the order Spark's buffer would see them; after the state step Spark's own function
  runs over them (:func:`replayed_call`), so the result is Spark's by construction.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession


# -- regression folds -------------------------------------------------------------------
_ZERO = 0.0


def _moments_step(acc: Column, v: Column, prefix: str = "", order: int = 2) -> dict[str, Column]:
    """CentralMomentAgg's update of (n, avg, m2[, m3[, m4]]) by ``v``, as Spark writes it:
    delta = v - avg, deltaN = delta / (n + 1), avg + deltaN, m2 + delta * (delta - deltaN),
    and m3, m4 from the new m2 (and m3). Only the grouping of the operations matters for
    the bits (IEEE sums and products commute)."""
    n, avg, m2 = acc[f"{prefix}n"], acc[f"{prefix}avg"], acc[f"{prefix}m2"]
    n1 = n + F.lit(1.0)
    delta = v - avg
    delta_n = delta / n1
    new_m2 = m2 + delta * (delta - delta_n)
    out = {f"{prefix}n": n1, f"{prefix}avg": avg + delta_n, f"{prefix}m2": new_m2}
    if order >= 3:
        new_m3 = (acc["m3"] - (F.lit(3.0) * delta_n) * new_m2) + delta * (delta * delta - delta_n * delta_n)
        out["m3"] = new_m3
    if order >= 4:
        out["m4"] = (
            (acc["m4"] - (F.lit(4.0) * delta_n) * new_m3) - (F.lit(6.0) * (delta_n * delta_n)) * new_m2
        ) + delta * (delta * (delta * delta) - delta_n * (delta_n * delta_n))
    return out


def _covariance_step(acc: Column, a: Column, b: Column, pearson: bool) -> dict[str, Column]:
    """Covariance's update of (n, xAvg, yAvg, ck) by the pair (a, b), as Spark writes it
    (ck with the old xAvg and the new yAvg); PearsonCorrelation's adds xMk and yMk."""
    n, x_avg, y_avg, ck = acc["n"], acc["xAvg"], acc["yAvg"], acc["ck"]
    n1 = n + F.lit(1.0)
    new_x = x_avg + (a - x_avg) / n1
    new_y = y_avg + (b - y_avg) / n1
    out = {"n": n1, "xAvg": new_x, "yAvg": new_y, "ck": ck + (a - x_avg) * (b - new_y)}
    if pearson:
        out["xMk"] = acc["xMk"] + (a - x_avg) * (a - new_x)
        out["yMk"] = acc["yMk"] + (b - y_avg) * (b - new_y)
    return out


_REGRESSION_LAYOUT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (fold fields in buffer order, merges)
    "regr_sxx": (("n", "avg", "m2"), ("moments",) * 3),
    "regr_syy": (("n", "avg", "m2"), ("moments",) * 3),
    "regr_sxy": (("n", "xAvg", "yAvg", "ck"), ("covariance",) * 4),
    "regr_slope": (
        ("n", "xAvg", "yAvg", "ck", "v_n", "v_avg", "v_m2"),
        ("covariance",) * 4 + ("moments",) * 3,
    ),
    "regr_r2": (("n", "xAvg", "yAvg", "ck", "xMk", "yMk"), ("corr",) * 6),
}
_REGRESSION_LAYOUT["regr_intercept"] = _REGRESSION_LAYOUT["regr_slope"]

REGRESSION_ROLES = {
    "regr_sxx": ("n", "avg", "m2"),
    "regr_syy": ("n", "avg", "m2"),
    "regr_sxy": ("n", "xAvg", "yAvg", "ck"),
    "regr_slope": ("n", "xAvg", "yAvg", "ck", "n", "avg", "m2"),
    "regr_intercept": ("n", "xAvg", "yAvg", "ck", "n", "avg", "m2"),
    "regr_r2": ("n", "xAvg", "yAvg", "ck", "xMk", "yMk"),
}
"""Spark's names of each regression function's buffers (its aggBufferAttributes)."""


def regression_partials(kind: str, y: Column, x: Column) -> tuple[tuple[Column, ...], tuple[str, ...]]:
    """The buffers of ``kind(y, x)`` over one batch, and how each merges.

    Spark's functions and their buffers (both inputs cast to double, rows where either
    is null skipped): regr_sxx and regr_syy a CentralMomentAgg of x and of y;
    regr_sxy ``Covariance(y, x)``; regr_slope and regr_intercept ``CovPopulation(x, y)``
    and ``VariancePop(x)``; regr_r2 ``PearsonCorrelation(y, x)``."""
    fields, merges = _REGRESSION_LAYOUT[kind]
    yd, xd = y.cast("double"), x.cast("double")
    pairs = F.collect_list(F.when(yd.isNotNull() & xd.isNotNull(), F.struct(yd.alias("y"), xd.alias("x"))))

    def step(acc: Column, pair: Column) -> Column:
        py, px = pair["y"], pair["x"]
        if kind == "regr_sxx":
            new = _moments_step(acc, px)
        elif kind == "regr_syy":
            new = _moments_step(acc, py)
        elif kind == "regr_sxy":
            new = _covariance_step(acc, py, px, pearson=False)
        elif kind == "regr_r2":
            new = _covariance_step(acc, py, px, pearson=True)
        else:  # regr_slope, regr_intercept
            new = {**_covariance_step(acc, px, py, pearson=False), **_moments_step(acc, px, "v_")}
        return F.struct(*[new[f].alias(f) for f in fields])

    init = F.struct(*[F.lit(_ZERO).alias(f) for f in fields])
    folded = F.aggregate(pairs, init, step)
    return tuple(folded[f] for f in fields), merges


def moment_partials(x: Column, order: int) -> tuple[Column, ...]:
    """CentralMomentAgg's buffers (n, avg, m2[, m3[, m4]]) of ``x`` over one batch, as
    Spark updates them row by row (stddev, variance, skewness, kurtosis)."""
    fields = ("n", "avg", "m2", "m3", "m4")[: order + 1]
    values = F.collect_list(x.cast("double"))  # nulls skipped, as Spark skips them
    init = F.struct(*[F.lit(_ZERO).alias(f) for f in fields])

    def step(acc: Column, v: Column) -> Column:
        new = _moments_step(acc, v, order=order)
        return F.struct(*[new[f].alias(f) for f in fields])

    folded = F.aggregate(values, init, step)
    return tuple(folded[f] for f in fields)


def moment_values(x: Column) -> Column:
    """The batch's values of ``x`` as doubles, in the order Spark's buffer would see
    them, nulls skipped as Spark skips them: what :func:`fold_moments` folds in the state
    step instead of :func:`moment_partials` in Spark."""
    return F.collect_list(x.cast("double"))


_LOCKSTEP_MIN_GROUPS = 64
"""Below this many groups still folding, :func:`fold_moments` finishes them one by one:
a numpy step over a handful of groups costs more than the Python loop over their values."""


def fold_moments(values: Any, lengths: Any, order: int) -> list[np.ndarray]:
    """CentralMomentAgg's buffers (n, avg, m2[, m3[, m4]]) of each group's values, the
    groups ``lengths`` long one after the other in ``values``: :func:`_moments_step`'s
    double operations in its grouping, so the bits are those of :func:`moment_partials`.

    A group's values must be folded in order, one after the other, but the groups are
    independent: step ``i`` folds the ``i``-th value of every group longer than ``i`` at
    once, in numpy, whose float64 operations are IEEE doubles one operation at a time as
    the JVM's (no fused multiply-add). The few groups still folding when most are done
    finish in a Python loop over their remaining values.

    Every value is the JVM's bit for bit but a NaN's sign: an operation of two NaNs keeps
    one of them, which one is the hardware's and the loop's operand order (the JIT's in
    the JVM), and Spark treats every NaN as the same value."""
    vals = np.asarray(values, dtype=np.float64)
    lens = np.asarray(lengths, dtype=np.int64)
    groups = len(lens)
    starts = np.zeros(groups, dtype=np.int64)
    if groups > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    buffers = [np.zeros(groups, dtype=np.float64) for _ in range(order + 1)]
    active = np.flatnonzero(lens > 0)
    i = 0
    with np.errstate(all="ignore"):  # inf and nan are results here, as in the JVM
        while len(active) >= _LOCKSTEP_MIN_GROUPS:
            stepped = _moment_step(vals[starts[active] + i], [b[active] for b in buffers])
            for column, new in zip(buffers, stepped):
                column[active] = new
            i += 1
            active = active[lens[active] > i]
    for g in active.tolist():
        # the few groups left: row by row in Python, whose floats are IEEE doubles too
        acc = [float(b[g]) for b in buffers]
        for v in vals[starts[g] + i : starts[g] + lens[g]].tolist():
            acc = _moment_step(v, acc)
        for column, value in zip(buffers, acc):
            column[g] = value
    return buffers


def _moment_step(v: Any, acc: list[Any]) -> list[Any]:
    """CentralMomentAgg's update of ``acc`` = [n, avg, m2[, m3[, m4]]] by ``v``:
    :func:`_moments_step`'s double operations in its grouping, on Python floats or on
    numpy arrays (one group per element) alike."""
    n, avg, m2 = acc[0], acc[1], acc[2]
    n1 = n + 1.0
    delta = v - avg
    delta_n = delta / n1
    new_m2 = m2 + delta * (delta - delta_n)
    out = [n1, avg + delta_n, new_m2]
    if len(acc) >= 4:
        new_m3 = (acc[3] - (3.0 * delta_n) * new_m2) + delta * (delta * delta - delta_n * delta_n)
        out.append(new_m3)
        if len(acc) >= 5:
            out.append(
                ((acc[4] - (4.0 * delta_n) * new_m3) - (6.0 * (delta_n * delta_n)) * new_m2)
                + delta * (delta * (delta * delta) - delta_n * (delta_n * delta_n))
            )
    return out


def co_moment_partials(x: Column, y: Column, pearson: bool) -> tuple[Column, ...]:
    """Covariance's buffers (n, xAvg, yAvg, ck) of ``(x, y)`` over one batch, and
    PearsonCorrelation's (and xMk, yMk), as Spark updates them row by row (covar_pop,
    covar_samp, corr): rows where either is null skipped."""
    fields = ("n", "xAvg", "yAvg", "ck") + (("xMk", "yMk") if pearson else ())
    xd, yd = x.cast("double"), y.cast("double")
    pairs = F.collect_list(F.when(xd.isNotNull() & yd.isNotNull(), F.struct(xd.alias("x"), yd.alias("y"))))
    init = F.struct(*[F.lit(_ZERO).alias(f) for f in fields])

    def step(acc: Column, pair: Column) -> Column:
        new = _covariance_step(acc, pair["x"], pair["y"], pearson)
        return F.struct(*[new[f].alias(f) for f in fields])

    folded = F.aggregate(pairs, init, step)
    return tuple(folded[f] for f in fields)


def regression_result(kind: str, buffers: list[Column]) -> Column:
    """Spark's evaluateExpression of each regression function over its merged buffers."""
    null = F.lit(None).cast("double")
    n = buffers[0]
    if kind in ("regr_sxx", "regr_syy"):
        return F.when(n == 0.0, null).otherwise(buffers[2])
    if kind == "regr_sxy":
        return F.when(n == 0.0, null).otherwise(buffers[3])
    if kind == "regr_r2":
        ck, x_mk, y_mk = buffers[3], buffers[4], buffers[5]
        corr = ck / F.sqrt(x_mk * y_mk)
        return F.when(y_mk == 0.0, null).when(x_mk == 0.0, F.lit(1.0)).otherwise(corr * corr)
    x_avg, y_avg, ck, m2 = buffers[1], buffers[2], buffers[3], buffers[6]
    if kind == "regr_slope":
        return F.when(m2 == 0.0, null).otherwise(ck / m2)
    return F.when(m2 == 0.0, null).otherwise(y_avg - ck / m2 * x_avg)  # regr_intercept


# -- count_min_sketch -------------------------------------------------------------------
def merge_count_min_sketches(left: bytes | None, right: bytes | None) -> bytes | None:
    """Spark's ``CountMinSketch.mergeInPlace`` on two serialized sketches (version 1:
    version, total count, depth, width, the depth hash seeds, then the depth x width
    table of counters, big-endian): the counters and the total add up."""
    if left is None:
        return right
    if right is None:
        return left
    a, b = bytes(left), bytes(right)
    version, total_a, depth, width = struct.unpack_from(">iqii", a, 0)
    _, total_b, depth_b, width_b = struct.unpack_from(">iqii", b, 0)
    header = struct.calcsize(">iqii") + 8 * depth
    if (depth, width) != (depth_b, width_b) or a[struct.calcsize(">iqii") : header] != b[
        struct.calcsize(">iqii") : header
    ]:
        raise ValueError("Cannot merge count-min sketches of different depth, width or seeds")
    cells = depth * width
    table_a = struct.unpack_from(f">{cells}q", a, header)
    table_b = struct.unpack_from(f">{cells}q", b, header)
    merged = struct.pack(f">{cells}q", *[x + y for x, y in zip(table_a, table_b)])
    return struct.pack(">iq", version, total_a + total_b) + a[struct.calcsize(">iq") : header] + merged


# -- replayed functions -----------------------------------------------------------------
def _reads_columns(expr: Any) -> bool:
    """Whether an unresolved expression reads the input (a setting, such as listagg's
    delimiter or mode's ``deterministic``, does not)."""
    name = expr.getClass().getSimpleName()
    if name.startswith("Unresolved") and name != "UnresolvedFunction":
        return True
    children = expr.children()
    return any(_reads_columns(children.apply(i)) for i in range(children.size()))


def replay_inputs(spark: SparkSession, call: Column) -> list[Any]:
    """The input expressions (JVM, unresolved) of the aggregate call ``call``: its
    arguments that read columns, then the expressions of its WITHIN GROUP ordering."""
    expr = spark._jsparkSession.expression(call._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    inputs = []
    children = expr.children()
    for i in range(children.size()):
        child = children.apply(i)
        if child.getClass().getSimpleName() == "SortOrder":
            inputs.append(child.child())
        elif _reads_columns(child):
            inputs.append(child)
    return inputs


def replayed_call(spark: SparkSession, call: Column, values: Column) -> Column:
    """``call`` with its inputs (:func:`replay_inputs`, in that order) read from the
    fields ``a0``, ``a1`` ... of the struct column ``values``: Spark's own function over
    the values the state kept."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    js = spark._jsparkSession
    to_seq = spark.sparkContext._jvm.PythonUtils.toSeq
    expr = js.expression(call._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    position = 0

    def field() -> Any:
        nonlocal position
        out = js.expression(values.getField(f"a{position}")._jc)
        position += 1
        return out

    new_children = []
    children = expr.children()
    for i in range(children.size()):
        child = children.apply(i)
        if child.getClass().getSimpleName() == "SortOrder":
            rest = child.children()
            parts = [field()] + [rest.apply(j) for j in range(1, rest.size())]
            new_children.append(child.withNewChildren(to_seq(parts)))
        elif _reads_columns(child):
            new_children.append(field())
        else:
            new_children.append(child)
    utils = spark.sparkContext._jvm.org.apache.spark.sql.classic.ExpressionUtils
    return ClassicColumn(utils.column(expr.withNewChildren(to_seq(new_children))))
