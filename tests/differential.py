"""Differential harness: run one streaming query on native Spark (the oracle) and on lockgate.

Typical use (see tests/test_differential.py)::

    inp = tmp_path / "in"; inp.mkdir()
    d = Differential(spark, ls, tmp_path, lambda rs: rs.schema("a LONG").json(str(inp)))
    write_json(inp, [{"a": 1}])
    d.run()                 # start both queries, process everything, compare
    write_json(inp, [{"a": 2}])
    d.run()
    d.restart()             # stop both; the next run() restarts them from their checkpoints
    d.stop()

``query_fn(reader)`` builds the query from a stream reader: ``spark.readStream`` for the
native side, ``ls.readStream`` for lockgate. Sinks: ``"memory"``, ``"foreachBatch"``
(every batch collected into a Python list), ``"parquet"`` (read back with
``spark.read.parquet``). ``trigger`` is the keyword of ``writeStream.trigger`` as a dict,
e.g. ``{"availableNow": True}``; ``None`` is the default trigger.

After every :meth:`Differential.run` both sides must agree on: the sink's rows (as a
multiset), the rows of each batch and the batch ids (foreachBatch), the
``(batchId, numInputRows)`` of every batch reported in progress since the last run, and
the ``numInputRows`` of the run's last batch (``lastProgress`` without Spark's reports of
idle triggers, whose timing is not deterministic).

The default trigger keeps both queries polling while files are written: write one file
per step, or write files before the first ``run()``, so that batch boundaries do not
depend on timing. With ``once``/``availableNow`` each ``run()`` starts both queries from
their checkpoints and waits for them to end, which is deterministic.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TIMEOUT_S = 180

# Input files get strictly increasing whole-second modification times, so both engines
# order them the same way (by mtime, oldest first or latestFirst).
_file_counter = itertools.count()
_BASE_MTIME = int(time.time()) - 86_400


def _publish(directory: Path | str, suffix: str, write: Callable[[Path], None]) -> Path:
    """Write a uniquely named file through a hidden temp name (skipped by both engines),
    set its mtime, then rename it into place."""
    temp, final = _stage(directory, suffix, write)
    os.rename(temp, final)
    return final


def _stage(directory: Path | str, suffix: str, write: Callable[[Path], None]) -> tuple[Path, Path]:
    """Write a file under its hidden temp name; returns (temp, final name)."""
    n = next(_file_counter)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"f{n:05d}-{uuid.uuid4().hex[:8]}{suffix}"
    temp = directory / f".{final.name}.tmp"
    write(temp)
    os.utime(temp, (_BASE_MTIME + n, _BASE_MTIME + n))
    return temp, final


def _lines(lines: Iterable[str]) -> str:
    return "".join(line + "\n" for line in lines)


def write_json(directory: Path | str, rows: Iterable[dict[str, Any] | str]) -> Path:
    """One JSON-lines file; a ``str`` row is written as is (e.g. a malformed line)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return _publish(directory, ".json", lambda p: p.write_text(_lines(lines)))


def write_json_together(files: dict[Path, list[dict[str, Any]]]) -> None:
    """One JSON-lines file per directory, all written first and then renamed into place
    back to back. A running query that reads several of the directories can still list
    one before its rename and another after: stop it while the files are written (see
    ``Pair.restart_each_step`` in tests/test_stateful.py) if its batches must not split."""
    staged = [
        _stage(d, ".json", lambda p, r=rows: p.write_text(_lines(json.dumps(x) for x in r)))
        for d, rows in files.items()
    ]
    for temp, final in staged:
        os.rename(temp, final)


def write_csv(
    directory: Path | str, rows: Iterable[Iterable[Any]], header: list[str] | None = None
) -> Path:
    def write(p: Path) -> None:
        with open(p, "w", newline="") as f:
            out = csv.writer(f)
            if header is not None:
                out.writerow(header)
            out.writerows(rows)

    return _publish(directory, ".csv", write)


def write_text(directory: Path | str, lines: Iterable[str]) -> Path:
    lines = list(lines)
    return _publish(directory, ".txt", lambda p: p.write_text(_lines(lines)))


def write_parquet(directory: Path | str, rows: list[dict[str, Any]], schema: Any = None) -> Path:
    """One parquet file written with pyarrow; ``schema`` is an optional ``pyarrow.Schema``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    return _publish(directory, ".parquet", lambda p: pq.write_table(table, str(p)))


def canonical(rows: Iterable[Any]) -> list[str]:
    """Rows as a sorted list of reprs: equal lists mean equal multisets of rows."""
    return sorted(repr(tuple(r)) for r in rows)


class _Side:
    """One engine's query: how to start it, and what it produced."""

    def __init__(self, diff: Differential, name: str, reader: Callable[[], Any]) -> None:
        self.diff = diff
        self.name = name
        self.reader = reader
        self.root = diff.root / name
        self.checkpoint = str(self.root / "checkpoint")
        self.output = str(self.root / "output")
        self.table = f"diff_{name}_{uuid.uuid4().hex[:12]}"
        self.query: Any = None
        self.starts = 0
        self.batches: list[tuple[int, list[Any]]] = []
        self.progress_seen = 0

    def _collect(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, df.collect()))

    def start(self) -> None:
        d = self.diff
        if d.sink == "memory" and self.starts > 0:
            raise ValueError("Spark's memory sink (append) cannot restart from a checkpoint")
        writer = d.query_fn(self.reader()).writeStream.option("checkpointLocation", self.checkpoint)
        if d.trigger is not None:
            writer = writer.trigger(**d.trigger)
        if d.sink == "memory":
            writer = writer.format("memory").queryName(self.table)
        elif d.sink == "foreachBatch":
            writer = writer.foreachBatch(self._collect)
        elif d.sink == "parquet":
            writer = writer.format("parquet").option("path", self.output)
            if d.partition_by:
                writer = writer.partitionBy(*d.partition_by)
        else:
            raise ValueError(f"unknown sink {d.sink!r}")
        self.query = writer.start()
        self.starts += 1
        self.progress_seen = 0

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None

    def rows(self) -> list[str]:
        d = self.diff
        if d.sink == "memory":
            return canonical(d.spark.table(self.table).collect())
        if d.sink == "foreachBatch":
            return canonical(row for _, rows in self.batches for row in rows)
        if not os.path.isdir(self.output):
            return []
        from pyspark.errors import AnalysisException

        try:
            return canonical(d.spark.read.parquet(self.output).collect())
        except AnalysisException as exc:  # a sink log without any file yet
            if "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return []
            raise

    def batch_rows(self) -> list[tuple[int, list[str]]]:
        return [(batch_id, canonical(rows)) for batch_id, rows in self.batches]

    def batch_progress(self) -> list[Any]:
        """This run's progress reports of batches that ran. Spark also records a report
        for an idle trigger (no ``addBatch`` duration) now and then; those depend on
        timing, so they are left out here (see test_idle_trigger_progress)."""
        return [p for p in self.query.recentProgress if "addBatch" in p.durationMs]

    def new_progress(self) -> list[tuple[int, int]]:
        """``(batchId, numInputRows)`` of the batches reported since the last call."""
        progress = [(p.batchId, p.numInputRows) for p in self.batch_progress()]
        new, self.progress_seen = progress[self.progress_seen :], len(progress)
        return new

    def last_input_rows(self) -> int | None:
        """``numInputRows`` of this run's last batch: ``lastProgress`` unless idle."""
        progress = self.batch_progress()
        return progress[-1].numInputRows if progress else None


class Differential:
    """The same query on native Spark and on lockgate, compared after every :meth:`run`."""

    def __init__(
        self,
        spark: Any,
        ls: Any,
        root: Path | str,
        query_fn: Callable[[Any], Any],
        *,
        sink: str = "memory",
        trigger: dict[str, Any] | None = None,
        partition_by: tuple[str, ...] = (),
    ) -> None:
        self.spark = spark
        self.query_fn = query_fn
        self.sink = sink
        self.trigger = trigger
        self.partition_by = partition_by
        self.root = Path(root)
        self.native = _Side(self, "native", lambda: spark.readStream)
        self.lockgate = _Side(self, "lockgate", lambda: ls.readStream)
        self.sides = (self.native, self.lockgate)

    @property
    def _runs_to_end(self) -> bool:
        return bool(self.trigger) and ("once" in self.trigger or "availableNow" in self.trigger)

    def run(self) -> list[str]:
        """Process all available input on both sides, compare them; return the oracle's rows."""
        if self._runs_to_end:
            for side in self.sides:
                side.stop()
                side.start()  # both run at once
            for side in self.sides:
                assert side.query.awaitTermination(TIMEOUT_S), f"{side.name} query did not end"
        else:
            for side in self.sides:
                if side.query is None:
                    side.start()
            for side in self.sides:
                side.query.processAllAvailable()
        for side in self.sides:
            error = side.query.exception()
            assert error is None, f"{side.name} query failed: {error}"
        return self.check()

    def check(self) -> list[str]:
        native, lockgate = self.native, self.lockgate
        expected, got = native.rows(), lockgate.rows()
        assert got == expected, f"sink rows differ:\nnative:   {expected}\nlockgate: {got}"
        if self.sink == "foreachBatch":
            expected_batches, got_batches = native.batch_rows(), lockgate.batch_rows()
            assert got_batches == expected_batches, (
                f"batches differ:\nnative:   {expected_batches}\nlockgate: {got_batches}"
            )
        progress = native.new_progress(), lockgate.new_progress()
        assert progress[1] == progress[0], (
            f"(batchId, numInputRows) differ: native, lockgate = {progress}"
        )
        last = native.last_input_rows(), lockgate.last_input_rows()
        assert last[1] == last[0], f"lastProgress.numInputRows differ: native, lockgate = {last}"
        return expected

    def batches(self) -> list[tuple[int, list[str]]]:
        """The oracle's ``(batch_id, rows)`` so far (foreachBatch sink)."""
        return self.native.batch_rows()

    def restart(self) -> None:
        """Stop both queries; the next :meth:`run` starts them again from their checkpoints."""
        self.stop()

    def stop(self) -> None:
        for side in self.sides:
            side.stop()


def exact_batches(batches: list[tuple[int, list[Any]]]) -> list[tuple[int, list[str]]]:
    """Each ``(batch id, rows)`` with the rows as sorted reprs: arrays and maps compared
    in their order, NaN and -0.0 as they print."""
    return [(batch_id, sorted(repr(r) for r in rows)) for batch_id, rows in batches]
