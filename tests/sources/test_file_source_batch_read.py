"""How the file source reads a batch's files: as Spark's FileStreamSource does, through
the format's relation resolved without checking that the files exist. So a file of a
logged batch that is gone when the batch runs again (after a restart) is skipped, on
native Spark and on lockgate alike, and the other files of the batch are read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from differential import available_now_batches, write_json

from lockgate.sources.file.source import _Relations


def _run_available_now(reader, inp: Path, checkpoint: Path) -> list[tuple[int, list[int]]]:
    """Each batch's id and its ids, from foreachBatch."""
    df = reader.schema("id LONG").json(str(inp))
    return available_now_batches(df, checkpoint, rows=lambda batch: sorted(r.id for r in batch.collect()))


def test_a_logged_file_deleted_before_its_batch_runs_again_is_skipped_like_spark(spark, ls, tmp_path):
    inp = tmp_path / "in"
    first = write_json(inp, [{"id": 1}, {"id": 2}])
    write_json(inp, [{"id": 3}])
    engines = (("native", spark.readStream), ("lockgate", ls.readStream))
    for name, reader in engines:
        checkpoint = tmp_path / f"ck-{name}"
        assert _run_available_now(reader, inp, checkpoint) == [(0, [1, 2, 3])]
        # batch 0 is committed; make it run again after a restart, its first file gone
        shutil.rmtree(checkpoint / "commits")
        (checkpoint / "commits").mkdir()
    first.unlink()
    again = {name: _run_available_now(reader, inp, tmp_path / f"ck-{name}") for name, reader in engines}
    assert again["native"] == [(0, [3])]
    assert again["lockgate"] == again["native"]


def test_batches_are_read_through_the_relation_not_the_reader(spark, ls, tmp_path, monkeypatch):
    """The relation path is the one taken on this Spark (the reader is the fallback)."""
    inp = tmp_path / "in"
    write_json(inp, [{"id": 7}])
    reads = []
    original = _Relations.read
    monkeypatch.setattr(_Relations, "read", lambda self, paths: reads.append(paths) or original(self, paths))
    assert _run_available_now(ls.readStream, inp, tmp_path / "ck") == [(0, [7])]
    assert len(reads) == 1 and len(reads[0]) == 1


@pytest.mark.parametrize("option", ["modifiedAfter", "modifiedBefore"])
def test_modification_time_filters_are_refused_like_spark(spark, ls, tmp_path, option):
    """Batch reads' file filters: Spark's file stream source refuses them (the query fails
    as it starts); so does lockgate, with Spark's message and what to use instead."""
    inp = tmp_path / "in"
    write_json(inp, [{"id": 1}])
    messages = {}
    for name, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        with pytest.raises(Exception) as info:  # each engine's own exception type
            query = (
                reader.schema("id LONG")
                .option(option, "2000-01-01T00:00:00")
                .json(str(inp))
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
                .start()
            )
            query.processAllAvailable()
        messages[name] = str(info.value)
    expected = f"option '{option.lower()}' is not allowed in file stream sources"
    assert expected in messages["native"]
    assert expected in messages["lockgate"] and "maxFileAge" in messages["lockgate"]
