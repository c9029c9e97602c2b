"""Structs with duplicated field names (``struct(ts, ts)``, two aliases ``x``) through
every stateful operator, against native Spark.

Arrow refuses such a struct (Spark's DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT), and every
state step of lockgate is an Arrow step; native Spark keeps them in UnsafeRows. The
struct crosses into the state step under unique names and comes back under Spark's
(``lockgate/state/arrow_types.py``, ``unique_field_names``). Each pair is compared with
native Spark batch by batch (rows in their order inside arrays, the batch ids, input
rows, watermark and state metrics) and by the schema of every batch, the output struct's
field names included; both queries restart from their checkpoints in the middle. The
operators: aggregation (values, keys, windows, session windows), dropDuplicates (also of
arrays and maps of such structs), limit and stream-stream joins. The state schema file
keeps Spark's field names, and the state reader shows them. ``applyInPandasWithState``
sends its rows to the user's function through Arrow in Spark too, and fails there on
both engines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from differential import SCHEMA, Side, ev, exact_batches
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

STEPS = [
    [ev(1, "a", 1.0), ev(2, "a", 3.0), ev(3, "b", 2.0)],
    [ev(4, "a", 2.0), ev(12, "b", 5.0), ev(13, "c", None)],
    [ev(25, "c", 4.0), ev(5, "a", 9.0), ev(26, "b", 2.0)],  # 5: late once the watermark passes it
    [ev(41, "a", 1.0), ev(42, "a", 7.0), ev(43, None, 1.0)],
]
RESTART_BEFORE_STEP = 2


def _source(reader: Any, inp: Path) -> Any:
    return reader.schema(SCHEMA).json(str(inp))


def _twice(column: str, alias: str | None = None) -> Any:
    """``struct(column, column)``: two fields named ``alias`` (default: the column's)."""
    field = F.col(column) if alias is None else F.col(column).alias(alias)
    return F.struct(field, field)


def aggregate_values(reader: Any, inp: Path) -> Any:
    """Such structs as aggregated values: buffers and results of max, min, first and
    collect_list (an array of them)."""
    return (
        _source(reader, inp)
        .groupBy("k")
        .agg(
            F.max(_twice("ts")).alias("latest"),
            F.min(F.struct(F.col("v").alias("x"), F.col("k").alias("x"))).alias("least"),
            F.first(_twice("v")).alias("some"),
            F.collect_list(_twice("v", "x")).alias("all"),
        )
    )


def aggregate_key(reader: Any, inp: Path) -> Any:
    """Such a struct as the grouping key (a nullable one and one that cannot be null)."""
    df = _source(reader, inp).withColumn("g", F.struct(F.col("k").alias("x"), F.col("v").alias("x")))
    return df.groupBy("g", F.struct(F.lit(1).alias("y"), F.lit(2).alias("y")).alias("c")).count()


def windowed_aggregate(reader: Any, inp: Path) -> Any:
    """Append mode: rows emitted and state evicted by the watermark."""
    df = _source(reader, inp).withWatermark("ts", "10 seconds")
    return df.groupBy(F.window("ts", "10 seconds")).agg(F.max(_twice("v")).alias("m"))


def session_window(reader: Any, inp: Path) -> Any:
    df = _source(reader, inp).withWatermark("ts", "10 seconds")
    return df.groupBy(F.session_window("ts", "5 seconds"), "k").agg(F.max(_twice("v")).alias("m"))


def dedup(reader: Any, inp: Path) -> Any:
    df = _source(reader, inp).select(_twice("k", "x").alias("s"), "v")
    return df.dropDuplicates(["s"])


def dedup_with_watermark(reader: Any, inp: Path) -> Any:
    """The key with an event time, evicted by the watermark; the struct's fields are
    taken from the column of the key."""
    df = _source(reader, inp).withWatermark("ts", "10 seconds")
    return df.select(_twice("k", "x").alias("s"), "ts", "v").dropDuplicates(["s", "ts"])


def nested_dedup(reader: Any, inp: Path) -> Any:
    """An array of such structs, and a map to one, as the key and a value."""
    df = _source(reader, inp).select(
        F.array(_twice("k", "x"), _twice("k", "x")).alias("arr"),
        F.create_map(F.lit("m"), F.struct(F.col("v").alias("y"), F.col("k").alias("y"))).alias("m"),
    )
    return df.dropDuplicates(["arr"])


def limit(reader: Any, inp: Path) -> Any:
    return _source(reader, inp).select(_twice("k", "x").alias("s"), "v").limit(4)


QUERIES = {
    "aggregate_values": (aggregate_values, "update"),
    "aggregate_key": (aggregate_key, "complete"),
    "windowed_aggregate": (windowed_aggregate, "append"),
    "session_window": (session_window, "append"),
    "dedup": (dedup, "append"),
    "dedup_with_watermark": (dedup_with_watermark, "append"),
    "nested_dedup": (nested_dedup, "append"),
    "limit": (limit, "append"),
}


def _record_schemas(side: Side) -> list[Any]:
    """Keep every batch's column names and types (nested field names included, not
    their nullability: lockgate's collect_list is not nullable where native's batch
    says it is, a difference of its own) as well as its rows (foreachBatch sink)."""
    schemas: list[Any] = []

    def collect(df: Any, batch_id: int) -> None:
        schemas.append((batch_id, df.schema.simpleString()))
        side.batches.append((batch_id, df.collect()))

    side._collect = collect  # type: ignore[method-assign]
    return schemas


def _check(bench: Any, schemas: dict[str, tuple[list[Any], list[Any]]]) -> None:
    for pair in bench.pairs:
        assert any(rows for _, rows in pair.native.batches), f"{pair.name} should emit rows"
        assert exact_batches(pair.lockgate.batches) == exact_batches(pair.native.batches), pair.name
        native, lockgate = schemas[pair.name]
        assert lockgate == native, pair.name


def test_stateful_operators_match_native(bench, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    schemas = {}
    for name, (query, mode) in QUERIES.items():
        pair = bench.add(name, lambda reader, q=query: q(reader, inp), mode, sink="foreachBatch")
        schemas[name] = (_record_schemas(pair.native), _record_schemas(pair.lockgate))
    bench.run_steps(tmp_path, [("in", rows) for rows in STEPS], RESTART_BEFORE_STEP)
    _check(bench, schemas)
    for name in ("windowed_aggregate", "session_window", "dedup_with_watermark"):
        pair = next(p for p in bench.pairs if p.name == name)
        removed = [op[-1] for _, _, _, ops in pair.native.progress() for op in ops]
        assert sum(removed) > 0, f"{name}: state should have been evicted by the watermark"


# -- stream-stream joins --------------------------------------------------------------------
JOIN_SCHEMA = "id LONG, t TIMESTAMP, v STRING"


def _join_side(reader: Any, inp: Path, suffix: str) -> Any:
    df = reader.schema(JOIN_SCHEMA).json(str(inp)).withWatermark("t", "10 seconds")
    return df.select(
        F.col("id").alias(f"id{suffix}"),
        F.col("t").alias(f"t{suffix}"),
        F.struct(F.col("v").alias("x"), F.col("id").alias("x")).alias(f"s{suffix}"),
        F.array(_twice("v")).alias(f"arr{suffix}"),
    )


def _join_condition(left: Any, right: Any) -> Any:
    return (left.id == right.id2) & (right.t2 >= left.t) & (right.t2 <= left.t + F.expr("interval 5 seconds"))


def inner_join(reader: Any, a: Path, b: Path) -> Any:
    left, right = _join_side(reader, a, ""), _join_side(reader, b, "2")
    return left.join(right, _join_condition(left, right))


def left_outer_join(reader: Any, a: Path, b: Path) -> Any:
    """Unmatched left rows null-padded when the watermark evicts them."""
    left, right = _join_side(reader, a, ""), _join_side(reader, b, "2")
    return left.join(right, _join_condition(left, right), "left_outer")


def struct_key_join(reader: Any, a: Path, b: Path) -> Any:
    """Such a struct as the equality key."""
    left, right = _join_side(reader, a, ""), _join_side(reader, b, "2")
    return left.join(right, (left.s == right.s2) & (right.t2 >= left.t) & (right.t2 <= left.t + F.expr("interval 5 seconds")))


def _jr(sec: int, id_: int, v: str) -> dict[str, Any]:
    return {"t": f"2024-01-01T00:00:{sec:02d}", "id": id_, "v": v}


JOIN_STEPS = [
    ("a", [_jr(1, 1, "p"), _jr(2, 2, "q"), _jr(3, 3, "r")]),
    ("b", [_jr(2, 1, "p"), _jr(4, 2, "z"), _jr(30, 9, "w")]),
    ("a", [_jr(31, 9, "w"), _jr(32, 4, "s")]),
    ("b", [_jr(33, 9, "w"), _jr(50, 4, "s")]),
]


@pytest.fixture
def join_bench(no_json_filter_pushdown, bench):
    """The shared ``bench`` (tests/conftest.py), with the JSON filter pushdown off first."""
    return bench


def test_stream_joins_match_native(join_bench, tmp_path):
    bench = join_bench
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    schemas = {}
    for name, query in (("inner", inner_join), ("left_outer", left_outer_join), ("struct_key", struct_key_join)):
        pair = bench.add(name, lambda reader, q=query: q(reader, a, b), sink="foreachBatch")
        schemas[name] = (_record_schemas(pair.native), _record_schemas(pair.lockgate))
    bench.run_steps(tmp_path, JOIN_STEPS, 2)
    _check(bench, schemas)
    outer = next(p for p in bench.pairs if p.name == "left_outer")
    assert any(r.id2 is None for _, rows in outer.native.batches for r in rows), "no null-padded row"


# -- explicit state: the rows reach the user's function -------------------------------------
def test_apply_in_pandas_with_state_fails_as_native(spark, ls, tmp_path):
    """Spark sends the user's function its rows through Arrow and fails such a struct
    there; lockgate does not rename it for the function, and fails alike."""
    import pandas as pd

    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "1.json").write_text("\n".join(json.dumps(r) for r in STEPS[0]) + "\n")

    def count(key: Any, frames: Any, state: Any) -> Any:
        yield pd.DataFrame({"k": [key[0]], "n": [sum(len(f) for f in frames)]})

    errors = []
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        df = _source(reader, inp).select("k", _twice("v", "x").alias("s"))
        query = (
            df.groupBy("k")
            .applyInPandasWithState(count, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout)
            .writeStream.outputMode("update")
            .foreachBatch(lambda batch, _: batch.collect())
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
        with pytest.raises(Exception, match=r"DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT") as failed:
            query.processAllAvailable()
        errors.append(failed.value)
    assert "got [x, x]" in str(errors[1])


# -- the state in the checkpoint ------------------------------------------------------------
def test_state_schema_file_and_reader_keep_spark_names(spark, ls, tmp_path):
    """The state schema file shows the struct under Spark's names, as a person reads it,
    and the statestore reader gives native's rows and schema."""
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "1.json").write_text("\n".join(json.dumps(r) for r in STEPS[0]) + "\n")
    checkpoints = {}
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        checkpoints[name] = str(tmp_path / name)
        query = (
            _source(reader, inp)
            .groupBy("k")
            .agg(F.max(_twice("ts")).alias("latest"))
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", checkpoints[name])
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    stored = json.loads(Path(checkpoints["lockgate"], "state", "0", "_metadata", "schema").read_text())
    (value,) = stored["valueFields"]
    assert [f["name"] for f in value["type"]["struct"]] == ["ts", "ts"]
    assert "ts: timestamp" in stored["valueSchema"][0][1] and "#" not in stored["valueSchema"][0][1]
    native = spark.read.format("statestore").load(checkpoints["native"])
    ours = ls.read.format("statestore").load(checkpoints["lockgate"])
    assert ours.schema == native.schema
    assert sorted(map(repr, ours.collect())) == sorted(map(repr, native.collect()))
