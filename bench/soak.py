"""``--soak N``: workload 2 on lockgate for N batches, memory drift (a Bench mixin)."""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from bench.common import next_batch_id, ratio
from bench.workloads import WORKLOADS, Context


class SoakRuns:
    """The soak run; mixed into :class:`bench.suite.Bench`."""

    def run_soak(self, n: int) -> dict[str, Any]:
        wl = WORKLOADS["2"]
        ctx = Context(self.sizes, wl.rows_per_batch(self.sizes))
        checkpoint = os.path.join(self.tmp, "soak-ck")
        mark = 100 if n > 100 else max(1, n // 2)
        samples: dict[str, Any] = {}

        def on_poll(q: Any, p: Any) -> None:
            if "mark" not in samples and p.batchId >= mark - 1:
                recent = [json.loads(x.json) for x in q.recentProgress]
                samples["mark"] = {
                    "batch": p.batchId + 1,
                    **self.mem.now(gc=False),
                    "after_gc": self.mem.now(gc=True),
                    "median_trigger_ms_last_100": statistics.median(
                        x["durationMs"]["triggerExecution"] for x in recent
                    ),
                }

        t0 = time.perf_counter()
        rr = self._round("lockgate", wl, ctx, checkpoint, warmup=0, measure=None, on_poll=on_poll,
                         done=lambda p: p.batchId >= n - 1)
        end = {
            "batch": next_batch_id(checkpoint),
            **self.mem.now(gc=False),
            "after_gc": self.mem.now(gc=True),
            "median_trigger_ms_last_100": statistics.median(
                p["durationMs"]["triggerExecution"] for p in rr.progresses if p.get("numInputRows")
            ),
        }
        start = samples.get("mark", {})

        def growth(key: str, gc: bool) -> float | None:
            a = (start.get("after_gc") or {}).get(key) if gc else start.get(key)
            b = end["after_gc"].get(key) if gc else end.get(key)
            return ratio(b, a)

        result = {
            "batches": n,
            "mark": start,
            "end": end,
            "elapsed_s": time.perf_counter() - t0,
            "growth": {
                "driver_rss": growth("driver_rss_mb", False),
                "jvm_rss": growth("jvm_rss_mb", False),
                "jvm_heap_used_after_gc": growth("jvm_heap_used_mb", True),
                "workers_pss": growth("workers_pss_mb", False),
            },
        }
        result["within_10_percent"] = all(
            g is not None and g <= 1.10 for k, g in result["growth"].items() if k in ("driver_rss", "jvm_heap_used_after_gc")
        )
        return result
