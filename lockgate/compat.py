"""What the supported Python versions (3.11, 3.12) spell differently."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 12):
    from typing import override
else:  # pragma: no cover - Python 3.11: typing.override is new in 3.12 (PEP 698)
    from collections.abc import Callable
    from typing import Any, TypeVar

    _F = TypeVar("_F", bound=Callable[..., Any])

    def override(method: _F, /) -> _F:
        """Mark ``method`` as overriding its base class's (``typing.override``, PEP 698)."""
        try:
            method.__override__ = True  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
        return method


__all__ = ["override"]
