"""One-line range checks for config fields, NaN and inf included.

`x <= 0` is False for NaN, so a plain comparison lets `lr=nan` through; these helpers
test membership positively (`low < x`), which NaN always fails.
"""

from __future__ import annotations

import math


def check_range(
    field: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    none_ok: bool = False,
) -> None:
    """Raise ValueError `field=value must be in [low, high]` unless value is a finite number in range."""
    if value is None and none_ok:
        return
    lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
    allowed = f"{lo}, {hi}" + (" or null" if none_ok else "")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise ValueError(f"{field}={value} must be a finite number in {allowed}")
