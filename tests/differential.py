"""The tests' shared helpers (not a test module): differential harnesses that run queries on
native Spark (the oracle) and on lockgate, and helpers that drive a query step by step.

``tests/`` is on ``sys.path`` (it holds ``conftest.py``), so test modules anywhere under it
import these as ``from differential import ...``; the ``bench`` fixture (a :class:`Bench`)
is in ``tests/conftest.py``. Sections: :class:`Differential` (one query, below),
step-by-step driving (``feed``, ``wait_until``, ``spark_conf`` ...), :class:`Bench`
(stateful query pairs over JSON files written in steps), stream-stream join pairs
(:func:`run_join_steps`).

Typical use of :class:`Differential` (see tests/execution/test_differential.py)::

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

import contextlib
import csv
import itertools
import json
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import Row

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
    ``Pair.restart_each_step`` below) if its batches must not split."""
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


def process_all(queries: Iterable[Any], times: int = 1) -> None:
    """``processAllAvailable()`` ``times`` times on every query, the queries at once (a
    thread each): a native query waits out its polling delay before its next trigger, and
    waited one after another those delays add up over a test's dozens of queries."""
    queries = list(queries)

    def wait(query: Any) -> None:
        for _ in range(times):
            query.processAllAvailable()

    with ThreadPoolExecutor(max_workers=max(1, len(queries))) as pool:
        for done in [pool.submit(wait, q) for q in queries]:
            done.result()


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
            process_all(side.query for side in self.sides)
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


class InMode:
    """A query with its output mode, as ``query_fn`` of :class:`Differential` returns it
    (the harness calls ``.writeStream`` on it)."""

    def __init__(self, df: Any, mode: str) -> None:
        self.df, self.mode = df, mode

    @property
    def writeStream(self) -> Any:
        return self.df.writeStream.outputMode(self.mode)


def run_steps(
    spark: Any, ls: Any, tmp_path: Path, schema: str, steps: list[list[Any]], build: Callable[[Any], Any], mode: str
) -> list[tuple[int, list[Any]]]:
    """``build`` over a JSON stream of ``schema`` on both engines, one file of ``steps``
    written and processed at a time, every batch compared (:meth:`Differential.run`);
    each step must run a batch and some batch must have rows. Native's batches."""
    inp = tmp_path / "in"
    inp.mkdir()
    d = Differential(
        spark, ls, tmp_path, lambda r: InMode(build(r.schema(schema).json(str(inp))), mode), sink="foreachBatch"
    )
    try:
        for rows in steps:
            write_json(inp, rows)
            d.run()
        # every step ran a batch (and watermarked queries no-data batches after some)
        assert len(d.batches()) >= len(steps)
        assert any(rows for _, rows in d.batches())
        return d.native.batches
    finally:
        d.stop()


def exact_batches(batches: list[tuple[int, list[Any]]]) -> list[tuple[int, list[str]]]:
    """Each ``(batch id, rows)`` with the rows as sorted reprs: arrays and maps compared
    in their order, NaN and -0.0 as they print."""
    return [(batch_id, sorted(repr(r) for r in rows)) for batch_id, rows in batches]


# -- driving a lockgate query step by step (MemoryStream, progress, conf) -------------------
def wait_until(predicate, timeout: float = 60.0, interval: float = 0.02, message: str = "") -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    assert predicate(), message or "condition not reached in time"


def batch_progress(query) -> list:
    """Progress of triggers that ran a batch (idle triggers also report progress, as in
    Spark 4, but have no addBatch duration)."""
    return [p for p in query.recentProgress if "addBatch" in p.durationMs]


def last_batch(query):
    batches = batch_progress(query)
    return batches[-1] if batches else None


def end_offset(query, source: int = 0):
    progress = last_batch(query)
    if progress is None:
        return None
    return json.loads(progress.sources[source].endOffset)


def feed(query, stream: Any, data) -> int:
    """Add data to a MemoryStream and wait until the query has committed it."""
    offset = stream.addData(data)

    def done() -> bool:
        if query.exception() is not None:
            raise query.exception()
        current = end_offset(query)
        return current is not None and current >= offset

    wait_until(done)
    return offset


def batches_over_a_copied_checkpoint(
    spark: Any,
    ls: Any,
    root: Path,
    schema: str,
    steps: list[list[str]],
    build: Callable[[Any], Any],
    mode: str,
    native_conf: tuple[str, str] | None = None,
) -> dict[str, tuple[list[tuple[int, list[str]]], str]]:
    """Per engine: its batches (id, sorted rows) over ``steps`` (JSON lines of ``schema``
    written to a directory read by ``build``, each step run with ``availableNow``) and
    its last checkpoint. Before the last step the checkpoint is copied and the query goes
    on from the copy, so its state is read back from the files; ``native_conf`` is set
    for native's runs only."""
    out: dict[str, tuple[list[tuple[int, list[str]]], str]] = {}
    for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
        inp, checkpoint = root / f"in-{engine}", root / f"ck-{engine}"
        got: list[tuple[int, list[str]]] = []
        for i, lines in enumerate(steps):
            if i == len(steps) - 1:
                moved = root / f"ck-{engine}-moved"
                shutil.copytree(checkpoint, moved)
                checkpoint = moved
            write_text(inp, lines)
            query = build(reader.schema(schema).json(str(inp)))
            native = native_conf is not None and engine == "native"
            with spark_conf(spark, *native_conf) if native else contextlib.nullcontext():
                got += available_now_batches(query, checkpoint, mode, rows=lambda b: sorted(map(repr, b.collect())))
        out[engine] = (got, str(checkpoint))
    assert any(rows for _, rows in out["native"][0])
    return out


def available_now_batches(
    df: Any, checkpoint: Path | str, output_mode: str | None = None, rows: Callable[[Any], Any] | None = None
) -> list[tuple[int, Any]]:
    """Run ``df`` from ``checkpoint`` with ``trigger(availableNow=True)`` into foreachBatch
    until it ends (its failure is raised); each batch's id and rows, as ``rows(batch)``
    gives them (by default its rows as sorted tuples)."""
    collect = rows or (lambda batch: sorted(map(tuple, batch.collect())))
    out: list[tuple[int, Any]] = []
    writer = df.writeStream if output_mode is None else df.writeStream.outputMode(output_mode)
    query = (
        writer.foreachBatch(lambda batch, batch_id: out.append((batch_id, collect(batch))))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(TIMEOUT_S)
    assert query.exception() is None
    return out


def unique(prefix: str = "q") -> str:
    """A fresh query / table name."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def spark_conf(spark, key: str, value: str) -> Iterator[None]:
    """Set a session conf for the block, restoring the previous value afterwards."""
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


# -- pairs of stateful queries over JSON files written in steps (the ``bench`` fixture) -----
SCHEMA = "ts TIMESTAMP, k STRING, v DOUBLE"
BENCH_POLLING_DELAY = "1s"
REL_TOL = 1e-9
BASE = datetime(2024, 1, 1)


def ev(sec: int, k: str | None, v: float | None) -> dict[str, Any]:
    """An input row ``sec`` seconds after 2024-01-01T00:00:00."""
    return {"ts": (BASE + timedelta(seconds=sec)).isoformat(), "k": k, "v": v}


# Aggregation input: one file per step; watermark delay 10 s. Comments give the
# watermark each step's batch runs with, and which rows are late for which grouping.
AGG_STEPS = [
    # watermark 0; after the batch -3 s (a no-data batch follows)
    [ev(1, "a", 1.0), ev(2, "b", 2.0), ev(3, "a", 3.0), ev(4, "b", None), ev(7, "a", 3.0)],
    # group c has only null values
    [ev(15, "a", 4.0), ev(4, "a", 5.0), ev(12, "b", 2.5), ev(12, "b", 2.5), ev(11, "c", None)],
    # watermark 5 s: ts=1 late for the timestamp key and for sliding window [-5, 5)
    [ev(35, "c", 6.0), ev(1, "a", 100.0), ev(6, "a", 7.0), ev(9, "b", 1.5)],
    # watermark 25 s: ts=14 late everywhere, ts=20 late for timestamp and sliding [15, 25)
    [ev(59, "c", 7.0), ev(20, "a", 1.0), ev(14, "b", 1.0), ev(26, "b", 2.0)],
    # watermark 49 s (queries with a restart resume here)
    [ev(40, "a", 3.0), ev(70, "d", 1.0), ev(55, "c", 2.0), ev(55, "c", 2.0), ev(48, None, 0.5)],
    # watermark 60 s
    [ev(80, "a", 1.0), ev(61, "d", None)],
]
RESTART_BEFORE_STEP = 4


# -- comparing rows -------------------------------------------------------------------
def _flatten(value: Any, exact: list[Any], floats: list[float]) -> None:
    """Split a row into exactly compared leaves and floats compared with a tolerance.
    Arrays (collect_list / collect_set) are compared sorted."""
    if isinstance(value, (Row, tuple)):
        for item in value:
            _flatten(item, exact, floats)
    elif isinstance(value, list):
        exact.append(("array", tuple(sorted(repr(x) for x in value))))
    elif isinstance(value, float) and not math.isnan(value):
        exact.append("<float>")
        floats.append(value)
    else:
        exact.append(repr(value))


def canon(
    rows: list[Any], ordered: bool = False
) -> list[tuple[tuple[Any, ...], tuple[float, ...]]]:
    items = []
    for row in rows:
        exact: list[Any] = []
        floats: list[float] = []
        _flatten(row, exact, floats)
        items.append((tuple(exact), tuple(floats)))
    if not ordered:
        items.sort(key=lambda it: (repr(it[0]), [float(f"{x:.6g}") for x in it[1]]))
    return items


def same_rows(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for (ea, fa), (eb, fb) in zip(a, b):
        if ea != eb or len(fa) != len(fb):
            return False
        if not all(math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12) for x, y in zip(fa, fb)):
            return False
    return True


def _show(items: list[Any]) -> str:
    return "\n      ".join(repr(it) for it in items) or "(none)"


# -- running several native/lockgate query pairs side by side ---------------------------
class Side:
    """One engine's run of a query: its sink and the progress of the batches that ran."""

    def __init__(self, pair: Pair, engine: str) -> None:
        self.pair = pair
        self.engine = engine
        self.table = f"st_{engine}_{pair.name}_{uuid.uuid4().hex[:8]}"
        self.checkpoint = str(pair.root / engine / "checkpoint")
        self.query: Any = None
        self.batches: list[tuple[int, list[Any]]] = []
        self.past_progress: list[Any] = []

    def _collect(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, df.collect()))

    def start(self, reader: Any) -> None:
        p = self.pair
        writer = (
            p.build(reader)
            .writeStream.outputMode(p.mode)
            .option("checkpointLocation", self.checkpoint)
        )
        if p.sink == "memory":
            writer = writer.format("memory").queryName(self.table)
        else:
            writer = writer.foreachBatch(self._collect)
        self.query = writer.start()

    def stop(self) -> None:
        if self.query is not None:
            self.past_progress += self._executed()
            self.query.stop()
            self.query = None

    def _executed(self) -> list[Any]:
        # Idle triggers also report progress (on a timer): only batches that ran count.
        return [p for p in self.query.recentProgress if "addBatch" in p.durationMs]

    def progress(self) -> list[tuple[Any, ...]]:
        result = []
        for p in self.past_progress + self._executed():
            ops = tuple(
                (
                    op.operatorName,
                    op.numRowsTotal,
                    op.numRowsDroppedByWatermark,
                    op.customMetrics.get("numDroppedDuplicateRows"),
                    op.numRowsUpdated,
                    op.numRowsRemoved,
                )
                for op in p.stateOperators
            )
            result.append((p.batchId, p.numInputRows, (p.eventTime or {}).get("watermark"), ops))
        return result

    def rows(self) -> list[Any]:
        if self.pair.sink == "memory":
            return self.pair.spark.table(self.table).collect()
        if self.pair.mode == "complete":
            return self.batches[-1][1] if self.batches else []
        return [row for _, rows in self.batches for row in rows]


class Pair:
    """The same query on native Spark and on lockgate."""

    def __init__(
        self,
        spark: Any,
        root: Path,
        name: str,
        build: Callable[[Any], Any],
        mode: str = "append",
        *,
        sink: str = "memory",
        ordered: bool = False,
        restart_each_step: bool = False,
    ) -> None:
        self.spark = spark
        self.root = root / name
        self.name = name
        self.build = build
        self.mode = mode
        self.sink = sink
        self.ordered = ordered
        # A query over several source directories cannot see one step's files appear at
        # the same instant: a running trigger may list one directory before the rename
        # and the next after it, splitting the step in two batches. Such a pair is
        # stopped while a step's files are written and restarted from its checkpoint,
        # whose first trigger then sees them all (foreachBatch sink only: a restarted
        # memory sink starts empty).
        if restart_each_step and sink != "foreachBatch":
            raise ValueError("restart_each_step needs the foreachBatch sink")
        self.restart_each_step = restart_each_step
        self.native = Side(self, "native")
        self.lockgate = Side(self, "lockgate")

    def start(self, ls: Any) -> None:
        self.native.start(self.spark.readStream)
        self.lockgate.start(ls.readStream)

    @property
    def running(self) -> bool:
        return self.native.query is not None

    def stop(self) -> None:
        self.native.stop()
        self.lockgate.stop()

    @property
    def queries(self) -> list[Any]:
        return [self.native.query, self.lockgate.query]

    def differences(self, step: str) -> list[str]:
        errors = []
        label = f"[{self.name} / {self.mode} @ {step}]"
        expected = canon(self.native.rows(), self.ordered)
        got = canon(self.lockgate.rows(), self.ordered)
        if not same_rows(expected, got):
            errors.append(
                f"{label} sink rows differ:\n   native:\n      {_show(expected)}\n   lockgate:\n      {_show(got)}"
            )
        if self.sink == "foreachBatch":
            eb = [(b, canon(r)) for b, r in self.native.batches]
            gb = [(b, canon(r)) for b, r in self.lockgate.batches]
            if [b for b, _ in eb] != [b for b, _ in gb] or not all(
                same_rows(x, y) for (_, x), (_, y) in zip(eb, gb)
            ):
                errors.append(f"{label} batches differ:\n   native:   {eb}\n   lockgate: {gb}")
        pe, pg = self.native.progress(), self.lockgate.progress()
        if pe != pg:
            errors.append(
                f"{label} (batchId, numInputRows, watermark, state operators) differ:\n"
                f"   native:   {pe}\n   lockgate: {pg}"
            )
        return errors


class Bench:
    """Pairs of queries fed by the same steps of input files."""

    def __init__(self, spark: Any, ls: Any, root: Path) -> None:
        self.spark = spark
        self.ls = ls
        self.root = root
        self.pairs: list[Pair] = []

    def add(self, name: str, build: Callable[[Any], Any], mode: str = "append", **kw: Any) -> Pair:
        pair = Pair(self.spark, self.root, name, build, mode, **kw)
        self.pairs.append(pair)
        return pair

    def start(self, pairs: list[Pair] | None = None) -> None:
        # A bench's dozens of idle native queries, listing their sources every 100 ms
        # (the tests' pollingDelay), kept a core busy: its queries poll every second. A
        # step waits for all of them at once (process_all), and lockgate's wait ends
        # when processAllAvailable() is called.
        with spark_conf(self.spark, "spark.sql.streaming.pollingDelay", BENCH_POLLING_DELAY):
            for pair in pairs if pairs is not None else self.pairs:
                pair.start(self.ls)

    def stop(self) -> None:
        for pair in self.pairs:
            pair.stop()

    def step(self, label: str, files: dict[Path, list[dict[str, Any]]]) -> None:
        paused = [p for p in self.pairs if p.restart_each_step and p.running]
        for pair in paused:
            pair.stop()
        write_json_together(files)
        self.start(paused)
        # Twice: a trigger that listed the files just before the new one appeared may
        # end the first wait; the second waits for a trigger that started after it.
        process_all((q for pair in self.pairs for q in pair.queries), times=2)
        errors = [e for pair in self.pairs for e in pair.differences(label)]
        assert not errors, "\n".join(errors)

    def run_steps(self, root: Path, steps: list[tuple[str, list[dict[str, Any]]]], restart_before: int) -> None:
        """Start every pair, then one :meth:`step` per ``(directory under root, rows)``,
        stopping and starting them from their checkpoints before step ``restart_before``."""
        self.start()
        for i, (directory, rows) in enumerate(steps):
            if i == restart_before:
                self.stop()
                self.start()
            self.step(f"step {i} ({directory})", {root / directory: rows})


def headline(exc: BaseException) -> str:
    text = str(exc).split("\n")[0].strip()
    text = re.sub(r"\s*SQLSTATE: \w+$", "", text)
    return text.rstrip(";").strip()


# -- stream-stream joins: two JSON sides, memory sinks ----------------------------------------
LEFT_SCHEMA = "leftId LONG, leftTime TIMESTAMP, lv STRING"
RIGHT_SCHEMA = "rightId LONG, rightTime TIMESTAMP, rv STRING"
RANGE = "leftId = rightId AND rightTime >= leftTime AND rightTime <= leftTime + interval 30 seconds"


def lrow(sec: int, k: int, v: str) -> dict[str, Any]:
    return {"leftId": k, "leftTime": (BASE + timedelta(seconds=sec)).isoformat(), "lv": v}


def rrow(sec: int, k: int, v: str) -> dict[str, Any]:
    return {"rightId": k, "rightTime": (BASE + timedelta(seconds=sec)).isoformat(), "rv": v}


def sides(reader: Any, ldir: Path, rdir: Path, watermarks: bool = True) -> tuple[Any, Any]:
    left = reader.schema(LEFT_SCHEMA).json(str(ldir))
    right = reader.schema(RIGHT_SCHEMA).json(str(rdir))
    if watermarks:
        left = left.withWatermark("leftTime", "10 seconds")
        right = right.withWatermark("rightTime", "20 seconds")
    return left, right


class JoinPair:
    """One query on both engines, memory sinks."""

    def __init__(self, spark: Any, ls: Any, name: str, fn: Callable[..., Any], ldir: Path, rdir: Path, root: Path):
        self.spark = spark
        self.name = name
        self.tables = {}
        self.queries = {}
        for engine, reader in (("native", spark.readStream), ("lockgate", ls.readStream)):
            table = f"j_{name}_{engine}_{uuid.uuid4().hex[:8]}"
            self.tables[engine] = table
            self.queries[engine] = (
                fn(reader, ldir, rdir)
                .writeStream.format("memory")
                .queryName(table)
                .option("checkpointLocation", str(root / name / engine))
                .start()
            )

    def rows(self, engine: str) -> list[str]:
        return canonical(self.spark.table(self.tables[engine]).collect())

    def state(self, engine: str) -> list[tuple[Any, ...]]:
        """Every batch that ran: its id and the join's state metrics."""
        ran = [p for p in self.queries[engine].recentProgress if "addBatch" in p.durationMs]
        return [
            (p.batchId, s.numRowsTotal, s.numRowsDroppedByWatermark, s.numRowsUpdated, s.numRowsRemoved)
            for p in ran
            for s in p.stateOperators[:1]
        ]

    def check(self, step: int) -> None:
        native, mine = self.rows("native"), self.rows("lockgate")
        assert mine == native, f"{self.name} step {step}: rows differ\nnative:   {native}\nlockgate: {mine}"
        assert self.state("lockgate") == self.state("native"), (
            f"{self.name} step {step}: (batchId, numRowsTotal, numRowsDroppedByWatermark, numRowsUpdated, "
            "numRowsRemoved) "
            f"native {self.state('native')} lockgate {self.state('lockgate')}"
        )


def run_join_steps(
    spark: Any, ls: Any, tmp_path: Path, queries: dict[str, Callable[..., Any]], steps: list[Any]
) -> dict[str, JoinPair]:
    """Every query on both engines through ``steps``, compared after each; the pairs."""
    ldir, rdir = tmp_path / "left", tmp_path / "right"
    ldir.mkdir()
    rdir.mkdir()
    with spark_conf(spark, "spark.sql.streaming.pollingDelay", BENCH_POLLING_DELAY):  # as Bench.start
        pairs = [JoinPair(spark, ls, name, fn, ldir, rdir, tmp_path) for name, fn in queries.items()]
    try:
        for step, (side, rows) in enumerate(steps):
            write_json(ldir if side == "left" else rdir, rows)
            process_all(q for pair in pairs for q in pair.queries.values())
            for pair in pairs:
                pair.check(step)
        # something was emitted by every query, outer rows included
        for pair in pairs:
            assert pair.rows("native"), pair.name
        return {pair.name: pair for pair in pairs}
    finally:
        for pair in pairs:
            for q in pair.queries.values():
                q.stop()
