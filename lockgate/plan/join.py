"""Stream-stream joins: Spark's symmetric hash join (StreamingSymmetricHashJoinExec).

Each batch, both sides' new rows are tagged with their side, hash-partitioned together by
the join keys into the state's partitions, and one ``mapInArrow`` task per partition:

1. drops rows Spark's optimizer would have filtered out below the join (single-side
   conjuncts pushed to a non-preserved side, and the inferred ``isnotnull`` of keys and
   of columns used by null-intolerant conjuncts);
2. processes the new **left** rows: drops late rows (event time <= the previous batch's
   watermark, counted as ``numRowsDroppedByWatermark``), joins each with the right state
   rows of its key that pass the condition (marking them matched), and buffers it in the
   left state (left semi: only when it matched nothing);
3. processes the new **right** rows the same way against the left state, which now holds
   this batch's left rows too (so each new pair is produced exactly once); a right row is
   buffered unless the state watermark would evict it at once (and, for right/full
   outer, it matched);
4. evicts state rows at or below each side's state watermark; for outer joins the
   evicted rows of the preserved side(s) that never matched are emitted with nulls.

The join condition is read from Spark's analysed plan of the same join on the
templates, so column resolution and types are Spark's. The non-equality part is
evaluated in Python for a documented subset of expressions (see docs/stream-joins.md);
anything else is refused when the join is defined.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial as bind
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    LongType,
    MapType,
    StructField,
    StructType,
)

from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.plan.nodes import EventTimeWatermark, PlanNode, Transform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lockgate.api.dataframe import StreamingDataFrame
    from lockgate.plan.aggregate import StatefulContext

LEFT, RIGHT = 0, 1
_SPARK_JOIN_NAMES = {
    "inner": "Inner",
    "left_outer": "LeftOuter",
    "right_outer": "RightOuter",
    "full_outer": "FullOuter",
    "left_semi": "LeftSemi",
}
_HOW = {
    "inner": "inner",
    "left": "left_outer",
    "leftouter": "left_outer",
    "right": "right_outer",
    "rightouter": "right_outer",
    "outer": "full_outer",
    "full": "full_outer",
    "fullouter": "full_outer",
    "semi": "left_semi",
    "leftsemi": "left_semi",
    "anti": "left_anti",
    "leftanti": "left_anti",
    "cross": "cross",
}
MICROS_PER_DAY = 86_400_000_000


# -- expressions ------------------------------------------------------------------------
# A picklable expression tree (tuples), evaluated with Spark's semantics:
#   ("attr", side, index, kind)      kind: ts | date | float | other
#   ("lit", value, kind)             timestamps as micros, intervals as micros
#   ("cmp", op, a, b)                op: = < <= > >=
#   ("and", a, b) / ("or", a, b) / ("isnull", a) / ("isnotnull", a)
#   ("tadd", ts, interval)           timestamp + day-time interval
#   ("neg", interval)


@dataclass
class _Conjunct:
    expr: tuple[Any, ...]
    refs: frozenset[tuple[int, int]]
    """(side, column index) of the attributes it uses."""
    not_null: frozenset[tuple[int, int]]
    """Attributes Spark infers ``isnotnull`` for from this conjunct."""
    watermark_forms: dict[int, Any]
    """side -> its state watermark form (see :func:`_state_watermark_form`) or None."""
    text: str


def _kind(type_name: str) -> str:
    if type_name in ("timestamp", "timestamp_ntz"):
        return "ts"
    if type_name == "date":
        return "date"
    if type_name in ("double", "float"):
        return "float"
    return "other"


class _Converter:
    """Turns resolved Catalyst expressions into the tuple form, refusing the rest."""

    def __init__(self, attrs: dict[int, tuple[int, int, Any]], whole: str) -> None:
        self.attrs = attrs  # exprId -> (side, index, java attribute)
        self.whole = whole

    def refuse(self, e: Any) -> NotSupportedYetError:
        return NotSupportedYetError(
            f"The stream-stream join condition term {str(e.toString())!r} (in {self.whole!r})",
            "lockgate evaluates join conditions made of column references, literals, "
            "comparisons (=, <>, <, <=, >, >=), AND, OR, NOT, IS [NOT] NULL and timestamp +/- "
            "day-time interval literals.",
        )

    def convert(self, e: Any) -> tuple[Any, ...]:
        name = e.getClass().getSimpleName()
        if name == "AttributeReference":
            key = int(e.exprId().id())
            if key not in self.attrs:
                raise self.refuse(e)
            side, index, _ = self.attrs[key]
            return ("attr", side, index, _kind(str(e.dataType().typeName())))
        if name == "Literal":
            return ("lit",) + _literal(e, self)
        if name in ("EqualTo", "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual"):
            op = {"EqualTo": "=", "LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">",
                  "GreaterThanOrEqual": ">="}[name]
            left, right = e.left(), e.right()
            if str(left.dataType().typeName()) != str(right.dataType().typeName()):
                raise self.refuse(e)
            t = str(left.dataType().typeName())
            if t.startswith(("struct", "array", "map", "binary", "interval", "decimal")) or "interval" in t:
                raise self.refuse(e)
            return ("cmp", op, self.convert(left), self.convert(right))
        if name in ("And", "Or"):
            return (name.lower(), self.convert(e.left()), self.convert(e.right()))
        if name in ("IsNull", "IsNotNull", "Not"):
            return (name.lower(), self.convert(e.child()))
        if name in ("TimeAdd", "TimestampAddInterval"):
            start, interval = e.children().apply(0), e.children().apply(1)
            itype = str(interval.dataType().typeName())
            if not itype.startswith("interval") or itype == "interval":
                # CalendarInterval ("interval") may carry days/months: time-zone dependent
                raise self.refuse(e)
            return ("tadd", self.convert(start), self.convert(interval))
        if name == "DatetimeSub":
            return self.convert(e.replacement())
        if name == "UnaryMinus":
            child = self.convert(e.child())
            if child[0] == "lit" and child[2] == "interval":
                return ("lit", None if child[1] is None else -child[1], "interval")
            raise self.refuse(e)
        if name == "Cast":
            child = e.child()
            if str(child.dataType().typeName()) == str(e.dataType().typeName()):
                return self.convert(child)
            raise self.refuse(e)
        raise self.refuse(e)


def _literal(e: Any, conv: _Converter) -> tuple[Any, str]:
    t = str(e.dataType().typeName())
    value = e.value()
    if value is None:
        return (None, "null")
    if t in ("timestamp", "timestamp_ntz"):
        return (int(value), "ts")
    if t.startswith("interval") and t != "interval":
        if "year" in t or "month" in t:
            raise conv.refuse(e)
        return (int(value), "interval")
    if t in ("integer", "long", "short", "byte"):
        return (int(value), "other")
    if t in ("double", "float"):
        return (float(value), "float")
    if t == "boolean":
        return (bool(value), "other")
    if t == "string":
        return (str(value.toString()), "other")
    if t == "date":
        import datetime as _dt

        return (_dt.date(1970, 1, 1) + _dt.timedelta(days=int(value)), "date")
    raise conv.refuse(e)


def _float_key(x: float) -> tuple[int, float]:
    return (1, 0.0) if math.isnan(x) else (0, x + 0.0)


def _micros(value: Any) -> Any:
    from lockgate.plan.aggregate import _micros as m

    return m(value)


def compile_expr(expr: tuple[Any, ...]) -> Callable[[Any, Any], Any]:
    """A function (left_row, right_row) -> True / False / None (SQL three-valued)."""
    tag = expr[0]
    if tag == "attr":
        _, side, index, kind = expr
        if kind == "ts":
            if side == LEFT:
                return lambda lr, rr: _micros(lr[index])
            return lambda lr, rr: _micros(rr[index])
        if side == LEFT:
            return lambda lr, rr: lr[index]
        return lambda lr, rr: rr[index]
    if tag == "lit":
        value = expr[1]
        return lambda lr, rr: value
    if tag == "cmp":
        op, a, b = expr[1], compile_expr(expr[2]), compile_expr(expr[3])
        floats = expr[2][-1] == "float" or expr[3][-1] == "float"

        def cmp(lr: Any, rr: Any) -> Any:
            x, y = a(lr, rr), b(lr, rr)
            if x is None or y is None:
                return None
            if floats:
                x, y = _float_key(float(x)), _float_key(float(y))
            if op == "=":
                return x == y
            if op == "<":
                return x < y
            if op == "<=":
                return x <= y
            if op == ">":
                return x > y
            return x >= y

        return cmp
    if tag == "and":
        a, b = compile_expr(expr[1]), compile_expr(expr[2])

        def and_(lr: Any, rr: Any) -> Any:
            x = a(lr, rr)
            if x is False:
                return False
            y = b(lr, rr)
            if y is False:
                return False
            if x is None or y is None:
                return None
            return True

        return and_
    if tag == "or":
        a, b = compile_expr(expr[1]), compile_expr(expr[2])

        def or_(lr: Any, rr: Any) -> Any:
            x = a(lr, rr)
            if x is True:
                return True
            y = b(lr, rr)
            if y is True:
                return True
            if x is None or y is None:
                return None
            return False

        return or_
    if tag == "not":
        a = compile_expr(expr[1])

        def not_(lr: Any, rr: Any) -> Any:
            x = a(lr, rr)
            return None if x is None else not x

        return not_
    if tag == "isnull":
        a = compile_expr(expr[1])
        return lambda lr, rr: a(lr, rr) is None
    if tag == "isnotnull":
        a = compile_expr(expr[1])
        return lambda lr, rr: a(lr, rr) is not None
    if tag == "tadd":
        a, b = compile_expr(expr[1]), compile_expr(expr[2])

        def tadd(lr: Any, rr: Any) -> Any:
            x, y = a(lr, rr), b(lr, rr)
            if x is None or y is None:
                return None
            return x + y

        return tadd
    raise ValueError(f"unknown expression {tag}")


# kinds for literals used by cmp's float detection: attr tuples end with kind, lit tuples too


def _all_true(fns: list[Callable[[Any, Any], Any]]) -> Callable[[Any, Any], bool]:
    if not fns:
        return lambda lr, rr: True
    return lambda lr, rr: all(f(lr, rr) is True for f in fns)


# -- state watermark (Spark's StreamingJoinHelper.getStateValueWatermark) ------------------
def _collect_terms(e: Any, negate: bool, attrs: dict[int, tuple[int, int, Any]]) -> list[Any] | None:
    """Spark's collectTerms: [(negated, ("attr", side, index, is_ts, has_wm) | ("lit", micros))],
    or None when Spark would find the expression invalid / fail."""
    name = e.getClass().getSimpleName()
    if name == "Add":
        a = _collect_terms(e.left(), negate, attrs)
        b = _collect_terms(e.right(), negate, attrs)
        return None if a is None or b is None else a + b
    if name == "Subtract":
        a = _collect_terms(e.left(), negate, attrs)
        b = _collect_terms(e.right(), not negate, attrs)
        return None if a is None or b is None else a + b
    if name in ("TimeAdd", "TimestampAddInterval"):
        a = _collect_terms(e.children().apply(0), negate, attrs)
        b = _collect_terms(e.children().apply(1), negate, attrs)
        return None if a is None or b is None else a + b
    if name == "DatetimeSub":
        return _collect_terms(e.replacement(), negate, attrs)
    if name == "UnaryMinus":
        return _collect_terms(e.child(), not negate, attrs)
    if name in ("CheckOverflow", "PromotePrecision"):
        return _collect_terms(e.child(), negate, attrs)
    if name == "Cast":
        t = str(e.dataType().typeName())
        if t in ("timestamp",) or t in ("byte", "short", "integer", "long", "float", "double") or t.startswith("decimal"):
            return _collect_terms(e.child(), negate, attrs)
        return None
    if name == "AttributeReference":
        key = int(e.exprId().id())
        if key not in attrs:
            return None
        side, index, _ = attrs[key]
        is_ts = str(e.dataType().typeName()) == "timestamp"
        return [(negate, ("attr", side, index, is_ts))]
    if name == "Literal":
        t = str(e.dataType().typeName())
        value = e.value()
        if value is None:
            return None
        if t == "interval":
            if int(value.months) != 0:
                return None
            return [(negate, ("lit", int(value.days) * float(MICROS_PER_DAY) + float(value.microseconds)))]
        if t.startswith("interval") and "year" not in t and "month" not in t:
            return [(negate, ("lit", float(int(value))))]
        if t == "double":
            return [(negate, ("lit", float(value) * 1000000.0))]
        if t in ("byte", "short", "integer", "long", "float"):
            return [(negate, ("lit", float(value) * 1000000.0))]
        if t == "timestamp":
            return [(negate, ("lit", float(int(value)) * 1000000.0))]
        return None  # Spark: MatchError, caught -> no watermark
    return None


def _state_watermark_form(
    conj: Any, this_side: int, attrs: dict[int, tuple[int, int, Any]], wm_cols: dict[int, int | None]
) -> tuple[list[tuple[bool, Any]], int] | None:
    """For one conjunct: the terms to add up (other side's watermark column replaced by
    the watermark) and the adjustment (-1 for <= / >=), or None when Spark derives no
    state watermark from it."""
    name = conj.getClass().getSimpleName()
    if name == "LessThan":
        a, b, adjust = conj.left(), conj.right(), 0
    elif name == "LessThanOrEqual":
        a, b, adjust = conj.left(), conj.right(), -1
    elif name == "GreaterThan":
        a, b, adjust = conj.right(), conj.left(), 0
    elif name == "GreaterThanOrEqual":
        a, b, adjust = conj.right(), conj.left(), -1
    else:
        return None
    other = 1 - this_side
    if wm_cols.get(other) is None:
        return None
    refs = _refs(a, attrs) | _refs(b, attrs)
    if len([r for r in refs if r[0] == this_side]) > 1 or len([r for r in refs if r[0] == other]) > 1:
        return None
    ta = _collect_terms(a, False, attrs)
    tb = _collect_terms(b, True, attrs)
    if ta is None or tb is None:
        return None
    terms: list[tuple[bool, Any]] = []
    for t in ta + tb:  # ExpressionSet: duplicates collapse
        if t not in terms:
            terms.append(t)
    constraint = [t for t in terms if t[1][0] == "attr" and t[1][1] == this_side and t[1][3]]
    if len(constraint) != 1 or not constraint[0][0]:
        return None
    rest = [t for t in terms if t is not constraint[0] and t != constraint[0]]
    if not rest:
        return None
    for negated, term in rest:
        if term[0] == "attr":
            side, index, is_ts = term[1], term[2], term[3]
            if not (side == other and is_ts and index == wm_cols[other]):
                return None  # Spark cannot evaluate a bound attribute: no watermark
    return rest, adjust


def state_watermark_ms(forms: list[tuple[list[tuple[bool, Any]], int]], watermark_ms: int) -> int | None:
    values = []
    for rest, adjust in forms:
        total: float | None = None
        for negated, term in rest:
            v = watermark_ms * 1000.0 if term[0] == "attr" else term[1]
            v = -v if negated else v
            total = v if total is None else total + v
        assert total is not None
        values.append(int(total / 1000.0) + adjust)
    return min(values) if values else None


def _refs(e: Any, attrs: dict[int, tuple[int, int, Any]]) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()

    def visit(x: Any) -> None:
        if x.getClass().getSimpleName() == "AttributeReference":
            key = int(x.exprId().id())
            if key in attrs:
                found.add(attrs[key][:2])
            return
        children = x.children()
        for i in range(children.size()):
            visit(children.apply(i))

    visit(e)
    return found


_NULL_INTOLERANT = {
    "EqualTo", "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Not",
    "TimeAdd", "TimestampAddInterval", "UnaryMinus", "Add", "Subtract",
}


def _null_intolerant_refs(e: Any, attrs: dict[int, tuple[int, int, Any]]) -> set[tuple[int, int]]:
    """Spark's scanNullIntolerantAttribute (after DatetimeSub / same-type Cast removal)."""
    name = e.getClass().getSimpleName()
    if name == "AttributeReference":
        key = int(e.exprId().id())
        return {attrs[key][:2]} if key in attrs else set()
    if name == "DatetimeSub":
        return _null_intolerant_refs(e.replacement(), attrs)
    if name == "Cast" and str(e.child().dataType().typeName()) == str(e.dataType().typeName()):
        return _null_intolerant_refs(e.child(), attrs)
    if name == "IsNotNull":
        return _null_intolerant_refs(e.child(), attrs)
    if name in _NULL_INTOLERANT:
        out: set[tuple[int, int]] = set()
        children = e.children()
        for i in range(children.size()):
            out |= _null_intolerant_refs(children.apply(i), attrs)
        return out
    return set()


def _split_and(e: Any) -> list[Any]:
    if e.getClass().getSimpleName() == "And":
        return _split_and(e.left()) + _split_and(e.right())
    return [e]


# -- the plan node ----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class StreamJoin(PlanNode):
    left: PlanNode
    right: PlanNode
    join_type: str
    operator_name = "symmetricHashJoin"
    left_schema: StructType = field(default_factory=StructType)
    right_schema: StructType = field(default_factory=StructType)
    left_keys: tuple[int, ...] = ()
    right_keys: tuple[int, ...] = ()
    pushed: tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]] = ((), ())
    """Per side: conjuncts Spark's optimizer pushes below the join (incl. isnotnull)."""
    pre_join: tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]] = ((), ())
    post_join: tuple[tuple[Any, ...], ...] = ()
    watermark_columns: tuple[int | None, int | None] = (None, None)
    key_watermark_ordinal: int | None = None
    state_watermark_forms: tuple[Any, Any] = (None, None)
    """Per side: list of forms from the join's remaining condition, or None."""
    check_watermark_ok: bool = True
    using_keys: tuple[str, ...] | None = None
    output_names: tuple[str, ...] = ()
    output_types: tuple[Any, ...] = ()

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.left, self.right)

    def side_has_predicate(self, side: int) -> bool:
        if self.key_watermark_ordinal is not None:
            return True
        return self.watermark_columns[side] is not None and bool(self.state_watermark_forms[side])

    @property
    def evicts_by_watermark(self) -> bool:
        return self.side_has_predicate(LEFT) or self.side_has_predicate(RIGHT)

    def describe(self) -> str:
        return f"StreamingSymmetricHashJoin {_SPARK_JOIN_NAMES.get(self.join_type, self.join_type)}"


def _side_watermark_column(sdf: StreamingDataFrame) -> int | None:
    """Index of the side's event-time column (the one carrying Spark's watermark metadata)."""
    marks: list[EventTimeWatermark] = []
    path_ok = True

    def visit(node: PlanNode, above: list[PlanNode]) -> None:
        nonlocal path_ok
        if isinstance(node, EventTimeWatermark):
            marks.append(node)
            for op in above:
                if not _keeps_column(op, node.column):
                    path_ok = False
        for child in node.children:
            visit(child, above + [node])

    visit(sdf._plan, [])
    if not marks:
        return None
    names = [m.column for m in marks]
    cols = sdf._template.columns
    present = [n for n in dict.fromkeys(names) if n in cols]
    if len(marks) > 1 or not path_ok:
        raise NotSupportedYetError(
            "A stream-stream join side with several watermarks, or whose watermark column "
            "is transformed after withWatermark()",
            "Apply withWatermark() as the last step before the join, on a column kept as is.",
        )
    return cols.index(present[0]) if present else None


_KEEPS = ("filter", "where", "dropna", "repartition", "coalesce", "hint", "sample")


def _keeps_column(node: PlanNode, column: str) -> bool:
    if isinstance(node, EventTimeWatermark):
        return True
    if not isinstance(node, Transform):
        return False
    if node.method in _KEEPS:
        return True
    if node.method == "drop":
        return all(isinstance(a, str) for a in node.args)
    if node.method in ("withColumn",):
        return isinstance(node.args[0], str) and node.args[0] != column
    if node.method == "withColumnRenamed":
        return node.args[0] != column and node.args[1] != column
    if node.method in ("select", "selectExpr"):
        return all(isinstance(a, str) and a.isidentifier() for a in node.args) and not node.kwargs
    return False


def _normalize_how(how: str | None) -> str:
    key = (how or "inner").lower().replace("_", "").replace(" ", "")
    jt = _HOW.get(key)
    if jt is None:
        raise AnalysisError(f"Unsupported join type {how!r}.")
    return jt


_OK_KEY_TYPES = ("string", "integer", "long", "short", "byte", "boolean", "date", "timestamp", "timestamp_ntz")


def make_stream_join(
    left: StreamingDataFrame, right: StreamingDataFrame, on: Any, how: str | None
) -> tuple[StreamJoin, DataFrame]:
    jt = _normalize_how(how)
    template = left._template.join(right._template, on, how)  # Spark's analysis errors
    if jt == "left_anti":
        raise AnalysisError("LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported")
    if jt == "cross" or on is None:
        raise NotSupportedYetError(
            "A stream-stream join without equality join keys (cross join)",
            "Join on at least one column equality.",
        )
    plan = template._jdf.queryExecution().analyzed()
    join = plan
    while join.getClass().getSimpleName() != "Join":
        if join.children().size() != 1:
            raise NotSupportedYetError(f"Stream-stream join {how!r}", "Its analysed plan is not a join.")
        join = join.children().apply(0)
    lschema, rschema = left._template.schema, right._template.schema
    attrs: dict[int, tuple[int, int, Any]] = {}
    for side, child, schema in ((LEFT, join.left(), lschema), (RIGHT, join.right(), rschema)):
        out = child.output()
        if out.size() != len(schema.fields):
            raise NotSupportedYetError("This stream-stream join", "Its sides' columns could not be matched.")
        for i in range(out.size()):
            a = out.apply(i)
            attrs[int(a.exprId().id())] = (side, i, a)
    for side, schema in ((LEFT, lschema), (RIGHT, rschema)):
        for f in schema.fields:
            if isinstance(f.dataType, (StructType, ArrayType, MapType, BinaryType)):
                raise NotSupportedYetError(
                    f"A stream-stream join of a side with the nested or binary column {f.name!r}",
                    "Flatten it (select its fields) before the join.",
                )
    cond = join.condition()
    if cond.isEmpty():
        raise NotSupportedYetError("A stream-stream join without equality join keys")
    whole = str(cond.get().toString())
    conv = _Converter(attrs, whole)
    wm_cols = {LEFT: _side_watermark_column(left), RIGHT: _side_watermark_column(right)}
    lkeys: list[int] = []
    rkeys: list[int] = []
    others: list[Any] = []
    for c in _split_and(cond.get()):
        name = c.getClass().getSimpleName()
        if name == "EqualTo":
            a, b = c.left(), c.right()
            ra, rb = _refs(a, attrs), _refs(b, attrs)
            sides_a, sides_b = {s for s, _ in ra}, {s for s, _ in rb}
            if sides_a and sides_b and len(sides_a) == 1 and len(sides_b) == 1 and sides_a != sides_b:
                if a.getClass().getSimpleName() != "AttributeReference" or b.getClass().getSimpleName() != "AttributeReference":
                    raise NotSupportedYetError(
                        f"The stream-stream join key {str(c.toString())!r} on expressions",
                        "Compute the key as a column of each side (withColumn) and join on the columns.",
                    )
                (sa, ia), (_sb, ib) = next(iter(ra)), next(iter(rb))
                if sa == RIGHT:
                    ia, ib = ib, ia
                t = str(attrs_type(attrs, LEFT, ia))
                if t not in _OK_KEY_TYPES:
                    raise NotSupportedYetError(
                        f"A stream-stream join key of type {t}",
                        f"Supported key types: {', '.join(_OK_KEY_TYPES)}.",
                    )
                lkeys.append(ia)
                rkeys.append(ib)
                continue
        if name == "EqualNullSafe":
            raise NotSupportedYetError(f"The null-safe stream-stream join key {str(c.toString())!r}")
        others.append(c)
    if not lkeys:
        raise NotSupportedYetError(
            "A stream-stream join without equality join keys",
            "Join on at least one column equality (e.g. leftId = rightId).",
        )
    key_refs = {(LEFT, i) for i in lkeys} | {(RIGHT, i) for i in rkeys}
    conjuncts: list[_Conjunct] = []
    for c in others:
        refs = frozenset(_refs(c, attrs))
        text = str(c.toString())
        if not refs:
            raise NotSupportedYetError(f"The constant stream-stream join condition term {text!r}")
        if refs & key_refs:
            raise NotSupportedYetError(
                f"The stream-stream join condition term {text!r} on a join key column",
                "Spark infers extra filters from such terms; filter the sides before the join.",
            )
        if c.getClass().getSimpleName() == "Not" and c.child().getClass().getSimpleName() in (
            "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual"
        ):
            raise conv.refuse(c)  # Spark's optimizer rewrites it into a range condition
        expr = conv.convert(c)
        forms = {s: _state_watermark_form(c, s, attrs, wm_cols) for s in (LEFT, RIGHT)}
        conjuncts.append(
            _Conjunct(expr, refs, frozenset(_null_intolerant_refs(c, attrs)), forms, text)
        )
    # Spark's optimizer: single-side conjuncts pushed below the join, and inferred
    # isnotnull filters, on the sides whose rows cannot appear null-padded.
    push_to = {
        "inner": {LEFT, RIGHT},
        "left_semi": {LEFT, RIGHT},
        "left_outer": {RIGHT},
        "right_outer": {LEFT},
        "full_outer": set(),
    }[jt]
    pushed: list[list[tuple[Any, ...]]] = [[], []]
    pre_join: list[list[tuple[Any, ...]]] = [[], []]
    post_join: list[tuple[Any, ...]] = []
    remaining: list[_Conjunct] = []
    not_null: list[set[int]] = [set(), set()]
    # (Spark 4's streaming plans show no inferred isnotnull on the equi-join keys.)
    for c in conjuncts:
        sides = {s for s, _ in c.refs}
        for s, i in c.not_null:
            if s in push_to:
                not_null[s].add(i)
        if len(sides) == 1:
            (s,) = sides
            if s in push_to:
                pushed[s].append(c.expr)
                continue
            pre_join[s].append(c.expr)
        else:
            post_join.append(c.expr)
        remaining.append(c)
    for side in (LEFT, RIGHT):
        kind_of = lambda i, s=side: _kind(attrs_type(attrs, s, i))  # noqa: E731
        for i in sorted(not_null[side]):
            pushed[side].append(("isnotnull", ("attr", side, i, kind_of(i))))
    # event-time join key (Spark's findJoinKeyOrdinalForWatermark)
    key_ord = next((j for j, i in enumerate(lkeys) if wm_cols[LEFT] == i), None)
    if key_ord is None:
        key_ord = next((j for j, i in enumerate(rkeys) if wm_cols[RIGHT] == i), None)
    forms: list[Any] = [None, None]
    for side in (LEFT, RIGHT):
        if wm_cols[side] is not None:
            found = [c.watermark_forms[side] for c in remaining if c.watermark_forms[side] is not None]
            forms[side] = found or None
    # start-time check (Spark's checkForStreamStreamJoinWatermark, on the whole condition)
    whole_forms = {
        s: [c.watermark_forms[s] for c in conjuncts if c.watermark_forms[s] is not None] for s in (LEFT, RIGHT)
    }
    key_has_wm = any(wm_cols[LEFT] == i for i in lkeys) or any(wm_cols[RIGHT] == i for i in rkeys)
    if jt in ("left_outer", "left_semi"):
        range_ok = bool(whole_forms[LEFT])
    elif jt == "right_outer":
        range_ok = bool(whole_forms[RIGHT])
    elif jt == "full_outer":
        range_ok = bool(whole_forms[LEFT]) or bool(whole_forms[RIGHT])
    else:
        range_ok = True
    check_ok = key_has_wm or range_ok
    using = None
    if isinstance(on, str):
        using = (on,)
    elif isinstance(on, (list, tuple)) and on and all(isinstance(x, str) for x in on):
        using = tuple(on)
    node = StreamJoin(
        left._plan,
        right._plan,
        jt,
        left_schema=lschema,
        right_schema=rschema,
        left_keys=tuple(lkeys),
        right_keys=tuple(rkeys),
        pushed=(tuple(pushed[LEFT]), tuple(pushed[RIGHT])),
        pre_join=(tuple(pre_join[LEFT]), tuple(pre_join[RIGHT])),
        post_join=tuple(post_join),
        watermark_columns=(wm_cols[LEFT], wm_cols[RIGHT]),
        key_watermark_ordinal=key_ord,
        state_watermark_forms=(forms[LEFT], forms[RIGHT]),
        check_watermark_ok=check_ok,
        using_keys=using,
        output_names=tuple(template.columns),
        output_types=tuple(f.dataType for f in template.schema.fields),
    )
    # the projection must give exactly Spark's output columns
    spark = template.sparkSession
    probe = _project(node, spark.createDataFrame([], _joined_schema(node)))
    if probe.columns != template.columns or [f.dataType for f in probe.schema.fields] != list(node.output_types):
        raise NotSupportedYetError(
            "This stream-stream join's output columns",
            f"lockgate would produce {probe.columns}, Spark {template.columns}.",
        )
    return node, template


def attrs_type(attrs: dict[int, tuple[int, int, Any]], side: int, index: int) -> str:
    for s, i, a in attrs.values():
        if s == side and i == index:
            return str(a.dataType().typeName())
    raise KeyError((side, index))


def check_stream_join(node: StreamJoin, output_mode: str) -> None:
    """Start-time checks (Spark's UnsupportedOperationChecker rules for joins)."""
    if output_mode != "append":
        raise AnalysisError(
            "Join between two streaming DataFrames/Datasets is not supported in "
            f"{output_mode.capitalize()} output mode, only in Append output mode"
        )
    if node.join_type != "inner" and not node.check_watermark_ok:
        raise AnalysisError(
            f"Stream-stream {_SPARK_JOIN_NAMES[node.join_type]} join between two streaming "
            "DataFrame/Datasets is not supported without a watermark in the join keys, or a "
            "watermark on the nullable side and an appropriate range condition"
        )


# -- per-batch physical steps -------------------------------------------------------------
def _joined_schema(node: StreamJoin) -> StructType:
    fields = [StructField(f"__l{i}", f.dataType, True) for i, f in enumerate(node.left_schema.fields)]
    if node.join_type != "left_semi":
        fields += [StructField(f"__r{i}", f.dataType, True) for i, f in enumerate(node.right_schema.fields)]
    return StructType(fields)


def _project(node: StreamJoin, df: DataFrame) -> DataFrame:
    lcols = [F.col(f"__l{i}") for i in range(len(node.left_schema.fields))]
    if node.join_type == "left_semi":
        cols = lcols
    elif node.using_keys is not None:
        lnames = [f.name for f in node.left_schema.fields]
        rnames = [f.name for f in node.right_schema.fields]
        cols = []
        lk, rk = set(), set()
        for name in node.using_keys:
            li = next(i for i, n in enumerate(lnames) if n.lower() == name.lower())
            ri = next(i for i, n in enumerate(rnames) if n.lower() == name.lower())
            lk.add(li)
            rk.add(ri)
            if node.join_type == "right_outer":
                cols.append(F.col(f"__r{ri}"))
            elif node.join_type == "full_outer":
                cols.append(F.coalesce(F.col(f"__l{li}"), F.col(f"__r{ri}")))
            else:
                cols.append(F.col(f"__l{li}"))
        cols += [c for i, c in enumerate(lcols) if i not in lk]
        cols += [F.col(f"__r{i}") for i in range(len(rnames)) if i not in rk]
    else:
        cols = lcols + [F.col(f"__r{i}") for i in range(len(node.right_schema.fields))]
    return df.select(*[c.alias(n) for c, n in zip(cols, node.output_names)])


@dataclass(frozen=True)
class JoinTask:
    left_store: Any
    right_store: Any
    version: int
    join_type: str
    left_keys: tuple[int, ...]
    right_keys: tuple[int, ...]
    pushed: Any
    pre_join: Any
    post_join: Any
    watermark_columns: tuple[int | None, int | None]
    late_watermark_ms: int
    evict_watermark_ms: int
    key_watermark_ordinal: int | None
    state_watermark_ms: tuple[int | None, int | None]
    left_width: int
    right_width: int
    out_schema: pa.Schema
    accumulator: Any
    operator_id: int


class _Side:
    """One side's buffered rows in a task: the store plus an index of key -> indices."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.index: dict[tuple[Any, ...], list[int]] = {}
        for k in list(store.map.keys()):
            self.index.setdefault(k[:-1], []).append(k[-1])
        for v in self.index.values():
            v.sort()

    def append(self, key: tuple[Any, ...], row: list[Any], matched: bool) -> None:
        indices = self.index.setdefault(key, [])
        nxt = indices[-1] + 1 if indices else 0
        indices.append(nxt)
        self.store.put(key + (nxt,), list(row) + [matched])

    def remove_where(self, pred: Callable[[tuple[Any, ...], list[Any]], bool]) -> list[list[Any]]:
        removed = []
        for k, v in self.store.items():
            if pred(k[:-1], v):
                self.store.remove(k)
                self.index[k[:-1]].remove(k[-1])
                removed.append(list(v))
        return removed


def run_join_task(task: JoinTask, batches: Any) -> Any:
    from pyspark import TaskContext

    from lockgate.state.store import StateStore

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    t0 = time.perf_counter()
    sides = [
        _Side(StateStore(task.left_store, partition, task.version - 1)),
        _Side(StateStore(task.right_store, partition, task.version - 1)),
    ]
    inputs: list[list[list[Any]]] = [[], []]
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pids = batch.column("__lockgate_pid").to_pylist()
        if any(p != partition for p in pids):
            raise RuntimeError(
                f"lockgate state partitioning is broken: task for partition {partition} got "
                "rows of another partition. Adaptive query execution must be off."
            )
        side_col = batch.column("__side").to_pylist()
        lcols = [batch.column(f"__l{i}").to_pylist() for i in range(task.left_width)]
        rcols = [batch.column(f"__r{i}").to_pylist() for i in range(task.right_width)]
        for j, s in enumerate(side_col):
            if s == LEFT:
                inputs[LEFT].append([c[j] for c in lcols])
            else:
                inputs[RIGHT].append([c[j] for c in rcols])
    jt = task.join_type
    semi = jt == "left_semi"
    pushed = [_all_true([compile_expr(e) for e in task.pushed[s]]) for s in (LEFT, RIGHT)]
    pre = [_all_true([compile_expr(e) for e in task.pre_join[s]]) for s in (LEFT, RIGHT)]
    post = _all_true([compile_expr(e) for e in task.post_join])
    keys = (task.left_keys, task.right_keys)
    late_us = task.late_watermark_ms * 1000
    null_rows = ([None] * task.left_width, [None] * task.right_width)

    def evict_pred(side: int) -> Callable[[tuple[Any, ...], list[Any]], bool] | None:
        if task.key_watermark_ordinal is not None:
            limit = task.evict_watermark_ms * 1000
            o = task.key_watermark_ordinal

            def by_key(key: tuple[Any, ...], row: list[Any]) -> bool:
                t = _micros(key[o])
                return t is not None and t <= limit

            return by_key
        wm = task.state_watermark_ms[side]
        col = task.watermark_columns[side]
        if wm is None or col is None:
            return None
        limit = wm * 1000

        def by_value(key: tuple[Any, ...], row: list[Any]) -> bool:
            t = _micros(row[col])
            return t is not None and t <= limit

        return by_value

    evicts = [evict_pred(LEFT), evict_pred(RIGHT)]
    out: list[list[Any]] = []
    dropped = updated = 0
    for side in (LEFT, RIGHT):
        other = 1 - side
        mine, theirs = sides[side], sides[other]
        wm_col = task.watermark_columns[side]
        for row in inputs[side]:
            lr, rr = (row, null_rows[RIGHT]) if side == LEFT else (null_rows[LEFT], row)
            if not pushed[side](lr, rr):
                continue
            if wm_col is not None:
                t = _micros(row[wm_col])
                if t is not None and t <= late_us:
                    dropped += 1
                    continue
            if not pre[side](lr, rr):
                if side == LEFT and jt in ("left_outer", "full_outer"):
                    out.append(row + null_rows[RIGHT])
                elif side == RIGHT and jt in ("right_outer", "full_outer"):
                    out.append(null_rows[LEFT] + row)
                continue
            key = tuple(row[k] for k in keys[side])
            matched = False
            for idx in list(theirs.index.get(key, ())):
                skey = key + (idx,)
                value = theirs.store.get(skey)
                if semi and side == RIGHT and value[-1]:
                    continue
                that = list(value[:-1])
                pair = (row, that) if side == LEFT else (that, row)
                if post(*pair):
                    matched = True
                    if not value[-1]:
                        theirs.store.put(skey, that + [True])
                    if semi:
                        if side == LEFT:
                            break
                        out.append(that)
                    else:
                        out.append(pair[0] + pair[1])
            if semi and side == LEFT:
                if matched:
                    out.append(row)
                    continue
            if side == LEFT:
                add = True
            else:
                ev = evicts[RIGHT]
                evicting = ev is not None and ev(key, row)
                add = not evicting or (jt in ("right_outer", "full_outer") and not matched)
            if add:
                mine.append(key, row, matched)
                updated += 1
    update_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    removed = 0
    for side in (LEFT, RIGHT):
        ev = evicts[side]
        if semi and side == LEFT:
            # left semi: a matched left row can never be output again; Spark drops it
            base = ev
            ev = (lambda k, v, b=base: bool(v[-1]) or (b is not None and b(k, v)))
        if ev is None:
            continue
        gone = sides[side].remove_where(ev)
        outer_side = (side == LEFT and jt in ("left_outer", "full_outer")) or (
            side == RIGHT and jt in ("right_outer", "full_outer")
        )
        if outer_side:
            for v in gone:
                if not v[-1]:
                    row = v[:-1]
                    out.append(row + null_rows[RIGHT] if side == LEFT else null_rows[LEFT] + row)
        else:
            removed += len(gone)
    remove_ms = (time.perf_counter() - t1) * 1000
    for s in sides:
        s.store.commit()
    op = task.operator_id
    ls, rs = sides[LEFT].store, sides[RIGHT].store
    task.accumulator.add(
        {
            f"{op}.numRowsTotal": len(ls) + len(rs),
            f"{op}.numRowsUpdated": updated,
            f"{op}.numRowsRemoved": removed,
            f"{op}.numRowsDroppedByWatermark": dropped,
            f"{op}.allUpdatesTimeMs": int(update_ms),
            f"{op}.allRemovalsTimeMs": int(remove_ms),
            f"{op}.commitTimeMs": int(ls.metrics.commit_ms + rs.metrics.commit_ms),
            f"{op}.memoryUsedBytes": ls.memory_bytes() + rs.memory_bytes(),
            f"{op}.numStateStoreInstances": 4,
            f"{op}.loadedFromCache": int(ls.metrics.loaded_from_cache) + int(rs.metrics.loaded_from_cache),
            f"{op}.loadedFromFiles": int(not ls.metrics.loaded_from_cache) + int(not rs.metrics.loaded_from_cache),
            f"{op}.stateFilesReplayed": ls.metrics.files_replayed + rs.metrics.files_replayed,
            f"{op}.snapshotsWritten": int(ls.metrics.snapshot_written) + int(rs.metrics.snapshot_written),
        }
    )
    if not out:
        return
    columns = list(zip(*out))
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, task.out_schema)]
    yield pa.RecordBatch.from_arrays(arrays, schema=task.out_schema)


def _late_events_watermark_ms(ctx: StatefulContext, batch_id: int) -> int:
    """The previous batch's watermark: Spark drops late rows by it (evicts by the current)."""
    return int(ctx.late_events_watermark_ms or 0)


def build_stream_join(
    node: StreamJoin,
    left: DataFrame,
    right: DataFrame,
    ctx: StatefulContext,
    operator_id: int,
    batch_id: int,
) -> tuple[DataFrame, Any]:
    from lockgate.plan.aggregate import _UniqueNames, schema_to_arrow
    from lockgate.state.schema import OperatorStateSchema
    from lockgate.state.store import StateStoreConf

    n = ctx.num_partitions
    tz = ctx.session_timezone
    lf, rf = node.left_schema.fields, node.right_schema.fields
    nkeys = len(node.left_keys)
    lnull = [F.lit(None).cast(f.dataType).alias(f"__l{i}") for i, f in enumerate(lf)]
    rnull = [F.lit(None).cast(f.dataType).alias(f"__r{i}") for i, f in enumerate(rf)]
    lpart = left.select(
        F.lit(LEFT).alias("__side"),
        *[F.col(f"`{lf[i].name}`").alias(f"__k{j}") for j, i in enumerate(node.left_keys)],
        *[F.col(f"`{f.name}`").alias(f"__l{i}") for i, f in enumerate(lf)],
        *rnull,
    )
    rpart = right.select(
        F.lit(RIGHT).alias("__side"),
        *[F.col(f"`{rf[i].name}`").alias(f"__k{j}") for j, i in enumerate(node.right_keys)],
        *lnull,
        *[F.col(f"`{f.name}`").alias(f"__r{i}") for i, f in enumerate(rf)],
    )
    key_cols = [F.col(f"__k{j}") for j in range(nkeys)]
    staged = (
        lpart.unionByName(rpart)
        .repartition(n, *key_cols)
        .withColumn("__lockgate_pid", F.pmod(F.hash(*key_cols), F.lit(n)))
    )

    def store_conf(name: str, fields: list[StructField], key_idx: tuple[int, ...]) -> StateStoreConf:
        names = _UniqueNames()
        key_fields = [StructField(names.take(f"key_{fields[i].name}"), fields[i].dataType, True) for i in key_idx]
        key_fields.append(StructField(names.take("index"), LongType(), True))
        value_fields = [StructField(names.take(f.name), f.dataType, True) for f in fields]
        value_fields.append(StructField(names.take("matched"), BooleanType(), True))
        return StateStoreConf(
            root=ctx.state_root,
            operator_id=operator_id,
            num_partitions=n,
            key_schema=schema_to_arrow(StructType(key_fields), tz),
            value_schema=schema_to_arrow(StructType(value_fields), tz),
            snapshot_interval=ctx.snapshot_interval,
            min_versions_to_retain=ctx.min_versions_to_retain,
            store_name=name,
        )

    lstore = store_conf("left", list(lf), node.left_keys)
    rstore = store_conf("right", list(rf), node.right_keys)
    evict_wm = ctx.batch_watermark_ms if ctx.batch_watermark_ms is not None else 0
    has_wm = ctx.batch_watermark_ms is not None
    state_wms: list[int | None] = [None, None]
    for side in (LEFT, RIGHT):
        forms = node.state_watermark_forms[side]
        if has_wm and forms and node.key_watermark_ordinal is None:
            state_wms[side] = state_watermark_ms(forms, evict_wm)
    joined = _joined_schema(node)
    out_struct = joined
    task = JoinTask(
        left_store=lstore,
        right_store=rstore,
        version=batch_id + 1,
        join_type=node.join_type,
        left_keys=node.left_keys,
        right_keys=node.right_keys,
        pushed=node.pushed,
        pre_join=node.pre_join,
        post_join=node.post_join,
        watermark_columns=node.watermark_columns if has_wm else (None, None),
        late_watermark_ms=_late_events_watermark_ms(ctx, batch_id) if has_wm else 0,
        evict_watermark_ms=evict_wm,
        key_watermark_ordinal=node.key_watermark_ordinal if has_wm else None,
        state_watermark_ms=(state_wms[LEFT], state_wms[RIGHT]),
        left_width=len(lf),
        right_width=len(rf),
        out_schema=schema_to_arrow(out_struct, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    result = staged.mapInArrow(bind(run_join_task, task), out_struct)
    # One state schema entry for the operator: both sides' stores, described together.
    key_schema = pa.schema(
        [pa.field(f"left.{f.name}", f.type) for f in lstore.key_schema]
        + [pa.field(f"right.{f.name}", f.type) for f in rstore.key_schema]
    )
    value_schema = pa.schema(
        [pa.field(f"left.{f.name}", f.type) for f in lstore.value_schema]
        + [pa.field(f"right.{f.name}", f.type) for f in rstore.value_schema]
    )
    schema = OperatorStateSchema(operator_id, node.operator_name, key_schema, value_schema, n)
    return _project(node, result), schema


__all__ = [
    "StreamJoin",
    "build_stream_join",
    "check_stream_join",
    "make_stream_join",
]
