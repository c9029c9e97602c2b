"""The join condition compiled to Arrow kernels (lockgate/plan/join/columnar.py) gives
what the row-at-a-time condition gives on every pair, nulls included, and the batch's own
pairs are the pairs of equal keys."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lockgate.plan.join.columnar import batch_pairs, compile_condition
from lockgate.plan.join.condition import LEFT, RIGHT, all_true, compile_expr

TS = pa.timestamp("us", tz="UTC")
S = 1_000_000


def _attr(side: int, index: int, kind: str = "other") -> tuple:
    return ("attr", side, index, kind)


BOUND = (
    (
        "cmp",
        ">=",
        _attr(LEFT, 1, "ts"),
        ("tadd", _attr(RIGHT, 1, "ts"), ("lit", -5 * S, "interval")),
    ),
    (
        "cmp",
        "<=",
        _attr(LEFT, 1, "ts"),
        ("tadd", _attr(RIGHT, 1, "ts"), ("lit", 5 * S, "interval")),
    ),
)
CONDITIONS = {
    "time bound": BOUND,
    "or / not / literal": (
        (
            "or",
            ("cmp", "<", _attr(LEFT, 0), ("lit", 3, "other")),
            ("not", ("cmp", "=", _attr(LEFT, 2), _attr(RIGHT, 2))),
        ),
    ),
    "and with nulls": (
        (
            "and",
            ("cmp", ">", _attr(RIGHT, 0), _attr(LEFT, 0)),
            ("cmp", "=", _attr(LEFT, 2), ("lit", "x", "other")),
        ),
    ),
}


def _pairs() -> pa.Table:
    """Left and right values of every combination, nulls included."""
    ints = [None, 1, 3, 5]
    times = [None, 0, 4 * S, 6 * S, 10 * S]
    strings = [None, "x", "y"]
    rows = [
        (a, t, s, b, u, r)
        for a in ints
        for t in times
        for s in strings
        for b in ints
        for u in times
        for r in strings
    ]
    cols = list(zip(*rows))
    return pa.table(
        {
            "__l0": pa.array(cols[0], pa.int64()),
            "__l1": pa.array(cols[1], pa.int64()).cast(TS),
            "__l2": pa.array(cols[2], pa.string()),
            "__r0": pa.array(cols[3], pa.int64()),
            "__r1": pa.array(cols[4], pa.int64()).cast(TS),
            "__r2": pa.array(cols[5], pa.string()),
        }
    )


@pytest.mark.parametrize("name", sorted(CONDITIONS))
def test_arrow_condition_matches_row_condition(name: str) -> None:
    terms = CONDITIONS[name]
    table = _pairs()
    types = (
        [table.schema.field(f"__l{i}").type for i in range(3)],
        [table.schema.field(f"__r{i}").type for i in range(3)],
    )
    mask = compile_condition(terms, types)
    assert mask is not None
    row_fn = all_true([compile_expr(t) for t in terms])
    # the row form: timestamps as int microseconds, as the task holds them
    lefts = list(
        zip(
            *[
                table.column(f"__l{i}").cast(pa.int64()).to_pylist()
                if i == 1
                else table.column(f"__l{i}").to_pylist()
                for i in range(3)
            ]
        )
    )
    rights = list(
        zip(
            *[
                table.column(f"__r{i}").cast(pa.int64()).to_pylist()
                if i == 1
                else table.column(f"__r{i}").to_pylist()
                for i in range(3)
            ]
        )
    )
    expected = [row_fn(lr, rr) for lr, rr in zip(lefts, rights)]
    assert mask(table).to_pylist() == expected
    assert any(expected) and not all(expected)


def test_uncovered_condition_falls_back() -> None:
    types = ([pa.float64()], [pa.float64()])
    assert (
        compile_condition((("cmp", "<", _attr(LEFT, 0, "float"), _attr(RIGHT, 0, "float")),), types)
        is None
    )
    assert compile_condition((("isnull", _attr(LEFT, 0)),), ([pa.int64()], [pa.int64()])) is None


def test_batch_pairs_are_the_pairs_of_equal_keys_in_right_then_left_order() -> None:
    left = pa.table({"__k0": [1, 2, 2, None], "__l0": ["a", "b", "c", "d"]})
    right = pa.table({"__k0": [2, 3, 1, 2, None], "__r0": ["p", "q", "r", "s", "t"]})
    pairs = batch_pairs(left, right, ["__k0"], (1, 1))
    got = list(
        zip(
            pairs.column("__rpos").to_pylist(),
            pairs.column("__lpos").to_pylist(),
            pairs.column("__l0").to_pylist(),
            pairs.column("__r0").to_pylist(),
        )
    )
    assert got == [
        (0, 1, "b", "p"),
        (0, 2, "c", "p"),
        (2, 0, "a", "r"),
        (3, 1, "b", "s"),
        (3, 2, "c", "s"),
    ]
