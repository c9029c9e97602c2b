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


def parse_duration_ms(text: str, *, what: str) -> int:
    """Parse ``"10 seconds"``, ``"1 minute 30 seconds"``, ``"500ms"`` or ``"interval 5 s"``."""
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
        value = self.get_str(key)
        if value is None:
            return default
        return parse_duration_ms(value, what=f"{self._owner} {key!r}")

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
