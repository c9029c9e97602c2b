"""A checkpoint of a stateless query restarted with a stateful one: Spark refuses it as
the first batch is planned (STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY), and so
does lockgate, with the same message, raised as the same PySpark exception class (the
captured StreamingQueryException that code written for native Spark catches)."""

from __future__ import annotations

import pytest
from differential import available_now_batches, write_json
from pyspark.errors.exceptions.captured import (
    StreamingQueryException as CapturedStreamingQueryException,
)
from pyspark.sql import functions as F


def _run(reader, inp, checkpoint, build):
    return available_now_batches(build(reader.schema("k STRING, v LONG").json(str(inp))), checkpoint, "update")


def test_stateful_query_on_a_stateless_checkpoint_fails_as_in_spark(spark, ls, tmp_path):
    failures = {}
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        inp, checkpoint = tmp_path / f"in-{name}", tmp_path / f"ck-{name}"
        write_json(inp, [{"k": "a", "v": 1}])
        assert _run(reader, inp, checkpoint, lambda df: df.select("k", "v")) == [(0, [("a", 1)])]
        write_json(inp, [{"k": "a", "v": 2}])
        with pytest.raises(CapturedStreamingQueryException) as info:
            _run(reader, inp, checkpoint, lambda df: df.groupBy("k").agg(F.sum("v").alias("s")))
        failures[name] = info.value
    for exc in failures.values():
        assert exc.getCondition() == "STREAM_FAILED"
    native, lockgate = (str(failures[n].getMessageParameters()["message"]) for n in ("native", "lockgate"))
    assert native.startswith("[STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY] Cannot restart")
    assert lockgate == native, repr(native)
