"""``groupBy(...).transformWithStateInPandas`` and ``transformWithState``: explicit state
kept by the user's ``StatefulProcessor`` (Spark's ``TransformWithStateInPySparkExec``,
``transformWithStateInPandasExec`` in progress; the Row-based one ``transformWithStateInPySparkExec``).

The batch is hash-partitioned by the grouping keys into the state's partitions (as
every stateful operator's); each state task opens, per partition, one
:class:`~lockgate.state.store.StateStore` per state variable, calls the processor's
``init`` with a handle over them, ``handleInputRows`` once per key of the batch (keys
in ascending order of their first row), ``handleExpiredTimer`` for each due timer (in
time order), ``close``, and commits every store.

**State layout.** One store per state variable rather than one store with a column
family per variable: each variable keeps its own declared Arrow types, so its files
read as a plain table, and it is versioned and cached as any other store
(``state/<operatorId>/<partition>/<stateName>/<v>.delta``). Every store is keyed by
the grouping key; the value is

* a ``ValueState``: the variable's own columns; with TTL, then ``$ttlExpirationMs``
  (int64, epoch ms: the batch timestamp of its last update plus the TTL);
* a ``ListState``: one column ``values``, a list of the variable's structs; with TTL,
  then ``$ttlExpirationsMs``, a list of int64 (each element's expiration);
* a ``MapState``: columns ``keys`` and ``values``, lists of the user key's and the
  value's structs in insertion order; with TTL, then ``$ttlExpirationsMs`` (each
  entry's expiration);
* the timers (store ``$timers``, ``$`` as in Spark's reserved column families): one
  column ``expiryTimestampsMs``, a list of int64.

**TTL** (``ttlDurationMs``, time mode ``processingTime`` only, as Spark's
``StatefulProcessorHandleImpl`` allows; 0 is no TTL): an update sets the value's (list
element's, map entry's) expiration to the batch timestamp (the offsets log's, the
query clock's) plus the TTL; from the first batch whose timestamp reaches it, it reads
as gone, and the batch's cleanup (after the timers, before the commit, Spark's
``doTtlCleanup``) removes it, counted in ``numValuesRemovedDueToTTLExpiry``. The cleanup
visits the keys by a min-heap of their earliest expiration kept with the store in the
worker cache, not every key.

The variables are found as Spark finds them: the processor's ``init`` runs once on
the driver with a handle that only records them (Spark's
``DriverStatefulProcessorHandleImpl``); the operator's state schema (its schema file)
has one column per variable, compared by name on a restart as Spark compares column
families: a variable whose type changed (or gained or lost its TTL) is refused with
Spark's ``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``; a variable added starts empty (the
schema file's ``stateVariablesSince`` keeps the version its store starts after); a
variable removed is no longer read (its files stay, ``stateVariablesRemoved`` keeps its
last version), and declared again later reads that state back, as Spark's does (the
versions in between are written as empty deltas, ``StateStoreConf.gap``), unless a run
deleted it (``deleteIfExists`` in ``init``): then it starts empty. A name declared twice
in one ``init`` is refused with Spark's state server's message.

State schemas may nest (structs, arrays, maps at any depth): values are written in
the store's Arrow form and given back as PySpark's handle gives them (structs as
``Row``, maps as dicts, arrays as lists; see :func:`_user_form`).

Any stateful operator may follow the operator, as Spark's UnsupportedOperationChecker
allows (a deduplication, an aggregation, a stream-stream join, another transformWithState
or an applyInPandasWithState), each with its own operator id and state directory; the
input watermark passes on to it, and ``eventTimeColumnName`` makes the output's column
its event time.

**Keys** as native Spark's: a struct key is handed to the processor as a dict (PySpark's
worker goes through pandas); the state is keyed by the key's bytes, so -0.0 and 0.0 are
two keys, at the top level, inside a struct, and as a MapState's user keys
(``StateStoreConf.signed_zero_keys``); an integer key column holding a null takes the
pandas worker's float conversion (:func:`_null_integer_groups`); a key holding an array
or a map is refused when the query is defined (Spark's worker fails on it at the first
batch, unable to read the key's schema).

Not there yet, refused with :class:`~lockgate.errors.NotSupportedYetError`: at
``start()``, a stateful operator after the operator in time mode ``processingTime`` with
an ``eventTimeColumnName`` (:func:`refuse_after_processing_time_transform_with_state`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import heapq
import itertools
import math
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial as bind
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lockgate.checkpoint.fs import resolve_filesystem
from lockgate.compat import override
from lockgate.errors import AnalysisError, LockgateError, NotSupportedYetError, OptionError
from lockgate.options import Options
from lockgate.plan.cache import frame
from lockgate.plan.nodes import PlanNode
from lockgate.plan.state_udf import map_with_state, with_batch_params
from lockgate.plan.stateful import StatefulContext, StatefulOperator, stateful_operators
from lockgate.state.arrow_types import schema_to_arrow
from lockgate.state.schema import (
    TIMERS_STORE,
    TRANSFORM_WITH_STATE_NAME,
    TRANSFORM_WITH_STATE_ROW_NAME,
    TTL_COLUMN,
    TTL_LIST_COLUMN,
    OperatorStateSchema,
    read_schema_file,
    stored_schema,
    variable_store_keys,
)
from lockgate.state.store import (
    StateStore,
    StateStoreConf,
    column_values,
    has_float,
    hashable,
    micros_array,
    signed_zero_key,
    unsigned_zero_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


TIMERS = TIMERS_STORE
"""The store of the registered timers (``$``: Spark's prefix of reserved column families)."""


_TIME_MODES = {"none": "none", "processingtime": "processingTime", "eventtime": "eventTime"}
_OUTPUT_MODES = {"append": "append", "update": "update"}
_KEY_PREFIX = "__lockgate_tws_key_"
_INIT_PREFIX = "__lockgate_tws_init_"
_INIT_MARK = "__lockgate_tws_initial"
_UNLIMITED = 2**31 - 1
"""Spark's ``Int.MaxValue``: no limit on a chunk's rows or bytes."""


# -- state variables declared by init() ---------------------------------------------------
@dataclass(frozen=True)
class StateVariable:
    """One state variable as the processor's ``init`` declares it."""

    name: str
    kind: str
    """``value``, ``list`` or ``map``."""
    schema: StructType
    """The value's schema (a map's value schema)."""
    key_schema: StructType | None = None
    """A map's user key schema."""
    ttl_ms: int | None = None
    """``ttlDurationMs`` (None: no TTL, also for 0, as Spark's ``TTLConfig.NONE``)."""

    def value_type(self) -> StructType:
        """The variable's value columns in its store (with TTL, the expirations too)."""
        if self.kind == "value":
            fields = list(self.schema.fields)
            if self.ttl_ms is not None:
                fields.append(StructField(TTL_COLUMN, LongType(), True))
            return StructType(fields)
        if self.kind == "list":
            fields = [StructField("values", ArrayType(self.schema, True), True)]
        else:
            assert self.key_schema is not None
            fields = [
                StructField("keys", ArrayType(self.key_schema, True), True),
                StructField("values", ArrayType(self.schema, True), True),
            ]
        if self.ttl_ms is not None:
            fields.append(StructField(TTL_LIST_COLUMN, ArrayType(LongType(), True), True))
        return StructType(fields)


_TIMER_VALUE = StructType([StructField("expiryTimestampsMs", ArrayType(LongType(), True), True)])


def _as_struct(schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        from pyspark.sql.types import _parse_datatype_string

        parsed = _parse_datatype_string(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise AnalysisError(
        f"A state variable's schema must be a StructType or a DDL string of fields such as "
        f"'count long', got {schema!r}."
    )


def _store_form(dtype: DataType, value: Any) -> Any:
    """A value of a state variable's field as the user gives it (a struct as a ``Row``
    or tuple, a map as a dict, an array as a list) in the form the store writes to
    Arrow: structs as dicts, maps as lists of (key, value) pairs, at any depth."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        values = [value.get(f.name) for f in dtype.fields] if isinstance(value, dict) else list(value)
        return {f.name: _store_form(f.dataType, v) for f, v in zip(dtype.fields, values)}
    if isinstance(dtype, ArrayType):
        return [_store_form(dtype.elementType, v) for v in value]
    if isinstance(dtype, MapType):
        items = value.items() if isinstance(value, dict) else value
        return [(_store_form(dtype.keyType, k), _store_form(dtype.valueType, v)) for k, v in items]
    return value


def _user_form(dtype: DataType, value: Any) -> Any:
    """A stored value (as :func:`_store_form` made it, or as the store loads it:
    structs and maps as tuples of pairs, arrays as tuples) as PySpark's handle gives
    it: structs as ``Row``, maps as dicts, arrays as lists."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        from pyspark.sql import Row

        items = dict(value.items() if isinstance(value, dict) else value)
        return Row(**{f.name: _user_form(f.dataType, items.get(f.name)) for f in dtype.fields})
    if isinstance(dtype, ArrayType):
        return [_user_form(dtype.elementType, v) for v in value]
    if isinstance(dtype, MapType):
        items = value.items() if isinstance(value, dict) else value
        return {_user_form(dtype.keyType, k): _user_form(dtype.valueType, v) for k, v in items}
    return value


def _user_tuple(schema: StructType, values: Any) -> tuple[Any, ...]:
    return tuple(_user_form(f.dataType, v) for f, v in zip(schema.fields, values))


def _store_values(schema: StructType, values: tuple[Any, ...]) -> list[Any]:
    return [_store_form(f.dataType, v) for f, v in zip(schema.fields, values)]


class _RecordingHandle:
    """The handle ``init`` gets on the driver: records the state variables (Spark's
    ``DriverStatefulProcessorHandleImpl``), and refuses what lockgate lacks."""

    def __init__(self, time_mode: str) -> None:
        self.time_mode = time_mode
        self.variables: dict[str, StateVariable] = {}
        self.deleted: set[str] = set()
        self.dropped: dict[str, StateVariable] = {}
        """Variables declared and then deleted (Spark still lists them)."""

    def _add(self, variable: StateVariable, ttl: int | None) -> None:
        from dataclasses import replace

        name = variable.name
        if not isinstance(name, str) or not name or name.startswith(("$", ".")) or "/" in name:
            raise AnalysisError(
                f"State variable name {name!r} cannot be used: it must be a non-empty name "
                "without '/', not starting with '$' or '.'."
            )
        if ttl is not None and int(ttl) != 0:  # 0: no TTL (Spark's TTLConfig.NONE)
            if self.time_mode != "processingTime":
                mode = {"none": "NoTime", "eventTime": "EventTime"}[self.time_mode]
                raise AnalysisError(
                    f"[STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL] Cannot use TTL for "
                    f"state={name} in timeMode={mode}, use TimeMode.ProcessingTime() instead."
                )
            if int(ttl) < 0:
                raise AnalysisError(
                    "[STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE] TTL duration must be greater "
                    f"than zero for State store operation=update on state={name}."
                )
            variable = replace(variable, ttl_ms=int(ttl))
        for f in variable.schema.fields:
            if f.name in (TTL_COLUMN, TTL_LIST_COLUMN):
                raise AnalysisError(f"State variable {name!r} cannot have a field named {f.name!r}: lockgate keeps TTL there.")
        if name in self.variables:
            # Spark's state server: a name is declared once per init()
            kind = variable.kind
            if self.variables[name].kind == variable.kind:
                raise AnalysisError(
                    f"Error initializing {kind} state: {kind.capitalize()} state {name} already exists"
                )
            raise AnalysisError(f"State variable {name!r} is declared twice, as a {self.variables[name].kind} "
                                f"and a {variable.kind} state, in init().")
        self.variables[name] = variable

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._add(StateVariable(stateName, "value", _as_struct(schema)), ttlDurationMs)
        return _Unavailable(stateName)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._add(StateVariable(stateName, "list", _as_struct(schema)), ttlDurationMs)
        return _Unavailable(stateName)

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> Any:
        variable = StateVariable(stateName, "map", _as_struct(valueSchema), _as_struct(userKeySchema))
        self._add(variable, ttlDurationMs)
        return _Unavailable(stateName)

    def deleteIfExists(self, stateName: str) -> None:
        dropped = self.variables.pop(stateName, None)
        if dropped is not None:
            self.dropped[stateName] = dropped
        self.deleted.add(stateName)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AnalysisError(
                f"[STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE] Failed to "
                f"perform stateful processor operation={name} with invalid handle state=PRE_INIT."
            )

        return refuse


class _Unavailable:
    """A state variable on the driver: it only exists in the tasks."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise AnalysisError(f"State variable {self._name!r} can only be read or written while rows are handled.")


def declared_variables(
    processor: Any, time_mode: str
) -> tuple[tuple[StateVariable, ...], tuple[str, ...], tuple[StateVariable, ...]]:
    """The state variables of the processor's ``init``, run on a copy of the processor,
    the names it deletes (``deleteIfExists``) without declaring them again, and the
    variables among those it declared before deleting them."""
    from pyspark import cloudpickle

    copy = pickle.loads(cloudpickle.dumps(processor))
    handle = _RecordingHandle(time_mode)
    copy.init(handle)
    copy.close()
    dropped = tuple(v for name, v in handle.dropped.items() if name not in handle.variables)
    return tuple(handle.variables.values()), tuple(sorted(handle.deleted - set(handle.variables))), dropped


# -- the plan node ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TransformWithState(StatefulOperator):
    child: PlanNode
    grouping: tuple[Any, ...]
    """The grouping columns or names as given."""
    processor: Any
    output_schema: StructType
    output_mode: str
    time_mode: str
    pandas: bool
    """transformWithStateInPandas (pandas DataFrames) or transformWithState (Rows)."""
    key_schema: StructType
    variables: tuple[StateVariable, ...]
    event_time_column: str | None = None
    """A watermarked input column: late rows are dropped by it, as Spark's
    ``watermarkPredicateForDataForLateEvents``."""
    output_event_time: str | None = None
    """``eventTimeColumnName``: the output column that carries event time on (Spark's
    ``UpdateEventTimeWatermarkColumn``), with the upstream watermark's delay."""
    output_delay_ms: int = 0
    initial_state: Any = None
    """The ``initialState`` (a static DataFrame) and the SQL of its grouping keys, or None."""
    deleted_variables: tuple[str, ...] = ()
    """Names ``init`` deletes (``deleteIfExists``) and does not declare: declared again
    later, they start empty."""
    declared_then_deleted: tuple[StateVariable, ...] = ()
    """The variables among ``deleted_variables`` that ``init`` declared first: Spark's
    operator properties list them (the state reader's ``state-metadata``)."""

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    @property
    @override
    def operator_name(self) -> str:
        return TRANSFORM_WITH_STATE_NAME if self.pandas else TRANSFORM_WITH_STATE_ROW_NAME

    @override
    def build_state(
        self, inputs: list[DataFrame], ctx: StatefulContext, operator_id: int, batch_id: int
    ) -> tuple[DataFrame, OperatorStateSchema]:
        return _build(self, inputs[0], ctx, operator_id, batch_id)

    @property
    @override
    def reuses_state_step(self) -> bool:
        """Not with an initial state: its rows join the first batch's step only."""
        return self.initial_state is None

    @override
    def batch_params(self, ctx: StatefulContext, batch_id: int) -> dict[str, Any]:
        drops_late = ctx.batch_watermark_ms is not None and (
            self.event_time_column is not None or self.output_event_time is not None
        )
        return {
            "version": batch_id + 1,
            "watermark_ms": ctx.batch_watermark_ms,
            "late_watermark_ms": (ctx.late_events_watermark_ms or 0) if drops_late else None,
            "batch_timestamp_ms": ctx.batch_timestamp_ms,
        }

    @override
    def event_time_outputs(self, lineage: Callable[[PlanNode], dict[str, int] | None]) -> dict[str, int]:
        """New output columns: only ``eventTimeColumnName`` carries event time."""
        return {} if self.output_event_time is None else {self.output_event_time: self.output_delay_ms}

    @override
    def should_run_another_batch(
        self, new_input_watermark_ms: int, eviction_watermark_ms: int | None, output_mode: str
    ) -> bool:
        """Spark's: with processing time, always (a timer may be due at any trigger;
        Spark does not track whether one is); in the other time modes, when the input
        has a watermark and it moves on (due event-time timers fire then; without any,
        Spark still runs that batch)."""
        if self.time_mode == "processingTime":
            return True
        return self.watermark_advanced(new_input_watermark_ms, eviction_watermark_ms)

    @property
    @override
    def custom_metric_names(self) -> tuple[str, ...]:
        return (
            "numValueStateVars",
            "numListStateVars",
            "numMapStateVars",
            "numDeletedStateVars",
            "numRegisteredTimers",
            "numDeletedTimers",
            "numExpiredTimers",
            "numValueStateWithTTLVars",
            "numListStateWithTTLVars",
            "numMapStateWithTTLVars",
            "numValuesRemovedDueToTTLExpiry",
        )

    @property
    @override
    def counts_for_watermark_correctness(self) -> bool:
        return True

    @override
    def explain_steps(
        self, state_info: str, output_mode: str, watermark_ms: int | None, num_partitions: int
    ) -> list[str]:
        keys = ", ".join(self.key_schema.names)
        name = "TransformWithStateInPySpark" if not self.pandas else "TransformWithStateInPandas"
        return [
            f"{name} [{keys}], {self.output_mode.capitalize()}, {self.time_mode}, {state_info}",
            f"Exchange hashpartitioning({keys}, {num_partitions})",
        ]

    def describe(self) -> str:
        method = "transformWithStateInPandas" if self.pandas else "transformWithState"
        return f"{method} [{', '.join(self.key_schema.names)}] {type(self.processor).__name__}"


def refuse_after_processing_time_transform_with_state(plan: PlanNode) -> None:
    """A stateful operator after a transformWithState in time mode ``processingTime``
    with an ``eventTimeColumnName``: Spark's operator passes no watermark on in that
    mode (its ``produceOutputWatermark`` is None), and lockgate's would pass its input's;
    native Spark's processing-time mode never lets ``processAllAvailable`` or
    ``availableNow`` finish, so the chain could not be compared with it. Checked after
    Spark's rules."""
    operators = stateful_operators(plan)
    for op in operators:
        below = [n for n in stateful_operators(op) if n is not op and isinstance(n, TransformWithState)]
        if any(n.time_mode == "processingTime" and n.output_event_time is not None for n in below):
            raise NotSupportedYetError(
                f"A stateful operator ({op.operator_name}) after transformWithState in time mode "
                "processingTime with an eventTimeColumnName",
                "Use time mode eventTime (its timers and the event time it passes on), or "
                "write the output out and read it back in a second query.",
            )


def make_transform_with_state(
    child: PlanNode,
    input_schema: StructType,
    grouping: tuple[Any, ...],
    key_schema: StructType,
    processor: Any,
    output_schema: StructType,
    output_mode: str,
    time_mode: str,
    pandas: bool,
    initial_state: Any,
    event_time_column_name: str,
    watermarks: Any,
) -> TransformWithState:
    """The node, with lockgate's refusals and Spark's checks of the arguments."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    method = "transformWithStateInPandas" if pandas else "transformWithState"
    if not isinstance(processor, StatefulProcessor):
        raise TypeError(f"{method} takes a pyspark.sql.streaming.StatefulProcessor, got {type(processor).__name__}")
    mode = _OUTPUT_MODES.get(str(output_mode).lower())
    if mode is None:
        raise AnalysisError(
            f"Output mode {output_mode!r} is not supported by {method}: use 'Append' or 'Update'."
        )
    tm = _TIME_MODES.get(str(time_mode).lower())
    if tm is None:
        raise AnalysisError(
            f"[STATEFUL_PROCESSOR_UNKNOWN_TIME_MODE] Unknown time mode {time_mode}. Accepted "
            "timeMode modes are 'none', 'processingTime', 'eventTime'"
        )
    initial = None
    if initial_state is not None:
        jgd = getattr(initial_state, "_jgd", None)
        if jgd is None or not hasattr(initial_state, "_df"):
            raise TypeError(f"{method}'s initialState must be a GroupedData (df.groupBy(...)), got {initial_state!r}")
        exprs = jgd.groupingExprs()
        keys = tuple(str(exprs.apply(i).sql()) for i in range(exprs.size()))
        if len(keys) != len(key_schema.fields):
            raise AnalysisError(
                f"{method}'s initialState is grouped by {len(keys)} keys ({', '.join(keys)}), the "
                f"input by {len(key_schema.fields)}: group both by the same keys."
            )
        if initial_state._df.isStreaming:
            raise AnalysisError(f"{method}'s initialState must be a batch DataFrame, not a streaming one.")
        initial = (initial_state._df, keys)
    watermarked = dict(watermarks)
    output_event_time = None
    if event_time_column_name:
        found = [f for f in output_schema.fields if f.name == event_time_column_name]
        if not found or not isinstance(found[0].dataType, TimestampType):
            raise AnalysisError(
                f"eventTimeColumnName {event_time_column_name!r} must name a timestamp column of "
                f"the output schema {output_schema.simpleString()}."
            )
        if not watermarked:
            raise AnalysisError(
                f"{method} with eventTimeColumnName needs a watermark on its input (withWatermark)."
            )
        output_event_time = event_time_column_name
    for f in key_schema.fields:
        if _holds_collection(f.dataType):
            # Spark runs the query, and its Python worker fails at the first batch with
            # rows: it cannot read such a grouping key's schema (KeyError: 'elementType').
            raise AnalysisError(
                f"{method} cannot group by a key holding an array or a map ({f.name}: "
                f"{f.dataType.simpleString()}): Spark's Python worker fails reading such a "
                "grouping key's schema at the first batch with rows (KeyError: 'elementType' "
                "or 'keyType'). Group by its scalar values instead, or by to_json() of it."
            )
    variables, deleted, declared_then_deleted = declared_variables(processor, tm)
    event_time = next((c for c in input_schema.names if c in watermarked), None)
    return TransformWithState(
        child=child,
        grouping=grouping,
        processor=processor,
        output_schema=output_schema,
        output_mode=mode,
        time_mode=tm,
        pandas=pandas,
        key_schema=key_schema,
        variables=variables,
        deleted_variables=deleted,
        declared_then_deleted=declared_then_deleted,
        event_time_column=event_time,
        output_event_time=output_event_time,
        output_delay_ms=max(watermarked.values(), default=0),
        initial_state=initial,
    )


def _holds_collection(dtype: DataType) -> bool:
    if isinstance(dtype, (ArrayType, MapType)):
        return True
    return isinstance(dtype, StructType) and any(_holds_collection(f.dataType) for f in dtype.fields)


# -- the state step ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TwsTask:
    stores: dict[str, Any]
    """State variable name (and :data:`TIMERS`) -> its store's conf."""
    variables: tuple[StateVariable, ...]
    processor_bytes: bytes
    """The processor, cloudpickled on the driver (unpickled per task: a fresh copy)."""
    pandas: bool
    time_mode: str
    key_columns: tuple[str, ...]
    input_columns: tuple[str, ...]
    input_schema: StructType
    event_time_column: str | None
    output_event_time: str | None
    initial_columns: tuple[str, ...]
    """The initial state's columns, prefixed in the first batch's rows (none without one)."""
    out_schema: pa.Schema
    output_struct: StructType
    timezone: str
    accumulator: Any
    operator_id: int
    version: int = 0
    watermark_ms: int | None = None
    late_watermark_ms: int | None = None
    batch_timestamp_ms: int | None = None
    deleted_variables: tuple[str, ...] = ()
    max_records_per_chunk: int = _UNLIMITED
    """A key's rows reach ``handleInputRows`` (pandas) in DataFrames of at most this
    many rows: ``spark.sql.execution.arrow.maxRecordsPerBatch`` (<= 0: unlimited)."""
    max_bytes_per_chunk: int = _UNLIMITED
    """... and of about at most this many bytes (the input's average Arrow row size
    times the rows): ``spark.sql.execution.arrow.maxBytesPerBatch``."""
    key_schema: StructType | None = None
    """The grouping keys' types: a struct key is handed to the processor as a dict."""


def _chunk_limits(spark: Any) -> tuple[int, int]:
    """pyspark's transformWithStateInPandas worker splits each key's rows into
    DataFrames by these two Arrow limits; lockgate splits them the same way."""
    records_key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    bytes_key = "spark.sql.execution.arrow.maxBytesPerBatch"
    conf = Options(
        {records_key: spark.conf.get(records_key, "10000"), bytes_key: spark.conf.get(bytes_key, str(_UNLIMITED))},
        owner="SQL conf",
    )
    records = conf.get_int(records_key, 10000)
    size = conf.get_size_bytes(bytes_key, _UNLIMITED)
    return (records if records > 0 else _UNLIMITED), (size if size > 0 else _UNLIMITED)


def _chunk_rows(task: TwsTask, table: pa.Table) -> int:
    """How many of a key's rows make one chunk, as pyspark's worker cuts them: a chunk
    ends when it reaches ``max_records_per_chunk`` rows or its rows times the input's
    average Arrow row size reach ``max_bytes_per_chunk``."""
    rows = task.max_records_per_chunk
    if task.max_bytes_per_chunk != _UNLIMITED and table.num_rows:
        average = table.nbytes / table.num_rows
        if average > 0:
            rows = min(rows, max(1, math.ceil(task.max_bytes_per_chunk / average)))
    return max(1, rows)


def _input_groups(
    table: pa.Table, key_columns: tuple[str, ...], keys: list[Any], pandas: bool, chunk_rows: int = _UNLIMITED
) -> list[tuple[Any, Any, list[int]]]:
    """The batch's rows by key, each key's rows in arrival order, as PySpark's worker
    hands them to ``handleInputRows``: ``(key handed to the processor, state key, row
    indices)``. The worker groups consecutive rows whose keys compare equal in Python,
    and makes each row's floats anew, so a key holding a NaN never equals the next
    row's, nor, for ``transformWithStateInPandas``, one with a null floating-point key
    column (pandas makes it NaN). Such a row is a call of its own, with the key's one
    state (Spark keys the state by the key's bytes, where every NaN is one, and every
    null); -0.0 and 0.0 rows are one call, with the state of the first row's key.
    An integer key column holding a null takes :func:`_null_integer_groups`."""
    types = [table.schema.field(k).type for k in key_columns]
    if pandas:
        ints = [j for j, t in enumerate(types) if pa.types.is_integer(t) and table.column(key_columns[j]).null_count]
        if ints:
            return _null_integer_groups(table, key_columns, keys, types, ints, chunk_rows)
    groups: dict[Any, tuple[Any, list[int]]] = {}
    if any(has_float(t) for t in types):
        nullable = [j for j, t in enumerate(types) if pandas and pa.types.is_floating(t)]
        for i, key in enumerate(keys):
            alone = _holds_nan(key) or any(key[j] is None for j in nullable)
            group = object() if alone else key
            groups.setdefault(group, (key, []))[1].append(i)
    else:
        for i, key in enumerate(keys):
            groups.setdefault(key, (key, []))[1].append(i)
    return [(key, signed_zero_key(key), indices) for key, indices in groups.values()]


def _null_integer_groups(
    table: pa.Table, key_columns: tuple[str, ...], keys: list[Any], types: list[pa.DataType],
    ints: list[int], chunk_rows: int,
) -> list[tuple[Any, Any, list[int]]]:
    """``transformWithStateInPandas``'s groups when an integer key column holds a null,
    as native Spark makes them. Spark sorts a partition's rows by key (nulls first) and
    sends them to the Python worker in Arrow batches of ``maxRecordsPerBatch`` rows,
    several keys to a batch; pandas makes an integer column with a null in its batch
    floating point: each null row is a NaN key, a call of its own, and every key of that
    batch is handed as a float (2.0). The worker sends the key back to key the state,
    and Spark's conversion of a Python float to an integer field gives null: every row
    of such a batch uses the null key's one state, in the order Spark sorted them."""
    try:
        rows = sorted(range(len(keys)), key=lambda i: tuple(_spark_order(v) for v in keys[i]))
    except TypeError:  # values Python does not order (a struct's): arrival order
        rows = list(range(len(keys)))
    floats = [j for j, t in enumerate(types) if pa.types.is_floating(t)]
    groups: list[tuple[Any, Any, list[int]]] = []
    joinable = False  # whether the next row may join the last group (itertools.groupby)
    for start in range(0, len(rows), chunk_rows):
        chunk = rows[start : start + chunk_rows]
        nulled = [j for j in ints if any(keys[i][j] is None for i in chunk)]
        for i in chunk:
            key = keys[i]
            alone = _holds_nan(key) or any(key[j] is None for j in floats) or any(key[j] is None for j in nulled)
            user, state = list(key), list(key)
            for j in nulled:
                user[j] = math.nan if key[j] is None else float(key[j])
                state[j] = None
            handed = tuple(user)
            if joinable and not alone and groups[-1][0] == handed:
                groups[-1][2].append(i)
            else:
                groups.append((handed, signed_zero_key(tuple(state)), [i]))
                joinable = not alone
    return groups


def _spark_order(value: Any) -> tuple[int, Any]:
    """A key value's place in Spark's ascending order: nulls first, NaN last."""
    if value is None:
        return (0, 0)
    if isinstance(value, float) and value != value:  # noqa: PLR0124 - NaN test
        return (2, 0)
    return (1, value)


def _holds_nan(value: Any) -> bool:
    if isinstance(value, float):
        return value != value  # noqa: PLR0124 - NaN test
    if isinstance(value, tuple):
        return any(_holds_nan(v) for v in value)
    return False


def _chunks(indices: list[int], size: int) -> Iterator[pa.Array]:
    for start in range(0, len(indices), size):
        yield pa.array(indices[start : start + size], type=pa.int64())


def _build(
    node: TransformWithState, child: DataFrame, ctx: StatefulContext, operator_id: int, batch_id: int
) -> tuple[DataFrame, Any]:
    from pyspark import cloudpickle

    n = ctx.num_partitions

    def partitioning() -> tuple[list[Any], Any]:
        keys = [_grouping_column(g) for g in node.grouping]
        aliased = [k.alias(f"{_KEY_PREFIX}{i}") for i, k in enumerate(keys)]
        key_cols = [F.col(f"`{_KEY_PREFIX}{i}`") for i in range(len(keys))]
        return aliased, (key_cols, F.pmod(F.hash(*key_cols), F.lit(n)))

    aliased, (key_cols, pid) = ctx.cache.get(node, f"partitioning/{n}", partitioning)
    keyed = child.select("*", *aliased)
    java_keys = ctx.cache.java_columns(node, f"partitioning/{n}", lambda: key_cols)
    tasks = ctx.state_tasks(n)
    initial_columns: tuple[str, ...] = ()
    if node.initial_state is not None and batch_id == 0:
        # The first batch's rows and the initial state's, in one shuffle: the initial
        # state's columns under a prefix, each side's columns null in the other's rows.
        init_df, init_keys = node.initial_state
        initial_columns = tuple(init_df.columns)
        init_rows = init_df.select(
            *[F.col(f"`{c}`").alias(f"{_INIT_PREFIX}{c}") for c in initial_columns],
            *[F.expr(k).alias(f"{_KEY_PREFIX}{i}") for i, k in enumerate(init_keys)],
        )
        keyed = keyed.withColumn(_INIT_MARK, F.lit(False)).unionByName(
            init_rows.withColumn(_INIT_MARK, F.lit(True)), allowMissingColumns=True
        )
    staged = frame(keyed, keyed._jdf.repartition(tasks, java_keys)).withColumn("__lockgate_pid", pid)
    ctx.schema_of(node, staged, "staged/initial" if initial_columns else "staged")
    tz = ctx.session_timezone
    key_arrow = schema_to_arrow(node.key_schema, tz)
    store_keys = variable_store_keys(key_arrow)

    versions = _variables_since(node, ctx.state_root, operator_id, batch_id)
    since = versions.since
    threshold = ctx.cache.get(
        node, f"evolution/{versions.encoding}", lambda: _evolution_threshold(child.sparkSession, versions.encoding)
    )
    if threshold is not None:  # Avro encoding
        _require_nullable(child.sparkSession, node.variables)

    def conf(name: str, value: StructType) -> StateStoreConf:
        return StateStoreConf(
            root=ctx.state_root,
            operator_id=operator_id,
            num_partitions=n,
            key_schema=store_keys,
            value_schema=schema_to_arrow(value, tz),
            snapshot_interval=ctx.snapshot_interval,
            background_snapshot_min_rows=ctx.background_snapshot_min_rows,
            min_versions_to_retain=ctx.min_versions_to_retain,
            store_name=name,
            checkpoint_id=ctx.checkpoint_id,
            first_version=since.get(name, 0),
            gap=tuple(versions.gaps[name]) if name in versions.gaps else None,  # type: ignore[arg-type]
            values_by_name=threshold is not None and name != TIMERS,
            signed_zero_keys=True,
        )

    stores = {v.name: conf(v.name, v.value_type()) for v in node.variables}
    stores[TIMERS] = conf(TIMERS, _TIMER_VALUE)
    input_schema = child.schema
    task = TwsTask(
        stores=stores,
        variables=node.variables,
        processor_bytes=cloudpickle.dumps(node.processor),
        pandas=node.pandas,
        time_mode=node.time_mode,
        key_columns=tuple(f"{_KEY_PREFIX}{i}" for i in range(len(node.grouping))),
        input_columns=tuple(input_schema.names),
        input_schema=input_schema,
        event_time_column=node.event_time_column,
        output_event_time=node.output_event_time,
        initial_columns=initial_columns,
        out_schema=schema_to_arrow(node.output_schema, tz),
        output_struct=node.output_schema,
        timezone=tz,
        accumulator=ctx.accumulator,
        operator_id=operator_id,
        deleted_variables=node.deleted_variables,
        key_schema=node.key_schema,
    )
    if node.pandas:
        records, size = ctx.cache.get(node, "chunk_limits", lambda: _chunk_limits(child.sparkSession))
        task = dataclasses.replace(task, max_records_per_chunk=records, max_bytes_per_chunk=size)
    params = node.batch_params(ctx, batch_id)
    result = map_with_state(
        staged, ctx, node, lambda: bind(run_tws_task, task), node.output_schema, operator_id, params, n,
        unique_names=False,  # the rows reach the user's function, as in Spark
    )
    # The operator's state schema: one column per state variable (and the timers).
    value_fields = [StructField(v.name, v.value_type(), True) for v in node.variables]
    value_fields.append(StructField(TIMERS, _TIMER_VALUE, True))
    value_schema = schema_to_arrow(StructType(value_fields), tz)
    return result, OperatorStateSchema(
        operator_id,
        node.operator_name,
        key_arrow,
        value_schema,
        n,
        variables_since=since,
        variables_removed=versions.removed,
        variables_gaps=versions.gaps,
        time_mode=node.time_mode,
        evolution_threshold=threshold,
        output_mode=node.output_mode,
        variables_deleted_in_init=tuple(
            (v.name, v.kind, v.ttl_ms is not None) for v in node.declared_then_deleted
        ) or None,
    )


@dataclass(frozen=True)
class _VariableVersions:
    since: dict[str, int]
    removed: dict[str, list[int]]
    gaps: dict[str, list[int]]
    encoding: str | None
    """The state's encoding recorded in the checkpoint (None: no state yet)."""


def _require_nullable(spark: Any, variables: tuple[StateVariable, ...] | list[StateVariable]) -> None:
    """Spark's refusal, under Avro encoding, of a state variable whose schema has a
    field that is not nullable (TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE)."""
    for variable in variables:
        for schema in (variable.key_schema, variable.schema):
            if schema is not None and not all(f.nullable for f in schema.fields):
                scala = str(spark._jsparkSession.parseDataType(schema.json()).toString())
                raise AnalysisError.spark(
                    "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE",
                    {"columnFamilyName": variable.name, "schema": scala},
                )


def _evolution_threshold(spark: Any, recorded: str | None) -> int | None:
    """How many times a state variable's value schema may evolve: Spark's
    ``valueStateSchemaEvolutionThreshold`` when the state is encoded as Avro (the
    checkpoint's encoding, or on a first run ``spark.sql.streaming.stateStore.encodingFormat``),
    else None: with Spark's default ``unsaferow`` a value schema may not change."""
    encoding = recorded or str(spark.conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow"))
    if encoding.strip().lower() != "avro":
        if encoding.strip().lower() != "unsaferow":
            raise OptionError(
                f"spark.sql.streaming.stateStore.encodingFormat={encoding!r} is not a state "
                "encoding: use 'unsaferow' (the default) or 'avro'."
            )
        return None
    key = "spark.sql.streaming.stateStore.valueStateSchemaEvolutionThreshold"
    return Options({key: spark.conf.get(key, "16")}, owner="SQL conf").get_int(key, 16, minimum=0)


def _variables_since(node: TransformWithState, state_root: str, operator_id: int, batch_id: int) -> _VariableVersions:
    """Per state variable, the version its store starts after: 0, or, for a variable
    the checkpoint's state schema file does not have (added on this restart), the
    version before this batch's; kept in the schema file for later restarts. A variable
    no longer declared is remembered with the last version it holds; declared again
    (Spark reads its earlier state back), its store reads that version through the
    versions it was not declared in (``StateStoreConf.gap``)."""

    fs, path = resolve_filesystem(f"{state_root.rstrip('/')}/{operator_id}/_metadata/schema")
    stored = read_schema_file(fs, path, operator_id)
    if stored is None:
        return _VariableVersions({}, {}, {}, None)
    known = set(stored_schema(stored, "value").names)
    previous = stored.get("stateVariablesSince") or {}
    removed = {k: list(v) for k, v in (stored.get("stateVariablesRemoved") or {}).items()}
    gaps = {k: list(v) for k, v in (stored.get("stateVariablesGaps") or {}).items()}
    declared = [v.name for v in node.variables] + [TIMERS]
    for name in known - set(declared):
        # removed now: its state as of this batch's version stays readable
        removed[name] = [int(previous.get(name) or 0), batch_id]
    for name in node.deleted_variables:
        if name in removed:
            removed[name][1] = -1  # deleted: declared again, it starts empty
    since = {}
    for name in declared:
        if name not in known:
            if name in removed:
                first, last = removed.pop(name)
                gaps.pop(name, None)
                if last < 0:
                    since[name] = batch_id
                else:
                    if first:
                        since[name] = first
                    gaps[name] = [last, batch_id]
                continue
            old = f"{state_root.rstrip('/')}/{operator_id}/0/{name}"
            ofs, opath = resolve_filesystem(old)
            if ofs.list_names(opath) if ofs.exists(opath) else []:
                raise NotSupportedYetError(
                    f"state variable {name!r} of transformWithState declared again after a run "
                    "without it, in a checkpoint written before lockgate kept the version "
                    "such a variable was removed at",
                    f"Give the variable a new name, or delete {old} in every partition.",
                )
            since[name] = batch_id
        elif previous.get(name):
            since[name] = int(previous[name])
    return _VariableVersions(since, removed, gaps, str(stored.get("encodingFormat") or "unsaferow"))


def _grouping_column(item: Any) -> Any:
    return F.col(item) if isinstance(item, str) else item


# -- inside a task ----------------------------------------------------------------------------
class _Timers:
    """The partition's timers: the ``$timers`` store (key -> sorted timestamps) and a
    min-heap of (timestamp, key) over it, kept with the store in the worker cache."""

    def __init__(self, store: Any) -> None:
        self.store = store
        if isinstance(store.aux, _TimerIndex):
            self.index = store.aux
        else:
            entries = [(ts, next(_SEQUENCE), key) for key, value in store.map.items() for ts in (value[0] or ())]
            self.index = _TimerIndex(entries)
            store.aux = self.index

    def list(self, key: Any) -> list[int]:
        value = self.store.get(key)
        return list(value[0] or ()) if value is not None else []

    def register(self, key: Any, ts: int) -> None:
        current = self.list(key)
        if ts not in current:
            current.append(ts)
            current.sort()
            self.store.put(key, [current])
            self.index.push(ts, key)

    def delete(self, key: Any, ts: int) -> None:
        current = self.list(key)
        if ts in current:
            current.remove(ts)
            if current:
                self.store.put(key, [current])
            else:
                self.store.remove(key)

    def expired(self, threshold: int) -> Iterator[tuple[int, Any]]:
        """Due timers (``ts <= threshold``, as Spark 4.3's), earliest first; each is still
        registered when it is handed out."""
        heap = self.index.heap
        while heap and heap[0][0] <= threshold:
            ts, _, key = heapq.heappop(heap)
            if ts in self.list(key):
                yield ts, key


class _TimerIndex:
    def __init__(self, entries: list[tuple[int, int, Any]]) -> None:
        heapq.heapify(entries)
        self.heap = entries

    def push(self, ts: int, key: Any) -> None:
        heapq.heappush(self.heap, (ts, next(_SEQUENCE), key))

    def catch_up(self, upserts: list[tuple[Any, Any]], removed: list[Any], previous: list[Any]) -> None:
        for key, value in upserts:  # stale entries are skipped when popped
            for ts in value[0] or ():
                self.push(ts, key)


_SEQUENCE = itertools.count()


def _plain(value: Any) -> tuple[Any, ...]:
    """A struct value of a list or map state as the user's tuple: a dict as put in this
    batch, or the store's ((field, value), ...) pairs as loaded."""
    if isinstance(value, dict):
        return tuple(value.values())
    return tuple(v for _, v in value)


def _struct(value: Any) -> Any:
    """A struct value of a list or map state as the store takes it back (a dict)."""
    return value if value is None or isinstance(value, dict) else dict(value)


class StateValueTypeError(LockgateError, TypeError):
    """A state variable written with a value its schema does not take (checked when it
    is written, before anything of the batch is committed)."""


def _as_dict(schema: StructType, value: Any, what: str) -> dict[str, Any]:
    """``value``, a tuple (or list, or ``Row``) of ``schema``'s fields, by field name;
    :class:`StateValueTypeError` when its arity or a field's type does not fit.

    Spark's own handle does not check: a value or map state's write of a wrong type is
    stored as null, a list state's fails in Arrow; either way the state is not what the
    processor meant, so lockgate fails the batch instead, naming the variable."""
    names, checks = _write_checks(schema)
    if type(value) is not tuple and (isinstance(value, dict) or not isinstance(value, (tuple, list))):
        raise StateValueTypeError(
            f"{what} takes {_expected(schema)}, got {value!r} ({type(value).__name__}). Pass "
            f"the values as a tuple, e.g. ({names[0] if names else ''},) for one field."
        )
    values = tuple(value)
    if len(values) != len(names):
        raise StateValueTypeError(
            f"{what} takes {_expected(schema)}, got {len(values)} value{'s' if len(values) != 1 else ''}: "
            f"{value!r}. Give one value per field of the schema, in its order ({', '.join(names)})."
        )
    for (f, fast, bounds), v in zip(checks, values):
        if v is None or (type(v) in fast and (bounds is None or bounds[0] <= v < bounds[1])):
            continue
        problem = _type_problem(f.dataType, v, f.name)
        if problem is not None:
            raise StateValueTypeError(
                f"{what} takes {_expected(schema)}, got {value!r}: {problem}. Convert the value "
                "to the declared type, or declare the state variable with the type it holds "
                "(a schema change the checkpoint refuses: use a new state variable name)."
            )
    return dict(zip(names, values))


def _expected(schema: StructType) -> str:
    n = len(schema.fields)
    return f"a tuple of {n} value{'s' if n != 1 else ''} of {schema.simpleString()}"


_CHECKS: dict[int, tuple[StructType, list[str], list[tuple[StructField, frozenset[type], tuple[int, int] | None]]]] = {}


def _write_checks(schema: StructType) -> tuple[list[str], list[tuple[StructField, frozenset[type], Any]]]:
    """``schema``'s field names, and per field the Python types that fit it without a
    closer look (with an integral type's range): built once per schema, as every state
    write checks its value."""
    cached = _CHECKS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1], cached[2]
    checks = []
    for f in schema.fields:
        t = f.dataType
        bounds = None
        if isinstance(t, IntegralType):
            fast: frozenset[type] = frozenset({int})
            bits = _INTEGRAL_BITS.get(t.simpleString(), 64)
            bounds = (-(2 ** (bits - 1)), 2 ** (bits - 1))
        elif isinstance(t, (FloatType, DoubleType)):
            fast = frozenset({float, int})
        elif isinstance(t, StringType):
            fast = frozenset({str})
        elif isinstance(t, BooleanType):
            fast = frozenset({bool})
        else:
            fast = frozenset()
        checks.append((f, fast, bounds))
    _CHECKS[id(schema)] = (schema, list(schema.names), checks)
    return list(schema.names), checks


_INTEGRAL_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}


def _type_problem(dtype: DataType, value: Any, path: str) -> str | None:
    """What in ``value`` (at ``path``) the type ``dtype`` does not take (None: all fits),
    as PySpark's ``createDataFrame(verifySchema=True)`` checks, also taking NumPy scalars
    (a pandas processor's values) and ints where floats are declared. Runs on every state
    write: the message is built only when the value does not fit."""
    if value is None:
        return None
    is_bool = isinstance(value, (bool, np.bool_))
    if isinstance(dtype, IntegralType):
        if is_bool or not isinstance(value, (int, np.integer)):
            return _misfit(dtype, value, path)
        bits = _INTEGRAL_BITS.get(dtype.simpleString(), 64)
        if not -(2 ** (bits - 1)) <= int(value) < 2 ** (bits - 1):
            return f"{path}={value!r} is out of the range of {dtype.simpleString()}"
        return None
    if isinstance(dtype, (FloatType, DoubleType)):
        fits = not is_bool and isinstance(value, (int, float, np.integer, np.floating))
    elif isinstance(dtype, BooleanType):
        fits = is_bool
    elif isinstance(dtype, StringType):
        fits = isinstance(value, str)
    elif isinstance(dtype, BinaryType):
        fits = isinstance(value, (bytes, bytearray, memoryview))
    elif isinstance(dtype, DecimalType):
        fits = not is_bool and isinstance(value, (decimal.Decimal, int, np.integer))
    elif isinstance(dtype, (TimestampType, TimestampNTZType)):
        fits = isinstance(value, (datetime.datetime, np.datetime64))
    elif isinstance(dtype, DateType):
        fits = isinstance(value, (datetime.date, np.datetime64))
    elif isinstance(dtype, ArrayType):
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple, np.ndarray)):
            return _misfit(dtype, value, path)
        for i, item in enumerate(value):
            problem = _type_problem(dtype.elementType, item, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    elif isinstance(dtype, MapType):
        if not isinstance(value, dict):
            return _misfit(dtype, value, path)
        for k, v in value.items():
            problem = _type_problem(dtype.keyType, k, f"{path} key") or _type_problem(
                dtype.valueType, v, f"{path}[{k!r}]"
            )
            if problem is not None:
                return problem
        return None
    elif isinstance(dtype, StructType):
        if isinstance(value, dict):
            items = [(f, value.get(f.name)) for f in dtype.fields]
        elif isinstance(value, (tuple, list)) and len(value) == len(dtype.fields):
            items = list(zip(dtype.fields, value))
        else:
            return _misfit(dtype, value, path)
        for f, v in items:
            problem = _type_problem(f.dataType, v, f"{path}.{f.name}")
            if problem is not None:
                return problem
        return None
    else:
        return None  # intervals, variants ...: left to Arrow
    return None if fits else _misfit(dtype, value, path)


def _misfit(dtype: DataType, value: Any, path: str) -> str:
    return f"{path}={value!r} ({type(value).__name__}) does not fit {dtype.simpleString()}"


class _Handle:
    """The ``StatefulProcessorHandle`` of a task: state variables and timers of the
    current grouping key (Spark's implicit key)."""

    def __init__(self, task: TwsTask, stores: dict[str, Any], timers: _Timers, metrics: dict[str, int]) -> None:
        self.task = task
        self.stores = stores
        self.timers = timers
        self.metrics = metrics
        self.key: Any = None
        self.handling_timers = False
        self.map_entries = _MapEntries(task)
        self.rows_updated = 0
        """Spark's ``numUpdatedStateRows`` of the task (:meth:`count_updated`)."""

    def count_updated(self, rows: int, *, restart: bool = False) -> None:
        """Count ``rows`` state rows written, as Spark's state variables count them in
        ``numUpdatedStateRows`` (the progress's ``numRowsUpdated``): one per
        ``ValueState.update`` and ``MapState.updateValue``, one per element a
        ``ListState`` puts or appends; removals and timers count none. ``restart``:
        Spark's ``ListState.put`` (without TTL) resets the task's count before counting
        its elements, so the writes before it in the same partition are not counted."""
        if restart:
            self.rows_updated = 0
        self.rows_updated += rows

    def _variable(self, name: str, kind: str) -> Any:
        variable = next((v for v in self.task.variables if v.name == name), None)
        if variable is None and name in self.task.deleted_variables:
            return _DeletedState(name, kind)  # declared, then deleted in init(): unusable
        if variable is None or variable.kind != kind:
            raise RuntimeError(
                f"State variable {name!r} ({kind}) was not declared when init() ran on the driver: "
                "init() must declare the same state variables every time it runs."
            )
        ttl = "WithTTL" if variable.ttl_ms is not None else ""
        self.metrics[f"num{kind.capitalize()}State{ttl}Vars"] += 1
        return variable

    def _state(self, name: str, kind: str, make: Callable[[Any, Any], Any]) -> Any:
        variable = self._variable(name, kind)
        return variable if isinstance(variable, _DeletedState) else make(self, variable)

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._state(stateName, "value", ValueState)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._state(stateName, "list", ListState)

    def getMapState(
        self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: int | None = None
    ) -> Any:
        return self._state(stateName, "map", MapState)

    def _check_timers(self, operation: str) -> None:
        if self.task.time_mode == "none":
            raise RuntimeError(
                f"[STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE] Failed to "
                f"perform stateful processor operation={operation} with invalid timeMode=NoTime"
            )
        if self.key is None:
            raise RuntimeError(f"{operation} needs a grouping key: call it while rows or timers are handled.")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers("register_timer")
        self.timers.register(self.key, int(expiryTimestampMs))
        self.metrics["numRegisteredTimers"] += 1

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers("delete_timer")
        self.timers.delete(self.key, int(expiryTimestampMs))
        self.metrics["numDeletedTimers"] += 1

    def listTimers(self) -> Iterator[int]:
        self._check_timers("list_timers")
        return iter(self.timers.list(self.key))

    def deleteIfExists(self, stateName: str) -> None:
        store = self.stores.get(stateName)
        if store is None:
            if stateName in self.task.deleted_variables:
                self.metrics["numDeletedStateVars"] += 1
            return
        for key in list(store.map):
            store.remove(key)
        self.map_entries.recount(stateName)
        self.metrics["numDeletedStateVars"] += 1


class _DeletedState:
    """A state variable ``init`` declared and then deleted (``deleteIfExists``), as the
    executor's ``init`` gets it again: every use fails as Spark's does ("Error checking
    value state exists: ..."), since its state is gone and the name not declared."""

    _VERBS: ClassVar[dict[str, str]] = {
        "exists": "checking {k} state exists",
        "get": "getting {k} state",
        "update": "updating {k} state",
        "clear": "clearing {k} state",
    }

    def __init__(self, name: str, kind: str) -> None:
        self._name, self._kind = name, kind

    def __getattr__(self, attr: str) -> Any:
        from pyspark.errors import PySparkRuntimeError

        if attr.startswith("__"):
            raise AttributeError(attr)

        def fail(*args: Any, **kwargs: Any) -> Any:
            verb = self._VERBS.get(attr, attr + " on {k} state").format(k=self._kind)
            raise PySparkRuntimeError(
                f"Error {verb}: state variable {self._name!r} was deleted in init() "
                "(deleteIfExists) and not declared again."
            )

        return fail


class _TTLIndex:
    """A TTL'd variable's keys by their earliest expiration (a min-heap kept with the
    store in the worker cache, as :class:`_TimerIndex`): the cleanup at the end of a
    batch visits the keys that have something expired, not every key. Stale entries
    (a key updated or cleared since) are checked against the store when popped."""

    def __init__(self, store: Any, kind: str) -> None:
        self.kind = kind
        self.heap: list[tuple[int, int, Any]] = []
        for key, value in store.map.items():
            self._push_value(key, value)
        heapq.heapify(self.heap)

    def _push_value(self, key: Any, value: Any) -> None:
        soonest = _soonest(self.kind, value)
        if soonest is not None:
            self.heap.append((soonest, next(_SEQUENCE), key))

    def push(self, key: Any, value: Any) -> None:
        soonest = _soonest(self.kind, value)
        if soonest is not None:
            heapq.heappush(self.heap, (soonest, next(_SEQUENCE), key))

    def catch_up(self, upserts: list[tuple[Any, Any]], removed: list[Any], previous: list[Any]) -> None:
        for key, value in upserts:
            self.push(key, value)


def _soonest(kind: str, value: Any) -> int | None:
    if value is None:
        return None
    if kind == "value":
        return value[-1]
    expirations = [e for e in (value[-1] or ()) if e is not None]
    return min(expirations) if expirations else None


def _expired(expiration: int | None, now: int) -> bool:
    """Spark's ``StateTTL.isExpired``: expired once the batch timestamp reaches it."""
    return expiration is not None and now >= expiration


class _StateVar:
    def __init__(self, handle: _Handle, variable: StateVariable) -> None:
        self._handle = handle
        self._variable = variable
        self._store = handle.stores[variable.name]
        self._ttl = variable.ttl_ms
        self._now = handle.task.batch_timestamp_ms or 0
        if self._ttl is not None and not isinstance(self._store.aux, _TTLIndex):
            self._store.aux = _TTLIndex(self._store, variable.kind)

    def _key(self) -> Any:
        key = self._handle.key
        if key is None:
            raise RuntimeError(
                f"State variable {self._variable.name!r} is read or written outside "
                "handleInputRows/handleExpiredTimer: there is no grouping key."
            )
        return key

    def _raw(self) -> Any:
        return self._store.get(self._key())

    def _write(self, value: list[Any]) -> None:
        key = self._key()
        self._store.put(key, value)
        if self._ttl is not None:
            self._store.aux.push(key, value)

    def _expiry(self) -> int:
        return self._now + (self._ttl or 0)

    def clear(self) -> None:
        if self._variable.kind == "map":
            self._handle.map_entries.change(self._variable.name, self._raw(), None)
        self._store.remove(self._key())


class ValueState(_StateVar):
    """pyspark's ``ValueState`` over lockgate's store (with TTL: the value's expiration
    in its last column; an expired value reads as none)."""

    def _get(self) -> Any:
        value = self._raw()
        if value is not None and self._ttl is not None:
            if _expired(value[-1], self._now):
                return None
            return value[:-1]
        return value

    def exists(self) -> bool:
        return self._get() is not None

    def get(self) -> tuple[Any, ...] | None:
        value = self._get()
        return _user_tuple(self._variable.schema, value) if value is not None else None

    def update(self, newValue: tuple[Any, ...]) -> None:
        schema = self._variable.schema
        value = _store_values(schema, tuple(_as_dict(schema, newValue, f"ValueState {self._variable.name!r}").values()))
        if self._ttl is not None:
            value.append(self._expiry())
            # with TTL, Spark writes (and counts) only a value or expiration that changed
            if not _same_stored(self._raw(), value):
                self._handle.count_updated(1)
        else:
            self._handle.count_updated(1)
        self._write(value)


class ListState(_StateVar):
    """pyspark's ``ListState`` over lockgate's store (with TTL: each element's
    expiration; expired elements read as gone and stay stored until the batch's cleanup,
    as Spark's)."""

    def _stored(self) -> tuple[list[Any], list[Any]]:
        value = self._raw()
        if value is None or value[0] is None:
            return [], []
        items = [_struct(v) for v in value[0]]
        return items, (list(value[1]) if self._ttl is not None else [None] * len(items))

    def _items(self) -> list[tuple[Any, ...]]:
        items, expirations = self._stored()
        schema = self._variable.schema
        return [_user_tuple(schema, _plain(v)) for v, e in zip(items, expirations) if not _expired(e, self._now)]

    def exists(self) -> bool:
        return bool(self._items())

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._items())

    def _rows(self, items: list[Any]) -> list[dict[str, Any]]:
        schema = self._variable.schema
        what = f"ListState {self._variable.name!r}"
        return [
            dict(zip(schema.names, _store_values(schema, tuple(_as_dict(schema, v, what).values()))))
            for v in items
        ]

    def _put(self, rows: list[Any], expirations: list[Any]) -> None:
        if not rows:
            self._store.remove(self._key())
        elif self._ttl is not None:
            self._write([rows, expirations])
        else:
            self._write([rows])

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        rows = self._rows(list(newState))
        self._handle.count_updated(len(rows), restart=self._ttl is None)
        self._put(rows, [self._expiry()] * len(rows))

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        self.appendList([newState])

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        items, expirations = self._stored()  # expired elements too: the cleanup counts them
        rows = self._rows(list(newState))
        self._handle.count_updated(len(rows))
        self._put([*items, *rows], [*expirations, *([self._expiry()] * len(rows))])


class MapState(_StateVar):
    """pyspark's ``MapState`` over lockgate's store (entries in insertion order; with
    TTL, each entry's expiration, reset when the entry is updated)."""

    def _stored(self) -> dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]]:
        """Entries by the user key's hashable store form, values in their store form."""
        value = self._raw()
        if value is None:
            return {}
        keys, values = value[0] or (), value[1] or ()
        expirations = (value[2] or ()) if self._ttl is not None else [None] * len(keys)
        return {signed_zero_key(hashable(_plain(k))): (_plain(v), e) for k, v, e in zip(keys, values, expirations)}

    def _entries(self) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        return {k: v for k, (v, e) in self._stored().items() if not _expired(e, self._now)}

    def _frozen(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        schema = self._variable.key_schema
        assert schema is not None
        values = tuple(_as_dict(schema, key, f"MapState {self._variable.name!r} key").values())
        # Spark keys the entries by the user key's bytes, where -0.0 is not 0.0
        return signed_zero_key(hashable(tuple(_store_values(schema, values))))  # type: ignore[no-any-return]

    def _user_key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._variable.key_schema is not None
        return _user_tuple(self._variable.key_schema, unsigned_zero_key(key))

    def _put(self, entries: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]]) -> None:
        self._handle.map_entries.change(self._variable.name, self._raw(), entries)
        if not entries:
            self._store.remove(self._key())
            return
        assert self._variable.key_schema is not None
        key_names, value_names = self._variable.key_schema.names, self._variable.schema.names
        keys = [dict(zip(key_names, k)) for k in entries]
        values = [dict(zip(value_names, v)) for v, _ in entries.values()]
        if self._ttl is not None:
            self._write([keys, values, [e for _, e in entries.values()]])
        else:
            self._write([keys, values])

    def exists(self) -> bool:
        return bool(self._entries())

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        # a Row, as PySpark's map state client gives it (iterator() and values() give tuples)
        value = self._entries().get(self._frozen(key))
        schema = self._variable.schema
        return None if value is None else _user_form(schema, dict(zip(schema.names, value)))

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        return self._frozen(key) in self._entries()

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        schema = self._variable.schema
        stored = tuple(_store_values(schema, tuple(_as_dict(schema, value, f"MapState {self._variable.name!r} value").values())))
        entries = self._stored()
        frozen = self._frozen(key)
        entry = (stored, self._expiry() if self._ttl is not None else None)
        # with TTL, Spark writes (and counts) only an entry or expiration that changed
        if self._ttl is None or not _same_stored(entries.get(frozen), entry):
            self._handle.count_updated(1)
        entries[frozen] = entry
        self._put(entries)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        schema = self._variable.schema
        return iter([(self._user_key(k), _user_tuple(schema, v)) for k, v in self._entries().items()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter([self._user_key(k) for k in self._entries()])

    def values(self) -> Iterator[tuple[Any, ...]]:
        schema = self._variable.schema
        return iter([_user_tuple(schema, v) for v in self._entries().values()])

    def removeKey(self, key: tuple[Any, ...]) -> None:
        entries = self._stored()
        if entries.pop(self._frozen(key), None) is not None:
            self._put(entries)


def _same_stored(before: Any, after: Any) -> bool:
    """Whether a stored value (a value state's columns, a map entry's value and
    expiration) equals the one about to be written."""
    return before is not None and hashable(before) == hashable(after)


def _clean_expired(store: Any, variable: StateVariable, now: int) -> int:
    """Spark's ``clearExpiredStateForAllKeys`` for one TTL'd variable: removes what has
    expired by the batch timestamp (a value, list elements, map entries) from every key
    that has some; the count of values removed."""
    index = store.aux if isinstance(store.aux, _TTLIndex) else _TTLIndex(store, variable.kind)
    store.aux = index
    removed = 0
    heap = index.heap
    while heap and heap[0][0] <= now:
        _, _, key = heapq.heappop(heap)
        value = store.get(key)
        if value is None or not _expired(_soonest(variable.kind, value), now):
            continue  # stale: cleared, or updated since
        if variable.kind == "value":
            store.remove(key)
            removed += 1
            continue
        keep = [i for i, e in enumerate(value[-1]) if not _expired(e, now)]
        removed += len(value[-1]) - len(keep)
        if not keep:
            store.remove(key)
            continue
        kept = [[_struct(column[i]) for i in keep] for column in value[:-1]]
        kept.append([value[-1][i] for i in keep])
        store.put(key, kept)
        index.push(key, kept)
    return removed


@dataclass
class _Converter:
    """Rows of the batch to what the processor takes, and its results back to Arrow, as
    PySpark's serializers convert them (timestamps naive in the session time zone)."""

    task: TwsTask
    timestamp_columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.timestamp_columns = [
            f.name for f in self.task.input_schema.fields if isinstance(f.dataType, TimestampType)
        ]
        self.out_timestamps = [
            f.name for f in self.task.output_struct.fields if isinstance(f.dataType, TimestampType)
        ]

    def key(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """A key (the store's form: a struct as (field, value) pairs) as PySpark's worker
        hands it: a struct as a dict, at any depth; -0.0 as the float it is."""
        schema = self.task.key_schema
        if schema is None:
            return tuple(self._user_value(v) for v in values)
        return tuple(self._key_value(f.dataType, v) for f, v in zip(schema.fields, values))

    def _key_value(self, dtype: DataType, value: Any) -> Any:
        if isinstance(dtype, StructType) and isinstance(value, tuple):
            items = dict(value)
            return {f.name: self._key_value(f.dataType, items.get(f.name)) for f in dtype.fields}
        return self._user_value(value)

    def _user_value(self, value: Any) -> Any:
        import datetime as dt

        if isinstance(value, float):
            return unsigned_zero_key(value)  # the store's -0.0 key (NEGATIVE_ZERO)

        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            from zoneinfo import ZoneInfo

            return value.astimezone(ZoneInfo(self.task.timezone)).replace(tzinfo=None)
        return value

    def rows(self, table: pa.Table) -> Any:
        if self.task.pandas:
            pdf = table.to_pandas(coerce_temporal_nanoseconds=True)
            for name in self.timestamp_columns:
                series = pdf[name]
                if getattr(series.dt, "tz", None) is not None:
                    pdf[name] = series.dt.tz_convert(self.task.timezone).dt.tz_localize(None)
            return pdf
        from pyspark.sql import Row

        names = table.column_names
        return [Row(**{n: self._user_value(r[n]) for n in names}) for r in table.to_pylist()]

    def collect(self, results: Any, where: str, into: list[Any]) -> None:
        """Consume the processor's output for the current key (an iterator of pandas
        DataFrames or Rows: consumed now, while the handle's key is this key), checked
        against the output schema, into ``into``; :meth:`batches` converts it."""
        if results is None:
            return
        names = self.task.out_schema.names
        if self.task.pandas:
            import pandas as pd

            for pdf in results:
                if not isinstance(pdf, pd.DataFrame):
                    raise TypeError(
                        f"{where} must yield pandas DataFrames (transformWithStateInPandas), got "
                        f"{type(pdf).__name__}"
                    )
                if len(pdf) == 0 and len(pdf.columns) == 0:
                    continue
                missing = [n for n in names if n not in pdf.columns]
                if missing:
                    raise ValueError(
                        f"[RESULT_COLUMNS_MISSING_IN_FUNCTION_OUTPUT] {where} returned columns "
                        f"{list(pdf.columns)}, which lack {missing} of the output schema "
                        f"{self.task.output_struct.simpleString()}."
                    )
                into.append(pdf[names])
            return
        for row in results:
            if hasattr(row, "asDict") and getattr(row, "__fields__", None):
                d = row.asDict()
                missing = [n for n in names if n not in d]
                if missing:
                    raise ValueError(
                        f"[RESULT_COLUMNS_MISSING_IN_FUNCTION_OUTPUT] {where} yielded {row!r}, "
                        f"which lacks {missing} of the output schema."
                    )
                values = [d[n] for n in names]
            else:
                values = list(row)
                if len(values) != len(names):
                    raise ValueError(
                        f"{where} yielded {row!r} with {len(values)} values; the output schema "
                        f"has {len(names)} ({', '.join(names)})."
                    )
            into.append(dict(zip(names, values)))

    def batches(self, collected: list[Any]) -> Iterator[pa.RecordBatch]:
        """What :meth:`collect` gathered (over many keys) as batches of the output
        schema: one conversion for all of it, where a conversion per key cost more
        than the processor. DataFrames whose column types differ are converted one by
        one (concatenating them could widen an integer column to floats)."""
        if not collected:
            return
        schema = self.task.out_schema
        if not self.task.pandas:
            yield from pa.Table.from_pylist(collected, schema=schema).to_batches()
            return
        import pandas as pd

        first = tuple(collected[0].dtypes)
        if len(collected) > 1 and all(tuple(pdf.dtypes) == first for pdf in collected):
            frames = [pd.concat(collected, ignore_index=True)]
        else:
            frames = collected
        for pdf in frames:
            pdf = pdf.copy()
            for name in self.out_timestamps:
                series = pd.to_datetime(pdf[name])
                if getattr(series.dt, "tz", None) is None:
                    series = series.dt.tz_localize(self.task.timezone)
                pdf[name] = series
            yield from pa.Table.from_pandas(pdf, schema=schema, preserve_index=False).to_batches()


_OUTPUT_CHUNK = 2048
"""Keys' outputs converted to Arrow at once (:meth:`_Converter.batches`)."""


def _checked(task: TwsTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The output, refused where a row's ``eventTimeColumnName`` is at or below the
    watermark for late rows (Spark's ``UpdateEventTimeColumnExec``)."""
    column, watermark = task.output_event_time, task.late_watermark_ms
    if column is None or watermark is None:
        yield from batches
        return
    import pyarrow.compute as pc

    for batch in batches:
        times = micros_array(batch.column(column))
        late = pc.fill_null(pc.less_equal(times, watermark * 1000), False)
        if pc.any(late).as_py():
            first = pc.min(pc.filter(times, late)).as_py()
            raise RuntimeError(
                "[EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED] Previous node emitted a row with "
                f"eventTime={first} which is older than current_watermark_value={watermark * 1000}. "
                "This can lead to correctness issues in the stateful operators downstream in the "
                "execution pipeline. Please correct the operator logic to emit rows after current "
                "global watermark value."
            )
        yield batch


_MAP_ENTRIES: OrderedDict[tuple[Any, ...], tuple[int, int]] = OrderedDict()
"""A worker's count of a map state's entries per (store, partition): ``(version, count)``
after the version's commit, so the next batch's count follows its changes."""
_MAP_ENTRIES_LIMIT = 1024


class _MapEntries:
    """Spark's ``numRowsTotal`` of a transformWithState: the rows of its store's column
    families, one per grouping key of a value or list state (a list is one merged value)
    and one per entry of a map state, keyed there by the grouping and the user key;
    timers, in Spark's internal column families, are not counted.

    lockgate holds a grouping key's map entries in one row, so their number is not the
    store's length: it is counted from the store once per worker and partition, then
    followed batch by batch through the changes the task makes (an update, a removal, a
    cleared key, the TTL cleanup), so that a batch costs what it changed, not the size of
    the state. A version the worker did not count last (another worker ran the batch
    before) is counted again."""

    def __init__(self, task: TwsTask) -> None:
        self.task = task
        self.delta: dict[str, int] = {}
        self.recounted: set[str] = set()

    def change(self, name: str, before: Any, after: Any) -> None:
        """A grouping key's entries went from the stored row ``before`` (None: none) to
        the entries ``after`` (None: none)."""
        old = len(before[0] or ()) if before is not None else 0
        new = len(after) if after else 0
        self.delta[name] = self.delta.get(name, 0) + new - old

    def removed(self, name: str, entries: int) -> None:
        self.delta[name] = self.delta.get(name, 0) - entries

    def recount(self, name: str) -> None:
        self.recounted.add(name)

    def rows_total(self, stores: dict[str, Any], partition: int) -> int:
        maps = {v.name for v in self.task.variables if v.kind == "map"}
        total = 0
        for name, store in stores.items():
            if name == TIMERS:
                continue
            if name not in maps:
                total += len(store)
                continue
            conf = store.conf
            key = (conf.checkpoint_id, conf.root, conf.operator_id, partition, name)
            counted = _MAP_ENTRIES.pop(key, None)
            if counted is not None and counted[0] == self.task.version - 1 and name not in self.recounted:
                entries = counted[1] + self.delta.get(name, 0)
            else:
                entries = sum(len(value[0] or ()) for _, value in store.items())
            _MAP_ENTRIES[key] = (self.task.version, entries)
            while len(_MAP_ENTRIES) > _MAP_ENTRIES_LIMIT:
                _MAP_ENTRIES.popitem(last=False)
            total += entries
        return total


def run_tws_task(task: TwsTask, partition: int, batches: Any) -> Any:
    """The state step of one partition (runs on an executor): the processor over the
    batch's keys, then its due timers; every store committed at the end."""
    from pyspark import cloudpickle
    from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

    task = with_batch_params(task, next(iter(task.stores.values())).checkpoint_id)
    started = time.perf_counter()
    stores = {name: StateStore(conf, partition, task.version - 1) for name, conf in task.stores.items()}
    timers = _Timers(stores[TIMERS])
    metrics: dict[str, int] = dict.fromkeys(
        (
            "numValueStateVars", "numListStateVars", "numMapStateVars", "numDeletedStateVars",
            "numRegisteredTimers", "numDeletedTimers", "numExpiredTimers", "numValueStateWithTTLVars",
            "numListStateWithTTLVars", "numMapStateWithTTLVars", "numValuesRemovedDueToTTLExpiry",
        ),
        0,
    )
    processor = cloudpickle.loads(task.processor_bytes)
    handle = _Handle(task, stores, timers, metrics)
    convert = _Converter(task)
    timed = task.time_mode != "none"
    processing_ms = task.batch_timestamp_ms if timed and task.batch_timestamp_ms is not None else -1
    watermark_ms = task.watermark_ms if timed and task.watermark_ms is not None else -1
    if task.time_mode == "eventTime" and task.watermark_ms is None:
        watermark_ms = -1
    timer_values = TimerValues(processing_ms, watermark_ms)

    processor.init(handle)
    collected: list[Any] = []  # the processor's output, converted a chunk of keys at a time
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    dropped = 0
    # the UDF is made on a run's first batch: only batch 0's rows hold the initial state
    if tables and task.initial_columns and _INIT_MARK in tables[0].column_names:
        import pyarrow.compute as pc

        both = pa.concat_tables(tables)
        marks = pc.fill_null(both.column(_INIT_MARK), False)
        initial = both.filter(marks)
        tables = [both.filter(pc.invert(marks))] if initial.num_rows < both.num_rows else []
        keys = list(zip(*[column_values(initial.column(k)) for k in task.key_columns]))
        groups: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        init_data = initial.select([f"{_INIT_PREFIX}{c}" for c in task.initial_columns]).rename_columns(
            list(task.initial_columns)
        )
        size = _chunk_rows(task, initial)
        for key, indices in groups.items():
            handle.key = signed_zero_key(key)
            if task.pandas:
                for chunk in _chunks(indices, size):
                    processor.handleInitialState(convert.key(key), convert.rows(init_data.take(chunk)), timer_values)
                continue
            for state in convert.rows(init_data.take(pa.array(indices, type=pa.int64()))):
                processor.handleInitialState(convert.key(key), state, timer_values)
    if tables:
        table = pa.concat_tables(tables)
        if task.time_mode == "eventTime" and task.late_watermark_ms is not None and task.event_time_column is not None and task.event_time_column in table.column_names:
            import pyarrow.compute as pc

            times = micros_array(table.column(task.event_time_column))
            late = pc.fill_null(pc.less_equal(times, task.late_watermark_ms * 1000), False)
            dropped = int(pc.sum(late).as_py() or 0)
            table = table.filter(pc.invert(late))
        keys = list(zip(*[column_values(table.column(k)) for k in task.key_columns]))
        data = table.select(list(task.input_columns))
        size = _chunk_rows(task, table)
        groups = _input_groups(table, task.key_columns, keys, task.pandas, size)
        for key, state_key, indices in groups:
            # Spark keys the state by the key's bytes, where -0.0 is not 0.0
            handle.key = state_key
            user_key = convert.key(key)
            if task.pandas:
                rows = (convert.rows(data.take(chunk)) for chunk in _chunks(indices, size))
            else:
                rows = iter(convert.rows(data.take(pa.array(indices, type=pa.int64()))))
            results = processor.handleInputRows(user_key, rows, timer_values)
            convert.collect(results, "handleInputRows", collected)
            if len(collected) >= _OUTPUT_CHUNK:
                yield from _checked(task, convert.batches(collected))
                collected = []
    yield from _checked(task, convert.batches(collected))
    collected = []
    t1 = time.perf_counter()
    if timed:
        threshold = processing_ms if task.time_mode == "processingTime" else watermark_ms
        for ts, key in timers.expired(threshold):
            handle.key = key
            metrics["numExpiredTimers"] += 1
            results = processor.handleExpiredTimer(
                key=convert.key(key), timerValues=timer_values, expiredTimerInfo=ExpiredTimerInfo(ts)
            )
            convert.collect(results, "handleExpiredTimer", collected)
            timers.delete(key, ts)
            if len(collected) >= _OUTPUT_CHUNK:
                yield from _checked(task, convert.batches(collected))
                collected = []
        yield from _checked(task, convert.batches(collected))
    handle.key = None
    processor.close()
    # Spark's doTtlCleanup, before the commit: what expired by the batch timestamp goes.
    for variable in task.variables:
        if variable.ttl_ms is not None and task.batch_timestamp_ms is not None:
            expired = _clean_expired(stores[variable.name], variable, task.batch_timestamp_ms)
            metrics["numValuesRemovedDueToTTLExpiry"] += expired
            if variable.kind == "map":
                handle.map_entries.removed(variable.name, expired)
    remove_ms = (time.perf_counter() - t1) * 1000
    removed = sum(len(s.removed) for s in stores.values())
    commit_ms = 0.0
    for store in stores.values():
        store.commit()
        commit_ms += store.metrics.commit_ms
    op = task.operator_id
    first = stores[TIMERS]
    values = {
        "numRowsTotal": handle.map_entries.rows_total(stores, partition),
        "numRowsUpdated": handle.rows_updated,
        "numRowsRemoved": removed,
        "numRowsDroppedByWatermark": dropped,
        "allUpdatesTimeMs": int((t1 - started) * 1000),
        "allRemovalsTimeMs": int(remove_ms),
        "commitTimeMs": int(commit_ms),
        "memoryUsedBytes": sum(s.memory_bytes() for s in stores.values()),
        "numStateStoreInstances": 1,
        "loadedFromCache": int(first.metrics.loaded_from_cache),
        "loadedFromFiles": int(not first.metrics.loaded_from_cache),
        "stateFilesReplayed": sum(s.metrics.files_replayed for s in stores.values()),
        "snapshotsWritten": int(any(s.metrics.snapshot_written for s in stores.values())),
        **metrics,
    }
    task.accumulator.add({f"{op}.{name}": value for name, value in values.items()})


__all__ = ["TransformWithState", "make_transform_with_state"]
