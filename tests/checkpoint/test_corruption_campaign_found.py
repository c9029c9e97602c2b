"""Damaged checkpoints that the corruption campaign (random and whole-directory damages
over many query shapes, beyond tests/checkpoint/test_corruption_fuzz.py's) found
handled wrongly, each restarted on lockgate and on native Spark.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from differential import canonical, write_json

SCHEMA = "id LONG, name STRING"


def _run(reader: Any, inp: Path, out: Path, ck: Path) -> Any:
    """A file source into a parquet file sink, one input file a batch, to the end."""
    q = (
        reader.format("json").schema(SCHEMA).option("maxFilesPerTrigger", 1).load(str(inp))
        .writeStream.format("parquet").option("path", str(out))
        .option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    )
    with contextlib.suppress(Exception):  # the query's exception, read below
        q.awaitTermination()
    return q.exception()


def _data_files(out: Path) -> list[str]:
    return sorted(str(p) for p in out.glob("part-*"))


def test_file_sink_log_deleted_fails_naming_it_instead_of_hiding_the_output(spark, ls, tmp_path):
    """The file sink's whole ``_spark_metadata`` deleted (the commits kept), then a
    restart with new input: native Spark writes the new batch's entry alone, and every
    reader of the output then fails on the missing entry 0 (the committed batches' rows
    are gone from view). lockgate used to do the same; it fails the batch naming the
    directory and the fix, and the output it committed stays as it was."""
    inp = tmp_path / "in"
    for b in range(2):
        write_json(inp, [{"id": b * 10 + i, "name": f"n{b}"} for i in range(3)])
    runs = {"native": spark.readStream, "lockgate": ls.readStream}
    for name, reader in runs.items():
        assert _run(reader, inp, tmp_path / name / "out", tmp_path / name / "ck") is None
    write_json(inp, [{"id": 99, "name": "late"}])
    committed = _data_files(tmp_path / "lockgate" / "out")
    results = {}
    for name, reader in runs.items():
        out = tmp_path / name / "out"
        shutil.rmtree(out / "_spark_metadata")
        results[name] = _run(reader, inp, out, tmp_path / name / "ck")

    # native: the restart "succeeds", and its output can no longer be read
    assert results["native"] is None
    try:
        spark.read.parquet(str(tmp_path / "native" / "out")).collect()
        native_read = None
    except Exception as exc:  # noqa: BLE001
        native_read = str(exc)
    assert native_read is not None and "_spark_metadata/0 doesn't exist" in native_read

    # lockgate: the batch fails naming the directory and the fix
    error = results["lockgate"]
    assert error is not None
    log_dir = str(tmp_path / "lockgate" / "out" / "_spark_metadata")
    assert log_dir in str(error) and "new checkpoint location" in str(error), str(error)
    # ... and writes nothing: the committed data files are all there, none added, and
    # they hold every committed row (the directory read as plain parquet files)
    assert _data_files(tmp_path / "lockgate" / "out") == committed
    rows = canonical(spark.read.schema(SCHEMA).parquet(*committed).collect())
    assert rows == canonical(spark.read.json(str(inp), schema=SCHEMA).where("id != 99").collect())
