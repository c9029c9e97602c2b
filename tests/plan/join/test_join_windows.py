"""Joins on a key and a time window (Nexmark q8's shape), every join type, against native
Spark batch by batch.

The window is part of the join key, so both sides evict by it (the state key's event
time) and a window struct is in the key, in the buffered rows and in the output: the
paths where the join task converts structs once per distinct window and computes event
times a column at a time. The steps hold null keys, a key repeated on both sides in one
window and across windows, and rows late by the watermark.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from differential import BASE, run_join_steps, sides
from pyspark.sql import functions as F


def _l(sec: int, k: int | None, v: str) -> dict[str, Any]:
    return {"leftId": k, "leftTime": (BASE + timedelta(seconds=sec)).isoformat(), "lv": v}


def _r(sec: int, k: int | None, v: str) -> dict[str, Any]:
    return {"rightId": k, "rightTime": (BASE + timedelta(seconds=sec)).isoformat(), "rv": v}


def q_windowed(how: str) -> Callable[[Any, Path, Path], Any]:
    def query(reader: Any, ldir: Path, rdir: Path) -> Any:
        left, right = sides(reader, ldir, rdir)
        lw = left.select("leftId", F.window("leftTime", "10 seconds").alias("lw"), "lv")
        rw = right.select("rightId", F.window("rightTime", "10 seconds").alias("rw"), "rv")
        return lw.join(rw, (F.col("leftId") == F.col("rightId")) & (F.col("lw") == F.col("rw")), how)

    return query


HOWS = ("inner", "left_outer", "right_outer", "full_outer", "left_semi")

# watermark delays: left 10 s, right 20 s (sides); the global watermark is the minimum
STEPS: list[tuple[str, list[dict[str, Any]]]] = [
    ("left", [_l(1, 1, "a"), _l(3, 1, "a2"), _l(5, None, "null"), _l(12, 2, "b"), _l(14, 2, "b2")]),
    ("right", [_r(2, 1, "x"), _r(4, 1, "x2"), _r(8, None, "null"), _r(15, 2, "y"), _r(25, 3, "z"), _r(9, 1, "x3")]),
    ("left", [_l(31, 3, "c"), _l(22, 3, "d"), _l(45, 4, "e"), _l(6, 1, "a3")]),
    ("right", [_r(70, 9, "adv"), _r(41, 4, "f"), _r(48, 4, "f2"), _r(33, 3, "c-match")]),
    ("left", [_l(90, 9, "g"), _l(5, 1, "too-late"), _l(61, 5, "h"), _l(62, 5, "h2"), _l(75, None, "null2")]),
    ("right", [_r(120, 9, "u"), _r(62, 5, "t"), _r(4, 1, "too-late"), _r(95, 9, "g-match")]),
    ("left", [_l(200, 7, "i"), _l(205, 7, "i2")]),
    ("right", [_r(260, 7, "s"), _r(203, 7, "r")]),
]


@pytest.mark.parametrize("how", HOWS)
def test_windowed_joins_match_native(spark: Any, ls: Any, tmp_path: Path, how: str) -> None:
    pairs = run_join_steps(spark, ls, tmp_path, {how: q_windowed(how)}, STEPS)
    counts = {}
    for engine in ("native", "lockgate"):
        progress = [p for p in pairs[how].queries[engine].recentProgress if p.stateOperators]
        counts[engine] = [
            (p.batchId, s.numRowsTotal, s.numRowsUpdated, s.numRowsRemoved, s.numRowsDroppedByWatermark)
            for p in progress
            for s in p.stateOperators[:1]
        ]
    assert counts["lockgate"] == counts["native"]
    assert any(c[-1] for c in counts["native"]), "some rows should be late"
    assert any(c[3] for c in counts["native"]), "some rows should be evicted"
