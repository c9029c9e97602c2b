"""Typed parsing of Spark-style string options.

Users pass options as strings (``option("maxFilesPerTrigger", "1")``), as in Spark.
:class:`Options` keeps them case-insensitively and converts each one once, at the
boundary, into a typed value, raising :class:`~lockgate.errors.OptionError` that
names the option and the bad value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from lockgate.errors import OptionError

_DURATION_UNITS_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
    "w": 604_800_000,
    "week": 604_800_000,
    "weeks": 604_800_000,
}
_DURATION_PART = re.compile(r"(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)")


def to_option_string(value: Any) -> str:
    """Render a Python value the way PySpark's ``option()`` does (bools lowercase)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def choice_setting(spark: Any, conf: str, choices: tuple[str, ...], hint: str) -> str:
    """Session setting ``conf``, one of ``choices`` (case-insensitive; unset or blank: the
    first), or an :class:`OptionError` naming the setting, its value and ``hint``."""
    raw = spark.conf.get(conf, None)
    value = choices[0] if raw is None or not str(raw).strip() else str(raw).strip().lower()
    if value not in choices:
        raise OptionError(
            f"Invalid value {raw!r} for {conf}: expected one of "
            + ", ".join(repr(c) for c in choices)
            + f" ({hint}).",
            option=conf,
        )
    return value


def parse_duration_ms(text: str, *, what: str) -> int:
    """Parse ``"10 seconds"``, ``"1 minute 30 seconds"``, ``"500ms"`` or ``"interval 5 s"``.

    Only for lockgate's own options (Redis's timeouts and TTLs), which Spark does not
    define. Durations Spark defines are parsed by Spark itself: :func:`watermark_delay_ms`,
    :func:`trigger_interval_ms`, :func:`time_string_ms`.
    """
    raw = text.strip().lower()
    if raw.startswith("interval"):
        raw = raw[len("interval") :].strip()
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    pos = 0
    total = 0.0
    matched = False
    for m in _DURATION_PART.finditer(raw):
        if raw[pos : m.start()].strip():
            break
        unit = m.group(2)
        if unit not in _DURATION_UNITS_MS:
            raise OptionError(
                f"Invalid {what}: {text!r}: unknown time unit {unit!r}; "
                f"use one of ms, second(s), minute(s), hour(s), day(s), week(s).",
                option=what,
            )
        total += float(m.group(1)) * _DURATION_UNITS_MS[unit]
        pos = m.end()
        matched = True
    if not matched or raw[pos:].strip():
        raise OptionError(
            f"Invalid {what}: {text!r}; expected a duration such as '10 seconds' or '500 ms'.",
            option=what,
        )
    return int(total)


def _jvm() -> Any:
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or sc._jvm is None:
        raise RuntimeError(
            "lockgate parses Spark's intervals with Spark's own parser, which needs an active "
            "SparkContext; create the SparkSession (lockgate.session(spark)) first."
        )
    return sc._jvm


def watermark_delay_ms(delay: str) -> int:
    """The delay of ``withWatermark(col, delay)`` in ms, as Spark computes it.

    Spark's own parser (``IntervalUtils.fromIntervalString``) and conversion
    (``EventTimeWatermark.getDelayMs``: a month is 31 days, a year 12 such months), so
    ``"1 month"``, ``"1 year"`` and ``"100 microseconds"`` mean what they mean to Spark
    and a bad delay raises Spark's ``CANNOT_PARSE_INTERVAL``.
    """
    jvm = _jvm()
    interval = jvm.org.apache.spark.sql.catalyst.util.IntervalUtils.fromIntervalString(delay)
    return int(jvm.org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark.getDelayMs(interval))


def trigger_interval_ms(kind: str, interval: str) -> int:
    """The interval of ``trigger(processingTime=...)`` or ``trigger(continuous=...)`` in ms.

    Built by Spark's own ``Trigger.ProcessingTime(String)`` / ``Trigger.Continuous(String)``
    (``kind`` is ``"processingTime"`` or ``"continuous"``), so the grammar and the errors
    are Spark's: ``INVALID_INTERVAL_FORMAT.*`` for ``"10"`` or ``"5 m"``, "Doesn't support
    month or year interval", "the interval of trigger should not be negative".
    """
    triggers = getattr(_jvm(), "org.apache.spark.sql.streaming.Trigger")
    make = triggers.ProcessingTime if kind == "processingTime" else triggers.Continuous
    return int(make(interval).intervalMs())


def time_string_ms(text: str, *, what: str) -> int:
    """A Spark time string (``"7d"``, ``"10s"``, ``"500ms"``, a bare number is ms) in ms.

    Spark's ``JavaUtils.timeStringAsMs``, the grammar of Spark's time options and confs
    (``maxFileAge``, ``rampUpTime``, ``spark.sql.streaming.pollingDelay``...).
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        return int(_jvm().org.apache.spark.network.util.JavaUtils.timeStringAsMs(text))
    except (Py4JError, PySparkException, ValueError) as exc:  # NumberFormatException
        detail = getattr(exc, "desc", None) or str(exc).strip().splitlines()[0]
        raise OptionError(
            f"Invalid {what}: {text!r}: {detail} (a time such as '7d', '10s' or '500ms').",
            option=what,
        ) from None


class Options(Mapping[str, str]):
    """Case-insensitive string options with typed getters.

    >>> o = Options({"maxFilesPerTrigger": "2"})
    >>> o.get_int("maxfilespertrigger", minimum=1)
    2
    """

    def __init__(self, options: Mapping[str, Any] | None = None, *, owner: str = "option") -> None:
        self._owner = owner
        self._original: dict[str, str] = {}
        self._lower: dict[str, str] = {}
        for key, value in (options or {}).items():
            if value is None:
                continue
            self._original[key] = to_option_string(value)
            self._lower[key.lower()] = to_option_string(value)

    def __getitem__(self, key: str) -> str:
        return self._lower[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._lower

    def __iter__(self) -> Iterator[str]:
        return iter(self._original)

    def __len__(self) -> int:
        return len(self._original)

    def as_dict(self) -> dict[str, str]:
        return dict(self._original)

    def get_str(self, key: str, default: str | None = None) -> str | None:
        return self._lower.get(key.lower(), default)

    def _bad(self, key: str, value: str, expected: str) -> OptionError:
        return OptionError(
            f"Invalid value {value!r} for {self._owner} {key!r}: expected {expected}.",
            option=key,
        )

    def get_int(
        self, key: str, default: int | None = None, *, minimum: int | None = None
    ) -> int | None:
        value = self.get_str(key)
        if value is None:
            return default
        try:
            number = int(value.strip())
        except ValueError:
            raise self._bad(key, value, "an integer") from None
        if minimum is not None and number < minimum:
            raise self._bad(key, value, f"an integer >= {minimum}")
        return number

    def get_float(self, key: str, default: float | None = None) -> float | None:
        value = self.get_str(key)
        if value is None:
            return default
        try:
            return float(value.strip())
        except ValueError:
            raise self._bad(key, value, "a number") from None

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.get_str(key)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise self._bad(key, value, "'true' or 'false'")

    def get_duration_ms(self, key: str, default: int | None = None) -> int | None:
        """lockgate's own duration options (see :func:`parse_duration_ms`)."""
        value = self.get_str(key)
        if value is None:
            return default
        return parse_duration_ms(value, what=f"{self._owner} {key!r}")

    def get_time_ms(self, key: str, default: int | None = None) -> int | None:
        """A time option Spark defines, in Spark's time-string grammar (:func:`time_string_ms`)."""
        value = self.get_str(key)
        if value is None:
            return default
        return time_string_ms(value, what=f"{self._owner} {key!r}")

    def get_choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get_str(key)
        if value is None:
            return default
        for choice in choices:
            if value.strip().lower() == choice.lower():
                return choice
        raise self._bad(key, value, "one of " + ", ".join(repr(c) for c in choices))

    def get_size_bytes(self, key: str, default: int | None = None) -> int | None:
        value = self.get_str(key)
        if value is None:
            return default
        m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", value.lower())
        if not m:
            raise self._bad(key, value, "a size such as '1048576', '512k' or '10m'")
        factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
        return int(m.group(1)) * factor
