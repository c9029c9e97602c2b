"""Event-time lineage: which output columns of a plan carry event time, as Spark propagates
watermark metadata (``spark.watermarkDelayMs``), with the delay of the watermark they
derive from.

The one owner of that analysis, used by aggregation (its event-time grouping key),
deduplication (the key it evicts by), stream-stream joins (each side's watermark column)
and the API (a projection whose lineage lockgate's rules cannot follow is given
Spark's answer when it is defined, :func:`with_event_time`).

* :func:`event_time_outputs`: a plan's event-time columns, following each step as Spark
  does; None when a step lockgate cannot follow transforms one of them.
* :func:`event_time_columns`: the same, falling back to every ``withWatermark`` column
  still present where the rules cannot tell.
* :func:`column_event_time`: what one projected Column carries.
* :func:`grouping_event_time_key`: an aggregation's event-time grouping key.
* :func:`with_event_time` / :func:`event_time_by_optimizer`: Spark's optimizer's answer
  for a projection the rules cannot follow.
* :func:`check_event_time_column`: Spark's check of a ``withWatermark`` column.
* :func:`qualified_outputs` / :func:`resolve_reference`: a plan's output columns with
  their qualifiers, and what a multi-part name (``l.ts``, ``s.f``) refers to among them,
  as Spark's analyzer resolves it.

Names are resolved as Spark's analyzer resolves them: a one-part name is the column of
that name; a multi-part one is first a qualifier (a DataFrame ``alias``, kept by a
join's output for each side) followed by a column name, and only when no column has
that qualifier a column followed by struct fields (``s.f``, which carries no event
time). Every place below that looks a column up (projections, window arguments,
grouping keys, ``withWatermark``) goes through the same resolution.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StructType, TimestampType

from lockgate.errors import AnalysisError
from lockgate.jvm import scala_list
from lockgate.jvm import seq as _seq
from lockgate.plan.nodes import EventTimeWatermark, PlanNode, StreamingRelation, Transform, Union
from lockgate.plan.pushdown import all_nodes as _nodes
from lockgate.plan.pushdown import with_marker
from lockgate.plan.stateful import OutputColumn, StatefulOperator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

KEEPS_EVENT_TIME = (
    "alias", "filter", "where", "dropna", "fillna", "replace", "repartition", "repartitionByRange",
    "coalesce", "hint", "sample", "orderBy", "sort", "sortWithinPartitions", "observe",
)
"""Row-by-row methods that keep every column as it is, with its watermark metadata
(``fillna`` and ``replace`` change only numeric, string and boolean columns, never an
event-time timestamp or window)."""


def check_event_time_column(frame: DataFrame, name: str) -> None:
    """Spark's analysis of ``withWatermark(name, ...)`` on ``frame``: its error for a
    missing column (``UNRESOLVED_COLUMN``) or one that is not a timestamp
    (``EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE``, with the type's SQL name). As Spark's
    CheckAnalysis, a ``TIMESTAMP`` column or a struct whose ``end`` is one (a window)
    passes; ``TIMESTAMP_NTZ`` does not."""
    field = next((f for f in frame.schema.fields if f.name == name), None)
    if field is None:
        # Spark's UNRESOLVED_COLUMN error, or the column a qualified name (l.ts) is
        frame = frame.select(name)
        field, name = frame.schema.fields[0], frame.columns[0]
    data_type = field.dataType
    window_like = isinstance(data_type, StructType) and any(
        f.name == "end" and isinstance(f.dataType, TimestampType) for f in data_type.fields
    )
    if not isinstance(data_type, TimestampType) and not window_like:
        sql_type = frame._jdf.schema().apply(name).dataType().sql()
        raise AnalysisError(
            f"[EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE] The event time `{name}` has the "
            f'invalid type "{sql_type}", but expected "TIMESTAMP". SQLSTATE: 42K09'
        )


def event_time_outputs(node: PlanNode) -> dict[str, int] | None:
    """The output columns of ``node`` that carry event time (Spark's watermark metadata),
    with their watermark delay in ms; None when a step lockgate cannot follow transforms
    one of them.

    A ``withWatermark`` column (Spark strips the metadata of the others there) passes
    through filters, deduplications, limits, joins and plain column selections; an
    aggregation's output carries it in its event-time grouping key (a watermarked column
    or a window over one).
    """
    if isinstance(node, EventTimeWatermark):
        name = watermark_column_name(node)
        return None if name is None else {name: node.delay_ms}
    if isinstance(node, StatefulOperator):  # each operator states what its output carries
        return node.event_time_outputs(event_time_outputs)
    if isinstance(node, Union):  # Spark's Union outputs its first child's attributes
        return event_time_outputs(node.left)
    if not isinstance(node, Transform):
        found: dict[str, int] = {}
        for child in node.children:
            below = event_time_outputs(child)
            if below is None:
                return None
            found.update(below)
        return found
    below = event_time_outputs(node.child)
    if below is None or not below:
        return below
    if node.event_time is not None:
        return dict(node.event_time)
    if node.method in KEEPS_EVENT_TIME:
        return below
    if node.method in ("mapInPandas", "mapInArrow"):
        return {}  # new output attributes, without Spark's watermark metadata
    if node.method == "withColumnsRenamed" and len(node.args) == 1 and isinstance(node.args[0], dict):
        renames = node.args[0]
        if any(new in below and new not in renames for new in renames.values()):
            return None
        return {renames.get(n, n): d for n, d in below.items()}
    if node.method == "withColumns" and len(node.args) == 1 and isinstance(node.args[0], dict):
        replaced = dict(below)
        for name, column in node.args[0].items():
            made = column_event_time(column, below, node.child)
            if made is None:
                return None
            replaced.pop(name, None)
            if made[1] is not None:
                replaced[name] = made[1]
        return replaced
    if node.method == "drop" and all(isinstance(a, str) for a in node.args):
        return {n: d for n, d in below.items() if n not in node.args}
    if node.method == "withColumn" and isinstance(node.args[0], str) and len(node.args) == 2:
        name = node.args[0]
        made = column_event_time(node.args[1], below, node.child)
        if made is None:
            return None
        if made[1] is not None:  # e.g. withColumn("window", window("ts", ...)): Spark's
            return {**below, name: made[1]}  # MULTIPLE_EVENT_TIME_COLUMNS if ts stays
        # a column replaced by an expression carries no event time any more, as in Spark
        return {n: d for n, d in below.items() if n != name}
    if node.method == "withColumnRenamed" and len(node.args) == 2:
        old, new = node.args
        if new in below and new != old:
            return None
        if old in below:  # a rename keeps Spark's watermark metadata
            return {(new if n == old else n): d for n, d in below.items()}
        return below
    if node.method == "selectExpr" and not node.kwargs and all(isinstance(a, str) for a in node.args):
        exprs: dict[str, int] = {}
        for text in node.args:
            if text.strip() == "*":
                exprs.update(below)
                continue
            made = column_event_time(F.expr(text), below, node.child)
            if made is None:
                return None
            if made[1] is not None:
                exprs[made[0]] = made[1]
        return exprs
    if node.method == "select" and not node.kwargs:
        args = node.args[0] if len(node.args) == 1 and isinstance(node.args[0], list) else node.args
        out: dict[str, int] = {}
        for arg in args:
            if isinstance(arg, str) and arg == "*":
                out.update(below)
                continue
            if isinstance(arg, str) and arg.isidentifier():
                made = (arg, below.get(arg))
            else:  # a Column, or a name PySpark makes one (select("l.ts") is col("l.ts"))
                made = column_event_time(F.col(arg) if isinstance(arg, str) else arg, below, node.child)
            if made is None:
                return None
            if made[1] is not None:
                out[made[0]] = made[1]
        return out
    return None


_WATERMARK_KEY = "spark.watermarkDelayMs"


def event_time_by_optimizer(
    before: DataFrame, after: DataFrame, below: dict[str, int], columns: list[OutputColumn] | None = None
) -> dict[str, int] | None:
    """The columns of ``after`` (one step over ``before``) that carry event time, with
    their delays, as Spark decides it; None when this cannot tell.

    ``below`` holds ``before``'s event-time columns. In Spark they are attributes of the
    ``EventTimeWatermark`` (or of a step that passed its metadata on), so the step
    above sees them as attributes, and an output column carries one's metadata when the
    optimized step outputs that very attribute, bare or under an alias: ``col("ts")``,
    but also ``cast(ts AS TIMESTAMP)`` or ``to_timestamp(ts)``, which the optimizer
    reduces to ``ts``. An alias with metadata of its own (``withMetadata``) carries only
    the delay in it. Anything else (``date_trunc("minute", "ts")``, ``ts + interval``)
    is a new attribute without it. The templates hold no ``EventTimeWatermark`` (Spark
    drops it from batch plans), so ``before`` is put under a marker the optimizer does
    not look through (:func:`~lockgate.plan.pushdown.with_marker`), where Spark's would
    be, and ``after``'s plan over it is optimized with Spark's optimizer. ``columns``
    (``before``'s :func:`qualified_outputs`, when known) tells columns of one name apart
    (``l.ts`` and ``r.ts`` of a join)."""
    target = before._jdf.queryExecution().analyzed()
    attributes = _seq(target.output())
    names = [a.name() for a in attributes]
    if columns is not None and [c.name for c in columns] == names:
        delays = {int(a.exprId().id()): c.delay_ms for a, c in zip(attributes, columns) if c.delay_ms is not None}
    elif any(names.count(n) != 1 for n in below):
        return None
    else:
        delays = {int(a.exprId().id()): below[a.name()] for a in attributes if a.name() in below}
    spark = after.sparkSession
    jvm = spark.sparkContext._jvm
    found = []

    def mark(plan: Any) -> Any:
        if plan.fastEquals(target):
            found.append(plan)
            return with_marker(spark, plan, keep_empty=True)  # a side filtered by false too
        children = _seq(plan.children())
        if not children:
            return plan
        return plan.withNewChildren(scala_list(jvm, [mark(c) for c in children]))

    plan = mark(after._jdf.queryExecution().analyzed())
    if len(found) != 1:
        return None
    try:
        optimized = spark._jsparkSession.sessionState().optimizer().execute(plan)
    except Exception:  # noqa: BLE001 - py4j: the optimizer refuses the plan; no answer
        return None
    if not any(n.getClass().getSimpleName() == "Sample" for n in _nodes(optimized)):
        return None  # folded away (an empty relation): nothing to read
    top = optimized
    outputs = _seq(top.projectList() if top.getClass().getSimpleName() == "Project" else top.output())
    if len(outputs) != len(after.columns):
        return None
    carried: dict[str, int] = {}
    for name, expression in zip(after.columns, outputs):
        metadata = None
        if expression.getClass().getSimpleName() == "Alias":
            if expression.explicitMetadata().isDefined():
                metadata = expression.explicitMetadata().get()
            expression = expression.child()
        if expression.getClass().getSimpleName() != "AttributeReference":
            continue
        delay = delays.get(int(expression.exprId().id()))
        if delay is None:
            continue
        if metadata is None:
            carried[name] = delay
        elif metadata.contains(_WATERMARK_KEY):
            carried[name] = int(metadata.getLong(_WATERMARK_KEY))
    return carried


def column_event_time(
    column: Any, below: dict[str, int], plan: PlanNode | None = None
) -> tuple[str, int | None] | None:
    """What a Column in a projection outputs, as Spark propagates event time (watermark
    metadata): ``(name, delay)`` for a reference to an event-time column, a ``window()``
    over one or a ``window_time()`` of one, aliased or not; ``(name, None)`` for a column
    that carries no event time; None when lockgate cannot tell.

    As Spark's analysis: an attribute keeps its metadata through an alias;
    ``window``/``session_window`` carry the delay of their time column only when it is a
    plain column (over an expression they carry none: their metadata is fixed at
    analysis); ``window_time`` carries its window column's. Other expressions carry
    none, but lockgate cannot tell when one that mentions an event-time column is
    optimized back into a reference to it, and refuses those (None). A
    ``session_window`` in a projection is the struct ``[t, t + gap]`` of each row
    (Spark's ``SessionWindowing`` of a ``Project``) and carries ``t``'s delay, as
    ``window`` does; the join evicts by its ``end`` as by a window's.

    ``plan`` is the plan the column is evaluated over: a multi-part name in the column
    (``l.ts``, ``s.f``) is resolved among its output columns
    (:func:`resolve_reference`); without it such a name cannot be told (None).
    """
    try:
        node = column._jc.node()
    except Exception:  # noqa: BLE001 - py4j: a Column without a Catalyst node
        return None
    return _expression_event_time(node, below, plan)


def _expression_event_time(
    node: Any, below: dict[str, int], plan: PlanNode | None = None
) -> tuple[str, int | None] | None:
    alias = None
    if node.getClass().getSimpleName() == "Alias":
        if node.name().size() != 1:
            return None
        alias = str(node.name().apply(0))
        node = node.child()
    kind = node.getClass().getSimpleName()
    if "Star" in kind or "Regex" in kind:
        return None  # several columns
    if kind == "SqlExpression":  # F.expr / selectExpr text
        return _sql_event_time(str(node.expression()), below, alias, plan)
    if kind == "ExpressionColumnNode":  # a parsed Catalyst expression (ls.sql)
        return _catalyst_event_time(node.expression(), below, alias, plan)
    if kind == "UnresolvedAttribute":
        made = _reference_event_time(node, below, plan)
        return None if made is None else (alias or made[0], made[1])
    if kind == "UnresolvedExtractValue" and _reference_event_time(node.child(), below, plan) is not None:
        # a field of a column (window.start): no metadata in Spark, and its optimizer
        # never makes a field of an attribute an attribute again
        return (alias or "", None)
    if kind == "UnresolvedFunction":
        function = str(node.functionName()).lower()
        args = node.arguments()
        if function in ("window", "session_window") and args.size() >= 2:
            return (alias or function, _time_argument_delay(args.apply(0), below, plan))
        if function == "window_time" and args.size() == 1:
            window = _reference_event_time(args.apply(0), below, plan)
            if window is None or not window[0]:
                return (alias or "", None)
            return (alias or f"window_time({window[0]})", window[1])
    # Other expressions carry no metadata in Spark's analysis, but its optimizer can make
    # one mentioning an event-time column a plain reference again (a cast to the same
    # type), which then carries it: lockgate refuses those rather than guess.
    return None if _mentions(node, below) else (alias or "", None)


def _sql_event_time(
    text: str, below: dict[str, int], alias: str | None = None, plan: PlanNode | None = None
) -> tuple[str, int | None] | None:
    """:func:`_expression_event_time` for SQL text, parsed by Spark's parser into
    Catalyst's unresolved expressions (the same rules; names follow Spark's defaults
    for a column reference, ``window``/``session_window``/``window_time`` or an alias,
    other expressions must not mention event time). ``alias`` names the column when the
    text is aliased outside (``F.expr(text).alias(alias)``)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return None
    try:
        expr = spark._jsparkSession.sessionState().sqlParser().parseExpression(text)
    except Exception:  # noqa: BLE001 - py4j: not an expression Spark parses
        return None
    return _catalyst_event_time(expr, below, alias, plan)


def _catalyst_event_time(
    expr: Any, below: dict[str, int], alias: str | None = None, plan: PlanNode | None = None
) -> tuple[str, int | None] | None:
    """:func:`_sql_event_time` of an unresolved Catalyst expression."""
    if expr.getClass().getSimpleName() == "Alias":
        alias = alias or str(expr.name())
        expr = expr.child()
    kind = expr.getClass().getSimpleName()
    if kind == "UnresolvedAttribute":
        made = _reference_event_time(expr, below, plan)
        return None if made is None else (alias or made[0], made[1])
    if kind == "UnresolvedFunction" and expr.nameParts().size() == 1 and not expr.isDistinct():
        function = str(expr.nameParts().apply(0)).lower()
        args = [expr.arguments().apply(i) for i in range(expr.arguments().size())]
        if function in ("window", "session_window") and len(args) >= 2:
            return (alias or function, _time_argument_delay(args[0], below, plan))
        if function == "window_time" and len(args) == 1:
            window = _reference_event_time(args[0], below, plan)
            if window is None or not window[0]:
                return (alias or "", None)
            return (alias or f"window_time({window[0]})", window[1])
    if kind in ("UnresolvedStar", "UnresolvedRegex"):
        return None  # several columns
    return None if _mentions(expr, below) else (alias or "", None)


def _mentions(expression: Any, columns: dict[str, int]) -> bool:
    """Whether a JVM expression's text names one of ``columns``."""
    text = str(expression.toString())
    return any(re.search(rf"\b{re.escape(name)}\b", text) for name in columns)


def _time_argument_delay(node: Any, below: dict[str, int], plan: PlanNode | None = None) -> int | None:
    """The watermark delay a ``window``/``session_window`` takes from its time argument
    (an unresolved JVM expression), as Spark's analysis gives it: the argument's when it
    is an event-time column, or ``window_time`` of one (Spark's ``ResolveWindowTime``
    makes that an attribute carrying the window's metadata, so a window over an upstream
    window's time is event time); None for other expressions (Spark's ``TimeWindowing``
    takes metadata only from an attribute)."""
    time = _reference_event_time(node, below, plan)
    if time is not None:
        return time[1]
    kind = node.getClass().getSimpleName()
    if kind == "UnresolvedFunction" and node.arguments().size() == 1 and _function_name(node) == "window_time":
        window = _reference_event_time(node.arguments().apply(0), below, plan)
        return window[1] if window is not None else None
    return None


def _function_name(node: Any) -> str:
    """The (last part of the) name of an unresolved function: Catalyst's expression has
    ``nameParts``, the Column API's node ``functionName``."""
    try:
        parts = node.nameParts()
        return str(parts.apply(parts.size() - 1)).lower()
    except Exception:  # noqa: BLE001 - py4j: the Column API's UnresolvedFunction
        return str(node.functionName()).lower()


def _name_parts(node: Any) -> list[str] | None:
    """The name parts of a column reference (an unresolved JVM attribute), else None."""
    if node.getClass().getSimpleName() != "UnresolvedAttribute":
        return None
    parts = node.nameParts()
    return [str(parts.apply(i)) for i in range(parts.size())]


def _reference_parts(node: Any) -> list[str] | None:
    """The name parts of a Column's node when it is a plain column reference, also as
    SQL text (``F.expr("r.ts")``, parsed by Spark's parser); else None."""
    if node.getClass().getSimpleName() == "SqlExpression":
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            return None
        try:
            node = spark._jsparkSession.sessionState().sqlParser().parseExpression(str(node.expression()))
        except Exception:  # noqa: BLE001 - py4j: not an expression Spark parses
            return None
    return _name_parts(node)


def _reference_event_time(node: Any, below: dict[str, int], plan: PlanNode | None) -> tuple[str, int | None] | None:
    """What a column reference (an unresolved JVM attribute) is, as Spark's analyzer
    resolves it: ``(name, delay)`` for a column (delay None when it carries no event
    time), ``("", None)`` for a field of an event-time column (``window.end``: a
    window's fields have no metadata); None when ``node`` is no reference or lockgate
    cannot tell: a multi-part name it cannot resolve, or a field of another struct. Such
    a field carries the metadata of its ``StructField`` in Spark, which holds a
    watermark delay when the struct was made of an event-time column
    (``struct(ts.alias("f"))``), so selecting ``s.f`` can carry event time; Spark's
    optimizer decides that (:func:`with_event_time`). As a ``window`` time argument a
    field carries none (``TimeWindowing`` takes metadata from an attribute only)."""
    parts = _name_parts(node)
    if parts is None:
        return None
    if len(parts) == 1:
        return (parts[0], below.get(parts[0]))
    columns = qualified_outputs(plan) if plan is not None else None
    if columns is None:
        # without the qualifiers: a field of an event-time column (window.end) carries
        # none (a window's fields have no metadata); anything else cannot be told
        return ("", None) if parts[0] in below else None
    found = resolve_reference(columns, parts)
    if found is None:
        return None
    index, fields = found
    if fields:
        # a field of an event-time column (a window) carries none; of another struct,
        # its StructField's metadata, which lockgate does not follow
        return ("", None) if columns[index].delay_ms is not None else None
    return (columns[index].name, columns[index].delay_ms)


def name_parts(name: str) -> list[str]:
    """The parts of a column name as Spark parses ``col(name)`` (``l.ts``, ```a.b```)."""
    if "." not in name and "`" not in name:
        return [name]
    parts = _name_parts(F.col(name)._jc.node())
    return parts if parts is not None else [name]


def resolve_reference(columns: list[OutputColumn], parts: list[str]) -> tuple[int, tuple[str, ...]] | None:
    """The column a name refers to among ``columns``, and the struct fields after it, as
    Spark's analyzer resolves it (``AttributeSeq.resolve``, case-insensitive): first as
    a qualifier (its last parts) followed by a column name, and only when no column
    matches so, as a column followed by fields. None when nothing or more than one
    column matches (Spark's analysis fails then)."""
    low = [p.lower() for p in parts]
    matches: list[tuple[int, tuple[str, ...]]] = []
    for i, column in enumerate(columns):
        qualifier = [q.lower() for q in column.qualifier]
        for k in range(len(qualifier), 0, -1):
            if len(low) > k and low[:k] == qualifier[-k:] and low[k] == column.name.lower():
                matches.append((i, tuple(parts[k + 1 :])))
                break
    if not matches:
        matches = [(i, tuple(parts[1:])) for i, c in enumerate(columns) if c.name.lower() == low[0]]
    return matches[0] if len(matches) == 1 else None


def watermark_column_name(node: EventTimeWatermark) -> str | None:
    """The name of the column ``withWatermark`` marks: its argument, or the column a
    qualified argument (``l.ts`` after a join) resolves to; None when that cannot be
    told."""
    parts = name_parts(node.column)
    if len(parts) == 1:
        return parts[0]
    columns = qualified_outputs(node.child)
    found = resolve_reference(columns, parts) if columns is not None else None
    if columns is None or found is None or found[1]:
        return None
    return columns[found[0]].name


_QUALIFIED: weakref.WeakKeyDictionary[PlanNode, list[OutputColumn] | None] = weakref.WeakKeyDictionary()
""":func:`qualified_outputs` of each plan node asked about (nodes are immutable)."""


def qualified_outputs(node: PlanNode) -> list[OutputColumn] | None:
    """The output columns of ``node`` in order, each with the qualifier Spark's analyzer
    gives it and the delay of the event time it carries; None when lockgate cannot tell.

    A source's columns have no qualifier; ``alias(q)`` qualifies every column by ``q``;
    row-by-row methods keep them as they are; a projection keeps the qualifier of a
    column it selects as is and gives none to what it computes or aliases (a rename
    too); ``withWatermark`` marks its column and strips the event time of the others;
    a stateful operator states its own (:meth:`StatefulOperator.qualified_outputs`: a
    join keeps each side's).
    """
    if node not in _QUALIFIED:
        _QUALIFIED[node] = _qualified_outputs(node)
    found = _QUALIFIED[node]
    return None if found is None else list(found)


def _qualified_outputs(node: PlanNode) -> list[OutputColumn] | None:
    if isinstance(node, StreamingRelation):
        return [OutputColumn((), f.name, origin=(id(node), i)) for i, f in enumerate(node.schema.fields)]
    if isinstance(node, EventTimeWatermark):
        return _watermarked_outputs(node)
    if isinstance(node, StatefulOperator):
        return node.qualified_outputs(qualified_outputs)
    if not isinstance(node, Transform):
        return None
    below = qualified_outputs(node.child)
    if below is None:
        return None
    if node.method == "alias" and len(node.args) == 1 and isinstance(node.args[0], str):
        return [replace(c, qualifier=(node.args[0],)) for c in below]
    if node.method in KEEPS_EVENT_TIME:
        return below
    lineage = event_time_outputs(node.child)
    if node.event_time is not None or lineage is None:
        return None  # Spark's optimizer decided: lockgate does not know the qualifiers
    if node.method == "drop" and all(isinstance(a, str) for a in node.args):
        dropped = {a.lower() for a in node.args}
        return [c for c in below if c.name.lower() not in dropped]
    if node.method == "withColumnRenamed" and len(node.args) == 2:
        old, new = (str(a) for a in node.args)
        return [
            OutputColumn((), new, c.delay_ms, (id(node), i)) if c.name.lower() == old.lower() else c
            for i, c in enumerate(below)
        ]
    if node.method == "withColumn" and len(node.args) == 2 and isinstance(node.args[0], str):
        return _with_column_outputs(node, below, lineage)
    if node.method == "select" and not node.kwargs:
        args = node.args[0] if len(node.args) == 1 and isinstance(node.args[0], list) else node.args
        return _select_outputs(node, below, args, lineage)
    if node.method == "selectExpr" and not node.kwargs and all(isinstance(a, str) for a in node.args):
        exprs = ["*" if text.strip() == "*" else F.expr(text) for text in node.args]
        return _select_outputs(node, below, exprs, lineage)
    return None


def _watermarked_outputs(node: EventTimeWatermark) -> list[OutputColumn] | None:
    """``withWatermark``'s output: its column marked with its delay, the event time of
    every other column removed (Spark's ``EventTimeWatermark.output``)."""
    below = qualified_outputs(node.child)
    found = resolve_reference(below, name_parts(node.column)) if below is not None else None
    if below is None or found is None or found[1]:
        return None
    return [replace(c, delay_ms=node.delay_ms if i == found[0] else None) for i, c in enumerate(below)]


def _with_column_outputs(
    node: Transform, below: list[OutputColumn], lineage: dict[str, int]
) -> list[OutputColumn] | None:
    """``withColumn(name, column)``: a column of that name replaced in place (without
    its qualifier), else one added at the end."""
    name, column = node.args
    made = column_event_time(column, lineage, node.child)
    if made is None:
        return None
    added = OutputColumn((), name, made[1], (id(node), 0))
    if any(c.name.lower() == name.lower() for c in below):
        return [added if c.name.lower() == name.lower() else c for c in below]
    return [*below, added]


def _select_outputs(
    node: Transform, below: list[OutputColumn], args: Any, lineage: dict[str, int]
) -> list[OutputColumn] | None:
    """``select(*args)``: a column selected by reference keeps its qualifier, what is
    computed or aliased has none."""
    out: list[OutputColumn] = []
    for position, arg in enumerate(args):
        if isinstance(arg, str) and arg == "*":
            out.extend(below)
            continue
        column = F.col(arg) if isinstance(arg, str) else arg
        try:
            parts = _reference_parts(column._jc.node())
        except Exception:  # noqa: BLE001 - py4j: a Column without a Catalyst node
            return None
        if parts is not None:
            found = resolve_reference(below, parts)
            if found is None:
                return None
            index, fields = found
            if fields and below[index].delay_ms is None:
                return None  # a struct field: see _reference_event_time
            out.append(OutputColumn((), fields[-1], None, (id(node), position)) if fields else below[index])
            continue
        made = column_event_time(column, lineage, node.child)
        if made is None:
            return None
        out.append(OutputColumn((), made[0], made[1], (id(node), position)))
    return out


def event_time_columns(plan: PlanNode) -> dict[str, int]:
    """The output columns of ``plan`` that carry event time (those Spark marks with
    watermark metadata), by name, with the delay of the watermark they derive from.

    A ``withWatermark`` column passes through row-by-row operations, deduplication and
    joins; an aggregation's output carries event time only in its event-time grouping
    key (a watermarked column, or a window over one), so a second stateful operator
    can use it as its own event time.

    Projections are followed as Spark propagates watermark metadata (an alias or a
    rename keeps it, ``window()`` over the column carries it; the rules of
    :func:`event_time_outputs`); where those cannot tell, every ``withWatermark``
    column below that is still present counts.
    """
    followed = event_time_outputs(plan)
    if followed is not None:
        return followed
    return _event_time_columns_below(plan)


def _event_time_columns_below(plan: PlanNode) -> dict[str, int]:
    if isinstance(plan, EventTimeWatermark):
        name = watermark_column_name(plan) or name_parts(plan.column)[-1]
        return {**_event_time_columns_below(plan.child), name: plan.delay_ms}
    if isinstance(plan, StatefulOperator):
        return plan.event_time_outputs(_event_time_columns_below) or {}
    if isinstance(plan, Union):
        return _event_time_columns_below(plan.left)
    found: dict[str, int] = {}
    for child in plan.children:
        found.update(_event_time_columns_below(child))
    return found


def grouping_event_time_key(
    schema: StructType,
    key_count: int,
    grouping: tuple[Any, ...],
    watermarked: dict[str, int],
    plan: PlanNode | None = None,
) -> int | None:
    """The index of an aggregation's event-time grouping key: the first of the
    ``key_count`` grouping columns of the aggregation's output ``schema`` that is an
    event-time column of its input (``watermarked``, from :func:`event_time_columns`) or a
    ``window()`` over one; ``grouping`` holds the groupBy items as given, ``plan`` is the
    aggregation's input, among whose columns a qualified item (``l.ts``,
    ``window("l.ts", ...)``) is resolved."""
    if not watermarked:
        return None
    for i, field in enumerate(schema.fields[:key_count]):
        item = grouping[i] if i < len(grouping) else None
        reference = _qualified_reference(item)
        made = _reference_event_time(reference, watermarked, plan) if reference is not None else None
        if made is not None:  # groupBy("l.ts"): the column it resolves to decides
            if made[1] is not None:
                return i
            continue
        if field.name in watermarked:
            return i
        if field.metadata.get("spark.timeWindow") and isinstance(item, Column):
            # a window() over an event-time column (or over window_time of an upstream
            # window), as Spark's TimeWindowing propagates the metadata; a window over
            # any other column (an upstream window's end) is no event time
            made = column_event_time(item, watermarked, plan)
            if made is not None and made[1] is not None:
                return i
    return None


def _qualified_reference(item: Any) -> Any:
    """The JVM node of a grouping item that is a multi-part column reference, else None."""
    if not isinstance(item, (str, Column)):
        return None
    try:
        node = (F.col(item) if isinstance(item, str) else item)._jc.node()
    except Exception:  # noqa: BLE001 - py4j: a Column without a Catalyst node
        return None
    parts = _name_parts(node)
    return node if parts is not None and len(parts) > 1 else None


def with_event_time(node: Transform, before: DataFrame, after: DataFrame) -> Transform:
    """``node``, with the columns that carry event time after it as Spark's optimizer
    decides (``Transform.event_time``) when lockgate's rules cannot tell."""
    if node.method in KEEPS_EVENT_TIME:
        return node
    below = event_time_outputs(node.child)
    if not below or event_time_outputs(node) is not None:
        return node
    found = event_time_by_optimizer(before, after, below, qualified_outputs(node.child))
    if found is None:
        return node
    return replace(node, event_time=tuple(sorted(found.items())))
