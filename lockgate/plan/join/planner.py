"""The stream-stream join plan node and its planning.

Holds :class:`StreamJoin`, :func:`make_stream_join` (analysis of the join when it is
defined), :func:`check_stream_join` (start-time checks) and :func:`build_stream_join`
(the per-batch physical plan, which runs :func:`~lockgate.plan.join.task.run_join_task`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial as bind
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    LongType,
    StructField,
    StructType,
)

from lockgate.compat import override
from lockgate.errors import AnalysisError, NotSupportedYetError
from lockgate.jvm import analysed_frame, jvm_name, scala_list, unresolved_column
from lockgate.plan.cache import frame
from lockgate.plan.event_time import event_time_outputs, qualified_outputs
from lockgate.plan.join.condition import (
    LEFT,
    RIGHT,
    Conjunct,
    Converter,
    negated_comparison,
    null_intolerant_refs,
    side_refs,
    split_and,
    split_common_expressions,
    state_watermark_form,
    state_watermark_ms,
)
from lockgate.plan.join.task import JoinTask, run_join_task
from lockgate.plan.nodes import EventTimeWatermark, PlanNode, StreamingRelation
from lockgate.plan.pushdown import all_of, inferred_for_join
from lockgate.plan.state_udf import map_with_state
from lockgate.plan.stateful import (
    OutputColumn,
    StatefulContext,
    StatefulOperator,
    UniqueNames,
    stateful_operators,
)
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.schema import STREAM_JOIN_NAME, OperatorStateSchema
from lockgate.state.store import StateStoreConf

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from lockgate.plan.nodes import PlanNode

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


OPERATOR_NAME = STREAM_JOIN_NAME


# -- the plan node ----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class StreamJoin(StatefulOperator):
    left: PlanNode
    right: PlanNode
    join_type: str
    left_schema: StructType = field(default_factory=StructType)
    right_schema: StructType = field(default_factory=StructType)
    left_keys: tuple[int, ...] = ()
    right_keys: tuple[int, ...] = ()
    """Per join key, the side's column it is, or -1 for a key on an expression
    (``key_expressions``)."""
    key_expressions: tuple[tuple[Any, Any], ...] = ()
    """Per join key, (left, right) Columns computing it from each side's columns, or
    None on a side whose key is a plain column."""
    key_types: tuple[Any, ...] = ()
    """Per join key, its type (the same on both sides, after Spark's casts)."""
    pre_join: tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]] = ((), ())
    pre_join_columns: tuple[tuple[Column, ...], tuple[Column, ...]] = ((), ())
    """Per side: single-side terms of the condition, on a side whose rows can come out
    null-padded (so Spark does not push them below the join), that lockgate's task does
    not evaluate (functions, arithmetic, ``LIKE``, ``IN``, ...): Spark computes them in
    the side's projection (column ``__pre``), and the task reads the result as it would
    evaluate ``pre_join``. (Such terms on the other sides are filters below the join,
    ``pushdown``.)"""
    post_join: tuple[tuple[Any, ...], ...] = ()
    post_join_columns: tuple[Column, ...] = ()
    """Terms of an inner join's condition that read both sides in a way the task does
    not evaluate (``l.v + r.v > 5``, ``concat(l.a, r.b) = 'x'``), as Columns over the
    task's output (``__l{i}``, ``__r{i}``): Spark filters the joined rows by them. An
    inner join's output is exactly the pairs that pass every term, so filtering after
    the task gives Spark's rows; an outer or semi join's cannot (a failed term makes an
    outer row, or lets another match count), so there they are refused."""
    derived_columns: tuple[tuple[Column, ...], tuple[Column, ...]] = ((), ())
    derived_types: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ())
    """Per side: parts of two-side condition terms that read only that side and that
    the task does not evaluate (``length(lv)`` in ``length(lv) < length(rv)``), computed
    by Spark in the side's tagging projection and carried (and buffered) after the
    side's columns, where ``post_join``/``pre_join`` read them (``Converter``)."""
    watermark_columns: tuple[int | None, int | None] = (None, None)
    key_watermark_ordinal: int | None = None
    state_watermark_forms: tuple[Any, Any] = (None, None)
    """Per side: list of forms from the join's remaining condition, or None."""
    check_watermark_ok: bool = True
    using_keys: tuple[str, ...] | None = None
    output_names: tuple[str, ...] = ()
    output_types: tuple[Any, ...] = ()
    output_qualifiers: tuple[tuple[str, ...], ...] = ()
    """Per output column, the qualifier Spark gives it (a side's ``alias``), so
    ``col("l.value")`` resolves after the join as in Spark."""
    several_event_times: tuple[tuple[str, int], ...] = ()
    """A side's event-time columns when it has more than one (Spark fails the query)."""
    join_plan: Any = field(default=None, repr=False)
    """Spark's analysed ``Join`` of the templates, by which later templates' plans are
    searched for the join's inputs (:func:`~lockgate.plan.pushdown.push_into_stateful`)."""
    unread: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    """Per side: the indexes of its columns that nothing above the join reads, set when
    the query starts (:mod:`lockgate.plan.join.pruning`). Spark prunes them below the
    join; the tagging projection puts a null in their place."""
    pushdown: tuple[tuple[Column, ...], tuple[Column, ...]] = ((), ())
    """Per side: the conjuncts Spark's optimizer pushes below the join (single-side
    terms on a side whose rows cannot come out null-padded, the inferred ``isnotnull``
    of keys and of columns in null-intolerant terms; and a filter right after the join,
    :func:`~lockgate.plan.pushdown.push_below_join`), as Columns over the side's batch.
    Spark filters the side's batch by them before the join: below the side's
    ``withWatermark`` too when they do not read its event-time column
    (:mod:`lockgate.plan.pushdown`)."""
    inferred: tuple[tuple[Column, ...], tuple[Column, ...]] = ((), ())
    """Per side: conjuncts Spark's ``InferFiltersFromConstraints`` carries across the key
    equality from the other side's own filters (``b.k > 5`` from ``a.k > 5`` below the
    join). Spark filters the side by them only in a batch where the other side has new
    rows: without, the other side is one empty relation in Spark's plan, with no
    constraints (:func:`~lockgate.plan.pushdown.inferred_for_join`)."""

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

    @property
    @override
    def operator_name(self) -> str:
        return OPERATOR_NAME

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        left, right = inputs
        return build_stream_join(self, left, right, ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        return True

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        return join_params(self, ctx, batch_id)

    @override
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        return self.evicts_by_watermark and self.watermark_advanced(new_input_watermark_ms, eviction_watermark_ms)

    @property
    @override
    def counts_for_watermark_correctness(self) -> bool:
        return True

    def state_watermarks_ms(self, input_ms: int) -> tuple[int | None, int | None]:
        """Each side's state watermark for the join's input watermark (Spark's
        ``StreamingSymmetricHashJoinHelper.getStateWatermark``): the input watermark for
        both sides when a join key carries event time, else per watermarked side the
        bound its range conditions give (None without one)."""
        if self.key_watermark_ordinal is not None:
            return (input_ms, input_ms)
        marks: list[int | None] = [None, None]
        for side in (LEFT, RIGHT):
            forms = self.state_watermark_forms[side]
            if self.watermark_columns[side] is not None and forms:
                marks[side] = state_watermark_ms(forms, input_ms)
        return (marks[LEFT], marks[RIGHT])

    @override
    def output_watermark_ms(self, input_ms: int) -> int:
        """Spark's ``produceOutputWatermark``: the minimum of the input watermark and both
        sides' state watermarks (the join may still emit rows down to them)."""
        return min([w for w in self.state_watermarks_ms(input_ms) if w is not None] + [input_ms])

    @override
    def event_time_outputs(
        self, lineage: Callable[[PlanNode], dict[str, int] | None]
    ) -> dict[str, int] | None:
        """Both sides' event-time columns among the join's output (a left semi join
        outputs the left side's only); the left's where the names meet. A full outer
        join's USING key is ``coalesce`` of both sides' keys, which carries no event time
        in Spark."""
        left = lineage(self.left)
        right = {} if self.join_type == "left_semi" else lineage(self.right)
        if left is None or right is None:
            return None
        merged = {**right, **left}
        coalesced = {k.lower() for k in self.using_keys or ()} if self.join_type == "full_outer" else set()
        return {n: merged[n] for n in self.output_names if n in merged and n.lower() not in coalesced}

    @override
    def qualified_outputs(
        self, outputs: Callable[[PlanNode], list[OutputColumn] | None]
    ) -> list[OutputColumn] | None:
        """The join's output columns with the qualifiers Spark's analysed join gives them
        (a side's alias), each carrying the event time of the side column it is; a full
        outer join's ``coalesce`` of a USING key carries none, as in Spark."""
        sides = [outputs(self.left), [] if self.join_type == "left_semi" else outputs(self.right)]
        if sides[LEFT] is None or sides[RIGHT] is None:
            return None
        if len(sides[LEFT]) != len(self.left_schema.fields) or (
            self.join_type != "left_semi" and len(sides[RIGHT]) != len(self.right_schema.fields)
        ):
            return None
        found = []
        for i, (name, qualifier, source) in enumerate(zip(self.output_names, self.output_qualifiers, output_sources(self))):
            if source is None:  # coalesce(l.k, r.k): a new column, without event time
                found.append(OutputColumn(qualifier, name, None, (id(self), i)))
            else:
                found.append(replace(sides[source[0]][source[1]], qualifier=qualifier, name=name))
        return found

    @property
    @override
    def takes_input_filters(self) -> bool:
        return self.join_plan is not None

    @override
    def filter_inputs(self, plan: Any) -> list[Any] | None:
        if self.join_plan is None or not plan.fastEquals(self.join_plan):
            return None
        return [plan.left(), plan.right()]

    @override
    def with_input_filters(self, pushed: list[list[Column]]) -> StreamJoin | None:
        """The join with ``pushed`` (per side) appended to its sides' ``pushdown``."""
        if not (pushed[0] or pushed[1]):
            return None
        return replace(self, pushdown=(self.pushdown[0] + tuple(pushed[0]), self.pushdown[1] + tuple(pushed[1])))

    def describe(self) -> str:
        return f"StreamingSymmetricHashJoin {_SPARK_JOIN_NAMES.get(self.join_type, self.join_type)}"


def _side_watermark_column(plan: PlanNode, template: DataFrame) -> tuple[int | None, list[tuple[str, int]]]:
    """Index of the side's event-time column (the one carrying Spark's watermark metadata),
    and all of the side's event-time columns with their delays (more than one is Spark's
    MULTIPLE_EVENT_TIME_COLUMNS, raised when the query starts). Columns are told apart
    as Spark tells its attributes apart (:func:`~lockgate.plan.event_time.qualified_outputs`):
    two columns of one name (``l.w`` and ``r.w`` of a join) are two, one column selected
    twice is one."""
    found = event_time_outputs(plan)
    if found is None:
        raise NotSupportedYetError(
            "A stream-stream join side whose watermark column is transformed after "
            "withWatermark()",
            "Apply withWatermark() as the last step before the join, on a column kept as is.",
        )
    cols = template.columns
    present = [(n, d) for n, d in found.items() if n in cols]
    columns = qualified_outputs(plan)
    if columns is not None and [c.name for c in columns] == cols:
        distinct = {c.origin: (c.name, c.delay_ms) for c in columns if c.delay_ms is not None}
        present = [(n, d) for n, d in distinct.values() if d is not None]
    if len(present) != 1:
        return None, present
    return cols.index(present[0][0]), present


def _normalize_how(how: str | None) -> str:
    key = (how or "inner").lower().replace("_", "").replace(" ", "")
    jt = _HOW.get(key)
    if jt is None:
        raise AnalysisError(f"Unsupported join type {how!r}.")
    return jt


_OK_KEY_TYPES = (
    "string",
    "binary",
    "integer",
    "long",
    "short",
    "byte",
    "boolean",
    "date",
    "timestamp",
    "timestamp_ntz",
    "float",
    "double",
    "decimal",
)


def make_stream_join(
    left: tuple[PlanNode, DataFrame], right: tuple[PlanNode, DataFrame], on: Any, how: str | None
) -> tuple[StreamJoin, DataFrame]:
    """The join of two streams, each given as its plan and template (the same operations
    over an empty DataFrame), and the join's template."""
    (left_plan, left_template), (right_plan, right_template) = left, right
    jt = _normalize_how(how)
    template = left_template.join(right_template, on, how)  # Spark's analysis errors
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
    lschema, rschema = left_template.schema, right_template.schema
    attrs: dict[int, tuple[int, int, Any]] = {}
    for side, child, schema in ((LEFT, join.left(), lschema), (RIGHT, join.right(), rschema)):
        out = child.output()
        if out.size() != len(schema.fields):
            raise NotSupportedYetError("This stream-stream join", "Its sides' columns could not be matched.")
        for i in range(out.size()):
            a = out.apply(i)
            attrs[int(a.exprId().id())] = (side, i, a)
    cond = join.condition()
    if cond.isEmpty():
        raise NotSupportedYetError("A stream-stream join without equality join keys")
    whole = str(cond.get().toString())
    conv = Converter(attrs, whole, (len(lschema.fields), len(rschema.fields)))
    (lwm, lmarks), (rwm, rmarks) = _side_watermark_column(*left), _side_watermark_column(*right)
    wm_cols = {LEFT: lwm, RIGHT: rwm}
    several = next((m for m in (lmarks, rmarks) if len(m) > 1), None)
    lkeys: list[int] = []
    rkeys: list[int] = []
    others: list[Any] = []
    null_safe: set[int] = set()  # indexes of keys compared with <=> (null matches null)
    key_exprs: list[tuple[Any, Any]] = []
    key_types: list[Any] = []
    key_not_null: set[tuple[int, int, tuple[int, ...]]] = set()  # Spark's isnotnull from them
    for c in split_and(cond.get()):
        name = c.getClass().getSimpleName()
        if name in ("EqualTo", "EqualNullSafe"):
            a, b = c.left(), c.right()
            ra, rb = side_refs(a, attrs), side_refs(b, attrs)
            sides_a, sides_b = {s for s, _ in ra}, {s for s, _ in rb}
            if sides_a and sides_b and len(sides_a) == 1 and len(sides_b) == 1 and sides_a != sides_b:
                if sides_a == {RIGHT}:
                    a, b, ra, rb = b, a, rb, ra
                exprs: list[Any] = []
                indexes: list[int] = []
                for e, refs in ((a, ra), (b, rb)):
                    if e.getClass().getSimpleName() == "AttributeReference":
                        exprs.append(None)
                        indexes.append(next(iter(refs))[1])
                    else:
                        exprs.append(unresolved_column(e))
                        indexes.append(-1)
                if name == "EqualTo" and -1 in indexes:
                    key_not_null.update(null_intolerant_refs(c, attrs))
                data_type = a.dataType()
                key_type, other_type = data_type.simpleString(), b.dataType().simpleString()
                if not _key_type_ok(_python_type(data_type)) or key_type != other_type:
                    raise NotSupportedYetError(
                        f"A stream-stream join key of type {key_type}"
                        + (f" = {other_type}" if key_type != other_type else ""),
                        f"Supported key types: {', '.join(_OK_KEY_TYPES)}, and arrays and "
                        "structs of them.",
                    )
                if name == "EqualNullSafe":
                    null_safe.add(len(lkeys))
                lkeys.append(indexes[0])
                rkeys.append(indexes[1])
                key_exprs.append((exprs[0], exprs[1]))
                key_types.append(_python_type(data_type))
                continue
        others.append(c)
    if not lkeys:
        raise NotSupportedYetError(
            "A stream-stream join without equality join keys",
            "Join on at least one column equality (e.g. leftId = rightId).",
        )
    conjuncts: list[Conjunct] = []
    plain = Converter(attrs, whole)
    post_join_columns: list[Column] = []
    negated: set[int] = set()
    for i, term in enumerate(others):
        flipped = negated_comparison(term)
        if flipped is not None:
            others[i] = flipped
            negated.add(id(flipped))
    for c in split_common_expressions(others, conv):
        refs = frozenset(side_refs(c, attrs))
        text = str(c.toString())
        if not refs:
            raise NotSupportedYetError(f"The constant stream-stream join condition term {text!r}")
        single_side = len({s for s, _ in refs}) == 1
        spark_term = None
        marks = [len(derived) for derived in conv.derived]
        try:
            # a single-side term is never split into derived columns: Spark evaluates
            # all of it when the task cannot (below)
            expr: tuple[Any, ...] | None = (plain if single_side else conv).convert(c)
        except NotSupportedYetError:
            for derived, mark in zip(conv.derived, marks):
                del derived[mark:]  # the parts of a term not evaluated by the task
            if single_side and c.deterministic():
                expr = None  # Spark evaluates it (see StreamJoin.pre_join_columns)
            elif jt == "inner" and c.deterministic():
                expr = None  # Spark filters the joined rows by it (StreamJoin.post_join_columns)
                spark_term = _joined_column(c, attrs)
            else:
                raise
        forms = {s: state_watermark_form(c, s, attrs, wm_cols) for s in (LEFT, RIGHT)}
        conjuncts.append(
            Conjunct(
                expr, refs, frozenset(null_intolerant_refs(c, attrs)), forms, text, c,
                seen_at_start=id(c) not in negated,
            )
        )
        if spark_term is not None:
            post_join_columns.append(spark_term)
    # Spark's optimizer: single-side conjuncts pushed below the join, and inferred
    # isnotnull filters, on the sides whose rows cannot appear null-padded.
    push_to = {
        "inner": {LEFT, RIGHT},
        "left_semi": {LEFT, RIGHT},
        "left_outer": {RIGHT},
        "right_outer": {LEFT},
        "full_outer": set(),
    }[jt]
    pushdown: list[list[Column]] = [[], []]
    schemas = {LEFT: lschema, RIGHT: rschema}
    pre_join: list[list[tuple[Any, ...]]] = [[], []]
    pre_join_columns: list[list[Column]] = [[], []]
    post_join: list[tuple[Any, ...]] = []
    remaining: list[Conjunct] = []
    # Spark infers isnotnull for the equi-join keys too (its scan's PushedFilters show
    # IsNotNull(k)): a null key never joins on those sides. On a side that can be
    # null-padded it does not, and there null keys do match each other (binary key
    # equality in the state store), as they do in lockgate's task. A null-safe key
    # (<=>) is not null-intolerant: Spark infers nothing from it, and null matches null.
    strict = [j for j in range(len(lkeys)) if j not in null_safe]
    not_null: list[set[tuple[int, tuple[int, ...]]]] = [
        {(lkeys[j], ()) for j in strict if lkeys[j] >= 0} if LEFT in push_to else set(),
        {(rkeys[j], ()) for j in strict if rkeys[j] >= 0} if RIGHT in push_to else set(),
    ]
    for s, i, path in key_not_null:
        if s in push_to:
            not_null[s].add((i, path))
    for c in conjuncts:
        sides = {s for s, _ in c.refs}
        for s, i, path in c.not_null:
            if s in push_to:
                not_null[s].add((i, path))
        if len(sides) == 1:
            (s,) = sides
            if s in push_to:
                pushdown[s].append(unresolved_column(c.source))
                continue
            if c.expr is None:
                pre_join_columns[s].append(unresolved_column(c.source))
            else:
                pre_join[s].append(c.expr)
        elif c.expr is not None:
            post_join.append(c.expr)
        remaining.append(c)
    derived_columns = [[unresolved_column(e) for e, _ in conv.derived[side]] for side in (LEFT, RIGHT)]
    for side in (LEFT, RIGHT):
        width = len(schemas[side].fields)
        for i, path in sorted(not_null[side]):
            if i >= width:  # a derived column (a BETWEEN's tested expression)
                pushdown[side].append(derived_columns[side][i - width].isNotNull())
                continue
            column = F.col(f"`{schemas[side].fields[i].name}`")
            data_type = schemas[side].fields[i].dataType
            for ordinal in path:  # a field of a struct column: isnotnull(s.a.x)
                column = column.getField(data_type.fields[ordinal].name)
                data_type = data_type.fields[ordinal].dataType
            pushdown[side].append(column.isNotNull())
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
        s: [c.watermark_forms[s] for c in conjuncts if c.watermark_forms[s] is not None and c.seen_at_start]
        for s in (LEFT, RIGHT)
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
        left_plan,
        right_plan,
        jt,
        left_schema=lschema,
        right_schema=rschema,
        left_keys=tuple(lkeys),
        right_keys=tuple(rkeys),
        key_expressions=tuple(key_exprs),
        key_types=tuple(key_types),
        pre_join=(tuple(pre_join[LEFT]), tuple(pre_join[RIGHT])),
        pre_join_columns=(tuple(pre_join_columns[LEFT]), tuple(pre_join_columns[RIGHT])),
        post_join=tuple(post_join),
        post_join_columns=tuple(post_join_columns),
        derived_columns=(tuple(derived_columns[LEFT]), tuple(derived_columns[RIGHT])),
        derived_types=tuple(tuple(_python_type(t) for _, t in conv.derived[side]) for side in (LEFT, RIGHT)),
        watermark_columns=(wm_cols[LEFT], wm_cols[RIGHT]),
        key_watermark_ordinal=key_ord,
        state_watermark_forms=(forms[LEFT], forms[RIGHT]),
        check_watermark_ok=check_ok,
        using_keys=using,
        output_names=tuple(template.columns),
        output_qualifiers=_qualifiers(plan.output()),
        output_types=tuple(f.dataType for f in template.schema.fields),
        several_event_times=tuple(several) if several else (),
        join_plan=join,
        pushdown=(tuple(pushdown[LEFT]), tuple(pushdown[RIGHT])),
    )
    # what Spark infers from the key equality and the sides' filters
    found = inferred_for_join(template)
    if found is not None:
        always, inferred = found
        node = node.with_input_filters(always) or node
        node = replace(node, inferred=(tuple(inferred[LEFT]), tuple(inferred[RIGHT])))
    # the projection must give exactly Spark's output columns
    spark = template.sparkSession
    probe = spark.createDataFrame([], _joined_schema(node)).select(*_output_columns(node))
    if probe.columns != template.columns or [f.dataType for f in probe.schema.fields] != list(node.output_types):
        raise NotSupportedYetError(
            "This stream-stream join's output columns",
            f"lockgate would produce {probe.columns}, Spark {template.columns}.",
        )
    return node, template


def _joined_column(term: Any, attrs: dict[int, tuple[int, int, Any]]) -> Column:
    """A condition term as a Column over the task's output rows (``__l{i}``, ``__r{i}``)."""
    def name_of(attribute: Any) -> str:
        side, index, _ = attrs[int(attribute.exprId().id())]
        return f"__{'lr'[side]}{index}"

    return unresolved_column(term, name_of=name_of)


def _python_type(data_type: Any) -> Any:
    """The PySpark type of a JVM ``DataType``."""
    from pyspark.sql.types import _parse_datatype_json_string

    return _parse_datatype_json_string(data_type.json())


def _key_type_ok(data_type: Any) -> bool:
    """A join key type whose values the join task compares as Spark compares keys (by
    their binary form): the scalars of ``_OK_KEY_TYPES`` and arrays and structs of them
    at any depth, held as tuples (structs as (field, value) pairs). Floating-point keys
    compare as Spark's normalized ones: -0.0 equals 0.0 in Python, and every NaN is the
    store's one ``NAN`` object (``lockgate.state.store.column_values``), so NaN keys
    meet. Maps cannot be keys in Spark at all (its analysis refuses ``=`` on maps when
    the join is defined)."""
    if isinstance(data_type, StructType):
        return all(_key_type_ok(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _key_type_ok(data_type.elementType)
    return data_type.typeName() in _OK_KEY_TYPES


def check_stream_join(node: StreamJoin, output_mode: str) -> None:
    """Start-time checks (Spark's UnsupportedOperationChecker rules for joins). Spark 4
    runs inner and left semi joins of two streams in Update mode too (their output is
    append-only either way, and an aggregation after them emits its updates); outer joins
    only in Append mode."""
    allowed = ["append", "update"] if node.join_type in ("inner", "left_semi") else ["append"]
    if output_mode not in allowed:
        modes = "Append and Update output modes" if len(allowed) == 2 else "Append output mode"
        raise AnalysisError.spark(
            "_LEGACY_ERROR_TEMP_3102",
            {
                "msg": f"{_SPARK_JOIN_NAMES[node.join_type]} join between two streaming DataFrames/Datasets "
                f"is not supported in {output_mode.capitalize()} output mode, only in {modes}"
            },
        )
    if node.several_event_times:
        # Spark raises it in the query's first batch; lockgate before running it.
        cols = ",".join(f"{name}-T{delay}ms" for name, delay in node.several_event_times)
        raise AnalysisError(
            "[MULTIPLE_EVENT_TIME_COLUMNS] More than one event time columns are available. "
            "Please ensure there is at most one event time column per stream. event time "
            f"columns: ({cols})"
        )
    if node.join_type != "inner" and not node.check_watermark_ok:
        raise AnalysisError(
            f"Stream-stream {_SPARK_JOIN_NAMES[node.join_type]} join between two streaming "
            "DataFrame/Datasets is not supported without a watermark in the join keys, or a "
            "watermark on the nullable side and an appropriate range condition"
        )


# -- per-batch physical steps -------------------------------------------------------------
def _side_types(node: StreamJoin, side: int) -> list[Any]:
    """The types of a side's rows in the task: its columns, then its derived columns."""
    schema = node.left_schema if side == LEFT else node.right_schema
    return [f.dataType for f in schema.fields] + list(node.derived_types[side])


def _joined_schema(node: StreamJoin) -> StructType:
    fields = [StructField(f"__l{i}", t, True) for i, t in enumerate(_side_types(node, LEFT))]
    if node.join_type != "left_semi":
        fields += [StructField(f"__r{i}", t, True) for i, t in enumerate(_side_types(node, RIGHT))]
    return StructType(fields)


def _qualifiers(attributes: Any) -> tuple[tuple[str, ...], ...]:
    """The qualifier of each of Spark's output attributes (a JVM ``Seq``)."""
    out = []
    for i in range(attributes.size()):
        qualifier = attributes.apply(i).qualifier()
        out.append(tuple(str(qualifier.apply(j)) for j in range(qualifier.size())))
    return tuple(out)


def _project(node: StreamJoin, df: DataFrame, ctx: StatefulContext) -> DataFrame:
    projected = frame(df, df._jdf.select(ctx.cache.java_columns(node, "output", lambda: _output_columns(node))))
    if not any(node.output_qualifiers):
        return projected
    return _qualified(projected, node.output_qualifiers)


def _qualified(df: DataFrame, qualifiers: tuple[tuple[str, ...], ...]) -> DataFrame:
    """``df`` (a projection of aliases) with its columns qualified as ``qualifiers``
    says: the DataFrame API cannot set a qualifier, so the projection is rebuilt."""

    jvm = df._sc._jvm
    plan = df._jdf.queryExecution().analyzed()
    aliases = plan.projectList()
    alias = jvm_name(jvm, "org.apache.spark.sql.catalyst.expressions.Alias")
    qualified = []
    for i, qualifier in enumerate(qualifiers):
        a = aliases.apply(i)
        qualified.append(
            alias(
                a.child(), a.name(), a.exprId(), scala_list(jvm, list(qualifier)),
                a.explicitMetadata(), a.nonInheritableMetadataKeys(),
            )
        )
    project = jvm_name(jvm, "org.apache.spark.sql.catalyst.plans.logical.Project")
    return analysed_frame(df.sparkSession, project(scala_list(jvm, qualified), plan.child()))


def _using_key_indexes(node: StreamJoin) -> list[tuple[int, int]]:
    """Per USING key, its (left, right) column index."""
    lnames = [f.name.lower() for f in node.left_schema.fields]
    rnames = [f.name.lower() for f in node.right_schema.fields]
    return [(lnames.index(k.lower()), rnames.index(k.lower())) for k in node.using_keys or ()]


def output_sources(node: StreamJoin) -> list[tuple[int, int] | None]:
    """Per output column of the join, the (side, column index) it is, or None for a
    full outer join's ``coalesce`` of a USING key. Spark's order: a USING join's keys
    first (the left's, the right's for a right outer join), then the other columns of
    the left and (but for a left semi join) the right side."""
    nleft, nright = len(node.left_schema.fields), len(node.right_schema.fields)
    if node.using_keys is None:
        right = [] if node.join_type == "left_semi" else [(RIGHT, i) for i in range(nright)]
        return [(LEFT, i) for i in range(nleft)] + right
    keys = _using_key_indexes(node)
    found: list[tuple[int, int] | None] = []
    for li, ri in keys:
        if node.join_type == "full_outer":
            found.append(None)
        else:
            found.append((RIGHT, ri) if node.join_type == "right_outer" else (LEFT, li))
    found += [(LEFT, i) for i in range(nleft) if i not in {li for li, _ in keys}]
    if node.join_type != "left_semi":
        found += [(RIGHT, i) for i in range(nright) if i not in {ri for _, ri in keys}]
    return found


def _output_columns(node: StreamJoin) -> list[Column]:
    coalesced = iter(_using_key_indexes(node))
    cols = []
    for source in output_sources(node):
        if source is None:
            li, ri = next(coalesced)
            cols.append(F.coalesce(F.col(f"__l{li}"), F.col(f"__r{ri}")))
        else:
            cols.append(F.col(f"__{'lr'[source[0]]}{source[1]}"))
    return [c.alias(n) for c, n in zip(cols, node.output_names)]


def _key(node: StreamJoin, j: int, side: int) -> Column:
    """Join key ``j`` computed from ``side``'s columns."""
    expression = node.key_expressions[j][side] if node.key_expressions else None
    if expression is not None:
        return expression
    fields, index = (node.left_schema.fields, node.left_keys[j]) if side == LEFT else (
        node.right_schema.fields, node.right_keys[j]
    )
    return F.col(f"`{fields[index].name}`")


def _pre_join_flag(node: StreamJoin, side: int) -> list[Column]:
    """The ``__pre`` column of a side's rows (whether its ``pre_join_columns`` hold, a
    null as false), when any side has such terms; else no column."""
    if not any(node.pre_join_columns):
        return []
    terms = node.pre_join_columns[side]
    flag = F.coalesce(all_of(list(terms)), F.lit(False)) if terms else F.lit(True)
    return [flag.alias("__pre")]


def _late_events_watermark_ms(ctx: StatefulContext, batch_id: int) -> int:
    """The previous batch's watermark: Spark drops late rows by it (evicts by the current)."""
    return int(ctx.late_events_watermark_ms or 0)


def join_params(node: StreamJoin, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
    """This batch's values for the join's state step (see ``map_with_state``)."""
    evict_wm = ctx.batch_watermark_ms if ctx.batch_watermark_ms is not None else 0
    has_wm = ctx.batch_watermark_ms is not None
    # by the join key (evict_watermark_ms) when it carries event time, else per side
    state_wms = node.state_watermarks_ms(evict_wm) if has_wm and node.key_watermark_ordinal is None else (None, None)
    return {
        "version": batch_id + 1,
        "late_watermark_ms": _late_events_watermark_ms(ctx, batch_id) if has_wm else 0,
        "evict_watermark_ms": evict_wm,
        "state_watermark_ms": list(state_wms),
    }


def _reads_stateful(plan: PlanNode) -> bool:
    return bool(stateful_operators(plan))


def _empty_sides(node: StreamJoin, ctx: StatefulContext) -> tuple[bool, bool]:
    """Per side: whether Spark's plan of this batch reads it as one empty relation, every
    source under it without new rows (``ctx.empty_sources``). Spark
    infers nothing across the join from such a side (``StreamJoin.inferred``).

    Not a side with a ``withWatermark``: Spark's ``PropagateEmptyRelation`` does not fold
    an ``EventTimeWatermark``, and it runs before filters are pushed below one, so the
    filters above it keep their constraints (those below it would not: lockgate's
    templates have no ``EventTimeWatermark`` to tell them apart, and keeps them all, a
    known difference). Nor a side reading another stateful operator, whose state can
    give rows in a batch without input."""
    empty = ctx.empty_sources

    def alone(plan: PlanNode) -> bool:
        nodes = list(plan.walk())
        relations = [n for n in nodes if isinstance(n, StreamingRelation)]
        return (
            bool(relations)
            and all(id(r) in empty for r in relations)
            and not any(isinstance(n, EventTimeWatermark) for n in nodes)
            and not stateful_operators(plan)
        )

    return alone(node.left), alone(node.right)


def build_stream_join(
    node: StreamJoin,
    left: DataFrame,
    right: DataFrame,
    ctx: StatefulContext,
    operator_id: int,
    batch_id: int,
) -> tuple[DataFrame, Any]:
    n = ctx.num_partitions
    tz = ctx.session_timezone
    lf, rf = node.left_schema.fields, node.right_schema.fields
    nkeys = len(node.left_keys)

    def tagging() -> tuple[list[Column], list[Column], list[Column], Column]:
        lnull = [F.lit(None).cast(t).alias(f"__l{i}") for i, t in enumerate(_side_types(node, LEFT))]
        rnull = [F.lit(None).cast(t).alias(f"__r{i}") for i, t in enumerate(_side_types(node, RIGHT))]
        pre = [_pre_join_flag(node, side) for side in (LEFT, RIGHT)]
        derived = [
            [c.alias(f"__{'lr'[side]}{len(fields) + k}") for k, c in enumerate(node.derived_columns[side])]
            for side, fields in ((LEFT, lf), (RIGHT, rf))
        ]
        def side_column(side: int, i: int, f: StructField) -> Column:
            name = f"__{'lr'[side]}{i}"
            if i in node.unread[side]:
                return F.lit(None).cast(f.dataType).alias(name)
            return F.col(f"`{f.name}`").alias(name)

        lcols = [
            F.lit(LEFT).alias("__side"),
            *[_key(node, j, LEFT).alias(f"__k{j}") for j in range(nkeys)],
            *[side_column(LEFT, i, f) for i, f in enumerate(lf)],
            *derived[LEFT],
            *rnull,
            *pre[LEFT],
        ]
        rcols = [
            F.lit(RIGHT).alias("__side"),
            *[_key(node, j, RIGHT).alias(f"__k{j}") for j in range(nkeys)],
            *lnull,
            *[side_column(RIGHT, i, f) for i, f in enumerate(rf)],
            *derived[RIGHT],
            *pre[RIGHT],
        ]
        key_cols = [F.col(f"__k{j}") for j in range(nkeys)]
        return lcols, rcols, key_cols, F.pmod(F.hash(*key_cols), F.lit(n))

    lcols, rcols, key_cols, pid = ctx.cache.get(node, f"tagging/{n}", tagging)
    empty = _empty_sides(node, ctx)
    for side, conditions in enumerate(node.pushdown):
        with_inferred = not empty[1 - side]
        if with_inferred:
            conditions = conditions + node.inferred[side]
        if conditions:
            condition = ctx.cache.get(
                node, f"pushdown/{side}/{with_inferred}", lambda c=conditions: all_of(list(c))
            )
            if side == LEFT:
                left = frame(left, left._jdf.filter(condition._jc))
            else:
                right = frame(right, right._jdf.filter(condition._jc))
    java_keys = ctx.cache.java_columns(node, f"keys/{n}", lambda: key_cols)
    lpart = frame(left, left._jdf.select(ctx.cache.java_columns(node, f"left/{n}", lambda: lcols)))
    rpart = frame(right, right._jdf.select(ctx.cache.java_columns(node, f"right/{n}", lambda: rcols)))
    # A side reading another stateful operator (an aggregation, a deduplication, a limit
    # or a join) ends with that operator's state task, which must run in a stage of its
    # own: under the union its task would see the union's partition index, not its state
    # partition.
    tasks = ctx.state_tasks(n)
    if _reads_stateful(node.left):
        lpart = frame(lpart, lpart._jdf.repartition(tasks, java_keys))
    if _reads_stateful(node.right):
        rpart = frame(rpart, rpart._jdf.repartition(tasks, java_keys))
    union = lpart.unionByName(rpart)
    staged = frame(union, union._jdf.repartition(tasks, java_keys)).withColumn("__lockgate_pid", pid)
    ctx.schema_of(node, staged, "staged")

    def store_conf(
        name: str, fields: list[StructField], derived: tuple[Any, ...], key_idx: tuple[int, ...]
    ) -> StateStoreConf:
        names = UniqueNames()
        key_fields = [
            StructField(names.take(f"key_{fields[i].name}"), fields[i].dataType, True)
            if i >= 0
            else StructField(names.take(f"key_expr{j}"), node.key_types[j], True)
            for j, i in enumerate(key_idx)
        ]
        key_fields.append(StructField(names.take("index"), LongType(), True))
        value_fields = [StructField(names.take(f.name), f.dataType, True) for f in fields]
        value_fields += [StructField(names.take(f"derived_{k}"), t, True) for k, t in enumerate(derived)]
        value_fields.append(StructField(names.take("matched"), BooleanType(), True))
        return StateStoreConf(
            root=ctx.state_root,
            operator_id=operator_id,
            num_partitions=n,
            key_schema=schema_to_arrow(StructType(key_fields), tz),
            value_schema=schema_to_arrow(StructType(value_fields), tz),
            snapshot_interval=ctx.snapshot_interval,
            background_snapshot_min_rows=ctx.background_snapshot_min_rows,
            min_versions_to_retain=ctx.min_versions_to_retain,
            store_name=name,
            checkpoint_id=ctx.checkpoint_id,
            timestamps_as_micros=True,
        )

    lstore = store_conf("left", list(lf), node.derived_types[LEFT], node.left_keys)
    rstore = store_conf("right", list(rf), node.derived_types[RIGHT], node.right_keys)
    has_wm = ctx.batch_watermark_ms is not None
    out_struct = _joined_schema(node)
    task = JoinTask(
        left_store=lstore,
        right_store=rstore,
        version=0,  # this batch's values come with the tasks (with_batch_params)
        join_type=node.join_type,
        left_keys=node.left_keys,
        right_keys=node.right_keys,
        pre_join=node.pre_join,
        spark_pre_join=any(node.pre_join_columns),
        post_join=node.post_join,
        watermark_columns=node.watermark_columns if has_wm else (None, None),
        late_watermark_ms=0,
        evict_watermark_ms=0,
        key_watermark_ordinal=node.key_watermark_ordinal if has_wm else None,
        state_watermark_ms=(None, None),
        left_width=len(lf) + len(node.derived_types[LEFT]),
        right_width=len(rf) + len(node.derived_types[RIGHT]),
        out_schema=schema_to_arrow(out_struct, tz),
        accumulator=ctx.accumulator,
        operator_id=operator_id,
    )
    params = join_params(node, ctx, batch_id)
    # watermark_columns and key_watermark_ordinal depend on whether the query has a
    # watermark at all, which is the same in every batch of a run.
    result = map_with_state(
        staged,
        ctx,
        node,
        lambda: bind(run_join_task, task),
        out_struct,
        operator_id,
        params,
        n,
        hosted=True,
    )
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
    if node.post_join_columns:
        condition = ctx.cache.get(node, "post_join", lambda: all_of(list(node.post_join_columns)))
        result = frame(result, result._jdf.filter(condition._jc))
    return _project(node, result, ctx), schema
