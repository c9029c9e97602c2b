"""transformWithStateInPandas against native Spark: how a key's rows are cut into
DataFrames (Spark's Arrow batch limits), state whose value fields share the grouping
key's name, and value schemas that evolve on a restart under
``spark.sql.streaming.stateStore.encodingFormat=avro`` (Spark's Avro schema resolution).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from differential import spark_conf, write_json
from explicit_state_runs import ROCKSDB, Run
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor

from lockgate.state.schema import avro_evolvable, spark_type_string
from lockgate.state.store import StateStore, StateStoreConf, clear_cache, evolve_array

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ChunkCounter(StatefulProcessor):
    """Reports how many DataFrames each key's rows came in, and their sizes."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        sizes = [len(pdf) for pdf in rows]
        yield pd.DataFrame({"k": [key[0]], "chunks": [len(sizes)], "sizes": [",".join(map(str, sizes))]})

    def close(self) -> None:
        pass


def _chunk_run(spark: Any, ls: Any, tmp_path: Any) -> Run:
    return Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("k").transformWithStateInPandas(
            ChunkCounter(), "k string, chunks int, sizes string", "Update", "None"
        ),
        "update", "k STRING, v LONG",
    )


@pytest.mark.parametrize(
    ("conf", "chunks_of_five"),
    [
        ({"spark.sql.execution.arrow.maxRecordsPerBatch": "2"}, 3),
        ({"spark.sql.execution.arrow.maxRecordsPerBatch": "-1"}, 1),
        ({"spark.sql.execution.arrow.maxBytesPerBatch": "2"}, 5),
    ],
    ids=["records-2", "records-unlimited", "bytes-2"],
)
def test_a_keys_rows_come_in_dataframes_cut_as_sparks(spark, ls, tmp_path, conf, chunks_of_five):
    """``handleInputRows`` gets a key's rows in DataFrames of at most
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (and about
    ``maxBytesPerBatch`` bytes), as pyspark's worker cuts them."""
    run = _chunk_run(spark, ls, tmp_path)
    with ExitStack() as stack:
        for key, value in conf.items():
            stack.enter_context(spark_conf(spark, key, value))
        run.start()
        run.step([{"k": "a", "v": i} for i in range(5)] + [{"k": "b", "v": 1}])
        run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "b", "v": 3}])
        run.stop()
    chunks = {r["k"]: r["chunks"] for r in run.batches["lockgate"][0][1]}
    assert chunks["a"] == chunks_of_five  # the five rows of key a in the first batch


class SameNames(StatefulProcessor):
    """Keyed by ``id`` and keeping a value state whose fields are ``id`` and ``n``."""

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("state", "id string, n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        old = self.state.get()
        n = (old[1] if old else 0) + sum(len(pdf) for pdf in rows)
        self.state.update((f"{key[0]}!", n))
        yield pd.DataFrame({"id": [key[0]], "seen": [old[0] if old else None], "n": [n]})

    def close(self) -> None:
        pass


def test_a_value_field_may_share_the_grouping_keys_name(spark, ls, tmp_path):
    """The grouping key ``id`` and a state field ``id``: kept apart, read back from the
    files after a restart as native Spark reads its own."""
    run = Run(
        spark, ls, tmp_path,
        lambda df: df.groupBy("id").transformWithStateInPandas(
            SameNames(), "id string, seen string, n long", "Update", "None"
        ),
        "update", "id STRING, v LONG",
    )
    run.start()
    run.step([{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "a", "v": 3}])
    run.stop()
    run.start()
    run.step([{"id": "a", "v": 4}, {"id": "c", "v": 5}])
    run.stop()


def test_a_store_keeps_a_key_and_a_value_of_the_same_name_from_its_files(tmp_path):
    """The store of a transformWithState variable holds its keys under reserved names:
    a key and a value field named alike load back from the files (no worker cache)."""
    from lockgate.state.schema import variable_store_keys

    conf = StateStoreConf(
        root=str(tmp_path / "state"),
        operator_id=0,
        num_partitions=1,
        key_schema=variable_store_keys(pa.schema([pa.field("id", pa.string())])),
        value_schema=pa.schema([pa.field("id", pa.string()), pa.field("n", pa.int64())]),
        store_name="state",
    )
    store = StateStore(conf, 0, 0)
    store.put(("a",), ("a!", 1))
    store.put(("b",), ("b!", 2))
    store.commit()
    clear_cache()
    assert dict(StateStore(conf, 0, 1).items()) == {("a",): ("a!", 1), ("b",): ("b!", 2)}


# -- value schemas evolving under Avro encoding -------------------------------------------------
class Shaped(StatefulProcessor):
    """A value state ``state`` of the given schema; each row sets it from the row's
    value, and the output shows the state as it was before."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("state", self.schema)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        v = max(int(x) for pdf in rows for x in pdf["v"])
        old = self.state.get()
        shown = None if old is None else repr(tuple(old))  # in the order of this run's schema
        new = {"id": v, "name": f"name-{v}", "count": v * 10, "active": v % 2 == 0, "score": v / 2}
        names = [f.split()[0] for f in self.schema.split(",")]
        self.state.update(tuple(new[n] for n in names))
        yield pd.DataFrame({"k": [key[0]], "before": [shown]})

    def close(self) -> None:
        pass


def _shaped(schema: str) -> Any:
    return lambda df: df.groupBy("k").transformWithStateInPandas(Shaped(schema), "k string, before string", "Update", "None")


def test_value_schemas_evolve_under_avro_as_in_spark(spark, ls, tmp_path):
    """Fields added (read as null), removed, reordered and widened (int to long, float
    to double) across restarts: each restarted query reads the earlier state as
    native Spark's does."""
    run = Run(spark, ls, tmp_path, _shaped("id int, name string"), "update", "k STRING, v LONG")
    with spark_conf(spark, "spark.sql.streaming.stateStore.encodingFormat", "avro"):
        run.start()
        run.step([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
        run.stop()
        for schema in (
            "id int, name string, count int, active boolean, score float",  # added
            "id int, name string, score float",  # removed
            "score float, name string, id int",  # reordered
            "id long, name string, score double",  # widened
        ):
            run.build = _shaped(schema)
            run.start()
            run.step([{"k": "a", "v": 3}, {"k": "c", "v": 4}])
            run.step([{"k": "b", "v": 5}])
            run.stop()
    shown = [r["before"] for _, rows in run.batches["lockgate"] for r in rows if r["before"]]
    assert "(1, 'name-1', None, None, None)" in shown, shown  # fields added: null
    # the state, files of every schema it had, read back as Spark's reader reads native's
    with spark_conf(spark, "spark.sql.streaming.stateStore.encodingFormat", "avro"):
        native = spark.read.format("statestore").option("stateVarName", "state").load(str(tmp_path / "native" / "ck"))
        mine = ls.read.format("statestore").option("stateVarName", "state").load(str(tmp_path / "lockgate" / "ck"))
        assert mine.schema == native.schema
        assert sorted(map(repr, mine.collect())) == sorted(map(repr, native.collect()))


def _failure(run: Run, engine: str, reader: Any) -> str:
    with spark_conf(run.spark, "spark.sql.streaming.stateStore.providerClass", ROCKSDB):
        run._start(engine, reader)
    with pytest.raises(Exception) as info:
        run.queries[engine].processAllAvailable()
    run.queries.pop(engine).stop()
    return str(info.value)


@pytest.mark.parametrize(
    ("first", "then", "conf", "error"),
    [
        ("id long, name string", "id int, name string", {}, "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"),
        ("id int, name string", "id string, name string", {}, "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION"),
        (
            "id int, name string",
            "id long, name string",
            {"spark.sql.streaming.stateStore.valueStateSchemaEvolutionThreshold": "0"},
            "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
        ),
    ],
    ids=["narrowed", "other-type", "threshold"],
)
def test_a_value_schema_avro_cannot_resolve_fails_the_restart_as_in_spark(spark, ls, tmp_path, first, then, conf, error):
    run = Run(spark, ls, tmp_path, _shaped(first), "update", "k STRING, v LONG")
    with ExitStack() as stack:
        stack.enter_context(spark_conf(spark, "spark.sql.streaming.stateStore.encodingFormat", "avro"))
        for key, value in conf.items():
            stack.enter_context(spark_conf(spark, key, value))
        run.start()
        run.step([{"k": "a", "v": 1}])
        run.stop()
        run.build = _shaped(then)
        write_json(run.input, [{"k": "a", "v": 2}])
        errors = {engine: _failure(run, engine, reader) for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream))}
    assert f"[{error}]" in errors["native"], errors["native"][:3000]
    assert f"[{error}]" in errors["lockgate"], errors["lockgate"]
    if error == "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION":
        assert "Schema evolution is not possible" in errors["lockgate"]
    else:
        assert re.search(r"evolutions 1 exceeds .* 0, .* column family: state\b", errors["lockgate"]), errors["lockgate"]


def test_a_value_schema_change_without_avro_still_fails_as_in_spark(spark, ls, tmp_path):
    run = Run(spark, ls, tmp_path, _shaped("id int, name string"), "update", "k STRING, v LONG")
    run.start()
    run.step([{"k": "a", "v": 1}])
    run.stop()
    run.build = _shaped("id long, name string")
    write_json(run.input, [{"k": "a", "v": 2}])
    errors = {engine: _failure(run, engine, reader) for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream))}
    assert "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE]" in errors["native"], errors["native"][:3000]
    assert "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE]" in errors["lockgate"], errors["lockgate"]


def test_avro_resolution_rules():
    s = lambda *fields: pa.struct([pa.field(n, t) for n, t in fields])
    old = s(("id", pa.int32()), ("name", pa.string()))
    assert avro_evolvable(old, s(("name", pa.string()), ("id", pa.int64()), ("extra", pa.bool_())))
    assert avro_evolvable(old, s(("name", pa.string())))
    assert not avro_evolvable(s(("id", pa.int64())), s(("id", pa.int32())))
    assert not avro_evolvable(old, s(("id", pa.string())))
    assert avro_evolvable(pa.list_(s(("x", pa.float32()))), pa.list_(s(("x", pa.float64()), ("y", pa.string()))))
    assert spark_type_string(old) == "StructType(StructField(id,IntegerType,true),StructField(name,StringType,true))"
    # a file's column read as the evolved type: by name, missing fields null, widened
    array = pa.array([{"id": 1, "name": "a"}, None, {"id": 3, "name": None}], type=old)
    target = s(("name", pa.string()), ("id", pa.int64()), ("extra", pa.bool_()))
    assert evolve_array(array, target).to_pylist() == [
        {"name": "a", "id": 1, "extra": None},
        None,
        {"name": None, "id": 3, "extra": None},
    ]
    lists = pa.array([[{"x": 1.5}], None, []], type=pa.list_(s(("x", pa.float32()))))
    assert evolve_array(lists, pa.list_(s(("x", pa.float64()), ("y", pa.string())))).to_pylist() == [
        [{"x": 1.5, "y": None}],
        None,
        [],
    ]


# -- Spark's state-metadata source, and state read inside foreachBatch ------------------------
class Declares(StatefulProcessor):
    """A value, a list (with TTL) and a map state, and event-time timers."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "v long")
        self.last = handle.getMapState("last", "v long", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        vs = [int(v) for pdf in rows for v in pdf["v"]]
        n = (self.count.get() or (0,))[0] + len(vs)
        self.count.update((n,))
        self.seen.appendList([(v,) for v in vs])
        self.last.updateValue((vs[-1],), (n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    def close(self) -> None:
        pass


@pytest.mark.parametrize("time_mode", ["None", "EventTime"])
def test_state_metadata_of_a_transform_with_state_query_reads_as_natives(spark, ls, tmp_path, time_mode):
    """``format("state-metadata")`` over lockgate's checkpoint gives native's rows for
    native's checkpoint, ``operatorProperties`` (time mode, output mode, state variables
    and timers as Spark's JSON) included; and a ``foreachBatch`` function reading its own
    query's state through ``batch_df.sparkSession.read`` reads lockgate's state."""
    import json

    def build(df: Any) -> Any:
        if time_mode == "EventTime":
            df = df.withWatermark("ts", "5 seconds")
        return df.groupBy("k").transformWithStateInPandas(Declares(), "k string, n long", "Update", time_mode)

    run = Run(spark, ls, tmp_path, build, "update", "ts TIMESTAMP, k STRING, v LONG")
    run.start()
    run.step([{"ts": "2024-01-01T00:00:10", "k": "a", "v": 1}, {"ts": "2024-01-01T00:00:12", "k": "b", "v": 2}])
    run.step([{"ts": "2024-01-01T00:00:20", "k": "a", "v": 3}])
    run.stop()
    native_ck, mine_ck = str(tmp_path / "native" / "ck"), str(tmp_path / "lockgate" / "ck")
    native = spark.read.format("state-metadata").load(native_ck)
    mine = ls.read.format("state-metadata").load(mine_ck)
    assert mine.schema == native.schema
    expected, got = _metadata_rows(native), _metadata_rows(mine)
    assert got == expected, json.dumps([got, expected])

    # the same reads from inside a foreachBatch function, through the batch's session
    # (Spark's own readers there would fail on lockgate's state files)
    def read_back(df: Any, batch_id: int) -> None:
        session = df.sparkSession
        seen.append(_metadata_rows(session.read.format("state-metadata").load(mine_ck)))
        seen.append(sorted(map(repr, session.read.format("statestore").option("stateVarName", "count").load(mine_ck).collect())))

    seen: list[Any] = []
    inp = tmp_path / "in2"
    write_json(inp, [{"ts": "2024-01-01T00:00:30", "k": "c", "v": 1}])
    q = (
        build(ls.readStream.schema(run.schema).json(str(inp))).writeStream.outputMode("update")
        .option("checkpointLocation", str(tmp_path / "lockgate" / "ck2"))
        .foreachBatch(read_back).start()
    )
    q.processAllAvailable()
    q.stop()
    outside = ls.read.format("statestore").option("stateVarName", "count").load(mine_ck).collect()
    assert seen[:2] == [got, sorted(map(repr, outside))], seen
    assert len(outside) == 2


def _metadata_rows(df: Any) -> list[dict[str, Any]]:
    """The rows of the state-metadata source, the properties parsed (Spark lists the
    state variables in the order of a hash map of their names: sorted by name here)."""
    import json

    rows = [r.asDict() for r in df.collect()]
    for row in rows:
        if row["operatorProperties"] is not None:
            row["operatorProperties"] = json.loads(row["operatorProperties"])
            row["operatorProperties"]["stateVariables"].sort(key=lambda v: v["stateName"])
    return rows


def test_a_state_schema_with_a_non_nullable_field_fails_under_avro_as_in_spark(spark, ls, tmp_path):
    """Under Avro encoding Spark requires every field of a state variable's schema to be
    nullable (TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE), naming the variable and the
    schema; lockgate refuses it with the same message."""
    run = Run(spark, ls, tmp_path, _shaped("id int not null, name string"), "update", "k STRING, v LONG")
    write_json(run.input, [{"k": "a", "v": 1}])
    with spark_conf(spark, "spark.sql.streaming.stateStore.encodingFormat", "avro"):
        errors = {engine: _failure(run, engine, reader) for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream))}
    pattern = r"\[TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE\][^\n]*?SQLSTATE: XXKST"
    native, lockgate = (re.search(pattern, errors[e].replace("\n", " ")) for e in ("native", "lockgate"))
    assert native is not None, errors["native"][:3000]
    assert "column family state" in native.group(0) and "StructField(id,IntegerType,false)" in native.group(0)
    assert lockgate is not None and lockgate.group(0) == native.group(0), errors["lockgate"]
