"""Redis in, a running count per word, Redis hashes out (update mode), across a restart."""

from __future__ import annotations

from collections import Counter

from pyspark.sql import functions as F

WORDS = ["apple", "pear", "apple", "fig", "pear", "apple", "kiwi", "fig", "apple"]


def test_word_counts_in_hashes(ls, redis_server, r, names, tmp_path):
    words, prefix = names("words"), names("count") + ":"
    checkpoint = str(tmp_path / "ck")

    def start():
        counts = (
            ls.readStream.format("redis")
            .options(**redis_server.options)
            .option("streams", words)
            .option("maxEntriesPerTrigger", 4)
            .load()
            .select(F.col("fields")["word"].alias("word"))
            .groupBy("word")
            .count()
        )
        return (
            counts.writeStream.format("redis")
            .outputMode("update")
            .options(**redis_server.options)
            .option("keyColumn", "word")
            .option("keyPrefix", prefix)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    def stored() -> dict[str, int]:
        keys = r.scan_iter(match=f"{prefix}*")
        return {k[len(prefix) :]: int(r.hget(k, "count")) for k in keys}

    sent: Counter[str] = Counter()

    def send(batch: list[str]) -> None:
        for word in batch:
            r.xadd(words, {"word": word})
        sent.update(batch)

    send(WORDS)  # before the start, so the batches are 4, 4 and 1 entries
    q = start()
    q.processAllAvailable()
    assert stored() == dict(sent)
    assert [p.numInputRows for p in q.recentProgress if p.numInputRows] == [4, 4, 1]
    send(["fig", "plum"])
    q.processAllAvailable()
    assert stored() == dict(sent)
    q.stop()

    # Restarted from the checkpoint: state and offsets continue where they were.
    send(["plum", "apple", "kiwi"])
    q = start()
    q.processAllAvailable()
    q.stop()
    assert stored() == dict(sent) == {"apple": 5, "pear": 2, "fig": 3, "kiwi": 2, "plum": 2}
