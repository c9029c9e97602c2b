"""Aggregate functions of a streaming aggregation: buffers, merges and results.

Each function of ``groupBy(keys).agg(fns)`` is decomposed (:func:`decompose`) into
*buffers*, Spark expressions computed over each batch by the partial aggregation (avg ->
sum and count; stddev, skewness, kurtosis -> Spark's CentralMomentAgg buffer of n, mean
and central moments; covar_pop, corr -> Spark's co-moments; max_by -> the value and its
ordering, ...). The state task merges a batch's buffers into the state's per key
(:func:`merge_buffers`, Spark's own merge expressions with the state on the left), and
Spark SQL turns the merged buffers into the result (:func:`final_column`, Spark's
evaluate expressions). Functions whose state is the values themselves (collect_set,
median, percentile, mode, listagg) get their result from Spark's own function over them
after the state task (:func:`finish_after_state`); approx_count_distinct keeps Spark's
HyperLogLog++ registers (:mod:`lockgate.plan.hyperloglog`) and gets Spark's estimate
from them there.
The regression functions' buffers, count_min_sketch's merge and the replay of mode and
listagg are in :mod:`lockgate.plan.aggregate_folds`; functions whose result depends on
the order Spark merges its buffers in (percentile_approx, histogram_numeric, the
datasketches sketches, approx_top_k) are refused with the reason.
"""

from __future__ import annotations

import decimal
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.aggregate_folds import (
    REGRESSION_ROLES,
    co_moment_partials,
    merge_count_min_sketches,
    moment_partials,
    moment_values,
    regression_partials,
    regression_result,
    replay_inputs,
    replayed_call,
)
from lockgate.plan.hyperloglog import estimate_column, merge_registers, registers

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# -- decomposition of aggregate functions ---------------------------------------------
_ALIASES = {
    "mean": "avg",
    "std": "stddev_samp",
    "stddev": "stddev_samp",
    "variance": "var_samp",
    "first_value": "first",
    "last_value": "last",
    "any_value": "first",  # Spark's AnyValue is replaced by First(child, ignoreNulls)
    "every": "bool_and",
    "some": "bool_or",
    "any": "bool_or",
    "approx_percentile": "percentile_approx",
    "array_agg": "collect_list",  # registered by Spark as CollectList under a second name
    "string_agg": "listagg",  # Spark's ListAgg under a second name
}
_SUPPORTED = {
    "approx_count_distinct",
    "count",
    "count_if",
    "sum",
    "avg",
    "min",
    "max",
    "first",
    "last",
    "bool_and",
    "bool_or",
    "bit_and",
    "bit_or",
    "bit_xor",
    "product",
    "regr_count",
    "max_by",
    "min_by",
    "collect_list",
    "collect_set",
    "stddev_samp",
    "stddev_pop",
    "var_samp",
    "var_pop",
    "skewness",
    "kurtosis",
    "covar_pop",
    "covar_samp",
    "corr",
    "median",
    "percentile",
    "try_sum",
    "try_avg",
    "regr_avgx",
    "regr_avgy",
    "regr_sxx",
    "regr_syy",
    "regr_sxy",
    "regr_slope",
    "regr_intercept",
    "regr_r2",
    "mode",
    "listagg",
    "count_min_sketch",
}
_AVERAGES = {"avg", "try_avg", "regr_avgx", "regr_avgy"}
"""Spark's Average (try_avg: in TRY mode; regr_avgx/regr_avgy: of x or y where both
are set), buffers sum and count."""
_REGRESSIONS = set(REGRESSION_ROLES)
_ORDER_DEPENDENT = {
    "histogram_numeric": (
        "Spark's NumericHistogram merges its bins approximately, so its answer depends on "
        "the order in which each batch's histogram is merged into the state's, which "
        "lockgate cannot reproduce. Use percentile(x, array(...)) for exact quantiles, or "
        "count rows per bucket (groupBy(floor(x / width)))."
    ),
    "hll_": (
        "The sketch's bytes depend on the order in which Spark merges each batch's sketch "
        "into the state's, which lockgate cannot reproduce. approx_count_distinct gives "
        "native Spark's estimate of the distinct count."
    ),
    "kll_": (
        "KLL sketches compact their items approximately, so the sketch depends on the "
        "order in which Spark merges each batch's sketch into the state's, which lockgate "
        "cannot reproduce. Use percentile(x, p) or median(x) for exact quantiles."
    ),
    "theta_": (
        "The sketch depends on the order in which Spark merges each batch's sketch into "
        "the state's, which lockgate cannot reproduce. approx_count_distinct gives native "
        "Spark's estimate of the distinct count."
    ),
    "tuple_": (
        "The sketch depends on the order in which Spark merges each batch's sketch into "
        "the state's, which lockgate cannot reproduce. Aggregate the summary values per "
        "key with sum() or avg() instead."
    ),
    "approx_top_k": (
        "The sketch depends on the order in which Spark merges each batch's sketch into "
        "the state's, which lockgate cannot reproduce. Count per value in a streaming "
        "aggregation and rank the counts in a complete-mode query."
    ),
}
"""Aggregate functions whose result depends on the order Spark merges its buffers in:
refused, with the reason and what to use instead (the key is the name's prefix)."""
_SELF_MERGING = {
    # The function computes its own buffer over a batch; merging is the same operation
    # (count_if is Spark's Count(NullIf(cond, false)); bool_and/bool_or are Min/Max;
    # bit_and/bit_or/bit_xor are BitAggregates, their buffer the function's value;
    # product's buffer is its double product, null until a value comes).
    "count": "count",
    "count_if": "count",
    "min": "min",
    "max": "max",
    "bool_and": "min",
    "bool_or": "max",
    "collect_list": "concat",
    "collect_set": "union",
    "bit_and": "bit_and",
    "bit_or": "bit_or",
    "bit_xor": "bit_xor",
    "product": "product",
    "regr_count": "count",  # Spark's RegrCount is Count(y, x)
}
_MOMENTS = {
    "stddev_samp": 2,
    "stddev_pop": 2,
    "var_samp": 2,
    "var_pop": 2,
    "skewness": 3,
    "kurtosis": 4,
}
"""Central-moment functions and the moment order of Spark's CentralMomentAgg buffer."""
_MOMENT_MERGES = {2: "moments", 3: "moments3", 4: "moments4"}
_MOMENT_WIDTHS = {"moments": 3, "moments3": 4, "moments4": 5, "covariance": 4, "corr": 6}
"""How many buffers each merge of moments takes together."""
_FINISHED_AFTER_STATE = {"approx_count_distinct", "median", "percentile", "collect_set", "mode", "listagg"}
"""Functions whose state is the values themselves, and whose result Spark's own
function computes over them after the state task (:func:`finish_after_state`).
collect_set is among them for its order: Spark's buffer is a Scala ``mutable.HashSet``,
whose array comes out in hash order, not in the order values were first seen; Spark's
own collect_set over the group's distinct values gives that order."""


@dataclass(frozen=True)
class AggSpec:
    """One aggregate function of the query, decomposed into buffers."""

    kind: str
    """Normalised function name, one of ``_SUPPORTED``."""
    partials: tuple[Column, ...]
    """Spark expressions computing this function's buffers over one batch."""
    merges: tuple[str, ...]
    """How each buffer merges with the state's: sum, count, min, max, first, last,
    concat, union, registers (approx_count_distinct's HyperLogLog++ registers),
    max_by/min_by (value and ordering merged together), moments, moments3, moments4,
    covariance, corr (Spark's buffers of n, means and co-moments, merged together)."""
    ignore_nulls: bool = False
    relative_sd: float | None = None
    """approx_count_distinct's maximum relative standard deviation."""
    null_on_divide_by_zero: bool = True
    """Spark's ``nullOnDivideByZero`` of the statistical functions (false under
    ``spark.sql.legacy.statisticalAggregate``: NaN where a divisor is zero)."""
    finish_args: tuple[Column, ...] = ()
    """percentile's percentage, passed to Spark's function after the state task."""
    weighted: bool = False
    """percentile with a frequency column: the buffer holds (value, frequency) pairs."""
    decimal_result: tuple[int, int] | None = None
    """avg of a decimal: the (precision, scale) of Spark's result; its sum is kept as a
    decimal and divided as Spark's Average divides it (:func:`final_column`)."""
    null_on_overflow: bool = False
    """avg of a decimal outside ANSI mode: null where the result overflows its type."""
    unscaled_scale: int | None = None
    """avg of a decimal of at most 11 digits: Spark's optimizer (DecimalAggregates)
    averages its unscaled values as doubles, divides by 10^scale and casts."""
    call: Column | None = None
    """mode, listagg: the call itself, run again after the state step over the inputs
    the state keeps (:func:`~lockgate.plan.aggregate_folds.replayed_call`)."""
    registers: int | None = None
    """approx_count_distinct: the ``p`` of the HyperLogLog++ registers its state keeps
    (:mod:`lockgate.plan.hyperloglog`); None where it keeps the distinct values."""
    values: Column | None = None
    """stddev, variance, skewness, kurtosis: the batch's values of the argument
    (:func:`~lockgate.plan.aggregate_folds.moment_values`), which the aggregation's state
    step folds into the buffers ``partials`` compute
    (:func:`~lockgate.plan.aggregate_folds.fold_moments`) ten times faster than Spark
    evaluates ``partials``' higher-order function. The session window folds with
    ``partials``."""


def function_parts(spark: SparkSession, col: Column) -> tuple[str, list[Any], bool]:
    """(name, argument expressions, distinct) of a top-level aggregate call."""
    js = spark._jsparkSession
    expr = js.expression(col._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    if expr.getClass().getSimpleName() != "UnresolvedFunction":
        raise NotSupportedYetError(
            f"Aggregate expression {str(col)!r}",
            "lockgate's streaming aggregation takes aggregate function calls, such as "
            "F.sum('x') or F.avg(F.col('x') * 2), each as its own column; compute "
            "expressions over their results in a select() after the aggregation.",
        )
    parts = expr.nameParts()
    name = str(parts.apply(parts.size() - 1)).lower()
    args_seq = expr.arguments()
    args = [args_seq.apply(i) for i in range(args_seq.size())]
    return _ALIASES.get(name, name), args, bool(expr.isDistinct())


_KEEPS_NULLS = ("first", "last", "first_value", "last_value", "any_value")
"""Aggregate functions whose result can be a null input: a FILTER clause cannot become
null inputs for them, unless they ignore nulls."""


def _filter_into_inputs(spark: SparkSession, col: Column) -> Column:
    """An aggregate call with a ``FILTER (WHERE c)`` clause, or with ``IGNORE NULLS``, in
    the form lockgate's buffers read: the same call with each input argument (any that
    is not a literal setting, such as a percentage) null where ``c`` does not hold, which
    gives the aggregate of the rows where it holds for every function that skips nulls
    (``count(*)``, parsed as ``count(1)``, becomes ``count(CASE WHEN c THEN 1 END)``);
    and ``IGNORE NULLS`` as the function's ``true`` argument. Without them, ``col``."""
    js = spark._jsparkSession
    expr = js.expression(col._jc)
    alias = None
    while expr.getClass().getSimpleName() == "Alias":
        alias = alias or str(expr.name())
        expr = expr.child()
    if expr.getClass().getSimpleName() != "UnresolvedFunction":
        return col
    has_filter = expr.filter().isDefined()
    flag = expr.ignoreNulls()  # an Option[Boolean] in Spark 4.x
    ignore_nulls = flag if isinstance(flag, bool) else bool(flag.isDefined() and flag.get())
    if not has_filter and not ignore_nulls:
        return col
    parts = expr.nameParts()
    name = str(parts.apply(parts.size() - 1)).lower()
    args_seq = expr.arguments()
    args = [args_seq.apply(i) for i in range(args_seq.size())]
    arguments = [F.lit(1) if a.getClass().getSimpleName() == "UnresolvedStar" else as_column(spark, a) for a in args]
    if ignore_nulls and name in _KEEPS_NULLS and len(arguments) == 1:
        arguments.append(F.lit(True))
    if has_filter:
        if name in _KEEPS_NULLS and not (
            len(args) > 1 and str(args[1].toString()).strip().lower() == "true" or ignore_nulls
        ):
            raise NotSupportedYetError(
                f"{name}(...) FILTER (WHERE ...) in a streaming aggregation",
                f"Filter the rows before the aggregation, or write {name}(x, true) "
                "(ignoring nulls), which lockgate runs with a FILTER clause.",
            )
        condition = as_column(spark, expr.filter().get())
        # the first argument is an input even as a literal (count(*) is count(1))
        arguments = [
            a if i > 0 and args[i].getClass().getSimpleName() == "Literal" else F.when(condition, a)
            for i, a in enumerate(arguments[: len(args)])
        ] + arguments[len(args) :]
    if expr.isDistinct():
        return col  # refused by decompose, with Spark's message
    if expr.orderingWithinGroup().size():
        raise NotSupportedYetError(
            f"{name}(...) WITHIN GROUP (ORDER BY ...) with FILTER or IGNORE NULLS in a streaming aggregation",
            "Filter the rows before the aggregation instead.",
        )
    call = F.call_function(".".join(str(parts.apply(i)) for i in range(parts.size())), *arguments)
    return call.alias(alias) if alias is not None else call


def as_column(spark: SparkSession, expr: Any) -> Column:
    from pyspark.sql.classic.column import Column as ClassicColumn

    utils = spark.sparkContext._jvm.org.apache.spark.sql.classic.ExpressionUtils
    return ClassicColumn(utils.column(expr))


def _is_literal(expr: Any, text: str) -> bool:
    if expr.getClass().getSimpleName() != "Literal":
        return False
    return str(expr.toString()).strip().lower() == text


def _null_on_divide_by_zero(spark: SparkSession) -> bool:
    """Spark's statistical functions read ``spark.sql.legacy.statisticalAggregate`` when
    the function is resolved (the query is defined), as this is called."""
    legacy = spark.conf.get("spark.sql.legacy.statisticalAggregate", "false")
    return str(legacy).strip().lower() != "true"


def decompose(spark: SparkSession, col: Column, input_frame: DataFrame | None = None) -> AggSpec:
    """``col``, one aggregate function call, as buffers; ``input_frame`` (a DataFrame of
    the aggregation's input) gives the argument types some functions depend on."""
    col = _filter_into_inputs(spark, col)
    name, args, distinct = function_parts(spark, col)
    if distinct:
        raise AnalysisError(
            "Distinct aggregations are not supported on streaming DataFrames/Datasets. "
            "Consider using approx_count_distinct() instead."
        )
    if name == "percentile_approx":
        raise NotSupportedYetError(
            "Streaming aggregate function percentile_approx()/approx_percentile()",
            "Spark's answer depends on the order in which its quantile summaries are "
            "merged (each batch's into the state's), which lockgate cannot reproduce, so it "
            "would not give native Spark's values batch by batch. Use percentile(x, p) or "
            "median(x), exact percentiles that lockgate computes as Spark does (the state "
            "keeps a group's values).",
        )
    reason = next((r for prefix, r in _ORDER_DEPENDENT.items() if name.startswith(prefix)), None)
    if reason is not None:
        raise NotSupportedYetError(f"Streaming aggregate function {name}()", reason)
    if name not in _SUPPORTED:
        raise NotSupportedYetError(
            f"Streaming aggregate function {name}()",
            f"Supported: {', '.join(sorted(_SUPPORTED))}.",
        )
    if name in _SELF_MERGING:
        return AggSpec(name, (col,), (_SELF_MERGING[name],))
    if name in ("mode", "listagg"):
        return _replayed(spark, name, col)
    if name == "count_min_sketch":
        return AggSpec(name, (col,), ("count_min_sketch",))
    arg = as_column(spark, args[0])
    if name == "approx_count_distinct":
        return _approx_count_distinct(arg, args, input_frame)
    if name in ("median", "percentile"):
        return _percentile(spark, name, arg, args)
    if name == "sum":
        # decimals add in a precision that keeps every digit (Python's default is 28)
        return AggSpec(name, (F.sum(arg),), ("decimal_sum" if _decimal_type(arg, input_frame) else "sum",))
    if name == "try_sum":
        return _try_sum(arg, input_frame)
    if name in ("regr_avgx", "regr_avgy"):
        y, x = arg, as_column(spark, args[1])
        arg = F.when(y.isNotNull() & x.isNotNull(), x if name == "regr_avgx" else y)
    if name in _REGRESSIONS:
        partials, merges = regression_partials(name, arg, as_column(spark, args[1]))
        return AggSpec(name, partials, merges)
    if name in _AVERAGES:
        _refuse_intervals(name, arg, input_frame)
        decimal = _decimal_type(arg, input_frame)
        if decimal is not None:
            return _decimal_avg(spark, name, arg, decimal)
        return AggSpec(name, (F.sum(arg.cast("double")), F.count(arg)), ("sum", "count"))
    if name in ("first", "last"):
        ignore = False
        if len(args) > 1:
            ignore = str(args[1].toString()).strip().lower() == "true"
        fn = F.first if name == "first" else F.last
        flag = F.count(arg) > 0 if ignore else F.lit(True)
        return AggSpec(name, (fn(arg, ignore), flag), (name, "flag"), ignore_nulls=ignore)
    if name in ("max_by", "min_by"):
        if len(args) > 2:
            raise NotSupportedYetError(
                f"Streaming {name}(x, ordering, k)", f"Use {name}(x, ordering) without k."
            )
        # Spark's buffer: the value and the extreme ordering (MaxMinBy), here the
        # function itself and max/min of the ordering over the batch.
        ordering = as_column(spark, args[1])
        extreme = F.max(ordering) if name == "max_by" else F.min(ordering)
        return AggSpec(name, (col, extreme), (name, "ordering"))
    nulls = _null_on_divide_by_zero(spark)
    if name in ("covar_pop", "covar_samp", "corr"):
        return _co_moments(name, arg, as_column(spark, args[1]), nulls)
    return _central_moments(name, arg, nulls)


def _decimal_type(arg: Column, input_frame: DataFrame | None) -> tuple[int, int] | None:
    """(precision, scale) of ``arg`` over ``input_frame`` when it is a decimal."""
    if input_frame is None:
        return None
    from pyspark.errors import AnalysisException
    from pyspark.sql.types import DecimalType

    try:
        data_type = input_frame.select(arg).schema.fields[0].dataType
    except AnalysisException:  # not an expression of the input alone
        return None
    if isinstance(data_type, DecimalType):
        return data_type.precision, data_type.scale
    return None


def _decimal_avg(spark: SparkSession, name: str, arg: Column, decimal: tuple[int, int]) -> AggSpec:
    """Spark's Average of a decimal(p, s): its sum is a decimal(p + 10, s) (bounded by 38
    digits) and its result a decimal(p + 4, s + 4), the sum divided by the count exactly
    (DecimalDivideWithOverflowCheck). Summed as doubles, a decimal of more digits than a
    double holds would lose them.

    Where p + 4 <= 15, Spark's optimizer (DecimalAggregates) averages the unscaled values
    as doubles instead, divides by 10^s and casts the double to the result type, for
    avg and try_avg alike. try_avg's sum is null once it overflows its type (a merge
    ``try_avg``), its result then null; so is avg's outside ANSI mode."""
    p, s = decimal
    bounded = _bounded_decimal(p + 4, s + 4)
    if p + 4 <= 15:
        unscaled = (arg * F.lit(10**s)).cast("long").cast("double")
        return AggSpec(
            name, (F.sum(unscaled), F.count(arg)), ("sum", "count"), decimal_result=bounded, unscaled_scale=s
        )
    ansi = str(spark.conf.get("spark.sql.ansi.enabled", "true")).strip().lower() == "true"
    if name == "try_avg":
        sum_type = _bounded_decimal(p + 10, s)
        return AggSpec(
            name,
            (F.try_sum(arg), F.count(arg)),
            (f"try_avg:{sum_type[0] - sum_type[1]}", "count"),
            decimal_result=bounded,
            null_on_overflow=True,
        )
    # F.sum of a decimal(p, s) is a decimal(p + 10, s), Average's own sum type
    return AggSpec(
        name,
        (F.sum(arg), F.count(arg)),
        ("decimal_sum", "count"),
        decimal_result=bounded,
        null_on_overflow=not ansi,
    )


def _input_type(arg: Column, input_frame: DataFrame | None) -> Any:
    if input_frame is None:
        return None
    from pyspark.errors import AnalysisException

    try:
        return input_frame.select(arg).schema.fields[0].dataType
    except AnalysisException:  # not an expression of the input alone
        return None


def _refuse_intervals(name: str, arg: Column, input_frame: DataFrame | None) -> None:
    from pyspark.sql.types import DayTimeIntervalType, YearMonthIntervalType

    if name.startswith("try_") and isinstance(
        _input_type(arg, input_frame), (DayTimeIntervalType, YearMonthIntervalType)
    ):
        raise NotSupportedYetError(
            f"Streaming {name}() of an interval",
            f"Use {name[4:]}() (it fails on overflow where {name}() gives null).",
        )


def _try_sum(arg: Column, input_frame: DataFrame | None) -> AggSpec:
    """Spark's Sum in TRY mode. Of doubles, a plain sum. Of integers (a long sum) and
    decimals (a decimal(p + 10, s)), Spark's buffer is the sum and ``isEmpty``; the sum
    becomes null when it overflows, and stays null through every later update and
    merge, so the result is null from then on (not an error, ANSI mode or not). Over a
    batch, Spark's own try_sum gives that buffer's sum (null where it overflowed, or no
    value came) and a count of zero its ``isEmpty``."""
    from pyspark.sql.types import DecimalType, FractionalType

    _refuse_intervals("try_sum", arg, input_frame)
    data_type = _input_type(arg, input_frame)
    if isinstance(data_type, FractionalType) and not isinstance(data_type, DecimalType):
        return AggSpec("try_sum", (F.try_sum(arg),), ("sum",))
    if isinstance(data_type, DecimalType):
        precision, scale = _bounded_decimal(data_type.precision + 10, data_type.scale)
        bound = f"try_sum:{precision - scale}"
    else:
        bound = "try_sum:long"
    return AggSpec("try_sum", (F.try_sum(arg), F.count(arg) == 0), (bound, "isEmpty"))


def _replayed(spark: SparkSession, name: str, call: Column) -> AggSpec:
    """mode, listagg/string_agg: the state keeps the rows' inputs (those whose first
    input is set; both functions skip the others) in the order Spark's buffer sees them,
    merged by concatenation as collect_list's, and Spark's own function runs over them
    after the state step. listagg's buffer is such a list; mode's a hash map of counts,
    whose result is its value of the highest count, ties broken by the value (with
    ``deterministic`` or WITHIN GROUP) or by the map's order. The state grows with the
    values."""
    inputs = replay_inputs(spark, call)
    if not inputs:
        raise NotSupportedYetError(f"Streaming {name}() without an input column")
    columns = [as_column(spark, e) for e in inputs]
    row = F.when(columns[0].isNotNull(), F.struct(*[c.alias(f"a{j}") for j, c in enumerate(columns)]))
    return AggSpec(name, (F.collect_list(row),), ("concat",), call=call)


def _bounded_decimal(precision: int, scale: int) -> tuple[int, int]:
    """Spark's ``DecimalType.bounded``: at most 38 digits and a scale of at most 38."""
    return min(precision, 38), min(scale, 38)


def _decimal_divide(spark: SparkSession, total: Column, count: Column, spec: AggSpec) -> Column:
    """Spark's own ``DecimalDivideWithOverflowCheck(sum, count as decimal(20, 0))`` of
    the result type, as Average evaluates a decimal: the quotient rounded once (half up)
    to the result's scale. Spark SQL's ``/`` would round it to the division's own type
    first (as few as 6 decimals for wide sums) and give other digits."""
    assert spec.decimal_result is not None
    jvm = spark.sparkContext._jvm
    js = spark._jsparkSession
    result_type = jvm.org.apache.spark.sql.types.DecimalType(*spec.decimal_result)
    divide = jvm.org.apache.spark.sql.catalyst.expressions.DecimalDivideWithOverflowCheck(
        js.expression(total._jc),
        js.expression(count.cast("decimal(20,0)")._jc),
        result_type,
        None,
        spec.null_on_overflow,
    )
    return as_column(spark, divide)


def _central_moments(name: str, arg: Column, null_on_divide_by_zero: bool) -> AggSpec:
    """Spark's CentralMomentAgg buffer over one batch: n, avg, m2 (, m3 (, m4)), the
    sums of powers of deviations from the mean, folded over the batch's values with
    Spark's own update expressions (:func:`~lockgate.plan.aggregate_folds.moment_partials`):
    recovered from another function's result (``var_pop(x) * count(x)``) they can be an
    ulp off, and the ulp shows in the result."""
    order = _MOMENTS[name]
    partials = moment_partials(arg, order)
    merge = _MOMENT_MERGES[order]
    return AggSpec(
        name,
        partials,
        (merge,) * len(partials),
        null_on_divide_by_zero=null_on_divide_by_zero,
        values=moment_values(arg),
    )


def _co_moments(name: str, x_arg: Column, y_arg: Column, null_on_divide_by_zero: bool) -> AggSpec:
    """Spark's Covariance buffer (n, xAvg, yAvg, ck) or PearsonCorrelation's (and xMk,
    yMk) over one batch, folded with Spark's update expressions: only rows where both
    values are set count."""
    partials = co_moment_partials(x_arg, y_arg, pearson=name == "corr")
    merge = "corr" if name == "corr" else "covariance"
    return AggSpec(
        name,
        partials,
        (merge,) * len(partials),
        null_on_divide_by_zero=null_on_divide_by_zero,
    )


def _percentile(spark: SparkSession, name: str, arg: Column, args: list[Any]) -> AggSpec:
    """median(x), percentile(x, p[, frequency]): the state keeps the group's values (a
    list merged by concatenation, as collect_list's) and Spark's own function computes
    the result over them after the state task (:func:`finish_after_state`), so it is
    native Spark's exact percentile by construction. The state grows with the values."""
    if name == "median":
        return AggSpec(name, (F.collect_list(arg),), ("concat",))
    percentage = as_column(spark, args[1])
    if len(args) < 3 or _is_literal(args[2], "1"):
        return AggSpec(name, (F.collect_list(arg),), ("concat",), finish_args=(percentage,))
    frequency = as_column(spark, args[2])
    # Spark's Percentile skips rows whose value or frequency is null.
    pair = F.when(
        arg.isNotNull() & frequency.isNotNull(),
        F.struct(arg.alias("value"), frequency.alias("frequency")),
    )
    return AggSpec(
        name, (F.collect_list(pair),), ("concat",), finish_args=(percentage,), weighted=True
    )


def _approx_count_distinct(arg: Column, args: list[Any], input_frame: DataFrame | None) -> AggSpec:
    """The state keeps Spark's HyperLogLog++ registers (:mod:`lockgate.plan.hyperloglog`),
    at most ``2^p`` per group, and the result is Spark's estimate from them.

    Where lockgate cannot compute the registers as Spark does (an argument of unknown
    type, a string with a collation, ``p`` outside 4..24), the state keeps the group's
    distinct values instead (merged by union; the state grows with them), and the result
    is Spark's own approx_count_distinct over them (:func:`finish_after_state`): Spark's
    estimate too, since it depends only on the set of values."""
    from lockgate.plan import hyperloglog

    rsd = 0.05
    if len(args) > 1:
        text = str(args[1].toString()).strip().rstrip("BDLbdl")
        try:
            rsd = float(text)
        except ValueError as exc:
            raise AnalysisError(
                f"approx_count_distinct's relative standard deviation must be a number, "
                f"got {text!r}."
            ) from exc
    data_type = _input_type(arg, input_frame)
    bits = hyperloglog.precision(rsd) if rsd > 0 else 0
    if (
        data_type is None
        or "collate" in data_type.simpleString().lower()
        or not 4 <= bits <= hyperloglog.MAX_BITS
    ):
        return AggSpec("approx_count_distinct", (F.collect_set(arg),), ("union",), relative_sd=rsd)
    return AggSpec(
        "approx_count_distinct",
        (hyperloglog.registers_partial(arg, bits),),
        ("registers",),
        relative_sd=rsd,
        registers=bits,
    )


def finished_after_state(specs: tuple[AggSpec, ...]) -> bool:
    """Whether :func:`finish_after_state` has work for these functions."""
    return any(spec.kind in _FINISHED_AFTER_STATE for spec in specs)


def _finish(spec: AggSpec, values: Column) -> Column:
    """Spark's own function over the exploded values of one buffer."""
    if spec.kind == "approx_count_distinct":
        return F.approx_count_distinct(values, spec.relative_sd)
    if spec.kind == "median":
        return F.median(values)
    if spec.kind == "collect_set":
        return F.collect_set(values)
    if spec.call is not None:  # mode, listagg
        from pyspark.sql import SparkSession

        return replayed_call(SparkSession.active(), spec.call, values)
    if spec.weighted:
        value, frequency = values.getField("value"), values.getField("frequency")
        return F.call_function("percentile", value, spec.finish_args[0], frequency)
    return F.call_function("percentile", values, spec.finish_args[0])


def finish_after_state(
    df: DataFrame, key_columns: list[str], buffer_columns: list[str], specs: tuple[AggSpec, ...]
) -> DataFrame:
    """Replace each buffer of values (collect_set's distinct values, median's and
    percentile's values) in the state task's output by Spark's own function over it,
    and each approx_count_distinct's registers by Spark's estimate from them.

    One row per group comes out of the state task. The buffers are zipped into one array
    (``arrays_zip`` pads the shorter ones with nulls, which every one of these functions
    skips), exploded once and grouped by the group's keys again, so every function gets
    exactly its group's values; the other columns pass through ``first`` unchanged. The
    state task's output is read once (a correlated subquery would make Spark join it
    with itself and run the state task twice), and one shuffle serves all the functions.
    """
    position = 0
    targets: list[tuple[AggSpec, str]] = []
    for spec in specs:
        names = buffer_columns[position : position + len(spec.partials)]
        position += len(spec.partials)
        if spec.kind in _FINISHED_AFTER_STATE:
            targets.append((spec, names[0]))
    estimates = {
        name: estimate_column(df.sparkSession, F.col(f"`{name}`"), spec.registers)
        for spec, name in targets
        if spec.registers is not None
    }
    if estimates:  # approx_count_distinct's registers: Spark's estimate from them
        df = df.withColumns(estimates)
        targets = [(spec, name) for spec, name in targets if spec.registers is None]
    if not targets:
        return df
    names = [name for _, name in targets]
    others = [c for c in df.columns if c not in names and c not in key_columns]
    values = "__lg_values"
    exploded = df.select(
        *[F.col(f"`{c}`") for c in key_columns + others],
        F.explode_outer(F.arrays_zip(*[F.col(f"`{n}`") for n in names])).alias(values),
    )
    # Without keys (a global aggregation), grouping by a literal keeps "no rows in, no
    # rows out" (Spark's RemoveLiteralFromGroupExpressions), where groupBy() would emit a
    # row for a batch that emits none.
    keys = [F.col(f"`{c}`") for c in key_columns] or [F.lit(0).alias("__lg_group")]
    finished = exploded.groupBy(*keys).agg(
        *[F.first(F.col(f"`{c}`")).alias(c) for c in others],
        *[_finish(spec, F.col(values).getField(name)).alias(name) for spec, name in targets],
    )
    return finished if key_columns else finished.drop("__lg_group")


def final_column(spec: AggSpec, buffers: list[Column]) -> Column:
    """Spark SQL computing the function's result from its merged buffers: Spark's own
    evaluateExpression. Its divisions give null for a zero divisor (``try_divide``), as
    Spark's do inside these functions whatever ``spark.sql.ansi.enabled`` says."""
    kind = spec.kind
    if kind in _FINISHED_AFTER_STATE:
        return buffers[0]  # already Spark's function over the values (finish_after_state)
    if kind in _SELF_MERGING or kind in ("sum", "first", "last", "max_by", "min_by", "count_min_sketch"):
        return buffers[0]
    if kind == "try_sum":
        return buffers[0] if len(buffers) == 1 else F.when(buffers[1], F.lit(None)).otherwise(buffers[0])
    if kind in _REGRESSIONS:
        return regression_result(kind, buffers)
    if kind in _AVERAGES:
        s, c = buffers
        if spec.unscaled_scale is not None:
            assert spec.decimal_result is not None
            result_type = "decimal({},{})".format(*spec.decimal_result)
            scaled = s / c / F.lit(float(10**spec.unscaled_scale))
            return F.when(c == 0, F.lit(None)).otherwise(scaled.cast(result_type))
        if spec.decimal_result is not None:
            from pyspark.sql import SparkSession

            # the session's JVM builds Spark's expression (the stream thread has no
            # active session; the default one shares the JVM)
            return F.when(c == 0, F.lit(None)).otherwise(_decimal_divide(SparkSession.active(), s, c, spec))
        return F.when(c == 0, F.lit(None)).otherwise(s / c)
    null = F.lit(None).cast("double")
    # divideByZeroEvalResult: null, or NaN under spark.sql.legacy.statisticalAggregate
    by_zero = null if spec.null_on_divide_by_zero else F.lit(float("nan"))
    n = buffers[0]
    if kind in ("covar_pop", "covar_samp", "corr"):
        ck = buffers[3]
        if kind == "covar_pop":
            return F.when(n == 0.0, null).otherwise(ck / n)
        if kind == "covar_samp":
            return F.when(n == 0.0, null).when(n == 1.0, by_zero).otherwise(ck / (n - 1.0))
        x_mk, y_mk = buffers[4], buffers[5]
        value = F.try_divide(ck, F.sqrt(x_mk * y_mk))
        return F.when(n == 0.0, null).when(n == 1.0, by_zero).otherwise(value)
    m2 = buffers[2]
    if kind == "var_pop":
        return F.when(n == 0.0, null).otherwise(m2 / n)
    if kind == "stddev_pop":
        return F.when(n == 0.0, null).otherwise(F.sqrt(m2 / n))
    if kind == "var_samp":
        return F.when(n == 0.0, null).when(n == 1.0, by_zero).otherwise(m2 / (n - 1.0))
    if kind == "stddev_samp":
        return F.when(n == 0.0, null).when(n == 1.0, by_zero).otherwise(F.sqrt(m2 / (n - 1.0)))
    if kind == "skewness":
        m3 = buffers[3]
        value = F.try_divide(F.sqrt(n) * m3, F.sqrt(m2 * m2 * m2))
        return F.when(n == 0.0, null).when(m2 == 0.0, by_zero).otherwise(value)
    m4 = buffers[4]  # kurtosis
    value = F.try_divide(n * m4, m2 * m2) - F.lit(3.0)
    return F.when(n == 0.0, null).when(m2 == 0.0, by_zero).otherwise(value)


# -- merging buffers (runs in tasks) ---------------------------------------------------
def _order_key(value: Any) -> Any:
    """A sort key giving Spark's ordering of a value: NaN above every other double (and
    equal to itself), -0.0 equal to 0.0, nested nulls first, structs field by field,
    arrays element by element (a prefix first)."""
    if value is None:
        return (0,)
    if isinstance(value, float):
        return (1, 1) if math.isnan(value) else (1, 0, value)
    if isinstance(value, dict):
        return (1, tuple(_order_key(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return (1, tuple(_order_key(v) for v in value))
    return (1, value)


def _greater(a: Any, b: Any) -> bool:
    """``a > b`` in Spark's ordering, for two non-null values of one type."""
    kind = type(a)
    if kind is float:
        if math.isnan(a):
            return not math.isnan(b)
        return not math.isnan(b) and a > b
    if kind is dict or kind is list or kind is tuple:
        return bool(_order_key(a) > _order_key(b))
    return bool(a > b)


def _merge_moments(
    kind: str, state: list[Any], batch: list[Any], i: int
) -> tuple[list[float], int]:
    """Spark's mergeExpressions of CentralMomentAgg (moments: n, avg, m2; moments3 and
    moments4 add m3, m4), Covariance (n, xAvg, yAvg, ck) and PearsonCorrelation (and xMk,
    yMk), in Spark's order of operations; returns the merged buffers and their count."""
    width = _MOMENT_WIDTHS[kind]
    left = [x or 0.0 for x in state[i : i + width]]
    right = [x or 0.0 for x in batch[i : i + width]]
    n1, n2 = left[0], right[0]
    n = n1 + n2
    # Spark 4 takes a side's means as they are when the other side is empty, and its
    # deltas are zero then
    empty = n1 == 0.0 or n2 == 0.0

    def mean(j: int, delta_n: float) -> float:
        if n1 == 0.0:
            return right[j]
        if n2 == 0.0:
            return left[j]
        return left[j] + delta_n * n2

    if kind in ("covariance", "corr"):
        dx = 0.0 if empty else right[1] - left[1]
        dx_n = 0.0 if n == 0.0 else dx / n
        dy = 0.0 if empty else right[2] - left[2]
        dy_n = 0.0 if n == 0.0 else dy / n
        merged = [
            n,
            mean(1, dx_n),
            mean(2, dy_n),
            left[3] + right[3] + dx * dy_n * n1 * n2,
        ]
        if kind == "corr":
            merged.append(left[4] + right[4] + dx * dx_n * n1 * n2)
            merged.append(left[5] + right[5] + dy * dy_n * n1 * n2)
        return merged, width
    delta = 0.0 if empty else right[1] - left[1]
    delta_n = 0.0 if n == 0.0 else delta / n
    m2_1, m2_2 = left[2], right[2]
    merged = [n, mean(1, delta_n), m2_1 + m2_2 + delta * delta_n * n1 * n2]
    if width >= 4:
        m3_1, m3_2 = left[3], right[3]
        merged.append(
            m3_1
            + m3_2
            + delta_n * delta_n * delta * n1 * n2 * (n1 - n2)
            + 3.0 * delta_n * (n1 * m2_2 - n2 * m2_1)
        )
    if width >= 5:
        merged.append(
            left[4]
            + right[4]
            + delta_n * delta_n * delta_n * delta * n1 * n2 * (n1 * n1 - n1 * n2 + n2 * n2)
            + 6.0 * delta_n * delta_n * (n1 * n1 * m2_2 + n2 * n2 * m2_1)
            + 4.0 * delta_n * (n1 * m3_2 - n2 * m3_1)
        )
    return merged, width


_OPERATOR_MERGES = {
    "bit_and": operator.and_,
    "bit_or": operator.or_,
    "bit_xor": operator.xor,
    "product": operator.mul,
}
"""bit_and, bit_or, bit_xor, product: the operator merging two buffers where neither is
null (Python's bitwise operators on ints are two's complement ones, so a merge of two
longs stays a long; product's buffers are doubles, multiplied state first as Spark's
merge ``coalesce(coalesce(left, 1) * right, left)`` does)."""


_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_WIDE_DECIMALS = decimal.Context(prec=80)
"""Decimal arithmetic exact for Spark's decimals (38 digits; Python's default context
rounds to 28)."""


def _merge_try_sum(kind: str, a: Any, a_set: Any, b: Any, b_set: Any) -> Any:
    """try_sum's merge (``try_sum:long`` or ``try_sum:<integral digits>``, with isEmpty)
    and try_avg's of a decimal (``try_avg:<integral digits>``, with the count): a side
    that has values and a null sum has overflowed, and the sum stays null; else the
    sums add, and one outside the type's range is null."""
    if kind.startswith("try_avg"):
        a_empty, b_empty = not a_set, not b_set  # the counts
    else:
        a_empty, b_empty = bool(a_set), bool(b_set)  # isEmpty
    if (not a_empty and a is None) or (not b_empty and b is None):
        return None
    if a is None or b is None:
        return b if a is None else a
    bound = kind.split(":")[1]
    if bound == "long":
        total = a + b
        return total if _LONG_MIN <= total <= _LONG_MAX else None
    total = _WIDE_DECIMALS.add(a, b)
    return total if abs(total) < decimal.Decimal(10) ** int(bound) else None


def merge_buffers(merges: tuple[str, ...], state: list[Any], batch: list[Any]) -> list[Any]:
    """One key's buffers after merging a batch's (``batch``) into the state's (``state``),
    as Spark's merge expressions do with the state's buffer on the left."""
    out = list(state)
    i = 0
    while i < len(merges):
        kind = merges[i]
        a, b = state[i], batch[i]
        if kind in ("sum", "count"):
            out[i] = b if a is None else (a if b is None else a + b)
        elif kind == "decimal_sum":
            out[i] = b if a is None else (a if b is None else _WIDE_DECIMALS.add(a, b))
        elif kind == "min":
            out[i] = b if a is None else (a if b is None or not _greater(a, b) else b)
        elif kind == "max":
            out[i] = b if a is None else (a if b is None or not _greater(b, a) else b)
        elif kind in _OPERATOR_MERGES:
            # BitAggregate's and Product's merge: a null side gives way to the other
            out[i] = b if a is None else (a if b is None else _OPERATOR_MERGES[kind](a, b))
        elif kind == "concat":
            out[i] = list(a or []) + list(b or [])
        elif kind == "union":
            out[i] = list(dict.fromkeys([*(a or []), *(b or [])]))
        elif kind == "registers":
            out[i] = merge_registers(a, b)
        elif kind in ("first", "last"):
            state_set, batch_set = bool(state[i + 1]), bool(batch[i + 1])
            take_batch = (kind == "first" and not state_set) or (kind == "last" and batch_set)
            out[i] = batch[i] if take_batch and batch_set else state[i]
            out[i + 1] = state_set or batch_set
            i += 2
            continue
        elif kind in ("max_by", "min_by"):
            # Spark's MaxMinBy merge: a side without ordering gives way to the other
            # (neither: null); else the state's value only if its ordering is strictly
            # more extreme, so a tie takes the batch's value.
            ord_a, ord_b = state[i + 1], batch[i + 1]
            if ord_a is None:
                out[i], out[i + 1] = (b, ord_b) if ord_b is not None else (None, None)
            else:
                state_wins = ord_b is None or (
                    _greater(ord_a, ord_b) if kind == "max_by" else _greater(ord_b, ord_a)
                )
                out[i], out[i + 1] = (a, ord_a) if state_wins else (b, ord_b)
            i += 2
            continue
        elif kind in _MOMENT_WIDTHS:
            merged, width = _merge_moments(kind, state, batch, i)
            out[i : i + width] = merged
            i += width
            continue
        elif kind.startswith(("try_sum:", "try_avg:")):
            out[i] = _merge_try_sum(kind, a, state[i + 1], b, batch[i + 1])
            if kind.startswith("try_sum"):
                out[i + 1] = bool(state[i + 1]) and bool(batch[i + 1])
            else:
                out[i + 1] = (state[i + 1] or 0) + (batch[i + 1] or 0)
            i += 2
            continue
        elif kind == "count_min_sketch":
            out[i] = merge_count_min_sketches(a, b)
        i += 1
    return out


def _merge_sums(state: list[Any], batch: Any) -> list[Any]:
    return [b if a is None else (a if b is None else a + b) for a, b in zip(state, batch)]


def buffer_starter(merges: tuple[str, ...]) -> Any:
    """``start(batch) -> buffers`` for a key new to the state: the batch's buffers as
    they are, but approx_count_distinct's codes reduced to registers (the state's form)."""
    positions = [i for i, m in enumerate(merges) if m == "registers"]
    if not positions:
        return list

    def start(batch: Any) -> list[Any]:
        out = list(batch)
        for i in positions:
            out[i] = registers(out[i])
        return out

    return start


def buffer_merger(merges: tuple[str, ...]) -> Any:
    """``merge(state, batch) -> merged`` for one key's buffers: :func:`merge_buffers`,
    or a faster equivalent when every buffer is a sum or a count (count, sum, avg)."""
    if merges and all(m in ("sum", "count") for m in merges):
        return _merge_sums
    return lambda state, batch: merge_buffers(merges, state, list(batch))


_BUFFER_ROLES = {
    "count": ("count",),
    "count_if": ("count",),
    "sum": ("sum",),
    "avg": ("sum", "count"),
    "min": ("min",),
    "max": ("max",),
    "bool_and": ("value",),
    "bool_or": ("value",),
    "bit_and": ("value",),
    "bit_or": ("value",),
    "bit_xor": ("value",),
    "product": ("product",),
    "regr_count": ("count",),
    "first": ("value", "isSet"),
    "last": ("value", "isSet"),
    "max_by": ("value", "ordering"),
    "min_by": ("value", "ordering"),
    "collect_list": ("values",),
    "collect_set": ("values",),
    "mode": ("values",),
    "listagg": ("values",),
    "count_min_sketch": ("buf",),
    "try_avg": ("sum", "count"),
    "regr_avgx": ("sum", "count"),
    "regr_avgy": ("sum", "count"),
    **REGRESSION_ROLES,
    "approx_count_distinct": ("distinctValues",),
    "median": ("values",),
    "percentile": ("values",),
    "skewness": ("n", "avg", "m2", "m3"),
    "kurtosis": ("n", "avg", "m2", "m3", "m4"),
    "covar_pop": ("n", "xAvg", "yAvg", "ck"),
    "covar_samp": ("n", "xAvg", "yAvg", "ck"),
    "corr": ("n", "xAvg", "yAvg", "ck", "xMk", "yMk"),
}
"""Names of each function's buffers in the state files (stddev and variance: n, mean, m2)."""


def buffer_roles(spec: AggSpec) -> tuple[str, ...]:
    """What each of the function's buffers holds, naming its state column."""
    if spec.kind == "try_sum":
        return ("sum", "isEmpty")[: len(spec.partials)]
    if spec.registers is not None:
        return ("registers",)
    return _BUFFER_ROLES.get(spec.kind, ("n", "mean", "m2"))


_SPARK_BUFFER_NAMES = {
    "count_if": ("count",),  # Spark rewrites it to count(nullif(...))
    "bool_and": ("min",),  # ... and these to min and max
    "bool_or": ("max",),
    "bit_and": ("bit_and",),  # BitAggregate's buffer is named after the function
    "bit_or": ("bit_or",),
    "bit_xor": ("bit_xor",),
    "regr_count": ("count",),  # Spark replaces it by Count
    "first": ("first", "valueSet"),
    "last": ("last", "valueSet"),
    "max_by": ("valueWithExtremumOrdering", "extremumOrdering"),
    "min_by": ("valueWithExtremumOrdering", "extremumOrdering"),
}


def sparks_buffer_names(spec: AggSpec) -> tuple[str, ...]:
    """The names Spark gives the function's buffers (its ``aggBufferAttributes``), which
    its state reader shows as the value's fields; one per lockgate buffer. Where
    lockgate's buffers are not Spark's in kind (collect_list's and percentile's values
    where Spark keeps one binary ``buf``, approx_count_distinct's registers as codes
    where Spark packs them in words ``MS[i]``), lockgate's own role names."""
    names = _SPARK_BUFFER_NAMES.get(spec.kind)
    if names is not None:
        return names
    return tuple("avg" if role == "mean" else role for role in buffer_roles(spec))


# -- expressions over aggregate functions ---------------------------------------------
def is_aggregate_call(spark: SparkSession, expr: Any) -> bool:
    """Whether the unresolved expression ``expr`` is a call of an aggregate function:
    a distinct call, or a function Spark's catalog lists among its aggregate functions
    (group ``agg_funcs``), as the analyzer resolves it into an AggregateExpression."""
    if expr.getClass().getSimpleName() != "UnresolvedFunction":
        return False
    if expr.isDistinct():
        return True
    parts = expr.nameParts()
    name = str(parts.apply(parts.size() - 1)).lower()
    if parts.size() == 1 and _ALIASES.get(name, name) in _SUPPORTED:
        return True  # product is not in Spark's catalog group of aggregate functions
    groups: dict[str, str] = spark.__dict__.setdefault("_lockgate_function_groups", {})
    if name not in groups:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import AnalysisException

        jvm = spark.sparkContext._jvm
        catalog = spark._jsparkSession.sessionState().catalog()
        try:
            info = catalog.lookupFunctionInfo(
                jvm.org.apache.spark.sql.catalyst.FunctionIdentifier(name)
            )
            groups[name] = str(info.getGroup() or "")
        except (AnalysisException, Py4JJavaError):  # a function the catalog does not know
            groups[name] = ""
    return groups[name] == "agg_funcs"


def map_aggregates(
    spark: SparkSession,
    col: Column,
    leaf: Any,
    other: Any = None,
) -> Column:
    """``col`` with each aggregate function call in it (:func:`is_aggregate_call`) by
    ``leaf(call)``, and each other sub-expression for which ``other(expr)`` gives a
    Column by that one: the expression's tree as Spark parsed it, rebuilt by Spark's own
    ``withNewChildren``. Aggregate calls are not looked into (Spark refuses an
    aggregate inside another when the query is defined)."""
    js = spark._jsparkSession
    to_seq = spark.sparkContext._jvm.PythonUtils.toSeq

    def walk(expr: Any) -> Any:
        if is_aggregate_call(spark, expr):
            return js.expression(leaf(as_column(spark, expr))._jc)
        if other is not None:
            replaced = other(expr)
            if replaced is not None:
                return js.expression(replaced._jc)
        children = expr.children()
        if children.size() == 0:
            return expr
        return expr.withNewChildren(
            to_seq([walk(children.apply(i)) for i in range(children.size())])
        )

    return as_column(spark, walk(js.expression(col._jc)))


def is_plain_aggregate(spark: SparkSession, col: Column) -> bool:
    """Whether ``col`` is one aggregate function call (possibly aliased), the form the
    aggregation computes directly; otherwise it is an expression over aggregates."""
    expr = spark._jsparkSession.expression(col._jc)
    while expr.getClass().getSimpleName() == "Alias":
        expr = expr.child()
    return is_aggregate_call(spark, expr)
