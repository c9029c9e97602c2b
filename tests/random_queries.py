"""A seeded random differential fuzzer of streaming queries (the tests' helper, not a test
module; tests/plan/test_random_queries.py runs it).

From a seed, :func:`scenario` makes input data (a schema of varied column types and 3 to
5 steps of rows, one JSON or parquet file per source directory a step, event times that
move forward with some late rows) and a query over ``readStream`` of those files: random
projections and filters, an optional watermark, then zero, one or two stateful operators
(aggregations, windows, session windows, deduplications, stream-stream and stream-static
joins, unions) in an output mode, now and then one Spark refuses. The query is Python
source text (``Scenario.code``), run on both engines with ``exec``, so a failure shows
the query as PySpark code.

Seeds from ``V2_FROM`` (300) draw from more (older seeds keep their queries): string,
date, cast, JSON and array functions, rows exploded from arrays, ``selectExpr``, more
aggregate functions (count_if, bit_or, try_sum, sort_array of collect_list, every...),
``limit``, the query's rest in SQL over a temporary view (``ls.sql``), stream-static joins
with the static side aggregated or on the left, and ``availableNow`` runs (a run a step).

Seeds from ``V3_FROM`` (600) draw from more again (older seeds still keep their queries:
every draw of the third generation is behind ``Generator.v3``): ``applyInPandasWithState``
(no timeout, or event-time timeouts set from the event times and the watermark, append and
update modes), ``transformWithStateInPandas`` with value, list and map states and
event-time timers (native runs it with the RocksDB provider), ``dropDuplicates`` of a
subset with the event time under a watermark, complete mode sorted by ``orderBy`` (with a
``limit`` after it now and then), unions and joins of two sources each with its own
watermark under ``spark.sql.streaming.multipleWatermarkPolicy`` ``min`` or ``max``, and the
parquet file sink in append mode (its directory read back after each step, all the rows
compared) instead of ``foreachBatch``.

:func:`run_scenarios` runs scenarios side by side on native Spark (the oracle) and on
lockgate, step by step (write the step's files, ``processAllAvailable``), restarting some
from their checkpoints, and compares each batch's rows (floats with a tolerance, arrays
sorted: differential.canon), the batch ids, ``numInputRows``, the watermark and the state
operators' metrics. A query native Spark refuses when it starts, or fails while it runs,
must be refused or failed by lockgate too (with the same error condition when both have
one).

Differences the engines may show rightly are kept out by construction, not by looser
comparisons: no nondeterministic functions, no order-dependent ``first``/``last``
(``max_by``/``min_by`` by an event time unique in the data instead), doubles that are
multiples of 1/4 of moderate size (their sums are exact in any order), ``try_`` forms where
ANSI mode would fail on some rows only, and one file per source directory a step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import textwrap
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from differential import _publish, canon, same_rows

BASE = datetime(2024, 1, 1)
V2_FROM = 300  # seeds from here on draw from more shapes and functions (Generator.v2)
V3_FROM = 600  # and from here on from more again (Generator.v3)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# How the scenarios ended ("ran", "both refuse <condition>", "both fail <condition>"):
# tells whether the generator makes queries that run.
STATS: Counter[str] = Counter()

# -- input data ------------------------------------------------------------------------------
KINDS = [
    "long",
    "int",
    "double",
    "string",
    "decimal",
    "bool",
    "timestamp",
    "ntz",
    "date",
    "array",
    "struct",
]
STRINGS = ["a", "b", "Ab c", "ß", "日本語", "", "😀x", "z" * 300, "a-b_c", " pad "]
KEYS = ["a", "b", "c", "ü", None]


@dataclass
class Column:
    name: str
    kind: str
    precision: int = 10
    scale: int = 2

    @property
    def sql(self) -> str:
        return {
            "long": "LONG",
            "int": "INT",
            "double": "DOUBLE",
            "string": "STRING",
            "decimal": f"DECIMAL({self.precision},{self.scale})",
            "bool": "BOOLEAN",
            "timestamp": "TIMESTAMP",
            "ntz": "TIMESTAMP_NTZ",
            "date": "DATE",
            "array": "ARRAY<INT>",
            "struct": "STRUCT<a: INT, b: STRING>",
        }[self.kind]


def _value(rng: random.Random, col: Column) -> Any:
    """A random value of ``col`` in the JSON form (parquet converts it: _arrow_value)."""
    if rng.random() < 0.12:
        return None
    kind = col.kind
    if kind == "long":
        return rng.choice(
            [0, 1, -1, rng.randint(-100, 100), rng.randint(-100, 100), 2**40 + rng.randint(0, 9)]
        )
    if kind == "int":
        return rng.randint(-50, 50)
    if kind == "double":
        return rng.choice(
            [
                rng.randint(-400, 400) / 4,
                rng.randint(-400, 400) / 4,
                rng.randint(0, 8) / 4,
                math.nan,
                -0.0,
                0.0,
            ]
        )
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "decimal":
        digits = col.precision - col.scale
        unscaled = rng.randint(
            -(10 ** min(digits + col.scale, 9)) + 1, 10 ** min(digits + col.scale, 9) - 1
        )
        return str(Decimal(unscaled).scaleb(-col.scale))
    if kind == "bool":
        return rng.random() < 0.5
    if kind in ("timestamp", "ntz"):
        return (
            BASE + timedelta(seconds=rng.randint(-50, 200), milliseconds=rng.randint(0, 999))
        ).isoformat()
    if kind == "date":
        return (BASE.date() + timedelta(days=rng.randint(-40, 400))).isoformat()
    if kind == "array":
        return [rng.choice([1, 2, 3, None, -4]) for _ in range(rng.randint(0, 3))]
    if kind == "struct":
        return {"a": rng.choice([1, 2, None]), "b": rng.choice(["x", "y", None])}
    raise ValueError(kind)


def _arrow_type(col: Column) -> Any:
    import pyarrow as pa

    return {
        "long": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "string": pa.string(),
        "decimal": pa.decimal128(col.precision, col.scale),
        "bool": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "ntz": pa.timestamp("us"),
        "date": pa.date32(),
        "array": pa.list_(pa.int32()),
        "struct": pa.struct([("a", pa.int32()), ("b", pa.string())]),
    }[col.kind]


def _arrow_value(col: Column, value: Any) -> Any:
    if value is None:
        return None
    if col.kind == "decimal":
        return Decimal(value)
    if col.kind == "timestamp":
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    if col.kind == "ntz":
        return datetime.fromisoformat(value)
    if col.kind == "date":
        from datetime import date

        return date.fromisoformat(value)
    return value


@dataclass
class Source:
    """One input directory: its columns (the event time and key first) and rows a step."""

    name: str
    columns: list[Column]
    steps: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def schema(self) -> str:
        return ", ".join(f"{c.name} {c.sql}" for c in self.columns)

    def write(self, root: Path, step: int, fmt: str) -> None:
        rows = self.steps[step]
        if not rows:
            return
        directory = root / self.name
        if fmt == "json":
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            _publish(directory, ".json", lambda p: p.write_text(text, encoding="utf-8"))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pa.schema([(c.name, _arrow_type(c)) for c in self.columns])
            table = pa.Table.from_pylist(
                [{c.name: _arrow_value(c, r.get(c.name)) for c in self.columns} for r in rows],
                schema=schema,
            )
            _publish(directory, ".parquet", lambda p: pq.write_table(table, str(p)))


def _event_rows(
    rng: random.Random,
    source: Source,
    n_steps: int,
    used: set[int],
    time_col: str,
    some_key: bool = False,
) -> None:
    """Rows of every step: event times move forward 15 s a step, some rows late; each
    event time is unique in the scenario (so max_by/min_by by it are deterministic).
    ``some_key``: no file has only null keys (parquet: Spark skips such a row group by
    the ``isnotnull(key)`` it infers for a join and counts none of its rows in
    numInputRows, which lockgate does not do; reported, not this module's to change)."""
    for step in range(n_steps):
        rows = []
        for _ in range(rng.randint(2, 7) if rng.random() < 0.9 or not step else 0):
            base_ms = step * 15_000
            ms = (
                base_ms - rng.randint(3_000, 30_000)
                if rng.random() < 0.2
                else base_ms + rng.randint(0, 15_000)
            )
            while ms in used:
                ms += 1
            used.add(ms)
            row: dict[str, Any] = {time_col: (BASE + timedelta(milliseconds=ms)).isoformat()}
            for col in source.columns[1:]:
                row[col.name] = rng.choice(KEYS) if col.name.endswith("k") else _value(rng, col)
            rows.append(row)
        if some_key and rows and all(r[source.columns[1].name] is None for r in rows):
            rows[0][source.columns[1].name] = "a"
        source.steps.append(rows)


# -- expressions -------------------------------------------------------------------------
NUMERIC = ("long", "int", "decimal", "double")


class Exprs:
    """Random typed column expressions (PySpark source text) over the columns in scope."""

    def __init__(self, rng: random.Random, columns: dict[str, str], v2: bool = False) -> None:
        self.rng = rng
        self.columns = columns  # name -> kind
        self.v2 = v2  # seeds from V2_FROM: more functions (older seeds keep their queries)

    def col(self, *kinds: str) -> str | None:
        names = [n for n, k in self.columns.items() if k in kinds]
        return f'F.col("{self.rng.choice(names)}")' if names else None

    def expr(self, kind: str, depth: int = 2) -> str:
        """An expression of ``kind`` (long, double, string, bool, date, timestamp, decimal)."""
        rng = self.rng
        direct = self.col(*({"long": ("long", "int")}.get(kind, (kind,))))
        if depth <= 0 or (direct is not None and rng.random() < 0.3):
            return direct if direct is not None else self.literal(kind)
        d = depth - 1
        options = getattr(self, f"_{kind}")(d)
        if self.v2:
            options = options + getattr(self, f"_{kind}_v2")(d)
        return rng.choice([o for o in options if o is not None])

    def literal(self, kind: str) -> str:
        rng = self.rng
        return {
            "long": f"F.lit({rng.randint(-5, 5)})",
            "double": f"F.lit({rng.randint(-8, 8) / 4})",
            "string": f"F.lit({rng.choice(['x', 'ß', ''])!r})",
            "bool": f"F.lit({rng.choice([True, False])})",
            "date": 'F.lit("2024-01-02").cast("date")',
            "timestamp": 'F.lit("2024-01-01 00:00:30").cast("timestamp")',
            "decimal": 'F.lit("1.50").cast("decimal(4,2)")',
        }[kind]

    def _long(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        s, dt, ts = self.col("string"), self.col("date"), self.col("timestamp", "ntz")
        arr = self.col("array")
        dbl = self.col("double")
        return [
            f"({e('long', d)} + {rng.randint(-3, 3)})",
            f"({e('long', d)} * 2)",
            f"F.abs({e('long', d)})",
            f"({e('long', d)} % {rng.randint(2, 7)})",
            f"F.coalesce({e('long', d)}, F.lit(0))",
            f"F.when({e('bool', d)}, {e('long', d)}).otherwise({e('long', d)})",
            f"F.length({s})" if s else None,
            f"F.year({dt})" if dt else None,
            f"F.dayofmonth({dt})" if dt else None,
            f"F.hour({ts})" if ts else None,
            f"F.second({ts})" if ts else None,
            f"F.size({arr})" if arr else None,
            f'{dbl}.try_cast("long")' if dbl else None,
            f'F.col("{self._struct_name()}.a")' if self.col("struct") else None,
            f"F.greatest({e('long', d)}, {e('long', d)})",
        ]

    def _struct_name(self) -> str:
        return self.rng.choice([n for n, k in self.columns.items() if k == "struct"])

    def _double(self, d: int) -> list[str | None]:
        e = self.expr
        return [
            f"({e('double', d)} * 0.5)",
            f"({e('double', d)} + {e('double', d)})",
            f"F.try_divide({e('double', d)}, {e('double', d)})",
            f"F.sqrt(F.abs({e('double', d)}))",
            f"F.round({e('double', d)}, 1)",
            f'{e("long", d)}.cast("double")',
            f"F.nanvl({e('double', d)}, F.lit(-1.0))",
            f"F.when({e('bool', d)}, {e('double', d)})",
            f"F.greatest({e('double', d)}, {e('double', d)})",
            f"F.negative({e('double', d)})",
        ]

    def _decimal(self, d: int) -> list[str | None]:
        e = self.expr
        return [
            f"({e('decimal', d)} + 1)",
            f"F.round({e('decimal', d)}, 1)",
            f'{e("long", d)}.cast("decimal(12,1)")',
            f"F.coalesce({e('decimal', d)}, F.lit(0))",
        ]

    def _string(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        ts, dec, dt = self.col("timestamp", "ntz"), self.col("decimal"), self.col("date")
        return [
            f"F.upper({e('string', d)})",
            f"F.lower({e('string', d)})",
            f"F.concat({e('string', d)}, F.lit('-'), {e('string', d)})",
            f"F.concat_ws('|', {e('string', d)}, {e('string', d)})",
            f"F.substring({e('string', d)}, {rng.randint(1, 3)}, {rng.randint(1, 4)})",
            f"F.coalesce({e('string', d)}, F.lit('∅'))",
            f'{e("long", d)}.cast("string")',
            f'{e("double", d)}.cast("string")',
            f'{dec}.cast("string")' if dec else None,
            f"F.date_format({ts}, 'yyyy-MM-dd HH:mm')" if ts else None,
            f'{dt}.cast("string")' if dt else None,
            f"F.trim({e('string', d)})",
            f"F.reverse({e('string', d)})",
            f"F.lpad({e('string', d)}, 4, '*')",
            f"F.regexp_replace({e('string', d)}, '[aeiou]', '_')",
            f"F.initcap({e('string', d)})",
            f"F.when({e('bool', d)}, {e('string', d)}).otherwise(F.lit('no'))",
        ]

    def _bool(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        dbl, s = self.col("double"), self.col("string")
        cmp = rng.choice([">", "<", ">=", "==", "!="])
        num = rng.choice(
            ["long", "double", "decimal"] if self.col("decimal") else ["long", "double"]
        )
        return [
            f"({e(num, d)} {cmp} {e(num, d)})",
            f"F.isnan({dbl})" if dbl else None,
            f"{e('string', d)}.isNull()",
            f"{e('long', d)}.isNotNull()",
            f"{s}.startswith('a')" if s else None,
            f"{s}.contains('b')" if s else None,
            f"(~{e('bool', d)})",
            f"({e('bool', d)} & {e('bool', d)})",
            f"({e('bool', d)} | {e('bool', d)})",
            'F.col("k").isin("a", "ü")',
            f"({e('timestamp', d)} > {self.literal('timestamp')})",
            f"({e('date', d)} <= {self.literal('date')})",
        ]

    def _date(self, d: int) -> list[str | None]:
        e = self.expr
        return [
            f"F.to_date({e('timestamp', d)})",
            f"F.date_add({e('date', d)}, {self.rng.randint(-3, 40)})",
            f"F.last_day({e('date', d)})",
        ]

    def _timestamp(self, d: int) -> list[str | None]:
        e = self.expr
        return [
            f"F.date_trunc('minute', {e('timestamp', d)})",
            f"({e('timestamp', d)} + F.expr('INTERVAL 90 SECONDS'))",
        ]

    # -- the functions of seeds from V2_FROM --------------------------------------------
    def _long_v2(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        s, dt, ts = self.col("string"), self.col("date"), self.col("timestamp")
        arr, st, b = self.col("array"), self.col("struct"), self.col("bool")
        return [
            f"F.datediff({dt}, {self.literal('date')})" if dt else None,
            f"F.dayofweek({dt})" if dt else None,
            f"F.weekofyear({dt})" if dt else None,
            f"F.month({dt})" if dt else None,
            f"F.instr({s}, 'a')" if s else None,
            f"F.locate('b', {s})" if s else None,
            f"F.ascii({s})" if s else None,
            f'{s}.try_cast("int")' if s else None,
            f"F.size(F.split({s}, 'a'))" if s else None,
            f'F.crc32({s}.cast("binary"))' if s else None,
            f"F.unix_seconds({ts})" if ts else None,
            f"F.minute({ts})" if ts else None,
            f'{b}.cast("int")' if b else None,
            f"F.array_max({arr})" if arr else None,
            f"F.array_position({arr}, 1)" if arr else None,
            f"F.aggregate({arr}, F.lit(0), lambda acc, x: acc + F.coalesce(x, F.lit(0)))"
            if arr
            else None,
            f'F.from_json(F.to_json({st}), "a INT, b STRING").getField("a")' if st else None,
            f'F.get_json_object(F.to_json({st}), "$.a").cast("long")' if st else None,
            f"F.pmod({e('long', d)}, F.lit({rng.randint(2, 5)}))",
            f"F.shiftleft({e('long', d)}, 1)",
            f"F.bit_count({e('long', d)})",
            f"F.nullif({e('long', d)}, F.lit(0))",
            "F.expr(\"CASE WHEN k = 'a' THEN 1 WHEN k IS NULL THEN NULL ELSE 2 END\")"
            if "k" in self.columns
            else None,
        ]

    def _double_v2(self, d: int) -> list[str | None]:
        e = self.expr
        dec, s = self.col("decimal"), self.col("string")
        return [
            f"F.signum({e('double', d)})",
            f'F.floor({e("double", d)}).cast("double")',
            f'F.ceil({e("double", d)}).cast("double")',
            f"F.bround({e('double', d)}, 0)",
            f"F.pow({e('double', d)}, 2)",
            f'{dec}.cast("double")' if dec else None,
            f'{s}.try_cast("double")' if s else None,
            f"F.coalesce({e('double', d)}, {e('double', d)}, F.lit(0.25))",
        ]

    def _decimal_v2(self, d: int) -> list[str | None]:
        e = self.expr
        return [
            f'{e("double", d)}.try_cast("decimal(10,2)")',
            f"F.abs({e('decimal', d)})",
            f"F.greatest({e('decimal', d)}, F.lit(0))",
        ]

    def _string_v2(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        ts, dt, arr, st = (
            self.col("timestamp", "ntz"),
            self.col("date"),
            self.col("array"),
            self.col("struct"),
        )
        return [
            f"F.translate({e('string', d)}, 'ab', 'xy')",
            f"F.repeat({e('string', d)}, 2)",
            f"F.rpad({e('string', d)}, 5, '.')",
            f"F.left({e('string', d)}, F.lit({rng.randint(0, 3)}))",
            f"F.md5({e('string', d)})",
            f"F.sha2({e('string', d)}, 256)",
            f"F.element_at(F.split({e('string', d)}, 'a'), 1)",
            f"F.format_string('%s-%d', {e('string', d)}, {e('long', d)})",
            f"F.hex({e('long', d)})",
            f"F.to_json(F.struct({e('string', d)}, {e('long', d)}))",
            f"F.to_json({st})" if st else None,
            f"F.to_json({arr})" if arr else None,
            f"F.array_join({arr}, ',', 'null')" if arr else None,
            f"F.date_format({dt}, 'EEE')" if dt else None,
            f'{ts}.cast("string")' if ts else None,
            "F.expr(\"CASE WHEN k IN ('a', 'b') THEN upper(k) ELSE coalesce(k, 'none') END\")"
            if "k" in self.columns
            else None,
            f"F.when({e('bool', d)}, {e('string', d)}).when({e('bool', d)}, F.lit('two'))",
        ]

    def _bool_v2(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        s, arr = self.col("string"), self.col("array")
        return [
            f"F.array_contains({arr}, 1)" if arr else None,
            f"F.exists({arr}, lambda x: x > 1)" if arr else None,
            f"{s}.rlike('^[a-z]')" if s else None,
            f"{s}.like('a%')" if s else None,
            f"{e('long', d)}.between(-3, {rng.randint(0, 9)})",
            f"F.coalesce({e('bool', d)}, F.lit(False))",
            f'{e("long", d)}.cast("boolean")',
            f"{e('string', d)}.eqNullSafe(F.lit('a'))",
        ]

    def _date_v2(self, d: int) -> list[str | None]:
        e, rng = self.expr, self.rng
        s = self.col("string")
        return [
            f"F.date_sub({e('date', d)}, {rng.randint(0, 10)})",
            f"F.add_months({e('date', d)}, {rng.randint(-2, 2)})",
            f"F.trunc({e('date', d)}, 'month')",
            f"F.next_day({e('date', d)}, 'Mon')",
            f'{e("timestamp", d)}.cast("date")',
            f'{s}.try_cast("date")' if s else None,
        ]

    def _timestamp_v2(self, d: int) -> list[str | None]:
        e = self.expr
        dt = self.col("date")
        return [
            f'{dt}.cast("timestamp")' if dt else None,
            f"F.from_utc_timestamp({e('timestamp', d)}, 'Asia/Tokyo')",
            f"F.timestamp_seconds({e('long', d)})",
            f"F.date_trunc('hour', {e('timestamp', d)})",
        ]

    def sql(self) -> tuple[str, str]:
        """A SQL expression over ``ts``, ``k`` and the columns in scope (selectExpr,
        ls.sql) and its kind."""
        rng = self.rng
        num = [n for n, k in self.columns.items() if k in ("long", "int")]
        options = [
            ("upper(k)", "string"),
            ("concat_ws('-', k, 'z')", "string"),
            ("nvl(k, '?')", "string"),
            ("substr(k, 1, 1)", "string"),
            ("CASE k WHEN 'a' THEN 'A' ELSE 'other' END", "string"),
            ("length(k)", "long"),
            ("date_format(ts, 'HH:mm:ss')", "string"),
            ("second(ts) % 10", "long"),
            ("k IS NULL", "bool"),
            ("CAST(ts AS DATE)", "date"),
        ]
        if num:
            n = rng.choice(num)
            options += [
                (f"{n} + 1", "long"),
                (f"abs({n})", "long"),
                (f"coalesce({n}, -1)", "long"),
                (f"CAST({n} AS STRING) || 'x'", "string"),
                (f"try_multiply({n}, 3)", "long"),
                (f"if({n} > 0, {n}, 0)", "long"),
                (f"{n} BETWEEN -2 AND 2", "bool"),
            ]
        return rng.choice(options)


# -- queries -------------------------------------------------------------------------------
@dataclass
class Scenario:
    seed: int
    fmt: str
    sources: list[Source]
    code: str
    mode: str
    shape: str
    restart_before: int | None
    trigger: str = "processAllAvailable"  # or "availableNow": a run of the query a step
    sink: str = "foreachBatch"  # or "parquet": the file sink, its directory read back
    confs: dict[str, str] = field(default_factory=dict)  # set for both engines' starts
    native_confs: dict[str, str] = field(default_factory=dict)  # for native's starts only

    @property
    def n_steps(self) -> int:
        return len(self.sources[0].steps)

    @property
    def multi_source(self) -> bool:
        return len(self.sources) > 1

    def build(self, reader: Any, root: Path, spark: Any, sql: Any = None, view: str = "") -> Any:
        from pyspark.sql import functions as F

        # a module name of its own: functions and classes of the query pickle by value
        namespace: dict[str, Any] = {
            "__name__": "lockgate_fuzz_query",
            "F": F,
            "sql": sql,
            "view": view,
        }
        exec(self.code, namespace)  # noqa: S102 - the generated query, shown on failure
        paths = {s.name: str(root / s.name) for s in self.sources}
        return namespace["query"](reader, paths, spark)

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: shape {self.shape}, {self.fmt} files, output mode {self.mode!r}"
            + (", trigger availableNow (a run a step)" if self.trigger == "availableNow" else "")
            + (f", {self.sink} sink" if self.sink != "foreachBatch" else "")
        ]
        for key, value in {**self.confs, **self.native_confs}.items():
            lines.append(f"conf {key}={value}" + (" (native)" if key in self.native_confs else ""))
        if self.restart_before is not None:
            lines.append(
                f"restart (stop, start from the checkpoint) before step {self.restart_before}"
            )
        for s in self.sources:
            lines.append(f"source {s.name!r}: {s.schema}")
            for i, rows in enumerate(s.steps):
                lines.append(f"  step {i}: {json.dumps(rows, ensure_ascii=False)[:2000]}")
        lines.append(self.code)
        return "\n".join(lines)


class Generator:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.lines: list[str] = []
        self.fmt = "parquet" if self.rng.random() < 0.25 else "json"
        self.n_steps = self.rng.randint(3, 5)
        self.used: set[int] = set()
        # Seeds from V2_FROM draw from more shapes and functions; older seeds keep theirs.
        self.v2 = seed >= V2_FROM
        self.v3 = seed >= V3_FROM
        self.confs: dict[str, str] = {}
        self.native_confs: dict[str, str] = {}
        self.n_keys = 0  # the grouping keys of the last aggregation (a limit orders by them)

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def source(
        self, name: str, time_col: str = "ts", key: str = "k", extra: int | None = None
    ) -> Source:
        rng = self.rng
        cols = [Column(time_col, "timestamp"), Column(key, "string")]
        for i in range(extra if extra is not None else rng.randint(2, 4)):
            kind = rng.choice(KINDS[:5] * 3 + KINDS[5:])
            col = Column(f"{name}{i}", kind)
            if kind == "decimal":
                col.precision = rng.randint(5, 18)
                col.scale = rng.randint(0, min(4, col.precision - 1))
            cols.append(col)
        src = Source(name, cols)
        _event_rows(rng, src, self.n_steps, self.used, time_col, some_key=self.fmt == "parquet")
        return src

    def read(self, var: str, src: Source) -> dict[str, str]:
        self.emit(f'    {var} = reader.schema("{src.schema}").{self.fmt}(paths["{src.name}"])')
        return {c.name: c.kind for c in src.columns}

    def project(self, var: str, columns: dict[str, str], keep: tuple[str, ...]) -> dict[str, str]:
        """Random derived columns and maybe a filter; ``keep`` columns stay as they are."""
        rng = self.rng
        exprs = Exprs(rng, columns, self.v2)
        if rng.random() < 0.5:
            cond = exprs.expr("bool")
            # Spark's parquet scan skips whole row groups by a pushed filter's statistics
            # and counts numInputRows after that, and counts every row under a constant
            # filter, which lockgate does not do (reported, its numInputRows counting is
            # another part's): parquet filters read a column and go through coalesce,
            # which Spark does not push into the scan.
            while self.fmt == "parquet" and "F.col(" not in cond:
                cond = exprs.expr("bool")
            if self.v2 and self.fmt == "parquet":
                # a condition that cannot be null (isNull, eqNullSafe...) loses the
                # coalesce in the optimizer and goes to the scan: under a CASE it stays
                cond = f'F.coalesce(F.when(F.col("{keep[0]}").isNotNull(), {cond}), F.lit(True))'
            elif rng.random() < 0.5 or self.fmt == "parquet":
                cond = f"F.coalesce({cond}, F.lit(True))"
            self.emit(f"    {var} = {var}.where({cond})")
        out = {name: columns[name] for name in keep}
        selected = [f'"{n}"' for n in keep]
        for name, kind in columns.items():
            if name not in keep and rng.random() < 0.6:
                out[name] = kind
                selected.append(f'"{name}"')
        for i in range(rng.randint(0, 3)):
            kind = rng.choice(
                ["long", "double", "string", "bool", "date", "decimal", "long", "double"]
            )
            name = f"e{i}"
            selected.append(f'{exprs.expr(kind)}.alias("{name}")')
            out[name] = kind
        self.emit(f"    {var} = {var}.select({', '.join(selected)})")
        if self.v2:
            out = self.project_v2(var, out)
        return out

    def project_v2(self, var: str, out: dict[str, str]) -> dict[str, str]:
        """Seeds from V2_FROM: maybe rows exploded from an array, maybe a selectExpr."""
        rng = self.rng
        arrays = [n for n, k in out.items() if k == "array"]
        if rng.random() < 0.3:
            how = rng.choice(["explode", "explode_outer", "posexplode", "posexplode_outer", "lit"])
            if how == "lit" or not arrays:
                self.emit(
                    f'    {var} = {var}.select("*", F.explode(F.array(F.lit(1), F.lit(2))).alias("x"))'
                )
                out = {**out, "x": "int"}
            elif how.startswith("pos"):
                a = rng.choice(arrays)
                self.emit(f'    {var} = {var}.select("*", F.{how}("{a}").alias("p", "x"))')
                out = {**out, "p": "int", "x": "int"}
            else:
                a = rng.choice(arrays)
                self.emit(f'    {var} = {var}.select("*", F.{how}("{a}").alias("x"))')
                out = {**out, "x": "int"}
        if "k" in out and rng.random() < 0.3:
            text, kind = Exprs(rng, out, True).sql()
            self.emit(f'    {var} = {var}.selectExpr("*", "{text} AS q")')
            out = {**out, "q": kind}
        return out

    def aggregates(
        self, columns: dict[str, str], time_col: str | None, session: bool = False
    ) -> list[str]:
        rng = self.rng
        numeric = [n for n, k in columns.items() if k in NUMERIC]
        ordered = [
            n
            for n, k in columns.items()
            if k in NUMERIC + ("string", "date", "timestamp", "ntz", "bool")
        ]
        anyc = [n for n, k in columns.items()]
        bools = [n for n, k in columns.items() if k == "bool"]
        options = ['F.count("*")', f'F.count("{rng.choice(anyc)}")']
        if numeric:
            n = rng.choice(numeric)
            options += [
                f'F.sum("{n}")',
                f'F.avg("{n}")',
                f'F.stddev("{n}")',
                f'F.max("{n}")',
                f'F.median("{n}")',
            ]
        if ordered:
            o = rng.choice(ordered)
            options += [
                f'F.min("{o}")',
                f'F.max("{o}")',
                f'F.collect_set("{o}")',
                f'F.collect_list("{o}")',
            ]
            if time_col:
                options.append(f'F.max_by("{o}", "{time_col}")')
                options.append(f'F.min_by("{o}", "{time_col}")')
            if not session:
                options.append(f'F.approx_count_distinct("{o}")')
        if bools:
            b = rng.choice(bools)
            options += [f'F.bool_and("{b}")', f'F.bool_or("{b}")']
        if rng.random() < 0.04:
            options.append(f'F.count_distinct("{rng.choice(anyc)}")')  # Spark refuses it
        if self.v2:
            options += self.aggregates_v2(columns)
        picked = rng.sample(options, min(len(options), rng.randint(1, 5)))
        return [f'{a}.alias("a{i}")' for i, a in enumerate(picked)]

    def aggregates_v2(self, columns: dict[str, str]) -> list[str]:
        rng = self.rng
        numeric = [n for n, k in columns.items() if k in NUMERIC]
        integral = [n for n, k in columns.items() if k in ("long", "int")]
        ordered = [
            n for n, k in columns.items() if k in NUMERIC + ("string", "date", "timestamp", "bool")
        ]
        options = ['F.count_if(F.col("k").isNull())', 'F.max(F.length("k"))']
        if numeric:
            n = rng.choice(numeric)
            options += [
                f'F.count_if(F.col("{n}") > 0)',
                f'F.try_sum("{n}")',
                f'F.try_avg("{n}")',
                f'F.var_pop("{n}")',
                f'F.sum(F.col("{n}") * 2)',
                f'F.min(F.abs("{n}"))',
            ]
        if integral:
            i = rng.choice(integral)
            options += [f'F.bit_or("{i}")', f'F.bit_xor("{i}")', f'F.bit_and("{i}")']
        if ordered:
            o = rng.choice(ordered)
            options += [
                f'F.sort_array(F.collect_list("{o}"))',
                f'F.sort_array(F.collect_set("{o}"), False)',
                f'F.array_agg("{o}")',
                f'F.max(F.struct("{o}", "ts"))' if "ts" in columns else None,
                f'F.size(F.collect_set("{o}"))',
            ]
        bools = [n for n, k in columns.items() if k == "bool"]
        if bools:
            options += [f'F.every("{rng.choice(bools)}")', f'F.some("{rng.choice(bools)}")']
        return [o for o in options if o is not None]

    def mode(self, valid: list[str]) -> str:
        if self.rng.random() < 0.08:
            return self.rng.choice(["append", "update", "complete"])
        return self.rng.choice(valid)

    def watermark(self, var: str, col: str) -> None:
        delay = self.rng.choice(["0 seconds", "5 seconds", "10 seconds", "20 seconds"])
        self.emit(f'    {var} = {var}.withWatermark("{col}", "{delay}")')

    def scenario(self) -> Scenario:
        rng = self.rng
        shapes = [
            "stateless",
            "agg",
            "agg",
            "window",
            "window",
            "session",
            "dedup",
            "dedup_ww",
            "join",
            "join",
            "static",
            "union",
            "chain",
        ]
        if self.v2:
            shapes += ["limit", "sql", "sql", "static2", "dedup_ww", "window"]
        if self.v3:
            shapes += ["apply", "apply", "apply", "tws", "tws", "tws", "dedup_wm", "sorted"]
            shapes += ["multi_wm", "multi_wm", "join"]
        shape = rng.choice(shapes)
        self.emit("def query(reader, paths, spark):")
        sources = [self.source("s")]
        cols = self.read("df", sources[0])
        mode = "append"
        if shape in ("window", "session", "dedup_ww", "chain", "dedup_wm", "multi_wm") or (
            shape in ("agg", "dedup", "sql", "limit", "static2", "sorted", "apply", "tws")
            and rng.random() < 0.4
        ):
            self.watermark("df", "ts")
        if shape == "multi_wm":
            return self.multi_wm(sources, cols)
        if shape == "union":
            other = Source(
                "u", [Column(c.name, c.kind, c.precision, c.scale) for c in sources[0].columns]
            )
            _event_rows(rng, other, self.n_steps, self.used, "ts", some_key=self.fmt == "parquet")
            sources.append(other)
            self.read("df2", other)
            if rng.random() < 0.5:
                self.watermark("df2", "ts")
            self.emit(
                "    df = df.union(df2)" if rng.random() < 0.6 else "    df = df.unionByName(df2)"
            )
        if shape == "join":
            return self.join(sources, cols)
        cols = self.project("df", cols, ("ts", "k"))
        if shape == "stateless":
            mode = self.mode(["append", "append", "update"])
        elif shape == "union":
            follow = rng.choice(["none", "agg", "dedup"])
            if follow == "agg":
                mode = self.agg("df", cols, "agg")
            elif follow == "dedup":
                self.dedup("df", cols, within=False)
                mode = self.mode(["append"])
            else:
                mode = self.mode(["append"])
        elif shape in ("agg", "window", "session"):
            mode = self.agg("df", cols, shape)
        elif shape == "dedup":
            self.dedup("df", cols, within=False)
            mode = self.mode(["append"])
        elif shape == "dedup_ww":
            self.dedup("df", cols, within=True)
            if rng.random() < 0.4:
                mode = self.agg("df", cols, "window")
            else:
                mode = self.mode(["append"])
        elif shape == "static":
            mode = self.static("df", cols)
        elif shape == "chain":
            mode = self.chain("df", cols)
        elif shape == "limit":
            mode = self.limit("df", cols)
        elif shape == "sql":
            mode = self.sql("df", cols)
        elif shape == "static2":
            mode = self.static2("df", cols)
        elif shape == "apply":
            mode = self.apply("df", cols)
        elif shape == "tws":
            mode = self.tws("df", cols)
        elif shape == "dedup_wm":
            mode = self.dedup_wm("df", cols)
        elif shape == "sorted":
            mode = self.sorted("df", cols)
        self.emit("    return df")
        restart = rng.randint(1, self.n_steps - 1) if rng.random() < 0.35 else None
        trigger = "availableNow" if self.v2 and rng.random() < 0.2 else "processAllAvailable"
        return self.finish(sources, mode, shape, restart, trigger)

    def finish(
        self, sources: list[Source], mode: str, shape: str, restart: int | None, trigger: str
    ) -> Scenario:
        """The scenario; seeds from V3_FROM write some append-mode queries to parquet files."""
        sink = "foreachBatch"
        if self.v3 and mode == "append" and self.rng.random() < 0.3:
            sink = "parquet"
        return Scenario(
            self.seed,
            self.fmt,
            sources,
            "\n".join(self.lines),
            mode,
            shape,
            restart,
            trigger,
            sink,
            dict(self.confs),
            dict(self.native_confs),
        )

    # -- the shapes of seeds from V3_FROM ------------------------------------------------
    def _long_column(self, cols: dict[str, str]) -> str | None:
        longs = [n for n, k in cols.items() if k in ("long", "int")]
        return self.rng.choice(longs) if longs else None

    def apply(self, var: str, cols: dict[str, str]) -> str:
        """groupBy(k).applyInPandasWithState: a count and a sum per key, emitted when the
        count reaches a threshold (then the state starts over), with no timeout or an
        event-time timeout (a watermark's) past the key's latest event time, which emits
        what the key holds and removes its state."""
        rng = self.rng
        event_time = "ts" in cols and rng.random() < 0.6
        if event_time and not any("withWatermark" in line for line in self.lines):
            self.watermark(var, "ts")
        num = self._long_column(cols)
        threshold = rng.randint(1, 4)
        gap = rng.choice([0, 5_000, 10_000])
        out_mode = rng.choice(["append", "update"])
        total = f'int(pdf["{num}"].fillna(0).sum())' if num else "len(pdf)"
        timeout = "EventTimeTimeout" if event_time else "NoTimeout"
        self.emit("    from pyspark.sql.streaming.state import GroupStateTimeout")
        self.emit("")
        self.emit("    def fn(key, pdfs, state):")
        self.emit("        import pandas as pd")
        self.emit("")
        self.emit("        if state.hasTimedOut:")
        self.emit("            n, s, last = state.get")
        self.emit("            state.remove()")
        self.emit(
            '            yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s], "why": ["timeout"]})'
        )
        self.emit("            return")
        self.emit("        n, s, last = state.get if state.exists else (0, 0, 0)")
        self.emit("        for pdf in pdfs:")
        self.emit("            n += len(pdf)")
        self.emit(f"            s += {total}")
        if event_time:
            self.emit('            last = max(last, int(pdf["ts"].max().value // 1_000_000))')
        self.emit(f"        if n >= {threshold}:")
        self.emit(
            '            yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s], "why": ["count"]})'
        )
        self.emit("            n, s = 0, 0")
        self.emit("        state.update((n, s, last))")
        if event_time:
            self.emit(
                f"        state.setTimeoutTimestamp(max(last + {gap}, state.getCurrentWatermarkMs() + 1))"
            )
        keys = '"k"' if rng.random() < 0.8 else '"k", F.col("k").isNull().alias("knull")'
        self.emit(
            f"    {var} = {var}.groupBy({keys}).applyInPandasWithState(fn, "
            f'"k STRING, n LONG, s LONG, why STRING", "n LONG, s LONG, last LONG", '
            f'"{out_mode}", GroupStateTimeout.{timeout})'
        )
        if rng.random() < 0.8:
            return self.mode([out_mode])
        return self.mode(["append", "update"])

    def tws(self, var: str, cols: dict[str, str]) -> str:
        """groupBy(k).transformWithStateInPandas: a StatefulProcessor with a ValueState
        count, maybe a ListState of a column's values and a MapState of counts per value,
        and maybe event-time timers (a watermark's) past the key's latest event time that
        emit what the key holds and clear it."""
        rng = self.rng
        timers = "ts" in cols and rng.random() < 0.6
        if timers and not any("withWatermark" in line for line in self.lines):
            self.watermark(var, "ts")
        num = self._long_column(cols)
        use_list = num is not None and rng.random() < 0.6
        use_map = num is not None and rng.random() < 0.5
        threshold = rng.randint(1, 4)
        gap = rng.choice([0, 5_000, 10_000])
        out_mode = rng.choice(["append", "update"])
        self.native_confs["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
        e = self.emit
        e("    from pyspark.sql.streaming import StatefulProcessor")
        e("")
        e("    class Proc(StatefulProcessor):")
        e("        def init(self, handle):")
        e("            self.handle = handle")
        e('            self.count = handle.getValueState("count", "n long")')
        if use_list:
            e('            self.seen = handle.getListState("seen", "v long")')
        if use_map:
            e('            self.per = handle.getMapState("per", "v long", "c long")')
        e("")
        e("        def _out(self, key, n, why):")
        e("            import pandas as pd")
        e("")
        if use_list:
            e("            seen = sorted(v for (v,) in self.seen.get())")
        else:
            e("            seen = []")
        if use_map:
            e("            pairs = sorted((a[0], c[0]) for a, c in self.per.iterator())")
        else:
            e("            pairs = []")
        e("            return pd.DataFrame(")
        e("                {")
        e('                    "k": [key[0]],')
        e('                    "n": [n],')
        e('                    "seen": [",".join(str(v) for v in seen)],')
        e('                    "per": [",".join(f"{a}:{c}" for a, c in pairs)],')
        e('                    "why": [why],')
        e("                }")
        e("            )")
        e("")
        e("        def handleInputRows(self, key, rows, timerValues):")
        e("            n = self.count.get()[0] if self.count.exists() else 0")
        e("            last = 0")
        e("            for pdf in rows:")
        e("                n += len(pdf)")
        if timers:
            e('                last = max(last, int(pdf["ts"].max().value // 1_000_000))')
        if use_list or use_map:
            e(f'                for v in pdf["{num}"].dropna():')
            if use_list:
                e("                    self.seen.appendValue((int(v),))")
            if use_map:
                e("                    old = self.per.getValue((int(v),))")
                e(
                    "                    self.per.updateValue((int(v),), ((old[0] if old else 0) + 1,))"
                )
        e("            self.count.update((n,))")
        if timers:
            e("            for t in list(self.handle.listTimers()):")
            e("                self.handle.deleteTimer(t)")
            e(
                f"            self.handle.registerTimer(max(last + {gap}, "
                "timerValues.getCurrentWatermarkInMs() + 1))"
            )
        e(f"            if n >= {threshold}:")
        e('                yield self._out(key, n, "count")')
        if use_list and rng.random() < 0.5:
            e("                self.seen.clear()")
        e("")
        e("        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):")
        e("            n = self.count.get()[0] if self.count.exists() else 0")
        e('            out = self._out(key, n, "timer")')
        e("            self.count.clear()")
        if use_list:
            e("            self.seen.clear()")
        if use_map:
            e("            self.per.clear()")
        e("            yield out")
        e("")
        e("        def close(self):")
        e("            pass")
        e("")
        e(
            f'    {var} = {var}.groupBy("k").transformWithStateInPandas(Proc(), '
            f'"k STRING, n LONG, seen STRING, per STRING, why STRING", "{out_mode}", '
            f'"{"eventTime" if timers else "none"}")'
        )
        return self.mode([out_mode])

    def dedup_wm(self, var: str, cols: dict[str, str]) -> str:
        """dropDuplicates of a subset with the event time under its watermark (the state
        evicted), or dropDuplicatesWithinWatermark; maybe a window count after it."""
        rng = self.rng
        others = [n for n, k in cols.items() if k not in ("array", "struct") and n != "ts"]
        subset = ["ts"] + rng.sample(others, rng.randint(0, min(2, len(others))))
        rng.shuffle(subset)
        if rng.random() < 0.7:
            self.emit(f"    {var} = {var}.dropDuplicates({subset!r})")
        else:
            self.emit(
                f"    {var} = {var}.dropDuplicatesWithinWatermark({[c for c in subset if c != 'ts'] or ['k']!r})"
            )
        if rng.random() < 0.4:
            self.emit(
                f'    {var} = {var}.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"))'
            )
            return self.mode(["append", "update"])
        return self.mode(["append"])

    def sorted(self, var: str, cols: dict[str, str]) -> str:
        """An aggregation in complete mode sorted by orderBy: by its keys, or by a count
        (descending) and then its keys (a total order: each group once); a limit after it
        now and then."""
        rng = self.rng
        keys = self.keys(cols)
        if not keys or rng.random() < 0.3:
            keys = [*keys, 'F.window("ts", "10 seconds")']
        aggs = ['F.count("*").alias("n")', *self.aggregates(cols, "ts")[:2]]
        self.emit(f"    {var} = {var}.groupBy({', '.join(keys)}).agg({', '.join(aggs)})")
        order = [f"{var}.columns[{i}]" for i in range(len(keys))]
        rng.shuffle(order)
        if rng.random() < 0.5:
            order.insert(0, 'F.col("n").desc()')
        elif rng.random() < 0.5:
            order = [f"F.col({o}).desc_nulls_last()" for o in order]
        self.emit(f"    {var} = {var}.orderBy({', '.join(order)})")
        if rng.random() < 0.5:
            self.emit(f"    {var} = {var}.limit({rng.randint(1, 4)})")
        return self.mode(["complete"])

    def multi_wm(self, sources: list[Source], cols: dict[str, str]) -> Scenario:
        """Two sources, each with its own watermark delay, unioned; the watermark follows
        spark.sql.streaming.multipleWatermarkPolicy (min or max); a window aggregation or
        a dedup within the watermark after."""
        rng = self.rng
        other = Source(
            "u", [Column(c.name, c.kind, c.precision, c.scale) for c in sources[0].columns]
        )
        _event_rows(rng, other, self.n_steps, self.used, "ts", some_key=self.fmt == "parquet")
        sources.append(other)
        self.read("df2", other)
        self.emit(f'    df2 = df2.withWatermark("ts", "{rng.choice([0, 15, 30])} seconds")')
        self.confs["spark.sql.streaming.multipleWatermarkPolicy"] = rng.choice(["min", "max"])
        self.emit("    df = df.unionByName(df2)")
        cols = self.project("df", cols, ("ts", "k"))
        follow = rng.choice(["window", "window", "dedup_ww", "none"])
        if follow == "window":
            mode = self.agg("df", cols, "window")
        elif follow == "dedup_ww":
            self.dedup("df", cols, within=True)
            mode = self.mode(["append"])
        else:
            mode = self.mode(["append"])
        self.emit("    return df")
        restart = rng.randint(1, self.n_steps - 1) if rng.random() < 0.35 else None
        return self.finish(sources, mode, "multi_wm", restart, "processAllAvailable")

    def limit(self, var: str, cols: dict[str, str]) -> str:
        """A limit: of the stream (Append), or of an aggregation ordered by its keys
        (Complete: the rows are the same whatever order the groups come in)."""
        rng = self.rng
        n = rng.randint(1, 6)
        if rng.random() < 0.5:
            self.emit(f"    {var} = {var}.limit({n})")
            return self.mode(["append"])
        self.agg(var, cols, rng.choice(["agg", "window"]))
        self.emit(f"    {var} = {var}.orderBy(*{var}.columns[: {self.n_keys}]).limit({n})")
        return self.mode(["complete"])

    def sql(self, var: str, cols: dict[str, str]) -> str:
        """The query's rest in SQL over a temporary view of the stream (``sql`` is
        ``spark.sql`` natively, ``ls.sql`` on lockgate; ``view`` a name of its own)."""
        rng = self.rng
        self.emit(f"    {var}.createOrReplaceTempView(view)")
        text, _ = Exprs(rng, cols, True).sql()
        cond, cond_kind = Exprs(rng, cols, True).sql()
        numeric = [n for n, k in cols.items() if k in ("long", "int", "double", "decimal")]
        num = rng.choice(numeric) if numeric else "1"
        kind = rng.choice(["select", "group", "window", "distinct", "having"])
        if kind == "select":
            where = f" WHERE {cond}" if cond_kind == "bool" else ""
            query, valid = f"SELECT ts, k, {text} AS q FROM {{view}}{where}", ["append"]
        elif kind == "group":
            query = (
                f"SELECT k, count(*) AS n, max(ts) AS m, sum({num}) AS s FROM {{view}} GROUP BY k"
            )
            valid = ["update", "complete"]
        elif kind == "having":
            query = "SELECT k, count(*) AS n FROM {view} GROUP BY k HAVING count(*) > 1"
            valid = ["update", "complete"]
        elif kind == "window":
            query = (
                "SELECT window(ts, '10 seconds') AS w, k, count(*) AS n, min("
                f"{num}) AS lo FROM {{view}} GROUP BY window(ts, '10 seconds'), k"
            )
            valid = ["append", "update", "complete"]
        else:
            query, valid = f"SELECT DISTINCT k, {text} AS q FROM {{view}}", ["append"]
        self.emit(f'    {var} = sql(f"{query}")')
        return self.mode(valid)

    def static2(self, var: str, cols: dict[str, str]) -> str:
        """Seeds from V2_FROM: a stream-static join with the static side aggregated, on
        the left, or joined by an expression; then maybe an aggregation or a dedup."""
        rng = self.rng
        self.emit(
            '    static = spark.createDataFrame([("a", 1), ("B", 2), ("ü", 3), ("a", 4), (None, 5), ("c", None)], "sk STRING, sn INT")'
        )
        if rng.random() < 0.4:
            self.emit('    static = static.groupBy("sk").agg(F.sum("sn").alias("sn"))')
        cond = rng.choice([f"{var}.k == static.sk", f"F.upper({var}.k) == F.upper(static.sk)"])
        how = rng.choice(["inner", "left_outer", "static_inner", "static_right_outer", "left_anti"])
        if how.startswith("static_"):
            self.emit(f'    {var} = static.join({var}, {cond}, "{how[7:]}")')
        else:
            self.emit(f'    {var} = {var}.join(static, {cond}, "{how}")')
        if how != "left_anti":
            cols = {**cols, "sk": "string", "sn": "int"}
        follow = rng.choice(["none", "agg", "window", "dedup"])
        if follow in ("agg", "window"):
            return self.agg(var, cols, follow)
        if follow == "dedup":
            self.dedup(var, cols, within=False)
        return self.mode(["append"])

    def keys(self, cols: dict[str, str]) -> list[str]:
        rng = self.rng
        keys = ['"k"'] if rng.random() < 0.85 else []
        hashable = [
            n
            for n, k in cols.items()
            if k in ("long", "int", "string", "bool", "date", "double", "decimal")
        ]
        hashable = [n for n in hashable if n != "k"]
        if hashable and rng.random() < 0.5:
            keys.append(f'"{rng.choice(hashable)}"')
        return keys

    def agg(self, var: str, cols: dict[str, str], shape: str) -> str:
        rng = self.rng
        keys = self.keys(cols)
        if shape == "window":
            size = rng.choice([10, 20])
            slide = rng.choice([None, size // 2])
            w = f'F.window("ts", "{size} seconds"' + (f', "{slide} seconds")' if slide else ")")
            keys.insert(rng.randint(0, len(keys)), w)
            valid = ["append", "update", "complete"]
        elif shape == "session":
            gap = rng.choice(["3 seconds", "5 seconds", "10 seconds"])
            keys.insert(rng.randint(0, len(keys)), f'F.session_window("ts", "{gap}")')
            if len(keys) == 1:
                keys.append('"k"')
            valid = ["append", "complete"]
        else:
            valid = ["update", "complete"]
        aggs = self.aggregates(cols, "ts", session=shape == "session")
        self.n_keys = len(keys)
        self.emit(f"    {var} = {var}.groupBy({', '.join(keys)}).agg({', '.join(aggs)})")
        return self.mode(valid)

    def dedup(self, var: str, cols: dict[str, str], within: bool) -> None:
        rng = self.rng
        candidates = [n for n, k in cols.items() if k not in ("array", "struct")]
        subset = rng.sample(candidates, rng.randint(1, min(3, len(candidates))))
        if within:
            subset = [c for c in subset if c != "ts"] or ["k"]
            self.emit(f"    {var} = {var}.dropDuplicatesWithinWatermark({subset!r})")
        elif rng.random() < 0.15:
            self.emit(f"    {var} = {var}.dropDuplicates()")
        else:
            self.emit(f"    {var} = {var}.dropDuplicates({subset!r})")

    def static(self, var: str, cols: dict[str, str]) -> str:
        rng = self.rng
        how = rng.choice(["inner", "left_outer", "left_semi", "left_anti"])
        self.emit(
            '    static = spark.createDataFrame([("a", 1), ("b", 2), ("ü", 3), ("a", 4), (None, 5)], "sk STRING, sn INT")'
        )
        self.emit(f'    {var} = {var}.join(static, {var}.k == static.sk, "{how}")')
        if how in ("inner", "left_outer"):
            cols = {**cols, "sk": "string", "sn": "int"}
        if rng.random() < 0.5:
            return self.agg(var, cols, rng.choice(["agg", "window"]))
        return self.mode(["append"])

    def chain(self, var: str, cols: dict[str, str]) -> str:
        rng = self.rng
        kind = rng.choice(["dedup_agg", "window_window", "dedup_window"])
        if kind == "dedup_agg":
            self.dedup(var, cols, within=False)
            return self.agg(var, cols, rng.choice(["agg", "window"]))
        if kind == "dedup_window":
            self.dedup(var, cols, within=True)
            self.emit(
                f'    {var} = {var}.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"))'
            )
            return self.mode(["append"])
        aggs = self.aggregates(cols, None)
        self.emit(
            f'    {var} = {var}.groupBy(F.window("ts", "10 seconds").alias("w"), "k").agg({", ".join(aggs)})'
        )
        self.emit(
            f'    {var} = {var}.groupBy(F.window(F.window_time("w"), "20 seconds"))'
            '.agg(F.count("*").alias("n"), F.collect_list("k").alias("ks"))'
        )
        return self.mode(["append"])

    def join(self, sources: list[Source], lcols: dict[str, str]) -> Scenario:
        rng = self.rng
        right = self.source("r", time_col="rts", key="rk", extra=rng.randint(1, 2))
        sources.append(right)
        rcols = self.read("rdf", right)
        how = rng.choice(["inner", "inner", "left_outer", "right_outer", "full_outer", "left_semi"])
        watermarks = how != "inner" or rng.random() < 0.7
        if watermarks:
            self.watermark("df", "ts")
            self.watermark("rdf", "rts")
        lcols = self.project("df", lcols, ("ts", "k"))
        rcols = self.project("rdf", rcols, ("rts", "rk"))
        lower, upper = rng.choice([5, 10, 20]), rng.choice([0, 5, 15])
        cond = (
            f'(df.k == rdf.rk) & (rdf.rts >= df.ts - F.expr("INTERVAL {lower} SECONDS"))'
            f' & (rdf.rts <= df.ts + F.expr("INTERVAL {upper} SECONDS"))'
        )
        if not watermarks and rng.random() < 0.5:
            cond = "df.k == rdf.rk"
        self.emit(f'    df = df.join(rdf, {cond}, "{how}")')
        mode = self.mode(["append"])
        cols = dict(lcols) if how == "left_semi" else {**lcols, **rcols}
        if how == "inner" and watermarks and rng.random() < 0.3:
            self.emit(
                '    df = df.groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n"))'
            )
        elif how == "inner" and not watermarks and rng.random() < 0.3:
            aggs = self.aggregates(cols, None)
            self.emit(f'    df = df.groupBy("k").agg({", ".join(aggs)})')
            mode = self.mode(["update", "complete"])
        self.emit("    return df")
        restart = rng.randint(1, self.n_steps - 1) if rng.random() < 0.35 else None
        if self.v3 and watermarks:
            self.confs["spark.sql.streaming.multipleWatermarkPolicy"] = rng.choice(["min", "max"])
        return self.finish(sources, mode, "join", restart, "processAllAvailable")


def scenario(seed: int) -> Scenario:
    return Generator(seed).scenario()


# -- running -----------------------------------------------------------------------------
def _condition(exc: BaseException) -> str | None:
    for attr in ("getCondition", "getErrorClass"):
        fn = getattr(exc, attr, None)
        if fn is not None:
            try:
                value = fn()
            except Exception:  # noqa: BLE001 - a wrapper without one
                value = None
            if value:
                return value
    cause = exc.__cause__
    return _condition(cause) if cause is not None else None


class Engine:
    """One engine's query of a scenario."""

    def __init__(self, run: Run, name: str, reader: Any, sql: Any) -> None:
        self.run = run
        self.name = name
        self.reader = reader
        self.sql = sql
        self.checkpoint = str(run.root / name / "checkpoint")
        self.query: Any = None
        self.batches: list[tuple[int, list[Any]]] = []
        self.progress: list[Any] = []
        self.start_error: BaseException | None = None
        self.run_error: BaseException | None = None

        self.output = str(run.root / name / "out")  # the parquet sink's directory
        self.schema: Any = None

    def _collect(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, df.collect()))

    def start(self) -> None:
        sc = self.run.scenario
        confs = {**sc.confs, **(sc.native_confs if self.name == "native" else {})}
        try:
            with _confs(self.run.spark, confs):
                view = f"fuzz_{self.name}_{self.run.root.name.replace('-', '_')}"
                df = sc.build(self.reader, self.run.root / "in", self.run.spark, self.sql, view)
                self.schema = df.schema
                writer = df.writeStream.outputMode(sc.mode)
                if sc.trigger == "availableNow":
                    writer = writer.trigger(availableNow=True)
                writer = writer.option("checkpointLocation", self.checkpoint)
                if sc.sink == "parquet":
                    writer = writer.format("parquet").option("path", self.output)
                else:
                    writer = writer.foreachBatch(self._collect)
                self.query = writer.start()
        except Exception as exc:  # noqa: BLE001 - compared with the other engine's
            self.start_error = exc

    def read_output(self) -> None:
        """The parquet sink's rows so far (its _spark_metadata log's files) as one batch."""
        if self.run.scenario.sink != "parquet":
            return
        rows: list[Any] = []
        if os.path.isdir(os.path.join(self.output, "_spark_metadata")):
            rows = self.run.spark.read.schema(self.schema).parquet(self.output).collect()
        self.batches = [(0, rows)]

    def wait(self) -> None:
        if self.query is None:
            return
        for attempt in range(8):
            try:
                if self.run.scenario.trigger == "availableNow":
                    # a run still going would be compared mid-run: a batch short, not a difference
                    if not self.query.awaitTermination(600):
                        raise TimeoutError(f"{self.name}'s availableNow run did not finish in 600 s")
                else:
                    self.query.processAllAvailable()
                    self.query.processAllAvailable()
                return
            except Exception as exc:  # noqa: BLE001
                # Spark waits 10 s, hard-coded, for the Python worker that runs a
                # StatefulProcessor's init() on the driver to connect back, which a loaded
                # machine can exceed; native's query then restarts from its checkpoint
                # (nothing of the failed batch was committed).
                if (
                    self.name != "native"
                    or "failed to connect back" not in str(exc)
                    or attempt == 7
                ):
                    self.run_error = exc
                    return
                self.stop()
                self.start()

    def stop(self) -> None:
        if self.query is not None:
            self.progress += [p for p in self.query.recentProgress if "addBatch" in p.durationMs]
            with contextlib.suppress(Exception):  # a failed query
                self.query.stop()
            self.query = None

    def metrics(self) -> list[tuple[Any, ...]]:
        current = (
            [p for p in self.query.recentProgress if "addBatch" in p.durationMs]
            if self.query
            else []
        )
        out = []
        for p in self.progress + current:
            ops = tuple(
                (op.operatorName, op.numRowsTotal, op.numRowsDroppedByWatermark)
                for op in p.stateOperators
            )
            out.append((p.batchId, p.numInputRows, (p.eventTime or {}).get("watermark"), ops))
        return out


class Run:
    """A scenario on both engines."""

    def __init__(self, scenario: Scenario, spark: Any, ls: Any, root: Path) -> None:
        self.scenario = scenario
        self.spark = spark
        self.root = root / f"seed{scenario.seed}-{uuid.uuid4().hex[:6]}"
        self.native = Engine(self, "native", spark.readStream, spark.sql)
        self.lockgate = Engine(self, "lockgate", ls.readStream, ls.sql)
        self.error: str | None = None
        self.done = False

    @property
    def engines(self) -> tuple[Engine, Engine]:
        return self.native, self.lockgate

    def fail(self, message: str) -> None:
        self.error = f"{message}\n--- scenario ---\n{self.scenario.describe()}"
        self.finish()

    def finish(self) -> None:
        self.done = True
        for e in self.engines:
            e.stop()

    def start(self) -> None:
        for src in self.scenario.sources:
            (self.root / "in" / src.name).mkdir(parents=True, exist_ok=True)
        for e in self.engines:
            e.start()
        n, g = self.native.start_error, self.lockgate.start_error
        if n is None and g is None:
            return
        if n is not None and g is not None:
            cn, cg = _condition(n), _condition(g)
            STATS[f"both refuse {cn}: {_headline(n)[:90]}"] += 1
            if cn is not None and cg is not None and cn != cg:
                self.fail(
                    f"both refuse the query, with different conditions: native {cn}, lockgate {cg}\n{n}\n{g}"
                )
            else:
                self.finish()
            return
        if n is not None:
            self.fail(f"native refuses the query, lockgate starts it; native:\n{_headline(n)}")
        else:
            self.fail(f"lockgate refuses the query, native starts it; lockgate:\n{_trace(g)}")

    def check(self, step: int) -> None:
        n, g = self.native.run_error, self.lockgate.run_error
        if n is not None and "failed to connect back" in str(n):
            # native's StatefulProcessor worker missed Spark's 10 s on an overloaded
            # machine, retried (Engine.wait): the seed tells nothing this time
            STATS["native worker did not connect back"] += 1
            self.finish()
            return
        if n is not None or g is not None:
            if n is not None and g is not None:
                cn, cg = _condition(n), _condition(g)
                STATS[f"both fail {cn}: {_headline(n)[:90]}"] += 1
                if cn is not None and cg is not None and cn != cg:
                    self.fail(
                        f"step {step}: both fail, with different conditions: native {cn}, lockgate {cg}"
                    )
                else:
                    self.finish()
            elif n is not None:
                self.fail(f"step {step}: native fails, lockgate runs on; native:\n{_headline(n)}")
            else:
                self.fail(f"step {step}: lockgate fails, native runs on; lockgate:\n{_trace(g)}")
            return
        for e in self.engines:
            e.read_output()
        nb, gb = self.native.batches, self.lockgate.batches
        for i in range(max(len(nb), len(gb))):
            if i >= len(nb) or i >= len(gb):
                extra = nb[i:] if len(nb) > len(gb) else gb[i:]
                who = "native" if len(nb) > len(gb) else "lockgate"
                self.fail(
                    f"step {step}: only {who} ran batches {[(b, list(map(tuple, r))) for b, r in extra]}"
                )
                return
            (bn, rn), (bg, rg) = nb[i], gb[i]
            en, eg = canon(rn), canon(rg)
            if bn != bg or not same_rows(en, eg):
                self.fail(
                    f"step {step}: batch {bn} (native) / {bg} (lockgate) differs\n"
                    f"  native:   {_rows(rn)}\n  lockgate: {_rows(rg)}"
                )
                return
        mn, mg = self.native.metrics(), self.lockgate.metrics()
        if mn != mg:
            first = next(
                i
                for i in range(max(len(mn), len(mg)))
                if i >= len(mn) or i >= len(mg) or mn[i] != mg[i]
            )
            self.fail(
                f"step {step}: progress (batchId, numInputRows, watermark, (operator, numRowsTotal, "
                f"numRowsDroppedByWatermark)) differs from batch index {first}\n"
                f"  native:   {mn[first : first + 3]}\n  lockgate: {mg[first : first + 3]}"
            )


@contextlib.contextmanager
def _confs(spark: Any, confs: dict[str, str]) -> Any:
    """Session confs for the block (a query keeps those it started with), then restored."""
    before = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _rows(rows: list[Any]) -> str:
    return repr(sorted(repr(tuple(r)) for r in rows))[:3000]


def _headline(exc: BaseException) -> str:
    return str(exc).strip().split("\n")[0][:500]


def _trace(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = "".join(traceback.format_exception(exc))
    return textwrap.shorten(str(exc), 600) + "\n" + text[-1500:]


def _wait_all(engines: list[Engine]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(engines))) as pool:
        list(pool.map(lambda e: e.wait(), engines))


def run_scenarios(spark: Any, ls: Any, root: Path, scenarios: list[Scenario]) -> dict[int, str]:
    """Run the scenarios side by side, step by step; the failure message of each seed that
    differs (an empty dict when all agree)."""
    runs = [Run(sc, spark, ls, root) for sc in scenarios]
    try:
        for run in runs:
            run.start()
        for step in range(max(sc.n_steps for sc in scenarios)):
            active = [r for r in runs if not r.done and step < r.scenario.n_steps]
            # Several source directories cannot get a step's files at one instant: those
            # queries are stopped while the files are written (their next run's first
            # trigger sees them all); some others restart here once.
            paused = [
                r
                for r in active
                if r.scenario.multi_source
                or r.scenario.restart_before == step
                or r.scenario.trigger == "availableNow"
            ]
            for run in paused:
                for e in run.engines:
                    e.stop()
            for run in active:
                for src in run.scenario.sources:
                    src.write(run.root / "in", step, run.scenario.fmt)
            for run in paused:
                for e in run.engines:
                    e.start()
                if run.native.start_error or run.lockgate.start_error:
                    run.fail(
                        f"restart before step {step} failed: {run.native.start_error or run.lockgate.start_error}"
                    )
            _wait_all([e for r in active if not r.done for e in r.engines])
            for run in active:
                if not run.done:
                    run.check(step)
    finally:
        for run in runs:
            if not run.done:
                STATS["ran"] += 1
            run.finish()
    return {r.scenario.seed: r.error for r in runs if r.error}


def seeds_from_env(default: list[int]) -> list[int]:
    """``LOCKGATE_FUZZ_SEEDS``: ``100-400`` (inclusive) or ``1,5,9``; ``default`` without it."""
    spec = os.environ.get("LOCKGATE_FUZZ_SEEDS")
    if not spec:
        return default
    seeds: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            seeds += range(int(lo), int(hi) + 1)
        elif part.strip():
            seeds.append(int(part))
    return seeds
