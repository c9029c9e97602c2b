"""The Redis source under trigger(continuous=...): long-running XREAD tasks."""

from __future__ import annotations

import json
import os

from pyspark.sql import functions as F
from redis_testing import add


def _file_writer(directory):
    class Writer:
        def open(self, partition_id, epoch_id):
            self.path = os.path.join(directory, f"{partition_id}-{epoch_id}-{os.getpid()}.jsonl")
            self.f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            return True

        def process(self, row):
            record = {"key": row.key, "id": row.id, "n": row.n, "ms": row.ms}
            self.f.write(json.dumps(record) + "\n")

        def close(self, error):
            self.f.close()

    return Writer()


def _read(directory):
    out = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return sorted((x["key"], x["id"], x["n"], x["ms"]) for x in out)


def test_continuous_query_reads_new_entries_and_restarts_after_the_committed_ids(
    ls, redis_server, r, names, tmp_path
):
    stream = names("cont")
    add(r, stream, ["1-0", "2-0"])
    out = tmp_path / "out"
    out.mkdir()

    def start():
        df = (
            ls.readStream.format("redis")
            .options(**redis_server.options)
            .option("streams", stream)
            .option("startingOffsets", "earliest")
            .load()
            .where(F.col("fields")["n"].isNotNull())
            .select(
                "key",
                "id",
                F.upper(F.col("fields")["n"]).alias("n"),
                (F.col("timestamp").cast("double") * 1000).cast("long").alias("ms"),
            )
        )
        return (
            df.writeStream.foreach(_file_writer(str(out)))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(continuous="100 milliseconds")
            .start()
        )

    def want(ids):
        return [(stream, f"{i}-0", f"{stream}/{i}-0".upper(), i) for i in ids]

    q = start()
    q.processAllAvailable()
    add(r, stream, ["3-0"])
    q.processAllAvailable()
    q.stop()
    assert _read(out) == want([1, 2, 3])

    add(r, stream, ["4-0", "5-0"])
    q = start()
    q.processAllAvailable()
    q.stop()
    # The restart read after the committed IDs: nothing again, nothing missed.
    assert _read(out) == want([1, 2, 3, 4, 5])
    offsets = tmp_path / "ck" / "offsets"
    commits = tmp_path / "ck" / "commits"
    last = max(int(n.name) for n in commits.iterdir() if n.name.isdigit())
    assert json.loads((offsets / str(last)).read_text().split("\n")[2]) == {stream: "5-0"}
