"""Where a Kafka -> Kafka micro-batch's latency goes: a per-batch timeline.

    .venv/bin/python -m bench.kafka_timeline --seconds 20 --engines native,lockgate,lockgate-at-least-once

Runs ``bench.kafka_latency``'s stateless query (``--query dedup``: its dedup query; same
broker, producer and sinks) with
Spark's event log on, and for every batch of the timed phase puts together:

* the driver loop, from the query's progress (trigger start, ``durationMs``) and, for
  lockgate, the wall-clock start and end of each timed phase (``ProgressTracker.time``)
  and of the work after the trigger (``_finish_trigger``: progress, listeners) and the
  wait before the next one;
* the batch's Spark jobs, from the event log: submission, first task launch (the
  scheduling delay), last task end, job end;
* the records: which batch read each one (its input offset within the batch's
  ``startOffset``/``endOffset``), how long it waited for that batch to start, and how long
  from the batch's start to its output record's CreateTime.

Prints medians over the batches that read records, and writes every batch to a JSON file.
A measurement tool: it does not change what it measures, except for the few
``time.perf_counter`` calls it wraps around lockgate's phases.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import kafka_latency as kl
from bench.common import RESULTS_DIR, loadavg

PHASES: list[tuple[float, str, float, float]] = []
"""(trigger start ms, phase, wall start ms, wall end ms), lockgate's driver loop."""


def _instrument() -> None:
    """Record the wall-clock bounds of lockgate's timed phases and of the work between
    triggers."""
    import contextlib

    from lockgate.execution import microbatch, progress

    original_time = progress.ProgressTracker.time

    @contextlib.contextmanager
    def timed(self: Any, key: str) -> Any:
        t0 = time.time() * 1000
        try:
            with original_time(self, key):
                yield
        finally:
            PHASES.append((self.trigger_start_ms, key, t0, time.time() * 1000))

    progress.ProgressTracker.time = timed  # type: ignore[method-assign]

    def wrap(name: str, label: str) -> None:
        original = getattr(microbatch.MicroBatchExecution, name)

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.time() * 1000
            try:
                return original(self, *args, **kwargs)
            finally:
                PHASES.append((self.progress.trigger_start_ms, label, t0, time.time() * 1000))

        setattr(microbatch.MicroBatchExecution, name, wrapped)

    wrap("_finish_trigger", "finishTrigger")
    wrap("_wait_for_data", "waitForData")
    wrap("_run_one_trigger", "wholeTrigger")


def _read_input_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """seq -> input offset."""
    return dict(kl.read_topic(bootstrap, topic, lambda m: (int(m.value().split(b",")[0]), m.offset())))


def output_row(value: bytes, create_time_ms: int, query: str) -> tuple[int, int, int]:
    """(seq, CreateTime, source ms) of an output record of ``query``.

    stateless: ``KEY,seq,event ms,source ms``; dedup: ``id,source ms``, the first of the
    pair of input records ``seq = 2 id`` and ``2 id + 1`` (the one the query keeps).
    """
    parts = value.split(b",")
    if query == "dedup":
        return 2 * int(parts[0]), create_time_ms, int(parts[1])
    return int(parts[1]), create_time_ms, int(parts[3])


def _read_output(bootstrap: str, topic: str, query: str) -> list[tuple[int, int, int]]:
    return kl.read_topic(bootstrap, topic, lambda m: output_row(m.value(), m.timestamp()[1], query))


def _events(log_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(p for p in log_dir.rglob("*") if p.is_file()):
        with path.open() as fh:
            for line in fh:
                events.append(json.loads(line))
    return events


def _jobs(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            desc = props.get("spark.job.description") or ""
            job = {"submitted": e["Submission Time"], "desc": desc,
                   "group": props.get("spark.jobGroup.id"), "first_task": None, "last_task_end": None,
                   "tasks": 0, "task_run_ms": []}
            jobs[e["Job ID"]] = job
            for s in e["Stage IDs"]:
                stage_job[s] = e["Job ID"]
        elif kind == "SparkListenerTaskStart":
            job = jobs.get(stage_job.get(e["Stage ID"], -1))
            if job is not None:
                t = e["Task Info"]["Launch Time"]
                job["first_task"] = t if job["first_task"] is None else min(job["first_task"], t)
        elif kind == "SparkListenerTaskEnd":
            job = jobs.get(stage_job.get(e["Stage ID"], -1))
            if job is not None:
                info = e["Task Info"]
                job["tasks"] += 1
                job["task_run_ms"].append(info["Finish Time"] - info["Launch Time"])
                job["last_task_end"] = max(job["last_task_end"] or 0, info["Finish Time"])
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["ended"] = e["Completion Time"]
    return jobs


def _batch_of(desc: str) -> int | None:
    for sep in ("<br/>batch = ", "\nbatch = "):
        if sep in desc:
            tail = desc.split(sep)[-1].strip()
            return int(tail) if tail.isdigit() else None
    return None


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp() * 1000


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def analyse(progress: list[Any], jobs: dict[int, dict[str, Any]], run_id: str,
            offsets: dict[int, int], output: list[tuple[int, int, int]],
            window: tuple[int, int], lockgate: bool) -> dict[str, Any]:
    batches = []
    for p in progress:
        start = _ts(p["timestamp"])
        src = p["sources"][0]
        so = json.loads(src["startOffset"]) if isinstance(src["startOffset"], str) else src["startOffset"]
        eo = json.loads(src["endOffset"]) if isinstance(src["endOffset"], str) else src["endOffset"]
        def first(o: Any) -> int:
            if not o:
                return 0
            return int(next(iter(next(iter(o.values())).values())))
        batches.append({"id": p["batchId"], "start": start, "dur": dict(p["durationMs"]),
                        "rows": p["numInputRows"], "from": first(so), "to": first(eo)})
    by_batch = {b["id"]: b for b in batches if b["rows"]}
    for job in jobs.values():
        if job["group"] != run_id:
            continue
        bid = _batch_of(job["desc"])
        if bid in by_batch:
            by_batch[bid].setdefault("jobs", []).append(job)
    if lockgate:
        for trig, key, t0, t1 in PHASES:
            for b in batches:
                if b["start"] == trig:
                    b.setdefault("phases", {}).setdefault(key, []).append((t0 - trig, t1 - trig))
    ordered = sorted(batches, key=lambda b: b["start"])
    for a, b in itertools.pairwise(ordered):
        a["next_start"] = b["start"]
    # records
    seq_batch = {}
    ranges = sorted((b["from"], b["to"], b["id"]) for b in by_batch.values())
    import bisect
    starts = [r[0] for r in ranges]
    for seq, off in offsets.items():
        i = bisect.bisect_right(starts, off) - 1
        if i >= 0 and ranges[i][0] <= off < ranges[i][1]:
            seq_batch[seq] = ranges[i][2]
    waits, insides, lats = [], [], []
    per_batch_lat = defaultdict(list)
    for seq, create, source in output:
        if not (window[0] <= source <= window[1]):
            continue
        bid = seq_batch.get(seq)
        if bid is None:
            continue
        b = by_batch[bid]
        waits.append(b["start"] - source)
        insides.append(create - b["start"])
        lats.append(create - source)
        per_batch_lat[bid].append(create - b["start"])
    timed = [b for b in by_batch.values() if window[0] <= b["start"] <= window[1] + 2000]
    rows: dict[str, list[float]] = defaultdict(list)
    for b in timed:
        for k, v in b["dur"].items():
            rows[f"durationMs.{k}"].append(v)
        if "next_start" in b:
            rows["gap: this trigger end -> next trigger start"].append(
                b["next_start"] - b["start"] - b["dur"].get("triggerExecution", 0))
            rows["trigger start -> next trigger start"].append(b["next_start"] - b["start"])
        for job in b.get("jobs", []):
            if job.get("first_task") is not None:
                rows["job: submitted - trigger start"].append(job["submitted"] - b["start"])
                rows["job: scheduling delay (submit -> first task)"].append(job["first_task"] - job["submitted"])
                rows["job: first task -> last task end"].append(job["last_task_end"] - job["first_task"])
                rows["job: last task end -> job end"].append(job.get("ended", job["last_task_end"]) - job["last_task_end"])
                rows["job: task run ms (each)"].extend(job["task_run_ms"])
                add = b.get("phases", {}).get("addBatch")
                if add:  # lockgate: the sink's planning before its job, and after it
                    rows["addBatch start -> job submitted"].append(
                        job["submitted"] - b["start"] - add[0][0])
                    rows["job end -> addBatch end"].append(
                        b["start"] + add[0][1] - job.get("ended", job["last_task_end"]))
        rows["jobs per batch"].append(len(b.get("jobs", [])))
        if per_batch_lat.get(b["id"]):
            rows["batch start -> first output CreateTime"].append(min(per_batch_lat[b["id"]]))
            rows["batch start -> last output CreateTime"].append(max(per_batch_lat[b["id"]]))
        for key, spans in b.get("phases", {}).items():
            rows[f"phase {key}: start after trigger start"].append(spans[0][0])
            rows[f"phase {key}: ms"].append(sum(t1 - t0 for t0, t1 in spans))
    summary = {k: _median(v) for k, v in sorted(rows.items())}
    summary["record: wait for its batch to start (median)"] = _median(waits)
    summary["record: batch start -> output (median)"] = _median(insides)
    summary["record: latency p50"] = _median(lats)
    summary["batches"] = len(timed)
    return {"summary": summary, "batches": [
        {k: v for k, v in b.items() if k != "jobs"} | {"jobs": [
            {k2: v2 for k2, v2 in j.items() if k2 != "task_run_ms"} for j in b.get("jobs", [])]}
        for b in timed]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--engines", default="native,lockgate,lockgate-at-least-once")
    parser.add_argument("--query", default="stateless", choices=("stateless", "dedup"))
    args = parser.parse_args(argv)
    _instrument()
    log_dir = Path(tempfile.mkdtemp(prefix="kafka-timeline-events-"))
    bench_args = kl.parse_args(["--seconds", str(args.seconds), "--rate", str(args.rate),
                                "--warmup", str(args.warmup)])
    import os

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import lockgate

    spark = (
        SparkSession.builder.master(bench_args.master)
        .appName("lockgate-kafka-timeline")
        .config("spark.jars", kl.connector_jars())
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config(map=lockgate.spark_conf())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.numRecentProgressUpdates", "2000")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.rolling.enabled", "false")
        .config("spark.eventLog.dir", f"file://{log_dir}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    ls = lockgate.session(spark)
    collected = []
    with tempfile.TemporaryDirectory(prefix="kafka-timeline-") as tmp, kl.broker_running(Path(tmp)) as broker:
        for engine in args.engines.split(","):
            token = uuid.uuid4().hex[:8]
            source, sink = f"in-{token}", f"out-{token}"
            broker.create_topic(source)
            broker.create_topic(sink)
            build, mode = kl.BUILD[args.query]
            readers = spark.readStream if engine == "native" else ls.readStream
            df = (readers.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                  .option("subscribe", source).option("startingOffsets", "earliest").load())
            writer = (build(df).writeStream.format("kafka").outputMode(mode)
                      .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", sink)
                      .option("checkpointLocation", str(Path(tmp) / engine)))
            if engine == "lockgate-at-least-once":
                writer = writer.option("exactlyOnce", "false")
            producer = kl.Producer(broker.bootstrap, source, rate=args.rate, seconds=args.seconds, keys=1000)
            PHASES.clear()
            q = writer.start()
            producer.start()
            kl._wait(q, engine, "first output", lambda s=sink: kl._high_watermark(broker.bootstrap, s) > 0, 180)
            producer.go()
            kl._wait(q, engine, "produced", producer.done.is_set, args.seconds + 120)
            kl._drain(q)
            progress = [json.loads(p.json) for p in q.recentProgress]
            run_id = str(q.runId)
            producer.stop()
            producer.join(60)
            q.stop()
            phases = list(PHASES)
            collected.append((engine, run_id, progress, phases,
                              _read_input_offsets(broker.bootstrap, source),
                              _read_output(broker.bootstrap, sink, args.query),
                              (producer.first_ms + int(args.warmup * 1000), producer.last_ms)))
    spark.stop()
    jobs = _jobs(_events(log_dir))
    results = {"loadavg": loadavg(), "engines": {}}
    for engine, run_id, progress, phases, offsets, output, window in collected:
        PHASES[:] = phases
        res = analyse(progress, jobs, run_id, offsets, output, window, engine != "native")
        results["engines"][engine] = res
        print(f"\n== {engine}")
        for k, v in res["summary"].items():
            print(f"  {k:60s} {v}")
    out = Path(RESULTS_DIR) / f"kafka-timeline-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwritten {out}; load {loadavg()}")


if __name__ == "__main__":
    main()
