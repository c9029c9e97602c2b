"""Workload 7: restart from a checkpoint with warm and cold workers (a Bench mixin)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from typing import Any

from bench.common import (
    ENGINES,
    QueryFailed,
    end_offset,
    failure_text,
    next_batch_id,
    numbered,
    parse_ts,
    ratio,
    state_rows,
)
from bench.workloads import Context, Workload


class RecoveryRuns:
    """Runs of workload 7; mixed into :class:`bench.suite.Bench`."""

    def _clear_lockgate_worker_caches(self) -> dict[str, Any]:
        """Empty lockgate's state cache in every reused Python worker, so the next batch
        loads state from the checkpoint files as a fresh process would."""

        # A mapInArrow job, so that it runs on the same pool of Python workers as
        # lockgate's state tasks (an RDD job's workers are a different pool).
        def clear(batches: Any) -> Any:
            import os as _os

            import pyarrow as _pa

            from lockgate.state import store

            for _ in batches:
                pass
            n = len(store._cache)
            store.clear_cache()
            yield _pa.RecordBatch.from_pydict({"pid": [_os.getpid()], "n": [n]})

        sc = self.spark.sparkContext
        sc.setJobGroup("lockgate-bench", "clear lockgate worker caches")
        df = self.spark.range(0, 64, 1, 64).mapInArrow(clear, "pid long, n long")
        hits = [(r["pid"], r["n"]) for r in df.collect()]
        workers = {pid for pid, _ in hits}
        return {"workers": len(workers), "entries_cleared": sum(n for _, n in hits)}

    def _prepare_recovery_checkpoint(self, wl: Workload, engine: str, checkpoint: str, target: int) -> int:
        ctx = Context(self.sizes, self.sizes.rows_3)
        if next_batch_id(checkpoint) == 0:
            # Workload 3 did not run: fill the state first.
            self._round(engine, wl, Context(self.sizes, self.sizes.fill_rows_3), checkpoint, warmup=0,
                        measure=None, done=lambda p: end_offset(json.loads(p.json)) >= self.sizes.keys_3)
        if next_batch_id(checkpoint) < target - 1:
            self._round(engine, wl, ctx, checkpoint, warmup=0, measure=None,
                        done=lambda p: p.batchId >= target - 2)
        # End cleanly: availableNow re-runs an interrupted batch, runs one more and stops,
        # so every logged batch is committed before the timed restart.
        while next_batch_id(checkpoint) < target or not self._all_committed(checkpoint):
            self._round(engine, wl, ctx, checkpoint, warmup=0, measure=None, available_now=True)
        return next_batch_id(checkpoint)

    @staticmethod
    def _all_committed(checkpoint: str) -> bool:
        offsets = numbered(os.path.join(checkpoint, "offsets"))
        commits = numbered(os.path.join(checkpoint, "commits"))
        return not offsets or (bool(commits) and commits[-1] == offsets[-1])

    def _recover_once(self, wl: Workload, engine: str, checkpoint: str) -> dict[str, Any]:
        ctx = Context(self.sizes, self.sizes.rows_3)
        start_batch = next_batch_id(checkpoint)
        self.mem.reset()
        t0 = time.time()
        q = self._start(engine, wl, ctx, checkpoint, None, available_now=True)
        start_call_ms = (time.time() - t0) * 1000
        with contextlib.suppress(Exception):
            q.awaitTermination(600)  # raises the query's failure
        if q.exception() is not None:
            raise QueryFailed(failure_text(engine, q))
        progresses = [json.loads(p.json) for p in q.recentProgress]
        first = next(p for p in progresses if int(p.get("numInputRows") or 0) > 0)
        done_at = parse_ts(first["timestamp"]) + first["durationMs"].get("triggerExecution", 0) / 1000.0
        return {
            "batches_before": start_batch,
            "recovery_ms": (done_at - t0) * 1000,
            "start_call_ms": start_call_ms,
            "first_batch_trigger_ms": first["durationMs"].get("triggerExecution"),
            "first_batch_durations": first["durationMs"],
            "first_batch_state_rows": state_rows(first),
            "first_batch_state_metrics": ((first.get("stateOperators") or [{}])[0]).get("customMetrics"),
            "memory": self.mem.peaks(),
        }

    def run_recovery(self, wl: Workload) -> dict[str, Any]:
        cks = self._w3_checkpoints or {e: os.path.join(self.tmp, f"w7-{e}-ck") for e in ENGINES}
        prepared = {e: self._prepare_recovery_checkpoint(wl, e, cks[e], self.recovery_after) for e in ENGINES}
        variants: dict[str, list[dict[str, Any]]] = {"native": [], "lockgate": [], "lockgate (cold workers)": []}
        clears = []
        for r in range(min(self.rounds, 3)):
            order = ["native", "lockgate", "lockgate (cold workers)"]
            if r % 2:
                order.reverse()
            for variant in order:
                engine = "native" if variant == "native" else "lockgate"
                if variant == "lockgate (cold workers)":
                    clears.append(self._clear_lockgate_worker_caches())
                variants[variant].append(self._recover_once(wl, engine, cks[engine]))
        summary = {
            v: {
                "runs": len(runs),
                "median_ms": statistics.median(x["recovery_ms"] for x in runs),
                "max_ms": max(x["recovery_ms"] for x in runs),
                "first_batch_trigger_ms_median": statistics.median(x["first_batch_trigger_ms"] for x in runs),
                "start_call_ms_median": statistics.median(x["start_call_ms"] for x in runs),
                "runs_detail": runs,
            }
            for v, runs in variants.items()
        }
        return {
            "status": "ok",
            "batches_in_checkpoint": prepared,
            "recovery": summary,
            "cache_clears": clears,
            "ratio_median": ratio(summary["lockgate (cold workers)"]["median_ms"], summary["native"]["median_ms"]),
            "ratio_median_warm": ratio(summary["lockgate"]["median_ms"], summary["native"]["median_ms"]),
            "notes": [],
        }

    # -- soak -----------------------------------------------------------------------------------
