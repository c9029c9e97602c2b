"""Damaged checkpoints of real queries, restarted: a seeded random file of a real
checkpoint (offsets, commits, metadata, the file source's log, state deltas, snapshots,
schema and operator metadata files, checksums, a file sink's ``_spark_metadata``, the
run lock) gets a random damage (emptied, cut off, a byte flipped, garbage, JSON of the
wrong shape, deleted, its checksum deleted or stale), and the query restarts on it and
runs one more batch. Either it fails with lockgate's error naming the damaged file (or
its directory), or it runs (a leftover temporary file beside a file is one more damage,
which Spark ignores) and its output equals the output of a run on the undamaged
checkpoint: no batch's rows lost, changed or written twice. A raw Python error, a wrong
answer or a hang fails the test.

Each shape's checkpoint is built once (four batches) and copied for every damage.
``make test`` runs two seeds per shape and the damages of ``PICKED`` (those that found
bugs, and ones the seeds hit seldom); the ``slow`` test runs more seeds. To run a range by
hand: ``LOCKGATE_CORRUPTION_SEEDS=0-300 .venv/bin/python -m pytest
tests/checkpoint/test_corruption_fuzz.py -k by_hand`` (``LOCKGATE_CORRUPTION_SHAPES``
picks shapes by name, comma-separated). A failure names the shape, the seed, the file
and the damage.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from differential import spark_conf, write_json_together

from lockgate.errors import LockgateError

BATCHES = 4  # batches run before the damage; the restart runs one more input file
TIMEOUT_S = 300  # a hang, not a slow machine
SCHEMA = "t TIMESTAMP, k STRING, v BIGINT"


def _rows(batch: int, side: str = "") -> list[dict[str, Any]]:
    base = 1_700_000_000 + batch * 8
    return [
        {"t": base + i * 3, "k": f"k{(batch + i) % 3}", "v": batch * 10 + i + (len(side) * 100)}
        for i in range(3)
    ] + [{"t": base, "k": f"k{batch % 3}", "v": batch * 10}]  # a duplicate of the first row


def _ts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import datetime

    return [
        {**r, "t": datetime.datetime.fromtimestamp(r["t"], datetime.UTC).isoformat()} for r in rows
    ]


@dataclass(frozen=True)
class Shape:
    name: str
    sides: tuple[str, ...]  # input directories
    mode: str
    build: Callable[[list[Any]], Any]  # the sources' DataFrames -> the query's DataFrame
    file_sink: bool = False


def _agg_append(dfs: list[Any]) -> Any:
    from pyspark.sql import functions as F

    return (
        dfs[0].withWatermark("t", "5 seconds")
        .groupBy(F.window("t", "10 seconds"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        .select(F.col("window.start").alias("start"), "k", "n", "s")
    )


def _agg_update(dfs: list[Any]) -> Any:
    from pyspark.sql import functions as F

    return (
        dfs[0].withWatermark("t", "5 seconds")
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.max("t").alias("latest"))
    )


def _dedup(dfs: list[Any]) -> Any:
    return dfs[0].withWatermark("t", "5 seconds").dropDuplicates(["k", "t"])


def _join(dfs: list[Any]) -> Any:
    from pyspark.sql import functions as F

    left = dfs[0].withWatermark("t", "5 seconds").select(F.col("t").alias("lt"), F.col("k").alias("lk"), "v")
    right = dfs[1].withWatermark("t", "5 seconds").select(F.col("t").alias("rt"), F.col("k").alias("rk"), F.col("v").alias("w"))
    return left.join(
        right,
        F.expr("lk = rk AND rt BETWEEN lt - INTERVAL 4 SECONDS AND lt + INTERVAL 4 SECONDS"),
        "leftOuter",
    )


def _with_state(dfs: list[Any]) -> Any:
    def count_per_key(key: Any, pdfs: Any, state: Any) -> Any:
        # nested, so that Spark's workers get it by value (this module is not importable there)
        import pandas as pd

        n, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            n += len(pdf)
            total += int(pdf["v"].sum())
        state.update((n, total))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "total": [total]})

    return dfs[0].groupBy("k").applyInPandasWithState(
        count_per_key, "k STRING, n LONG, total LONG", "n LONG, total LONG", "update", "NoTimeout"
    )


SHAPES = {
    s.name: s
    for s in (
        Shape("agg_append_file_sink", ("in",), "append", _agg_append, file_sink=True),
        Shape("agg_update", ("in",), "update", _agg_update),
        Shape("dedup", ("in",), "append", _dedup),
        Shape("join", ("left", "right"), "append", _join),
        Shape("with_state", ("in",), "update", _with_state),
    )
}


# -- damages ---------------------------------------------------------------------------


def _crc(path: Path) -> Path:
    return path.with_name(path.name + ".crc")


def _damage(path: Path, kind: str, rng: random.Random) -> str | None:
    """Damage ``path``; what was done, or None when ``kind`` does not apply to it."""
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "cut":
        if len(data) < 2:
            return None
        path.write_bytes(data[: rng.randrange(1, len(data))])
    elif kind == "flip":
        if not data:
            return None
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :])
    elif kind == "garbage":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(max(8, len(data)))))
    elif kind == "wrong_json":
        shapes = ['{"a": [1, 2]}', "[]", "v1\n{}", "v1\n[1]\n", '"text"', "v1\n{\"batchWatermarkMs\":\"x\"}\n"]
        path.write_text(rng.choice(shapes))
    elif kind == "delete":
        path.unlink()
        _crc(path).unlink(missing_ok=True)  # a file gone with its checksum, as deleted by hand
    elif kind == "delete_crc":
        if not _crc(path).exists():
            return None
        _crc(path).unlink()
    elif kind == "stale_crc":
        # the checksum of an earlier version of the file: as if the file was rewritten
        # (edited, restored from elsewhere) without its .crc
        crc = _crc(path)
        if not crc.exists():
            return None
        entry = json.loads(crc.read_text())
        entry["value"] = (entry["value"] ^ 0x5A5A) if isinstance(entry.get("value"), int) else 1
        crc.write_text(json.dumps(entry))
    elif kind == "leftover_tmp":
        # an atomic write cut off before its rename (lockgate's or Spark's temp name)
        path.with_name(f".{path.name}.{rng.randrange(16**8):08x}.tmp").write_bytes(data[: len(data) // 2])
    else:
        raise AssertionError(kind)
    return kind


DAMAGES = ("empty", "cut", "flip", "garbage", "wrong_json", "delete", "delete_crc", "stale_crc", "leftover_tmp")
CRC_DAMAGES = ("delete_crc", "stale_crc")


def _kind_of(relative: Path) -> str | None:
    """The part of a checkpoint a file belongs to (None: output data, not damaged)."""
    parts = relative.parts
    name = parts[-1]
    if name.endswith(".crc"):
        return "checksum"
    if parts[0] == "out":
        return "sink log" if "_spark_metadata" in parts else None
    if parts[1] in ("offsets", "commits", "sources"):
        return parts[1]
    if parts[1] == "state":
        if "_metadata" in parts:
            return "state metadata"
        return "state snapshot" if name.endswith(".snapshot") else "state delta"
    if name.startswith(".lockgate-run"):
        return "run lock"
    return "metadata" if name == "metadata" else "other"


def _candidates(root: Path) -> dict[str, list[Path]]:
    """The files a damage may hit, by the part of the checkpoint they belong to: every
    file of the checkpoint (and of a file sink's ``_spark_metadata``), checksum files
    included, in a stable order."""
    out: dict[str, list[Path]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        kind = _kind_of(path.relative_to(root))
        if kind is not None:
            out.setdefault(kind, []).append(path)
    return out


# -- running ---------------------------------------------------------------------------


@dataclass
class Built:
    """A shape's undamaged checkpoint (and output) after BATCHES batches, the batches it
    emitted, and what a restart on an undamaged copy emits."""

    shape: Shape
    root: Path  # holds ck/ (and out/ for a file sink) of the undamaged run
    inputs: dict[str, Path]
    before: dict[int, list[str]]
    expected: Any


def _run(ls: Any, shape: Shape, inputs: dict[str, Path], root: Path) -> tuple[dict[int, list[str]], BaseException | None, bool]:
    """Run ``shape`` with availableNow on ``root``'s checkpoint: the batches it emitted
    (foreachBatch) and the error it failed with, and whether it ended in time."""
    dfs = [ls.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(inputs[s])) for s in shape.sides]
    df = shape.build(dfs)
    out: dict[int, list[str]] = {}
    writer = df.writeStream.outputMode(shape.mode).option("checkpointLocation", str(root / "ck"))
    if shape.file_sink:
        writer = writer.format("parquet").option("path", str(root / "out"))
    else:
        writer = writer.foreachBatch(lambda batch, batch_id: out.__setitem__(batch_id, sorted(map(repr, batch.collect()))))
    try:
        query = writer.trigger(availableNow=True).start()
    except Exception as exc:  # noqa: BLE001 - classified by the caller
        return out, exc, True
    try:
        ended = query.awaitTermination(TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the query's failure
        return out, exc, True
    if not ended:
        query.stop()
        return out, None, False
    return out, query.exception(), True


def _output(spark: Any, shape: Shape, root: Path, batches: dict[int, list[str]]) -> Any:
    if shape.file_sink:
        return sorted(map(repr, spark.read.parquet(str(root / "out")).collect()))
    return batches


def build_shape(spark: Any, ls: Any, shape: Shape, base: Path) -> Built:
    inputs = {s: base / s for s in shape.sides}
    root = base / "clean"
    root.mkdir(parents=True)
    before: dict[int, list[str]] = {}
    for batch in range(BATCHES):
        write_json_together({inputs[s]: _ts(_rows(batch, s)) for s in shape.sides})
    got, error, ended = _run(ls, shape, inputs, root)
    assert ended and error is None, error
    before.update(got)
    # the input of the restart, there for every copy
    write_json_together({inputs[s]: _ts(_rows(BATCHES, s)) for s in shape.sides})
    copy = base / "clean-restart"
    shutil.copytree(root, copy)
    after, error, ended = _run(ls, shape, inputs, copy)
    assert ended and error is None, error
    built = Built(shape, root, inputs, before, None)
    built.expected = _output(spark, shape, copy, {**before, **after})
    assert built.expected, "the undamaged run emitted nothing"
    return built


def _names(error: BaseException) -> str:
    """Every message of ``error``'s chain (a StreamingQueryException's cause too)."""
    parts, seen = [], set()
    stack = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}")
        stack += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return "\n".join(parts)


def _lockgate_errors(error: BaseException) -> list[BaseException]:
    found, stack, seen = [], [error], set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, LockgateError) and type(e).__name__ != "StreamingQueryException":
            found.append(e)
        stack += [getattr(e, "cause", None), e.__cause__]
    return found


def _latest(directory: Path) -> Path:
    return max((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def check_case(
    spark: Any, ls: Any, built: Built, seed: int, work: Path, pick: tuple[str, str] | None = None
) -> str | None:
    """Damage a copy of ``built``'s checkpoint as ``seed`` says (or ``pick``: a file's path
    under the copy, ``latest`` for a log's newest entry, and a damage) and restart it;
    None when the outcome is allowed, else what went wrong."""
    rng = random.Random(f"{built.shape.name}:{seed}")
    root = work / f"{built.shape.name}-{seed}"
    shutil.copytree(built.root, root)
    files = _candidates(root)
    if pick is not None:
        path = root / pick[0]
        if path.name == "latest":
            path = _latest(path.parent)
        files, kind = {"picked": [path]}, pick[1]
    for _ in range(50):
        # a part of the checkpoint, then a file of it: the few offsets, commits and
        # metadata files are hit as often as the many state files
        path = rng.choice(files[rng.choice(sorted(files))])
        kind = kind if pick is not None else rng.choice(DAMAGES)
        if path.name.endswith(".crc") and kind in CRC_DAMAGES + ("delete",):
            continue
        if _damage(path, kind, rng) is not None:
            break
    else:
        return None if pick is None else f"{pick}: the damage does not apply to {path}"
    case = f"shape {built.shape.name}, seed {seed}: {kind} {path.relative_to(root)}"
    try:
        after, error, ended = _run(ls, built.shape, built.inputs, root)
        if not ended:
            return f"{case}: the restart did not end in {TIMEOUT_S}s"
        if error is not None:
            # lockgate's error, raised on the driver or in a task (Spark's PythonException
            # quotes a task's lockgate error and its message)
            text = _names(error)
            ours = _lockgate_errors(error) or re.search(r"^lockgate\.[\w.]+Error: ", text, re.MULTILINE)
            named = str(path) in text or str(path.parent) in text
            if ours and named:
                return None
            return f"{case}: failed without lockgate's error naming {path}:\n{_names(error)}\n" + "".join(
                traceback.format_exception(error)
            )[-3000:]
        try:
            got = _output(spark, built.shape, root, {**built.before, **after})
        except Exception as exc:  # noqa: BLE001
            return f"{case}: ran, then its output could not be read: {_names(exc)}"
        if got != built.expected:
            return f"{case}: ran with a different output:\nexpected {built.expected}\ngot      {got}"
        return None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def seeds_from_env(default: list[int]) -> list[int]:
    text = os.environ.get("LOCKGATE_CORRUPTION_SEEDS")
    if not text:
        return default
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def _check(
    spark: Any, ls: Any, tmp_path: Path, shapes: list[str], seeds: list[int], picked: bool = False
) -> None:
    failures: list[str] = []
    # snapshots every two deltas, so that checkpoints hold snapshots to damage
    with spark_conf(spark, "spark.sql.streaming.stateStore.minDeltasForSnapshot", "2"):
        for name in shapes:
            built = build_shape(spark, ls, SHAPES[name], tmp_path / name)
            cases: list[tuple[int, tuple[str, str] | None]] = [(seed, None) for seed in seeds]
            if picked:
                cases += [(-1 - i, (file, damage)) for i, (shape, file, damage) in enumerate(PICKED) if shape == name]
            for seed, pick in cases:
                problem = check_case(spark, ls, built, seed, tmp_path / "cases", pick)
                if problem is not None:
                    print(f"\n=== {problem[:4000]}", flush=True)  # seen at once under -s
                    failures.append(problem)
    assert not failures, f"{len(failures)} damaged checkpoints went wrong:\n\n" + "\n\n".join(failures)


FAST_SEEDS = [0, 1]
# Damages that found a bug, and damages the random seeds hit seldom: (shape, a file
# under the shape's directory, ``latest`` for a log's newest entry, damage)
PICKED = [
    # an earlier _spark_metadata entry damaged: the query ran on, its output unreadable
    ("agg_append_file_sink", "out/_spark_metadata/1", "wrong_json"),
    # the latest one deleted: the next batch committed past the gap
    ("agg_append_file_sink", "out/_spark_metadata/latest", "delete"),
    # a file source log entry deleted: its file read again as new
    ("dedup", "ck/sources/0/2", "delete"),
    ("dedup", "ck/sources/0/latest", "delete"),
    ("dedup", "ck/commits/latest", "delete"),
    ("dedup", "ck/offsets/latest", "delete"),
    ("agg_update", "ck/offsets/latest", "leftover_tmp"),
    ("agg_update", "ck/metadata", "delete"),
    # the state schema file deleted: refused as state native Spark wrote
    ("agg_update", "ck/state/0/_metadata/schema", "delete"),
]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_damaged_checkpoint_fails_naming_the_file_or_recovers(spark, ls, tmp_path, shape):
    _check(spark, ls, tmp_path, [shape], FAST_SEEDS, picked=True)


@pytest.mark.parametrize("lost", [0, 1, 3])
def test_file_source_log_missing_an_entry_names_it(tmp_path, lost):
    """An entry of the file source log deleted: the source's files of it would be read
    again (rows twice); the restart fails naming it, as Spark's restore() fails."""
    from lockgate.checkpoint.fs import LocalFileSystem
    from lockgate.errors import CheckpointError
    from lockgate.sources.file.log import FileEntry, FileStreamSourceLog

    log = FileStreamSourceLog(LocalFileSystem(), str(tmp_path / "sources" / "0"))
    for batch in range(5):
        log.add(batch, [FileEntry(f"file:///in/{batch}.json", 1000 + batch, batch)])
    path = tmp_path / "sources" / "0" / str(lost)
    path.unlink()
    _crc(path).unlink()
    with pytest.raises(CheckpointError) as err:
        log.all_entries()
    assert str(path) in str(err.value) and "new checkpoint location" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_more_damaged_checkpoints(spark, ls, tmp_path, shape):
    _check(spark, ls, tmp_path, [shape], list(range(2, 40)))


@pytest.mark.skipif(
    "LOCKGATE_CORRUPTION_SEEDS" not in os.environ, reason="set LOCKGATE_CORRUPTION_SEEDS=0-300 to run"
)
def test_damaged_checkpoints_by_hand(spark, ls, tmp_path):
    names = os.environ.get("LOCKGATE_CORRUPTION_SHAPES")
    _check(spark, ls, tmp_path, names.split(",") if names else sorted(SHAPES), seeds_from_env([]))
