"""Workloads 1, 2, 4, 5, 6: interleaved rounds of one query per engine (a Bench mixin)."""

from __future__ import annotations

import os
from typing import Any

from bench.common import ENGINES, Round, ratio, summarize
from bench.workloads import Context, Workload, write_json_files


class StandardRuns:
    """Runs of the standard workloads; mixed into :class:`bench.suite.Bench`."""

    def run_standard(self, wl: Workload) -> dict[str, Any]:
        from lockgate import NotSupportedYetError

        ctx = Context(self.sizes, wl.rows_per_batch(self.sizes))
        slack = 3
        if wl.kind == "files":
            files = (self.rounds * (self.warmup + self.per_round + slack) + slack) * self.sizes.files_per_trigger_6
            ctx.input_dir = self._dir(f"w{wl.key}-input")
            write_json_files(ctx.input_dir, files, self.sizes.rows_per_file_6)
        expected = ctx.rows_per_batch * wl.inputs
        rounds: dict[str, list[Round]] = {e: [] for e in ENGINES}
        unsupported: str | None = None
        notes: list[str] = []
        for r in range(self.rounds):
            for engine in self._order(r):
                if engine == "lockgate" and unsupported is not None:
                    continue
                checkpoint = os.path.join(self.tmp, f"w{wl.key}-{engine}-ck")
                out_dir = os.path.join(self.tmp, f"w{wl.key}-{engine}-out") if wl.sink != "noop" else None
                try:
                    rr = self._round(
                        engine,
                        wl,
                        ctx,
                        checkpoint,
                        warmup=self.warmup,
                        measure=self.per_round,
                        # File sources: native counts input rows after the filter pushed
                        # into the JSON scan, so only require data.
                        accept=None if wl.kind == "files" else (lambda p: int(p.get("numInputRows") or 0) == expected),
                        out_dir=out_dir,
                    )
                except NotSupportedYetError as exc:
                    if engine != "lockgate":
                        raise
                    unsupported = str(exc)
                    continue
                except Exception as exc:
                    if engine != "lockgate":
                        raise
                    self._stop_all()
                    failed = f"{type(exc).__name__}: {exc}"
                    unsupported = failed
                    notes.append(f"lockgate failed: {failed}")
                    continue
                rounds[engine].append(rr)
                notes.extend(rr.notes)
        engines = {e: summarize(rs) for e, rs in rounds.items() if rs}
        result: dict[str, Any] = {"engines": engines, "notes": notes}
        if unsupported is not None:
            failed = any(n.startswith("lockgate failed") for n in notes)
            result["status"] = "lockgate-error" if failed else "lockgate-not-supported"
            result["lockgate_error"] = unsupported
            result["ratio_median"] = None
        else:
            result["status"] = "ok"
            result["ratio_median"] = ratio(engines["lockgate"]["median_ms"], engines["native"]["median_ms"])
            result["ratio_p90"] = ratio(engines["lockgate"]["p90_ms"], engines["native"]["p90_ms"])
            result["ratio_cpu"] = ratio(engines["lockgate"]["cpu_s_mean"], engines["native"]["cpu_s_mean"])
        if wl.kind == "files":
            result["output_check"] = self._check_file_outputs(wl)
        return result

    def _check_file_outputs(self, wl: Workload) -> dict[str, int]:
        """Rows each engine's parquet sink holds (read through its _spark_metadata log)."""
        counts = {}
        for engine in ENGINES:
            out_dir = os.path.join(self.tmp, f"w{wl.key}-{engine}-out")
            if os.path.isdir(out_dir):
                counts[engine] = self.spark.read.parquet(out_dir).count()
        return counts

    # -- 3: state size scaling ------------------------------------------------------------------
