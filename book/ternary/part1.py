"""Numbers that chapter 05 part 1 (the Triton steps) states in its prose, read from the committed benchmark files:
step 14 against GemLite at every shape of GemLite's float64 check, where GemLite fails it included, step 14's
host time when it is called eagerly, and which Triton step is the fastest at each of BitNet b1.58 2B4T's layers, with
what the whole-step estimates would read with that step at each layer.

Every time is on the GPU clock, from :mod:`book.ternary.lesson`'s readers; ``None`` where a file lacks the rows.
"""

from __future__ import annotations

from typing import Any, Optional

from book.ternary import lesson
from studylog.ternary.results import CUBLAS, GEMLITE, on_gpu_clock
from studylog.ternary.steps import SERIES

#: The step part 1 ends on, the one ``T.ternary_matmul`` runs on ``2bit_mma`` weights.
LAST = 14
#: The Triton steps of bf16 x that the benchmark times at BitNet b1.58's shapes (the others only at the Llama
#: shapes; step 9, timed there too, computes another product, of x quantised to int8).
AT_BITNET = (5, 6, 7, 8, 14)
#: The kernel that takes a step's weights to several rows of x, as ``T.ternary_matmul`` picks it for the step's
#: format: ``2bit`` (steps 5 and 6) step 6, ``base3`` (steps 7 and 8) step 8, ``2bit_mma`` step 14.
MANY_ROWS = {5: 6, 6: 6, 7: 8, 8: 8, 14: 14}
#: Up to this ratio of times, as printed at two decimals, a faster step only ties (the course's tie rule, 0.97× to
#: 1.03×): the page says "ties", not "beats".
TIE = 1.03


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


def bitnet_layers(results, steps=AT_BITNET, step: int = LAST) -> Optional[list[dict[str, Any]]]:
    """At each ternary layer of BitNet b1.58 2B4T (:data:`lesson.BITNET_LAYERS`), one row of x, read where
    :func:`lesson.amdahl` reads it (:func:`lesson.layer_source`: the benchmark at the layer's own shape, else the
    layer run), the steps of ``steps`` timed there: a dict a layer with its ``name``, ``shape``, ``count`` (how many
    a transformer layer has), ``times`` (step -> µs), ``best`` (the fastest step), ``ahead``: (step, ``step``'s
    time over its time) for each step faster than ``step``, fastest first, and ``lead``: where ``step`` is the
    fastest, (the runner-up, its time over ``step``'s), else None. None without ``step``'s time at every layer."""
    if results is None:
        return None
    layers = lesson.layer_run(results)
    out = []
    for name, n, k, count, stand_in in lesson.BITNET_LAYERS:
        source, shape, _ = lesson.layer_source(results, layers, n, k, stand_in)
        times = {s: t for s in steps if (t := lesson.us(source, SERIES[s], shape)) is not None}
        if step not in times:
            return None
        order = sorted(times, key=times.get)
        ours = times[step]
        out.append({"name": name, "shape": shape, "count": count, "times": times, "best": order[0],
                    "ahead": [(s, ours / times[s]) for s in order if times[s] < ours],
                    "lead": (order[1], times[order[1]] / ours) if order[0] == step and len(order) > 1 else None})
    return out


def fastest_estimates(results, steps=AT_BITNET) -> Optional[dict[str, float]]:
    """The estimates of "Why it matters" with the fastest of ``steps`` at each layer in place of step 14 alone:
    against cuBLAS bf16, :func:`lesson.amdahl` over those steps (``cublas``, a transformer layer's ternary matmuls;
    ``cublas_step``, the whole decode step); against GemLite, :func:`lesson.amdahl_peer`'s sums over the layers it
    keeps (both timed at their own shape in the benchmark), ours the fastest step's time at each (``gemlite``,
    ``gemlite_step``). None without the times."""
    if results is None:
        return None
    view = lesson.amdahl(results, [SERIES[s] for s in steps])
    if view["speedup"] is None:
        return None
    base = theirs = mine = 0.0
    for _, n, k, count, _ in lesson.BITNET_LAYERS:
        shape = f"{n}x{k}"
        b, p = lesson.us(results, CUBLAS, shape), lesson.us(results, GEMLITE, shape)
        ours = [t for s in steps if (t := lesson.us(results, SERIES[s], shape)) is not None]
        if b is None or p is None or not ours:
            continue  # as amdahl_peer: a layer is kept where cuBLAS, GemLite and ours are all timed at its shape
        base, theirs, mine = base + count * b, theirs + count * p, mine + count * min(ours)
    if not mine:
        return None
    share = view["time_share"]  # the ternary layers' share of a cuBLAS step's time, as lesson.amdahl_peer
    step = lambda speed: (1 - share) + share / speed  # noqa: E731  a step's time, cuBLAS's = 1
    return {"cublas": view["speedup"], "cublas_step": view["end_to_end"], "gemlite": theirs / mine,
            "gemlite_step": step(base / theirs) / step(base / mine)}


def many_rows_cost(results, shape: str, steps, m: int = 128, step: int = LAST) -> dict[int, float]:
    """For each of ``steps``: the time at ``m`` rows of x and ``shape`` of the kernel that takes its weights' format
    to several rows (:data:`MANY_ROWS`), over ``step``'s time there; steps without both times are left out."""
    ours = lesson.us(results, SERIES[step], shape, m)
    out = {}
    for s in steps:
        theirs = lesson.us(results, SERIES[MANY_ROWS[s]], shape, m)
        if ours is not None and theirs is not None:
            out[s] = theirs / ours
    return out


def layer_name(layer: dict) -> str:
    """A layer's name in prose: "q and o", "gate and up", "down"."""
    return layer["name"].split(" (")[0].replace(", ", " and ")


def _beaten(layer: dict, tie: float = TIE) -> tuple[list, list]:
    """The steps faster than the last step at ``layer`` (:func:`bitnet_layers`): (those faster by more than ``tie`` as printed,
    those that only tie), each as (step, the last step's time over its time)."""
    return [a for a in layer["ahead"] if round(a[1], 2) > tie], [a for a in layer["ahead"] if round(a[1], 2) <= tie]


def layer_words(layer: dict, step: int = LAST, tie: float = TIE, shape: bool = True) -> str:
    """One layer of :func:`bitnet_layers` in words, against ``step``: "at q and o's 2560 × 2560 step 7 is 1.26×
    faster and step 6 1.03×", "at down's 2560 × 6912 step 5 ties it (1.01×)", "at gate and up's 13824 × 2560 it
    leads step 6 by 1.38×" ("" where it is alone); without ``shape``, "at q and o step 7 is 1.26× faster ..."."""
    where = f"at {layer_name(layer)}" + (f"'s {lesson.shape_words(layer['shape'])}" if shape else "")
    beat, ties = _beaten(layer, tie)
    said = [f"step {n} is {r:.2f}× faster" if i == 0 else f"step {n} {r:.2f}×" for i, (n, r) in enumerate(beat)]
    said += [f"step {n} ties it ({r:.2f}×)" for n, r in ties]
    if said:
        return f"{where} {lesson.and_list(said)}"
    if layer["lead"] is None:
        return ""
    return f"{where} it leads step {layer['lead'][0]} by {layer['lead'][1]:.2f}×"


def tried_wins(layers, tried=(7, 8, 9), step: int = LAST, tie: float = TIE) -> dict[int, list]:
    """Where a tried step (7 to 9, slower at the steps' shape) is faster than ``step`` at one of BitNet's layers
    (:func:`bitnet_layers`), by more than ``tie``: tried step -> [(layer, ``step``'s time over its time)]."""
    out: dict[int, list] = {}
    for layer in layers or []:
        for n, r in _beaten(layer, tie)[0]:
            if n in tried:
                out.setdefault(n, []).append((layer, r))
    return out


def part1_rows(layers, step: int = LAST) -> tuple:
    """:data:`lesson.PART1_ROWS`, the one-row cell of a tried step that is faster than ``step`` at one of BitNet's
    layers saying where and by how much (from :func:`tried_wins`), so that "did not pay" reads as the shape it was
    measured at."""
    wins = tried_wins(layers, step=step)
    where = {n: "; faster than step {} at {}".format(step, lesson.and_list(
        f"{lesson.shape_words(layer['shape'])} ({r:.2f}×)" for layer, r in got)) for n, got in wins.items()}
    return tuple((n, m, p, c + where[n] if m == 1 and n in where else c) for n, m, p, c in lesson.PART1_ROWS)


def loss_words(layers, step: int = LAST, tie: float = TIE) -> str:
    """Where ``step`` is not the fastest of :func:`bitnet_layers`, in words with the times: "at 2560 × 2560 step 14
    (6.1 µs) loses to step 7 (4.8 µs) and step 6 (5.9 µs), and at 2560 × 6912 it ties step 5 (7.86 against 7.92
    µs)"; "" where it is the fastest everywhere."""
    said, named = [], False
    for layer in layers or []:
        beat, ties = _beaten(layer, tie)
        if not beat and not ties:
            continue
        t = layer["times"]
        who = f"step {step} ({t[step]:.1f} µs)" if not named else "it"
        named = True
        verbs = ([f"loses to {lesson.and_list(f'step {n} ({t[n]:.1f} µs)' for n, _ in beat)}"] if beat else []) + (
            [f"ties {lesson.and_list(f'step {n} ({t[n]:.2f} against {t[step]:.2f} µs)' for n, _ in ties)}"]
            if ties else [])
        said.append(f"at {lesson.shape_words(layer['shape'])} {who} {' and '.join(verbs)}")
    return ", and ".join(said)
