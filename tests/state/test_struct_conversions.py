"""The state store's conversions of struct columns (a time window, typically) between
Arrow and its Python form take shortcuts: a struct column of scalar fields is converted
once per distinct struct (``column_values``), and a column holding structs is built back
from its distinct values (``arrow_array``). Each shortcut must give exactly what the
row-by-row conversion gives, including the cases where it must not be taken."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lockgate.state.store import arrow_array, arrow_values, column_values, hashable

WINDOW = pa.struct([("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))])


def _ts(sec: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, sec, tzinfo=UTC)


def _row_by_row(column: pa.ChunkedArray | pa.Array) -> list:
    return [hashable(v) for v in column.to_pylist()]


WINDOWS = [
    {"start": _ts(0), "end": _ts(10)},
    None,  # a null window
    {"start": _ts(0), "end": _ts(10)},
    {"start": None, "end": _ts(10)},  # a null field
    {"start": _ts(10), "end": _ts(20)},
    None,
    {"start": _ts(0), "end": _ts(10)},
]

STRUCT_COLUMNS = [
    pa.array(WINDOWS, type=WINDOW),
    # chunks, as a task's batches come
    pa.chunked_array([pa.array(WINDOWS[:3], type=WINDOW), pa.array(WINDOWS[3:], type=WINDOW)]),
    # a null struct over field values that are not null (Arrow keeps them under the mask)
    pa.StructArray.from_arrays(
        [pa.array([_ts(0), _ts(0)], WINDOW.field(0).type), pa.array([_ts(10), _ts(10)], WINDOW.field(1).type)],
        fields=list(WINDOW),
        mask=pa.array([False, True]),
    ),
    pa.array(
        [{"k": 1, "s": "a", "b": True}, {"k": 1, "s": "a", "b": True}, {"k": None, "s": "a", "b": False}, None],
        type=pa.struct([("k", pa.int64()), ("s", pa.string()), ("b", pa.bool_())]),
    ),
    # fields the shortcut does not take (a float, a nested list): row by row
    pa.array([{"x": -0.0}, {"x": 0.0}, {"x": float("nan")}, None], type=pa.struct([("x", pa.float64())])),
    pa.array([{"l": [1, 2]}, {"l": [1, 2]}, None], type=pa.struct([("l", pa.list_(pa.int64()))])),
    pa.array([], type=WINDOW),
]


@pytest.mark.parametrize("column", STRUCT_COLUMNS, ids=lambda c: str(c.type)[:40])
def test_struct_column_values_match_row_by_row(column):
    converted = column_values(column, micros=True)
    expected = _row_by_row(column)
    assert converted == expected
    # the same Python types (a datetime stays a datetime inside a struct)
    assert [repr(v) for v in converted] == [repr(v) for v in expected]


def test_distinct_windows_are_one_object_each():
    """Why the shortcut pays: equal windows are one tuple, which hashes once."""
    converted = column_values(pa.array(WINDOWS, type=WINDOW), micros=True)
    assert converted[0] is converted[2] is converted[6]


ARROW_CASES = [
    (WINDOW, [hashable(w) for w in WINDOWS]),
    # a struct as an operator put it (a dict): not hashable, row by row
    (WINDOW, [WINDOWS[0], hashable(WINDOWS[4]), None]),
    # 0.0 == -0.0 in Python but not in Arrow: a struct with a float is never merged
    (pa.struct([("x", pa.float64())]), [(("x", 0.0),), (("x", -0.0),), None]),
    (pa.list_(WINDOW), [tuple(hashable(w) for w in WINDOWS[:2]), None, ()]),
    (pa.int64(), [1, None, 1]),
    (WINDOW, []),
]


@pytest.mark.parametrize(("t", "values"), ARROW_CASES, ids=lambda x: str(x)[:40])
def test_arrow_array_matches_row_by_row(t, values):
    built = arrow_array(values, t)
    expected = pa.array(arrow_values(values, t), type=t)
    assert built.type == expected.type
    assert built.to_pylist() == expected.to_pylist()
    assert [repr(v) for v in built.to_pylist()] == [repr(v) for v in expected.to_pylist()]
    assert built.null_count == expected.null_count
