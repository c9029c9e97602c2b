"""Two runs on one checkpoint.

In one application, a second session starting the same query does what Spark does
across all sessions of an application (``spark.sql.streaming.stopActiveRunOnRestart``):
by default it stops the older run, and with the conf off it is refused with Spark's
message. A run in another driver process is detected before anything is written, by the
run lock on the checkpoint. The lock is released when its holder stops or is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from differential import spark_conf
from pyspark.errors import AnalysisException

import lockgate
from lockgate.checkpoint.fs import LocalFileSystem
from lockgate.checkpoint.run_lock import CheckpointRunLock
from lockgate.errors import ConcurrentWriteError

ROOT = str(Path(__file__).resolve().parents[2])


def test_other_session_same_query_is_stopped_or_refused(spark, ls, tmp_path):
    """The same checkpoint started from a second lockgate session of the application."""
    other_spark = spark.newSession()
    other = lockgate.session(other_spark)
    checkpoint = tmp_path / "ck"
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "0.json").write_text('{"value": 1}\n')

    def start(session: Any) -> Any:
        df = session.readStream.schema("value INT").json(str(inp))
        return df.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()

    first = start(ls)
    first.processAllAvailable()
    try:
        with spark_conf(other_spark, "spark.sql.streaming.stopActiveRunOnRestart", "false"):
            with pytest.raises(AnalysisException) as info:
                start(other)
        message = str(info.value)
        assert f"Cannot start query with id {first.id} as another query with same id is already active" in message
        assert "spark.sql.streaming.stopActiveRunOnRestart" in message
        assert first.isActive and other.streams.active == []
        second = start(other)  # Spark's default: the older run (in the other session) stops
        try:
            assert second.id == first.id and second.runId != first.runId
            assert not first.isActive and first.exception() is None
            assert [q.runId for q in other.streams.active] == [second.runId]
            assert ls.streams.active == []
            (inp / "1.json").write_text('{"value": 2}\n')
            second.processAllAvailable()
            assert second.exception() is None
        finally:
            second.stop()
    finally:
        first.stop()


_HOLD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from lockgate.checkpoint.fs import LocalFileSystem
    from lockgate.checkpoint.run_lock import CheckpointRunLock
    from lockgate.errors import ConcurrentWriteError
    try:
        lock = CheckpointRunLock.acquire(LocalFileSystem(), {checkpoint!r}, "other-run", "query q")
    except ConcurrentWriteError as exc:
        print("REFUSED", exc, flush=True)
        sys.exit(3)
    print("HOLDING", flush=True)
    sys.stdin.read()  # hold until the test closes stdin, or kills us
    """
)


def _holder(checkpoint: Path) -> subprocess.Popen[str]:
    code = _HOLD.format(root=ROOT, checkpoint=str(checkpoint))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(("HOLDING", "REFUSED")), line
    return proc


def test_another_driver_process_is_detected_before_anything_is_written(ls, tmp_path):
    checkpoint = tmp_path / "ck"
    proc = _holder(checkpoint)
    try:
        stream = lockgate.MemoryStream(ls, "value INT")
        with pytest.raises(ConcurrentWriteError) as info:
            stream.toDF().writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
        message = str(info.value)
        assert "another run is writing to this checkpoint" in message
        assert f"run other-run (process {proc.pid}" in message
        assert "checkpoint location" in message
        assert not (checkpoint / "offsets").exists() or os.listdir(checkpoint / "offsets") == []
        assert ls.streams.active == []
    finally:
        proc.kill()
        proc.wait()
    # the holder was killed (-9): the lock went with it, the query starts now
    q = stream.toDF().writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        stream.addData([1])
        q.processAllAvailable()
        # while it runs, another process is refused
        other = _holder(checkpoint)
        assert other.wait() == 3
    finally:
        q.stop()
    # stopped: the lock is free for another process
    after = _holder(checkpoint)
    assert after.poll() is None
    after.send_signal(signal.SIGKILL)
    after.wait()


def test_lock_refused_within_one_process_too(tmp_path):
    fs = LocalFileSystem()
    first = CheckpointRunLock.acquire(fs, str(tmp_path), "a", "query a")
    with pytest.raises(ConcurrentWriteError, match="run a \\(process"):
        CheckpointRunLock.acquire(fs, str(tmp_path), "b", "query b")
    first.release()
    CheckpointRunLock.acquire(fs, str(tmp_path), "b", "query b").release()


@pytest.mark.parametrize("stop_active", ["true", "false"])
def test_sessions_starting_one_query_at_the_same_instant_leave_one_run(spark, ls, tmp_path, stop_active):
    """Three sessions start the same checkpoint at once, released together by a barrier.
    Whatever the interleaving, one run is left: every other start either failed with
    Spark's error (CONCURRENT_QUERY when both passed the first check together, the
    already-active error when the conf forbids stopping the older run) or started and
    was stopped by a later start. The survivor then runs batches on the checkpoint."""
    checkpoint = tmp_path / "ck"
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "0.json").write_text('{"value": 1}\n')
    sessions = [lockgate.session(spark.newSession()) for _ in range(3)]
    barrier = threading.Barrier(len(sessions))
    outcomes: list[Any] = [None] * len(sessions)

    def start(i: int) -> None:
        session = sessions[i]
        session.spark.conf.set("spark.sql.streaming.stopActiveRunOnRestart", stop_active)
        df = session.readStream.schema("value INT").json(str(inp))
        writer = df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        barrier.wait()
        try:
            outcomes[i] = writer.start()
        except Exception as exc:  # noqa: BLE001 - every outcome is checked below
            outcomes[i] = exc

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert None not in outcomes, outcomes
    started = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    try:
        assert len(started) + len(refused) == len(sessions), outcomes
        active = [q for s in sessions for q in s.streams.active]
        assert len(active) == 1, (active, outcomes)
        survivor = active[0]
        assert survivor in started
        for q in started:
            if q is not survivor:
                q.awaitTermination(60)
                assert not q.isActive and q.exception() is None
        for exc in refused:
            assert isinstance(exc, AnalysisException), repr(exc)
            message = str(exc)
            assert "[CONCURRENT_QUERY]" in message or (
                "another query with same id is already active" in message
            ), message
        if stop_active == "false":
            assert len(started) == 1  # nothing was stopped: every later start was refused
        survivor.processAllAvailable()
        before = _committed(checkpoint)
        (inp / "1.json").write_text('{"value": 2}\n')
        survivor.processAllAvailable()
        assert survivor.exception() is None
        after = _committed(checkpoint)
        assert after == list(range(len(after))) and len(after) == len(before) + 1, (before, after)
        assert survivor.lastProgress["numInputRows"] == 1
    finally:
        for q in started:
            q.stop()


def _committed(checkpoint: Path) -> list[int]:
    return sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
