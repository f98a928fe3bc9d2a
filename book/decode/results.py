"""The decode chapter's readings of its committed benchmark (``python -m studylog bench decode``): each
configuration's parts per output token (:func:`breakdown`), what each chapter could at best remove of them
(:func:`amdahl`; per schema, :func:`schema_bounds`), and the chapter's targets on a run (:func:`target_report`)."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from studylog.decode.grammar import suite_names
from studylog.decode.loop import COMPONENTS
from studylog.decode.report import ORDER, rows_of


def breakdown(rows: Sequence[dict], model: str, batch: int, kind: str = "json",
              whitespace: str = "compact") -> dict[str, dict[str, float]]:
    """Per configuration, the median over the suite's schemas (of ``kind``) of each component per output token
    (ms), plus ``wall`` (the end-to-end median) and ``forwards_per_token``."""
    names = set(suite_names(kind)) if kind else None
    out = {}
    for config in ORDER:
        sel = [r for r in rows_of(rows, model=model, batch=batch, config=config, whitespace=whitespace)
               if names is None or r["params"]["schema"] in names]
        if not sel:
            continue
        parts = {k: statistics.median(r["breakdown_ms_per_token"].get(k, 0.0) for r in sel)
                 for k in (*COMPONENTS, "mask_host", "head_host")}
        parts["wall"] = statistics.median(r["ms"] for r in sel)
        parts["forwards_per_token"] = statistics.median(r["forwards"] / max(r["tokens"], 1) for r in sel)
        out[config] = parts
    return out


def amdahl(parts: dict[str, dict[str, float]]) -> dict[str, float]:
    """What share of the baseline's time per token each chapter could at best remove, and the speedup bound
    that share gives: chapter 1 the forwards it saves (as if a saved step cost a whole step), chapter 2 the
    LM head, the mask's application and the sampling (as if the masked head, and the greedy pick among the logits
    it computed, cost nothing); ``both_bound`` the two together
    (chapter 2's share of the steps that remain). Beside them the shares no kernel of either chapter touches:
    the body (``body_share``) and the host's part of a step (``host_share``: the host time left after the
    device's parts, and the mask the body did not hide)."""
    base, jump = parts.get("baseline"), parts.get("jump_forward")
    out = {}
    if base:
        total = sum(base[k] for k in COMPONENTS)
        share2 = (base["head"] + base["mask_apply"] + base["sampling"]) / total if total else 0.0
        out.update(chapter2_share=share2, chapter2_bound=1 / (1 - share2) if share2 < 1 else float("inf"),
                   body_share=base["body"] / total if total else 0.0,
                   host_share=(base["host"] + base["mask_wait"]) / total if total else 0.0)
    if base and jump:
        share1 = 1 - jump["forwards_per_token"] / base["forwards_per_token"]
        out.update(chapter1_share=share1, chapter1_bound=1 / (1 - share1) if share1 < 1 else float("inf"))
        if "chapter2_share" in out:
            rest = (1 - share1) * (1 - out["chapter2_share"])
            out["both_bound"] = 1 / rest if rest > 0 else float("inf")
    return out


def schema_bounds(rows: Sequence[dict], model: str, batch: int, kind: str | None = "json",
                  whitespace: str = "compact") -> dict[str, dict[str, float]]:
    """:func:`amdahl` on each schema's own breakdown (of ``kind``; every schema measured with ``None``), by schema:
    the bound of a request, to set beside that request's measured speedup."""
    names = set(suite_names(kind)) if kind else None
    schemas = {r["params"]["schema"] for r in rows_of(rows, model=model, batch=batch, config="baseline",
                                                      whitespace=whitespace)}
    out = {}
    for name in sorted(schemas):
        if names is not None and name not in names:
            continue
        mine = [r for r in rows if r["params"].get("schema") == name]
        b = amdahl(breakdown(mine, model, batch, kind=kind, whitespace=whitespace))
        if "both_bound" in b:
            out[name] = b
    return out


def median_bound(rows: Sequence[dict], model: str, batch: int, kind: str | None = "json",
                 key: str = "both_bound") -> float | None:
    """The median over the schemas of each one's own bound (:func:`schema_bounds`): a bound taken request by request,
    as the speedups it is set beside are, where :func:`amdahl` of :func:`breakdown` takes it on a breakdown of
    medians that no request has. None where no schema has the bound."""
    values = [b[key] for b in schema_bounds(rows, model, batch, kind).values() if key in b]
    return statistics.median(values) if values else None


#: The chapter's targets: step 3 over step 1, end to end per output token, at the ~1B shape: the median over
#: the JSON schemas at batch 1, and no schema slower at batch 8.
TARGET_SPEEDUP = 1.25


def target_report(rows: Sequence[dict], model: str = "1b") -> dict[str, Any]:
    """Whether the targets are met on these rows, and why not: per batch, step 3's speedups over step 1 per JSON
    schema, their median and minimum, and the median of the schemas' own Amdahl bounds (:func:`median_bound`)."""
    out: dict[str, Any] = {"target": TARGET_SPEEDUP}
    json_names = set(suite_names("json"))
    for batch in (1, 8):
        ratios = {}
        for r in rows_of(rows, model=model, batch=batch, config="masked_head", whitespace="compact"):
            name = r["params"]["schema"]
            base = rows_of(rows, model=model, batch=batch, config="baseline", whitespace="compact", schema=name)
            if base and name in json_names:
                ratios[name] = base[0]["ms"] / r["ms"]
        if not ratios:
            continue
        bound = median_bound(rows, model, batch)
        median = statistics.median(ratios.values())
        out[batch] = {"speedups": ratios, "median": median, "min": min(ratios.values()), "bound": bound,
                      "met": median >= TARGET_SPEEDUP if batch == 1 else min(ratios.values()) >= 1.0}
    return out


__all__ = ["TARGET_SPEEDUP", "amdahl", "breakdown", "median_bound", "schema_bounds", "target_report"]
