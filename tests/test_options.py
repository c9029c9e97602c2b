"""Options: case-insensitive string options with typed getters, and duration parsing."""

from __future__ import annotations

import pytest

from lockgate.errors import LockgateError, OptionError
from lockgate.options import Options, parse_duration_ms, to_option_string


def _bad(callable_, *args, **kwargs) -> OptionError:
    with pytest.raises(OptionError) as info:
        callable_(*args, **kwargs)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, LockgateError)
    return err


# -- the mapping ---------------------------------------------------------------------------


def test_keys_are_case_insensitive_and_original_spelling_is_kept():
    o = Options({"maxFilesPerTrigger": "2", "Path": "/x"})
    assert o["maxfilespertrigger"] == "2"
    assert o["MAXFILESPERTRIGGER"] == "2"
    assert "MaxFilesPerTrigger" in o
    assert "nope" not in o
    assert 1 not in o  # non-string keys are simply absent
    assert list(o) == ["maxFilesPerTrigger", "Path"]
    assert len(o) == 2
    assert o.as_dict() == {"maxFilesPerTrigger": "2", "Path": "/x"}
    assert dict(o) == {"maxFilesPerTrigger": "2", "Path": "/x"}
    with pytest.raises(KeyError):
        o["nope"]


def test_values_are_rendered_like_pyspark_option():
    o = Options({"a": True, "b": False, "c": 3, "d": 1.5, "e": None})
    assert o.as_dict() == {"a": "true", "b": "false", "c": "3", "d": "1.5"}
    assert "e" not in o  # None means "not set", as in PySpark's options(**kw)
    assert to_option_string(True) == "true"
    assert to_option_string(0) == "0"
    assert to_option_string("x") == "x"


def test_empty_options():
    for o in (Options(), Options(None), Options({})):
        assert len(o) == 0
        assert o.get_str("x") is None
        assert o.get_int("x") is None
        assert o.get_int("x", 5) == 5


# -- typed getters -------------------------------------------------------------------------


def test_get_str():
    o = Options({"Name": "v"})
    assert o.get_str("name") == "v"
    assert o.get_str("missing") is None
    assert o.get_str("missing", "d") == "d"


def test_get_int():
    o = Options({"n": "42", "spaced": " 7 ", "neg": "-3"})
    assert o.get_int("N") == 42
    assert o.get_int("spaced") == 7
    assert o.get_int("neg") == -3
    assert o.get_int("missing") is None
    assert o.get_int("missing", 9) == 9
    assert o.get_int("n", minimum=42) == 42


@pytest.mark.parametrize("value", ["abc", "1.5", "", "1e3", "0x10"])
def test_get_int_rejects_non_integers_naming_option_and_value(value):
    o = Options({"maxFilesPerTrigger": value}, owner="json source option")
    err = _bad(o.get_int, "maxFilesPerTrigger")
    assert err.option == "maxFilesPerTrigger"
    message = str(err)
    assert "'maxFilesPerTrigger'" in message
    assert repr(value) in message
    assert "json source option" in message
    assert "integer" in message


def test_get_int_minimum():
    o = Options({"rows": "0"})
    err = _bad(o.get_int, "rows", minimum=1)
    assert err.option == "rows"
    assert "'0'" in str(err) and ">= 1" in str(err)


def test_get_float():
    o = Options({"f": "1.25", "i": "3", "bad": "x1"})
    assert o.get_float("f") == 1.25
    assert o.get_float("i") == 3.0
    assert o.get_float("missing") is None
    assert o.get_float("missing", 0.5) == 0.5
    err = _bad(o.get_float, "bad")
    assert err.option == "bad" and "'x1'" in str(err) and "number" in str(err)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), (" True ", True), ("1", True), ("yes", True),
     ("false", False), ("False", False), ("0", False), ("no", False)],
)
def test_get_bool(value, expected):
    assert Options({"b": value}).get_bool("b", not expected) is expected


def test_get_bool_default_and_error():
    assert Options().get_bool("b", True) is True
    assert Options().get_bool("b", False) is False
    err = _bad(Options({"truncate": "maybe"}).get_bool, "truncate", True)
    assert err.option == "truncate"
    assert "'maybe'" in str(err) and "'true' or 'false'" in str(err)


def test_get_choice_returns_canonical_spelling():
    o = Options({"mode": " PERMISSIVE ", "other": "Append"})
    assert o.get_choice("mode", ("permissive", "dropMalformed"), "permissive") == "permissive"
    assert o.get_choice("other", ("append", "update"), "update") == "append"
    assert o.get_choice("missing", ("a", "b"), "b") == "b"
    err = _bad(Options({"mode": "weird"}).get_choice, "mode", ("permissive", "failFast"), "permissive")
    assert err.option == "mode"
    assert "'weird'" in str(err)
    assert "'permissive'" in str(err) and "'failFast'" in str(err)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1048576", 1048576), ("512k", 512 * 1024), ("512K", 512 * 1024), ("10m", 10 << 20),
     ("10mb", 10 << 20), ("2g", 2 << 30), ("1t", 1 << 40), (" 3 kb ", 3 * 1024), ("0", 0),
     ("5b", 5)],
)
def test_get_size_bytes(value, expected):
    assert Options({"s": value}).get_size_bytes("s") == expected


@pytest.mark.parametrize("value", ["1.5m", "-1", "ten", "10x", "k"])
def test_get_size_bytes_rejects_bad_sizes(value):
    err = _bad(Options({"maxBytesPerTrigger": value}).get_size_bytes, "maxBytesPerTrigger")
    assert err.option == "maxBytesPerTrigger"
    assert repr(value) in str(err)


def test_get_size_bytes_default():
    assert Options().get_size_bytes("s") is None
    assert Options().get_size_bytes("s", 7) == 7


def test_get_duration_ms():
    o = Options({"latestFirst": "x", "maxFileAge": "7 days", "d": "1500"}, owner="file source option")
    assert o.get_duration_ms("maxFileAge") == 7 * 86_400_000
    assert o.get_duration_ms("d") == 1500
    assert o.get_duration_ms("missing") is None
    assert o.get_duration_ms("missing", 10) == 10
    err = _bad(Options({"maxFileAge": "soon"}, owner="file source option").get_duration_ms, "maxFileAge")
    assert "'soon'" in str(err)
    assert "maxFileAge" in str(err)
    assert err.option is not None and "maxFileAge" in err.option


# -- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10 seconds", 10_000),
        ("10 second", 10_000),
        ("10seconds", 10_000),
        ("10s", 10_000),
        ("10 sec", 10_000),
        ("1 minute 30 seconds", 90_000),
        ("1 min", 60_000),
        ("2 minutes", 120_000),
        ("5m", 300_000),
        ("500ms", 500),
        ("500 milliseconds", 500),
        ("1 millisecond", 1),
        ("interval 5 s", 5_000),
        ("INTERVAL 1 MINUTE", 60_000),
        ("Interval 2 Hours", 7_200_000),
        ("1 hour", 3_600_000),
        ("1h", 3_600_000),
        ("1 day", 86_400_000),
        ("2 days", 172_800_000),
        ("1d", 86_400_000),
        ("1 week", 604_800_000),
        ("2w", 1_209_600_000),
        ("1.5 seconds", 1_500),
        ("0.5s", 500),
        ("0 seconds", 0),
        ("100", 100),  # a bare number is milliseconds
        (" 42 ", 42),
        ("-1 second", -1_000),
        ("-5", -5),
        ("1 hour 2 minutes 3 seconds 4 ms", 3_723_004),
    ],
)
def test_parse_duration_ms_forms(text, expected):
    assert parse_duration_ms(text, what="duration") == expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "abc", "seconds", "10 parsecs", "10 seconds garbage", "5 s 3", "1 minute, 30 seconds",
     "interval", "1 month", "ten seconds", "10 s!"],
)
def test_parse_duration_ms_rejects_bad_durations_naming_what(text):
    err = _bad(parse_duration_ms, text, what="processingTime")
    assert err.option == "processingTime"
    assert "processingTime" in str(err)
    assert repr(text) in str(err)


def test_parse_duration_ms_unknown_unit_message_lists_units():
    err = _bad(parse_duration_ms, "3 fortnights", what="delayThreshold")
    assert "'fortnights'" in str(err)
    assert "second" in str(err) and "minute" in str(err)
