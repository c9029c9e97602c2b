"""Workload 3: one keyed aggregation at a small and a large state (a Bench mixin)."""

from __future__ import annotations

import json
import os
from typing import Any

from bench.common import ENGINES, Round, end_offset, ratio, state_rows, summarize
from bench.workloads import Context, Workload


class StateScalingRuns:
    """Runs of workload 3; mixed into :class:`bench.suite.Bench`."""

    def run_state_scaling(self, wl: Workload) -> dict[str, Any]:
        """Workload 3: the same query with a small state and with keys_3 keys in state.

        Fill first: a query restarted with fill_rows_3 rows per batch until every key
        ``value % keys_3`` is in state (the rate source's offset does not depend on
        rowsPerBatch, so the checkpoint continues), then back to rows_3 rows per batch.
        Then rounds, interleaving engines and the two states so drift cancels in the
        large/small ratio: per engine a small-state sub-round (a fresh query, batch 0
        its warm-up, state 2*rows_3 ... (k+1)*rows_3 keys) and a large-state sub-round
        (the filled query, rows_3 changed keys of keys_3 per batch).
        """
        s = self.sizes
        ctx = Context(s, s.rows_3)
        cks = {e: os.path.join(self.tmp, f"w3-{e}-ck") for e in ENGINES}
        small: dict[str, list[Round]] = {e: [] for e in ENGINES}
        large: dict[str, list[Round]] = {e: [] for e in ENGINES}
        fill: dict[str, dict[str, Any]] = {}
        steady = lambda p: int(p.get("numInputRows") or 0) == s.rows_3
        full_state = lambda p: steady(p) and (state_rows(p) or 0) >= s.keys_3
        # Warm-up: a throwaway run of the same query per engine (Python workers, JIT).
        if self.warmup:
            for engine in ENGINES:
                self._round(engine, wl, ctx, self._dir(f"w3-{engine}-warmup-ck"), warmup=0, measure=2)
        for engine in ENGINES:
            rr = self._round(
                engine, wl, Context(s, s.fill_rows_3), cks[engine], warmup=0, measure=None,
                done=lambda p: end_offset(json.loads(p.json)) >= s.keys_3,
            )
            fill[engine] = {
                "batches": len([p for p in rr.progresses if p.get("numInputRows")]),
                "rows_per_batch": s.fill_rows_3,
                "wall_s": rr.wall_s,
                "trigger_ms": [p["durationMs"].get("triggerExecution") for p in rr.progresses if p.get("numInputRows")],
                "memory": rr.memory,
            }
        small_warmup = min(1, self.warmup)
        for r in range(self.rounds):
            for engine in self._order(r):
                phases = ("small", "large") if r % 2 == 0 else ("large", "small")
                for phase in phases:
                    if phase == "small":
                        small[engine].append(self._round(
                            engine, wl, ctx, os.path.join(self.tmp, f"w3-{engine}-small{r}-ck"),
                            warmup=small_warmup, measure=self.per_round, accept=steady))
                    else:
                        large[engine].append(self._round(
                            engine, wl, ctx, cks[engine], warmup=max(self.warmup, 1),
                            measure=self.per_round, accept=full_state))
        self._w3_checkpoints = cks
        phases = {
            "small": {e: summarize(rs) for e, rs in small.items()},
            "large": {e: summarize(rs) for e, rs in large.items()},
        }
        scaling = {
            e: ratio(phases["large"][e]["median_ms"], phases["small"][e]["median_ms"]) for e in ENGINES
        }
        engines = phases["large"]
        return {
            "status": "ok",
            "engines": engines,
            "phases": phases,
            "fill": fill,
            "large_over_small_median": scaling,
            "lockgate_scaling_target_1_3x_met": (scaling["lockgate"] or 99) <= 1.3,
            "ratio_median": ratio(engines["lockgate"]["median_ms"], engines["native"]["median_ms"]),
            "ratio_median_small": ratio(
                phases["small"]["lockgate"]["median_ms"], phases["small"]["native"]["median_ms"]
            ),
            "ratio_cpu": ratio(engines["lockgate"]["cpu_s_mean"], engines["native"]["cpu_s_mean"]),
            "ratio_cpu_small": ratio(
                phases["small"]["lockgate"]["cpu_s_mean"], phases["small"]["native"]["cpu_s_mean"]
            ),
            "notes": [],
        }

    # -- 7: recovery ------------------------------------------------------------------------------
