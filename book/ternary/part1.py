"""Numbers that chapter 05 part 1 (the Triton steps) states in its prose, read from the committed benchmark files:
step 14 against GemLite at every shape of GemLite's float64 check, where GemLite fails it included, and step 14's
host time when it is called eagerly.

Every time is on the GPU clock, from :mod:`book.ternary.lesson`'s readers; ``None`` where a file lacks the rows.
"""

from __future__ import annotations

from typing import Any, Optional

from book.ternary import lesson
from studylog.ternary.results import GEMLITE, on_gpu_clock
from studylog.ternary.steps import SERIES

#: The step part 1 ends on, the one ``T.ternary_matmul`` runs on ``2bit_mma`` weights.
LAST = 14


def gemlite_split(results, other=None, step: int = LAST) -> Optional[dict[str, Any]]:
    """Step ``step`` against GemLite at one row of x, at every shape of GemLite's float64 check on ``results``'s
    card: ``passing`` (shape -> GemLite's time over ours, where GemLite's output passes) with its ``lowest`` and
    ``highest``, and ``failed``, one dict a shape where GemLite's output fails, in the order of the check: its
    ``shape``, ``ratio`` (GemLite's time over ours: below 1, GemLite is the faster), ``gemlite_us``, ``ours_us``,
    ``error``, ``tolerance``, ``faster`` (GemLite is) and ``passes_elsewhere``: whether GemLite's output passes
    the check at that shape on the ``other`` card's file (None without that file or that shape there). None without
    the checks or a passing shape."""
    gem = lesson.gemlite_check(results)
    if gem is None or not gem["passed_at"]:
        return None
    ours = SERIES[step]
    passing = {s: lesson.ratio(lesson.us(results, GEMLITE, s), lesson.us(results, ours, s)) for s in gem["passed_at"]}
    if any(r is None for r in passing.values()):
        return None
    failed = []
    for s in gem["failed"]:
        here = lesson.gemlite_check(results, s)
        there = lesson.gemlite_check(other, s) if other is not None else None
        g, o = lesson.us(results, GEMLITE, s), lesson.us(results, ours, s)
        failed.append({"shape": s, "ratio": lesson.ratio(g, o), "gemlite_us": g, "ours_us": o,
                       "error": here["error"], "tolerance": here["tolerance"],
                       "faster": g is not None and o is not None and g < o,
                       "passes_elsewhere": None if there is None else there["passed"]})
    return {"passing": passing, "lowest": min(passing.values()), "highest": max(passing.values()), "failed": failed}


def host_range(results, step: int = LAST, m: int = 1) -> Optional[dict[str, float]]:
    """Step ``step`` called eagerly, back to back, at ``m`` rows of x over every shape of the file: the lowest and
    highest host time a call (``host_lo``, ``host_hi``) and GPU time of its kernel (``gpu_lo``, ``gpu_hi``), in µs,
    and ``bound``: whether the host time exceeds the GPU time at every shape. None without host times."""
    if results is None:
        return None
    rows = [r for r in on_gpu_clock(results).select(SERIES[step], m=m) if r.get("host_ms") is not None]
    if not rows:
        return None
    host = [r["host_ms"] * 1e3 for r in rows]
    gpu = [r["ms"] * 1e3 for r in rows]
    return {"host_lo": min(host), "host_hi": max(host), "gpu_lo": min(gpu), "gpu_hi": max(gpu),
            "bound": all(r["host_ms"] > r["ms"] for r in rows)}
