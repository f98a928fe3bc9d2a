"""Small helpers every chapter's lesson and exercises share: formatting a time, a number not measured yet, and the
line an exercise check prints."""

from __future__ import annotations

#: What a prose number or a table cell reads when the results file does not have it yet.
PENDING = "pending"


def us(ms: float | None, digits: int = 1, missing: str = "–") -> str:
    """A time given in ms, written in µs with thousands separators (``missing`` where there is none)."""
    return missing if ms is None else f"{ms * 1e3:,.{digits}f}"


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or :data:`PENDING` where there is none."""
    return PENDING if value is None else f"{value:{spec}}{suffix}"


def report(name: str, ok: bool, problem: str | None, cases: int) -> bool:
    """Print an exercise check's verdict (all inputs agree, or the first problem) and return ``ok``."""
    print(f"{name}: {'all ' + str(cases) + ' inputs agree' if ok else 'wrong: ' + str(problem)}")
    return ok


__all__ = ["PENDING", "fmt", "report", "us"]
