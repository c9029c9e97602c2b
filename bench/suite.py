"""The benchmark suite: rounds of a workload on each engine, and the dispatch by kind."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.common import (
    ENGINES,
    BenchError,
    QueryFailed,
    Round,
    failure_text,
    loadavg,
    next_batch_id,
)
from bench.cpu import CpuProbe
from bench.memory import MemoryProbe
from bench.recovery import RecoveryRuns
from bench.shapes import SHAPES
from bench.soak import SoakRuns
from bench.standard import StandardRuns
from bench.state_scaling import StateScalingRuns
from bench.workloads import WORKLOADS, Context, Sizes, Workload


# -- the suite -------------------------------------------------------------------------------
class Bench(StandardRuns, StateScalingRuns, RecoveryRuns, SoakRuns):
    """The suite: one SparkSession, both engines, interleaved rounds; one mixin per kind of
    workload (standard, state scaling, recovery, soak)."""

    def __init__(
        self,
        spark: Any,
        *,
        sizes: Sizes,
        batches: int,
        rounds: int,
        warmup: int,
        recovery_after: int,
        log: Callable[[str], None] = print,
        exclude_pids: set[int] | None = None,
    ) -> None:
        """``exclude_pids``: processes of this tree whose CPU is not the engines' (the burner
        of ``--busy-core``)."""
        import lockgate

        self.spark = spark
        self.ls = lockgate.session(spark)
        self.sizes = sizes
        self.rounds = max(1, rounds)
        self.per_round = max(1, math.ceil(batches / self.rounds))
        self.warmup = max(0, warmup)
        self.recovery_after = recovery_after
        self.log = log
        self.tmp = tempfile.mkdtemp(prefix="lockgate-bench-")
        self.mem = MemoryProbe(spark)
        self.cpu = CpuProbe(exclude=set(exclude_pids or ()))
        self._w3_checkpoints: dict[str, str] | None = None
        self.failures: list[str] = []

    def close(self) -> None:
        self._stop_all()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _stop_all(self) -> None:
        for q in [*self.spark.streams.active, *self.ls.streams.active]:
            try:
                q.stop()
            except Exception as exc:  # noqa: BLE001 - best effort after a failure
                self.log(f"   (stopping a leftover query failed: {exc})")

    def _dir(self, name: str) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(path, exist_ok=True)
        return path

    def _readers(self, engine: str) -> Callable[[], Any]:
        if engine == "native":
            return lambda: self.spark.readStream
        return lambda: self.ls.readStream

    def _order(self, r: int) -> tuple[str, ...]:
        return ENGINES if r % 2 == 0 else tuple(reversed(ENGINES))

    # -- one round ---------------------------------------------------------------------------
    def _start(
        self, engine: str, wl: Workload, ctx: Context, checkpoint: str, out_dir: str | None, available_now: bool
    ) -> Any:
        df = wl.build(self._readers(engine), ctx)
        writer = df.writeStream.format(wl.sink).outputMode(wl.output_mode).option(
            "checkpointLocation", checkpoint
        )
        if out_dir is not None:
            writer = writer.option("path", out_dir)
        if available_now:
            writer = writer.trigger(availableNow=True)
        return writer.start()

    def _round(self, engine: str, wl: Workload, ctx: Context, checkpoint: str, **kwargs: Any) -> Round:
        """``_round_once``; a query that fails is noted and restarted once from its checkpoint."""
        try:
            return self._round_once(engine, wl, ctx, checkpoint, **kwargs)
        except QueryFailed as exc:
            self.failures.append(str(exc))
            self.log(f"   !! {wl.key}: {str(exc)[:400]}; restarting it from its checkpoint once")
            self._stop_all()
            return self._round_once(engine, wl, ctx, checkpoint, **kwargs)

    def _round_once(
        self,
        engine: str,
        wl: Workload,
        ctx: Context,
        checkpoint: str,
        *,
        warmup: int,
        measure: int | None,
        accept: Callable[[dict[str, Any]], bool] | None = None,
        done: Callable[[Any], bool] | None = None,
        on_poll: Callable[[Any, Any], None] | None = None,
        out_dir: str | None = None,
        available_now: bool = False,
        stall_timeout_s: float = 600.0,
    ) -> Round:
        """Run the query until ``measure`` accepted batches followed ``warmup`` batches
        (or ``done(progress)``), then stop it."""
        start_batch = next_batch_id(checkpoint)
        self.mem.reset()
        t0 = time.perf_counter()
        q = self._start(engine, wl, ctx, checkpoint, out_dir, available_now)
        start_call_ms = (time.perf_counter() - t0) * 1000
        self.cpu.start(first_batch=start_batch)
        notes: list[str] = []
        seen: list[int] = []
        accepted = 0
        last_new = time.monotonic()
        last_check = 0.0
        try:
            while True:
                p = q.lastProgress
                if p is not None and p.numInputRows > 0 and (not seen or p.batchId > seen[-1]):
                    seen.append(p.batchId)
                    self.cpu.observe(p.batchId)
                    last_new = time.monotonic()
                    if len(seen) > warmup and (accept is None or accept(json.loads(p.json))):
                        accepted += 1
                if on_poll is not None and p is not None:
                    on_poll(q, p)
                if done is not None and p is not None and done(p):
                    break
                if measure is not None and accepted >= measure:
                    break
                if measure is not None and len(seen) > warmup + 3 * measure + 10:
                    raise BenchError(
                        f"{engine}: {len(seen)} batches ran but only {accepted} of them were "
                        "accepted for measurement (unexpected numInputRows or state size)"
                    )
                exhausted = p is not None and p.numInputRows == 0 and seen and not available_now
                if exhausted and wl.kind == "files":
                    notes.append(f"{engine}: source exhausted after {len(seen)} batches")
                    break
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    if not q.isActive:
                        if q.exception() is not None:
                            raise QueryFailed(failure_text(engine, q))
                        break
                if now - last_new > stall_timeout_s:
                    raise BenchError(f"{engine}: no new batch in {stall_timeout_s:.0f} s")
                self.mem.sample()
                time.sleep(0.05)
        finally:
            if available_now:
                with contextlib.suppress(Exception):
                    q.awaitTermination(stall_timeout_s)  # raises the query's failure
            q.stop()
        if q.exception() is not None:
            raise QueryFailed(failure_text(engine, q))
        wall_s = time.perf_counter() - t0
        progresses = [json.loads(p.json) for p in q.recentProgress]
        with_data = [p for p in progresses if int(p.get("numInputRows") or 0) > 0]
        measured = [p for p in with_data[warmup:] if accept is None or accept(p)]
        if measure is not None:
            measured = measured[:measure]
        return Round(engine, start_batch, progresses, measured, self.mem.peaks(), start_call_ms, wall_s, notes,
                     cpu=self.cpu.per_batch())

    # -- workloads -------------------------------------------------------------------------------
    def run(self, key: str) -> dict[str, Any]:
        wl = WORKLOADS[key] if key in WORKLOADS else SHAPES[key]
        base = {
            "key": key,
            "title": wl.title,
            "description": wl.description,
            "output_mode": wl.output_mode,
            "sink": wl.sink,
            "rows_per_batch": wl.rows_per_batch(self.sizes),
            "loadavg_before": loadavg(),
        }
        t0 = time.perf_counter()
        failures_before = len(self.failures)
        try:
            if wl.kind == "state-scaling":
                result = self.run_state_scaling(wl)
            elif wl.kind == "recovery":
                result = self.run_recovery(wl)
            else:
                result = self.run_standard(wl)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next workload
            self._stop_all()
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        base.update(result)
        base["query_failures"] = self.failures[failures_before:]
        base["elapsed_s"] = time.perf_counter() - t0
        base["loadavg_after"] = loadavg()
        return base
