"""Trigger.AvailableNow logs, after each batch, what each source has left to read."""

from __future__ import annotations

import json
import logging
import re

LOGGER = "lockgate.execution.MicroBatchExecution"


def test_file_source_backlog_is_logged_after_each_batch(ls, tmp_path, caplog):
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(4):
        (inp / f"{i}.json").write_text(json.dumps({"v": i}) + "\n")
    caplog.set_level(logging.INFO, logger=LOGGER)
    q = (
        ls.readStream.schema("v LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(inp))
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and "Trigger.AvailableNow" in r.getMessage()]
    found = [
        tuple(int(x) for x in re.search(r"batch (\d+) done \((\d+) this run\); .*: (\d+) files read, (\d+) left", line).groups())
        for line in lines
    ]
    assert found == [(0, 1, 1, 3), (1, 2, 2, 2), (2, 3, 3, 1), (3, 4, 4, 0)], lines
    assert "about 3 more batches" in lines[0] and "about 1 more batch" in lines[2], lines
    assert "more batch" not in lines[3], lines


def test_a_restart_counts_from_what_was_left(ls, tmp_path, caplog):
    inp = tmp_path / "in"
    inp.mkdir()
    cp = str(tmp_path / "cp")

    def run():
        q = (
            ls.readStream.schema("v LONG")
            .option("maxFilesPerTrigger", 2)
            .json(str(inp))
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", cp)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None

    for i in range(2):
        (inp / f"{i}.json").write_text(json.dumps({"v": i}) + "\n")
    run()
    for i in range(2, 5):
        (inp / f"{i}.json").write_text(json.dumps({"v": i}) + "\n")
    caplog.clear()
    caplog.set_level(logging.INFO, logger=LOGGER)
    run()
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and "Trigger.AvailableNow" in r.getMessage()]
    assert [re.search(r"batch \d+ done \(\d+ this run\); .*files read, \d+ left", x).group(0).split(";")[0] for x in lines] == [
        "batch 1 done (1 this run)",
        "batch 2 done (2 this run)",
    ], lines
    assert "2 files read, 1 left" in lines[0] and "3 files read, 0 left" in lines[1], lines
