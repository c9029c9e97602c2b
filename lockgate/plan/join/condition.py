"""The stream-stream join condition: parsed from Spark's plan, evaluated in Python.

Holds the supported expression subset (:class:`Converter` turns resolved Catalyst
expressions into picklable tuples, refusing the rest), their evaluation with Spark's
semantics (:func:`compile_expr`), the state watermark derived from range conditions
(Spark's ``StreamingJoinHelper``) and the helpers that inspect condition terms.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockgate.errors import NotSupportedYetError
from lockgate.jvm import scala_list
from lockgate.plan.row_expressions import build_expression, compile_expression
from lockgate.plan.stateful import micros

LEFT, RIGHT = 0, 1
MICROS_PER_DAY = 86_400_000_000
_EPOCH_DAY = _dt.date(1970, 1, 1)


# -- expressions ------------------------------------------------------------------------
# A picklable expression tree (tuples), evaluated with Spark's semantics:
#   ("attr", side, index, kind)      kind: ts | date | float | other
#   ("lit", value, kind)             timestamps as micros, intervals as micros
#   ("cmp", op, a, b)                op: = < <= > >=
#   ("and", a, b) / ("or", a, b) / ("isnull", a) / ("isnotnull", a)
#   ("tadd", ts, interval)           timestamp + day-time interval
#   ("neg", interval)
#   ("field", struct, ordinal, kind)   a field of a struct column (e.g. window.start) or
#                                      of a field of one (struct: an attr or a field)
#   ("row", program, inputs, kind)     any other expression reading both sides that the
#                                      continuous tasks' evaluator compiles (arithmetic,
#                                      string and date functions, CASE WHEN...): its
#                                      program over ``inputs``, ((side, index, kind), ...)


@dataclass
class Conjunct:
    expr: tuple[Any, ...] | None
    """The term in the task's form (:func:`compile_expr`), or None for a single-side
    term only Spark evaluates."""
    refs: frozenset[tuple[int, int]]
    """(side, column index) of the attributes it uses."""
    not_null: frozenset[tuple[int, int, tuple[int, ...]]]
    """(side, column index, field ordinals) of the attributes, or fields of struct
    attributes (``s.a.x``), Spark infers ``isnotnull`` for from this conjunct."""
    watermark_forms: dict[int, Any]
    """side -> its state watermark form (see :func:`state_watermark_form`) or None."""
    text: str
    source: Any = None
    """The conjunct as Spark's analysed expression."""
    seen_at_start: bool = True
    """Whether Spark's start-time check (on the analysed plan) sees its watermark form:
    not for a negated bound, which only Spark's optimizer makes a range condition."""


def _kind(type_name: str) -> str:
    if type_name in ("timestamp", "timestamp_ntz"):
        return "ts"
    if type_name == "date":
        return "date"
    if type_name in ("double", "float"):
        return "float"
    return "other"


class Converter:
    """Turns resolved Catalyst expressions into the tuple form, refusing the rest.

    With ``widths`` (each side's column count), a deterministic part of a term that
    reads one side only and that the task cannot evaluate (``length(lv)``,
    ``cast(ts AS BIGINT)``, ``v * 2``) becomes a column *derived* from that side: Spark
    computes it in the side's tagging projection, the row carries it after the side's
    own columns (index ``width + k``), and the term reads it as a column. ``derived``
    holds them per side, as (Catalyst expression, type)."""

    def __init__(
        self, attrs: dict[int, tuple[int, int, Any]], whole: str, widths: tuple[int, int] | None = None
    ) -> None:
        self.attrs = attrs  # exprId -> (side, index, java attribute)
        self.whole = whole
        self.widths = widths
        self.derived: tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]] = ([], [])

    def refuse(self, e: Any) -> NotSupportedYetError:
        return NotSupportedYetError(
            f"The stream-stream join condition term {str(e.toString())!r} (in {self.whole!r})",
            "In an outer or semi join, lockgate evaluates terms that read both sides when "
            "they join, with comparisons (=, <>, <, <=, >, >=), BETWEEN, AND, OR, NOT, "
            "IS [NOT] NULL and timestamp +/- day-time interval literals, column references, "
            "literals, fields of struct columns, deterministic expressions of one side's "
            "columns (such as length(l.name) or cast(r.ts AS BIGINT)) and, over both sides, "
            "the expressions continuous queries evaluate (arithmetic, string and date "
            "functions, CASE WHEN...; docs/continuous.md lists them). An inner join takes "
            "any deterministic term.",
        )

    def convert(self, e: Any) -> tuple[Any, ...]:
        try:
            return self._convert(e)
        except NotSupportedYetError:
            derived = self._derive(e)
            if derived is None:
                derived = self._row_expression(e)
            if derived is None:
                raise
            return derived

    def _row_expression(self, e: Any) -> tuple[Any, ...] | None:
        """``e``, reading both sides, as a program of the continuous tasks' row evaluator
        (:mod:`lockgate.plan.row_expressions`, Spark's semantics for
        arithmetic, strings, dates, conditionals), or None when it cannot compile it.
        A part reading one side only is computed by the evaluator too."""
        refs = _attributes(e, self.attrs)
        if len({self.attrs[i][0] for i in refs}) != 2 or _has_unknown_attribute(e, self.attrs):
            return None
        try:
            program = compile_expression(e, refs)
        except NotSupportedYetError:
            return None
        inputs = tuple(
            (side, index, _kind(str(a.dataType().typeName()))) for side, index, a in (self.attrs[i] for i in refs)
        )
        return ("row", program, inputs, _kind(str(e.dataType().typeName())))

    def _derivable_side(self, e: Any) -> int | None:
        """The side ``e`` can be derived from (see the class), or None."""
        if self.widths is None or not e.deterministic():
            return None
        sides = {side for side, _ in side_refs(e, self.attrs)}
        if len(sides) != 1 or _has_unknown_attribute(e, self.attrs):
            return None
        return next(iter(sides))

    def _derive(self, e: Any) -> tuple[Any, ...] | None:
        """``e`` as a column derived from one side (see the class), or None."""
        side = self._derivable_side(e)
        if side is None:
            return None
        derived = self.derived[side]
        canonical = e.canonicalized()
        index = next((k for k, (d, _) in enumerate(derived) if d.canonicalized().equals(canonical)), None)
        if index is None:
            index = len(derived)
            derived.append((e, e.dataType()))
        return ("attr", side, self.widths[side] + index, _kind(str(e.dataType().typeName())))

    def stand_in(self, e: Any) -> Any | None:
        """A new attribute standing for ``e`` as a derived column of its side (None when
        ``e`` cannot be one), known to this converter as that side's column."""
        side = self._derivable_side(e)
        if side is None:
            return None
        from pyspark import SparkContext

        jvm = SparkContext._jvm
        assert jvm is not None
        expressions = jvm.org.apache.spark.sql.catalyst.expressions
        index = len(self.derived[side])
        self.derived[side].append((e, e.dataType()))
        attribute = expressions.AttributeReference(
            f"_common_expr_{side}_{index}", e.dataType(), True,
            jvm.org.apache.spark.sql.types.Metadata.empty(), expressions.NamedExpression.newExprId(),
            scala_list(jvm, []),
        )
        self.attrs[int(attribute.exprId().id())] = (side, self.widths[side] + index, attribute)  # type: ignore[index]
        return attribute

    def _convert(self, e: Any) -> tuple[Any, ...]:
        name = e.getClass().getSimpleName()
        if name != "Literal" and e.foldable() and e.deterministic():
            # a constant (CAST(1.5 AS DOUBLE)): its value, as Spark's ConstantFolding
            try:
                value = e.eval(None)
            except Exception:  # noqa: BLE001 - py4j: Spark fails to evaluate it (1 / 0 in ANSI mode)
                raise self.refuse(e) from None
            return ("lit",) + _literal(e, self, (value,))
        if name == "AttributeReference":
            key = int(e.exprId().id())
            if key not in self.attrs:
                raise self.refuse(e)
            side, index, _ = self.attrs[key]
            return ("attr", side, index, _kind(str(e.dataType().typeName())))
        if name == "Literal":
            return ("lit",) + _literal(e, self)
        if name == "GetStructField" and _field_path(e.child()):
            # a field of a struct column (e.g. window.start), or of a struct in one
            base = self.convert(e.child())
            return ("field", base, int(e.ordinal()), _kind(str(e.dataType().typeName())))
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
        if name == "Between":
            # an expression as the tested value: Spark computes it once, in a projection
            # below the join, as a derived column does
            parts = between_parts(e) or (between_comparisons(e) if self._derivable_side(e.input()) is not None else None)
            if parts is None:
                raise self.refuse(e)
            return ("and", self.convert(parts[0]), self.convert(parts[1]))
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


def _attributes(e: Any, attrs: dict[int, tuple[int, int, Any]]) -> list[int]:
    """The exprIds of the columns of either side ``e`` reads, each once, in order."""
    found: list[int] = []

    def visit(x: Any) -> None:
        if x.getClass().getSimpleName() == "AttributeReference":
            key = int(x.exprId().id())
            if key in attrs and key not in found:
                found.append(key)
            return
        children = x.children()
        for i in range(children.size()):
            visit(children.apply(i))

    visit(e)
    return found


def _has_unknown_attribute(e: Any, attrs: dict[int, tuple[int, int, Any]]) -> bool:
    """Whether ``e`` reads an attribute that is not a column of either side (an outer
    reference)."""
    if e.getClass().getSimpleName() == "AttributeReference":
        return int(e.exprId().id()) not in attrs
    children = e.children()
    return any(_has_unknown_attribute(children.apply(i), attrs) for i in range(children.size()))


def _field_path(e: Any) -> bool:
    """A column reference, or a field of a field ... of one (``s.a.x``)."""
    name = e.getClass().getSimpleName()
    if name == "GetStructField":
        return _field_path(e.child())
    return name == "AttributeReference"


def _literal(e: Any, conv: Converter, evaluated: tuple[Any] | None = None) -> tuple[Any, str]:
    """A literal's (or, with ``evaluated``, a constant's) value and kind in the task's
    form; ``evaluated`` holds Spark's internal value of the constant."""
    t = str(e.dataType().typeName())
    value = e.value() if evaluated is None else evaluated[0]
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
        return (_EPOCH_DAY + _dt.timedelta(days=int(value)), "date")
    raise conv.refuse(e)


def _float_key(x: float) -> tuple[int, float]:
    return (1, 0.0) if math.isnan(x) else (0, x + 0.0)


def compile_expr(expr: tuple[Any, ...]) -> Callable[[Any, Any], Any]:
    """A function (left_row, right_row) -> True / False / None (SQL three-valued)."""
    tag = expr[0]
    if tag == "attr":
        _, side, index, kind = expr
        if kind == "ts":
            if side == LEFT:
                return lambda lr, rr: micros(lr[index])
            return lambda lr, rr: micros(rr[index])
        if side == LEFT:
            return lambda lr, rr: lr[index]
        return lambda lr, rr: rr[index]
    if tag == "lit":
        value = expr[1]
        return lambda lr, rr: value
    if tag == "field":
        struct, ordinal, to_micros = compile_expr(expr[1]), expr[2], expr[3] == "ts"

        def field(lr: Any, rr: Any) -> Any:
            # structs are held as ((field, value), ...) pairs, timestamps in them as datetimes
            value = struct(lr, rr)
            if value is None:
                return None
            value = value[ordinal][1]
            return micros(value) if to_micros else value

        return field
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
    if tag == "row":
        return _compile_row_expression(expr[1], expr[2], expr[3])
    raise ValueError(f"unknown expression {tag}")


def _compile_row_expression(program: Any, inputs: tuple[tuple[int, int, str], ...], kind: str) -> Callable[[Any, Any], Any]:
    """A ("row", ...) expression: the continuous evaluator's function over the values it
    reads, in Spark's internal form (timestamps in microseconds, dates in days), its
    result in the task's form (dates as dates)."""
    fn = build_expression(program)

    def internal(side: int, index: int, kind: str) -> Callable[[Any, Any], Any]:
        if kind == "ts":
            return (lambda lr, rr: micros(lr[index])) if side == LEFT else (lambda lr, rr: micros(rr[index]))
        if kind == "date":
            def days(value: Any) -> Any:
                return None if value is None else (value - _EPOCH_DAY).days

            return (lambda lr, rr: days(lr[index])) if side == LEFT else (lambda lr, rr: days(rr[index]))
        return (lambda lr, rr: lr[index]) if side == LEFT else (lambda lr, rr: rr[index])

    getters = [internal(*i) for i in inputs]

    def evaluate(lr: Any, rr: Any) -> Any:
        value = fn(tuple(g(lr, rr) for g in getters))
        if kind == "date" and value is not None:
            return _EPOCH_DAY + _dt.timedelta(days=value)
        return value

    return evaluate


# kinds for literals used by cmp's float detection: attr tuples end with kind, lit tuples too


def all_true(fns: list[Callable[[Any, Any], Any]]) -> Callable[[Any, Any], bool]:
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


def state_watermark_form(
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
    refs = side_refs(a, attrs) | side_refs(b, attrs)
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
    # Spark's constraint term: the one reading this side, of any type (Spark casts every
    # attribute to double), so a bound on a number column of this side (``-r.id < 0``)
    # bounds its state as if it were its event time
    constraint = [t for t in terms if t[1][0] == "attr" and t[1][1] == this_side]
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


def side_refs(e: Any, attrs: dict[int, tuple[int, int, Any]]) -> set[tuple[int, int]]:
    """(side, column index) of the columns of either side ``e`` reads."""
    return {attrs[key][:2] for key in _attributes(e, attrs)}


_NULL_INTOLERANT = {
    "EqualTo", "LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Not",
    "TimeAdd", "TimestampAddInterval", "UnaryMinus", "Add", "Subtract",
}


def _spark_null_intolerant(e: Any) -> bool:
    """Spark's own answer (``Expression.nullIntolerant``, Spark 4), False before it."""
    try:
        return bool(e.nullIntolerant())
    except Exception:  # noqa: BLE001 - py4j: no such method
        return False


def null_intolerant_refs(
    e: Any, attrs: dict[int, tuple[int, int, Any]]
) -> set[tuple[int, int, tuple[int, ...]]]:
    """Spark's scanNullIntolerantAttribute (after DatetimeSub / same-type Cast removal):
    (side, index, field ordinals), the ordinals of a field path such as ``s.a.x``, which
    Spark 4 infers ``isnotnull`` for as for an attribute."""
    name = e.getClass().getSimpleName()
    if name == "AttributeReference":
        key = int(e.exprId().id())
        return {(*attrs[key][:2], ())} if key in attrs else set()
    if name == "GetStructField" and _field_path(e):
        path: list[int] = []
        while e.getClass().getSimpleName() == "GetStructField":
            path.insert(0, int(e.ordinal()))
            e = e.child()
        key = int(e.exprId().id())
        return {(*attrs[key][:2], tuple(path))} if key in attrs else set()
    if name == "DatetimeSub":
        return null_intolerant_refs(e.replacement(), attrs)
    if name == "Cast" and str(e.child().dataType().typeName()) == str(e.dataType().typeName()):
        return null_intolerant_refs(e.child(), attrs)
    if name == "IsNotNull":
        return null_intolerant_refs(e.child(), attrs)
    if name == "Between":  # x >= lo AND x <= hi: both null-intolerant
        parts = between_comparisons(e)
        return set() if parts is None else null_intolerant_refs(parts[0], attrs) | null_intolerant_refs(parts[1], attrs)
    if name in _NULL_INTOLERANT or _spark_null_intolerant(e):
        out: set[tuple[int, int, tuple[int, ...]]] = set()
        children = e.children()
        for i in range(children.size()):
            out |= null_intolerant_refs(children.apply(i), attrs)
        return out
    return set()


def between_parts(e: Any) -> tuple[Any, Any] | None:
    """``x BETWEEN lo AND hi`` (SQL's ``Between``, a runtime-replaceable expression) as
    Spark's optimizer sees it: ``x >= lo`` and ``x <= hi``. Only for a column ``x`` or a
    field of one (``window.start``), which Spark inlines into both comparisons; any other
    ``x`` it computes once, in a projection below the join (see
    :func:`split_common_expressions`)."""
    if e.getClass().getSimpleName() != "Between":
        return None
    if not _field_path(e.input()):
        return None
    return between_comparisons(e)


def between_comparisons(e: Any) -> tuple[Any, Any] | None:
    """``x >= lo`` and ``x <= hi`` of ``x BETWEEN lo AND hi``, for any ``x``."""
    value = e.input()
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:
        return None
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    return (
        expressions.GreaterThanOrEqual(value, e.lower()),
        expressions.LessThanOrEqual(value, e.upper()),
    )


def split_common_expressions(terms: list[Any], conv: Converter) -> list[Any]:
    """Spark's rewrite of ``x BETWEEN lo AND hi`` when ``x`` is an expression (its
    ``With``): the optimizer computes ``x`` once, in a projection below the join on
    ``x``'s side (``_common_expr_0``), and the condition holds ``_common_expr_0 >= lo``
    and ``_common_expr_0 <= hi``. The state watermark follows that form: Spark derives
    a side's watermark from a comparison of *any* of its timestamp columns, so a bound
    on ``_common_expr_0`` bounds the side's event time as if it were that column. Here
    ``x`` becomes a derived column (:meth:`Converter.stand_in`) and the term those two
    comparisons of it, for terms reading both sides."""
    from pyspark import SparkContext

    out: list[Any] = []
    for term in terms:
        two_sided_between = term.getClass().getSimpleName() == "Between" and len(
            {side for side, _ in side_refs(term, conv.attrs)}
        ) == 2
        x = conv.stand_in(term.input()) if two_sided_between else None
        if x is None:
            out.append(term)
            continue
        expressions = SparkContext._jvm.org.apache.spark.sql.catalyst.expressions  # type: ignore[union-attr]
        out.append(expressions.GreaterThanOrEqual(x, term.lower()))
        out.append(expressions.LessThanOrEqual(x, term.upper()))
    return out


_NEGATED = {
    "LessThan": "GreaterThanOrEqual",
    "LessThanOrEqual": "GreaterThan",
    "GreaterThan": "LessThanOrEqual",
    "GreaterThanOrEqual": "LessThan",
}


def negated_comparison(term: Any) -> Any | None:
    """Spark's ``BooleanSimplification`` of a term ``NOT (a < b)``: ``a >= b`` (and so
    on; the same under SQL's three-valued logic), so a negated bound is a range
    condition for the state watermark, as in Spark's optimized join condition. None for
    other terms."""
    from pyspark import SparkContext

    child = term.child() if term.getClass().getSimpleName() == "Not" else None
    flipped = _NEGATED.get(child.getClass().getSimpleName()) if child is not None else None
    if flipped is None:
        return None
    expressions = SparkContext._jvm.org.apache.spark.sql.catalyst.expressions  # type: ignore[union-attr]
    return getattr(expressions, flipped)(child.left(), child.right())


def split_and(e: Any) -> list[Any]:
    """Spark's splitConjunctivePredicates of the optimized condition (BETWEEN on a column
    is already ``>= AND <=`` there)."""
    if e.getClass().getSimpleName() == "And":
        return split_and(e.left()) + split_and(e.right())
    parts = between_parts(e)
    if parts is not None:
        return split_and(parts[0]) + split_and(parts[1])
    return [e]
