"""What notebook 08 reads from the committed benchmark (``assets/bench/<gpu>/speculate.json``, written by
``python -m studylog bench speculate``): the steps' table, the verifier's layer per chunk length, the forecasts, the
drafting's cost, the agreement with chapter 07, and the requests where drafting loses."""

from __future__ import annotations

import ast
import json
import re
import statistics
from typing import Any, Sequence

from book.common import ChainRow
from studylog.speculate import CHAPTER, report, requests
from studylog.speculate.report import SHIPPED

SERIES = ("step01", "step02", "step03", "step04")


def committed():
    """The chapter's committed results (the newest GPU's)."""
    from studylog.plotting import load_results

    return load_results("speculate")


def _rows(results, batch: int, workload: str, series: str) -> list[dict]:
    return [r for r in report.rows_of(results.rows, batch=batch, workload=workload) if r["series"] == series]


def _median(rows: Sequence[dict], batch: int, workload: str, series: str) -> float:
    """The median over a workload's requests of each request's milliseconds per output token."""
    return statistics.median(r["ms"] for r in report.rows_of(rows, series=series, batch=batch, workload=workload))


def median_ms(results, batch: int, workload: str, series: str) -> float:
    """The median request's milliseconds per output token (:func:`_median`): the statistic of the chapter's
    headline, its scoreboard row and its results row (which at batch 1 take it over the requests that close their
    JSON: :func:`capped`)."""
    return _median(results.rows, batch, workload, series)


def body_ms(rows: Sequence[dict], batch: int) -> dict[int, float]:
    """The body's GPU time per chunk length (``verify`` rows)."""
    return {r["params"]["chunk"]: r["ms"] for r in report.rows_of(rows, series="verify", batch=batch) if r.get("used", True)}


def bound(rows: Sequence[dict], batch: int, workload: str, series: str = SHIPPED) -> dict[str, float]:
    """What the drafts allow against chapter 7's step 3 over a workload: the ratio of ``forwards``, and the
    ``forecast`` with each forward at its chunk length's body time and the drafting calls at theirs."""
    body = body_ms(rows, batch)
    draft = report.rows_of(rows, series="draft_call", batch=batch)
    draft_ms = draft[0].get("host_ms", draft[0]["ms"]) if draft else 0.0  # the loop waits for the drafts
    sizes = sorted(body)

    def cost(chunks: Sequence[int]) -> float:  # the decode steps: the prefill (the first) is the same in both
        return sum(body[next(s for s in sizes if s >= c)] for c in chunks[1:])

    base = report.rows_of(rows, series="ch7_step03", batch=batch, workload=workload)
    spec = report.rows_of(rows, series=series, batch=batch, workload=workload)
    f3, fs = sum(r["forwards"] for r in base), sum(r["forwards"] for r in spec)
    out = {"forwards": f3 / max(fs, 1)}
    if body:
        c3 = sum(cost(r["chunk_lengths"]) for r in base)
        cs = sum(cost(r["chunk_lengths"]) + r["draft_calls"] * draft_ms for r in spec)
        out["forecast"] = c3 / cs if cs else float("nan")
    return out


def speedups(rows: Sequence[dict], batch: int, workload: str, series: str = SHIPPED,
             over: str = "ch7_step03") -> list[float]:
    """Per request: ``over``'s time per output token over ``series``'s."""
    by = {r["params"]["request"]: r["ms"] for r in report.rows_of(rows, series=over, batch=batch, workload=workload)}
    return [by[r["params"]["request"]] / r["ms"] for r in report.rows_of(rows, series=series, batch=batch, workload=workload)
            if r["params"]["request"] in by]


def summary(rows: Sequence[dict]) -> list[dict]:
    """Per batch and workload: the shipped step's median and slowest speedup over ch7_step03, accepted per draft,
    bound()."""
    out = []
    for batch in (1, 8):
        for workload in report.WORKLOADS:
            s = speedups(rows, batch, workload)
            if not s:
                continue
            spec = report.rows_of(rows, series=SHIPPED, batch=batch, workload=workload)
            acc = sum(r["accepted"] for r in spec) / max(sum(r["drafts"] for r in spec), 1)
            b = bound(rows, batch, workload)
            out.append({"batch": batch, "workload": workload, "median_speedup_over_ch7_step03": statistics.median(s),
                        "min_speedup": min(s), "mean_accepted": acc, "forward_ratio": b["forwards"],
                        "forecast": b.get("forecast")})
    return out


def two_digits(text: str) -> str:
    """``text`` with every chapter number written in two digits, as the book writes them ("chapter 7's" becomes
    "chapter 07's"): the library's step titles keep the short form."""
    return re.sub(r"\b([Cc]hapter) (\d)\b", r"\1 0\2", text)


#: Each row's label in the page's tables: the step's number and a short name, as its section is titled (the library's
#: series and step names stay in ``step``).
START_LABEL = "chapter 07, step 3"
STEP_LABELS = {"step01": "step 1: every hidden state", "step02": "step 2: n-gram drafts",
               "step03": "step 3: forced chains", "step04": "step 4: the draft gate, not shipped"}


def steps_table(results, batch: int = 1, workload: str = "extraction") -> list[dict[str, Any]]:
    """One row per step (``label``: "step N: short name", the tables' row label): what changed, the median over
    requests of the ms per output token, the previous step's
    median over this step's and chapter 07's step 3 median over this step's (ratios of the table's own times, so
    they multiply), forwards per output token (the median request's, the statistic of the times and of
    :func:`loop_bound`'s count), accepted tokens per verified draft; ``faster``: (how many requests
    ran faster than in the previous step, how many requests both ran), which tells a step's gain from run-to-run
    variation where the ratio of medians is near 1."""
    ref = "ch7_step03"
    out = [{"step": START_LABEL, "label": START_LABEL, "change": "the loop chapter 08 starts from",
            "ms_per_token": median_ms(results, batch, workload, ref), "x_previous": None, "x_ch7_step03": 1.0,
            "forwards_per_token": _forwards(results, batch, workload, ref), "accepted": None, "faster": None}]
    prev = ref
    for s in SERIES:
        step = CHAPTER.step(s)
        rows = _rows(results, batch, workload, s)
        drafts = sum(r["drafts"] for r in rows)
        ms = median_ms(results, batch, workload, s)
        out.append({"step": step.name, "label": STEP_LABELS[s], "change": two_digits(step.title), "ms_per_token": ms,
                    "x_previous": median_ms(results, batch, workload, prev) / ms,
                    "x_ch7_step03": median_ms(results, batch, workload, ref) / ms,
                    "forwards_per_token": _forwards(results, batch, workload, s),
                    "accepted": sum(r["accepted"] for r in rows) / drafts if drafts else None,
                    "faster": _faster(results, batch, workload, prev, s)})
        prev = s
    return out


def _faster(results, batch: int, workload: str, before: str, after: str) -> tuple[int, int]:
    """How many requests ``after`` ran faster than ``before`` (time per output token), of those both ran."""
    ups = speedups(results.rows, batch, workload, after, over=before)
    return sum(u > 1 for u in ups), len(ups)


def _forwards(results, batch, workload, series) -> float:
    """The median request's forwards per output token: the page's one count (the steps' times are medians over the
    requests too, and :func:`loop_bound` prices this count)."""
    return statistics.median(r["forwards"] / r["tokens"] for r in _rows(results, batch, workload, series))


def drafts_table(results, batch: int = 1, workload: str = "extraction") -> list[dict[str, Any]]:
    """Per drafting step (``label`` as in :func:`steps_table`), summed over the workload's requests: tokens the
    matcher proposed, those the grammar cut,
    forced tokens that joined drafts, draft tokens verified and accepted, and accepted tokens per verified draft."""
    out = []
    for s in SERIES[1:]:
        rows = _rows(results, batch, workload, s)
        total = {k: sum(r[k] for r in rows) for k in ("proposed", "cut", "forced_drafted", "verified", "accepted",
                                                     "drafts")}
        out.append({"step": CHAPTER.step(s).name, "label": STEP_LABELS[s], **total,
                    "accepted_per_draft": total["accepted"] / total["drafts"]
                    if total["drafts"] else None})
    return out


#: Chapter 07's components folded into this chapter's: the mask's wait and its application count as the head's.
_CH7_HEAD = ("mask_wait", "head", "mask_apply")


def breakdown_table(results, batch: int = 1, workload: str = "extraction") -> list[dict[str, Any]]:
    """Where an output token's time goes, in microseconds over all the workload's requests (each request's
    instrumented run; the prefill included in the body): drafting, the body (the verifying forward), the head,
    sampling and the host's own work, for chapter 07's step 3 and this chapter's step 1 and shipped step 3. ``total`` is the
    instrumented runs' time over all the tokens (long requests weigh more); ``median``, the median request's time
    per output token in the timed runs (the steps table's statistic), sits beside it."""
    out = []
    for s, name in (("ch7_step03", START_LABEL), ("step01", STEP_LABELS["step01"]), (SHIPPED, STEP_LABELS[SHIPPED])):
        rows = _rows(results, batch, workload, s)
        tokens = sum(r["tokens"] for r in rows)

        def us(keys) -> float:
            return sum(r["breakdown_ms_per_token"].get(k, 0.0) * r["tokens"] for r in rows for k in keys) / tokens * 1e3

        out.append({"step": name, "draft": us(("draft",)), "body": us(("body",)),
                    "head": us(_CH7_HEAD if s.startswith("ch7") else ("head",)), "sampling": us(("sampling",)),
                    "host": us(("host",)), "total": us(("wall",)),
                    "median": median_ms(results, batch, workload, s) * 1e3})
    return out


def tuned_layers(results, batch: int = 1) -> dict[int, dict[str, float]]:
    """What the decoder's start-up timing (:meth:`studylog.speculate.SpeculativeDecoder.tune`, graph replay) measured
    per chunk length at ``batch``, in microseconds: ``{chunk: {"gemv": us, "cublas": us}}``, read from the note the
    benchmark writes with it; empty where the run has no such note."""
    pattern = re.compile(rf"^batch {batch}: the verifying forward runs the six-launch layer .*?ms: (\{{.*\}})\);")
    for note in results.data.get("notes", []):
        found = pattern.match(note)
        if found:
            return {t: {k: v * 1e3 for k, v in d.items()} for t, d in ast.literal_eval(found.group(1)).items()}
    return {}


def layer_table(results, batch: int = 1) -> list[dict[str, Any]]:
    """The body per chunk length on each layer (GPU clock, graph replay), and which one the loop runs. The timed
    rows hold only the layer the loop runs beyond two tokens; where a layer's time is missing there, it comes from
    the decoder's start-up timing (:func:`tuned_layers`) and its name is in ``tuned``. A chunk the six-launch layer
    cannot take (more tokens than ``studylog.decode.model.GEMV_MAX_TOKENS``) keeps None."""
    rows = [r for r in report.rows_of(results.rows, batch=batch) if r["series"] == "verify"]
    tuned = tuned_layers(results, batch)
    by: dict[int, dict[str, Any]] = {}
    for r in rows:
        d = by.setdefault(r["params"]["chunk"], {"chunk": r["params"]["chunk"], "gemv": None, "cublas": None,
                                                 "tuned": []})
        d[r["params"]["layer"]] = r["ms"] * 1e3
        if r.get("used"):
            d["used"] = r["params"]["layer"]
    for chunk, d in by.items():
        for layer in ("gemv", "cublas"):
            if d[layer] is None and layer in tuned.get(chunk, {}):
                d[layer] = tuned[chunk][layer]
                d["tuned"].append(layer)
    return [by[k] for k in sorted(by)]


def loop_bound(results, batch: int = 1, workload: str = "extraction") -> dict[str, float]:
    """Our loop's forward-time bound, the page's last forecast (a time per token): each request's forwards per output token
    in the shipped step (3), each priced at the one-token
    forward's GPU time on the layer the loop runs (:func:`layer_table`, chunk 1, graph replay), the median over the
    requests the headline keeps (:func:`studylog.speculate.report.closed_requests`: those that close their JSON; µs
    per token; the scoreboard's note for this chapter gives the same number). It holds the host's work and the
    drafting at zero, so ``over`` (the shipped step's median time over those requests, over it) is what they and the longer
    verifying forwards add. ``one_token_us``: that forward's time; ``requests``: how many; ``forwards``: the median
    request's forwards per output token (:func:`steps_table`'s count; the bound is that count at ``one_token_us``)."""
    one = next(d for d in layer_table(results, batch) if d["chunk"] == 1)
    one_ms = one[one["used"]] / 1e3
    kept = report.closed_requests(results.rows, workload)
    mine = [r for r in _rows(results, batch, workload, SHIPPED) if r["params"]["request"] in kept]
    bound = statistics.median(one_ms * r["forwards"] / r["tokens"] for r in mine)
    measured = statistics.median(r["ms"] for r in mine)
    return {"one_token_us": one_ms * 1e3, "bound_us": bound * 1e3, "measured_us": measured * 1e3,
            "over": measured / bound, "requests": len(mine),
            "forwards": statistics.median(r["forwards"] / r["tokens"] for r in mine)}


def forward_anatomy(results) -> dict[str, float] | None:
    """What a one-token forward's time is measured against, beside :func:`kernel_count_bound`: its GPU time on the
    layer the loop runs (``us``, :func:`loop_bound`), its kernels (``kernels``) at this run's empty kernel's time
    each (``empty_us``; ``launches_us``, their product), and its weights read once at this run's copy bandwidth
    (``bytes_us``: chapter 07's run prices SmolLM2's body bytes, its ``body`` row's floor, repriced here). The rest
    of ``us`` is not split by any run. None without the kernel count or chapter 07's body row."""
    from book.decode import lesson as decode_lesson

    kc, ch7 = kernel_count_bound(), decode_lesson.committed()
    body = next((r for r in ch7.rows if r["series"] == "body" and r["params"].get("model") == "smollm2"
                 and r["params"].get("batch") == 1 and r["params"].get("chunk") == 1), None) if ch7 else None
    empty = results.data["ceilings"].get("empty_launch_gpu_ms")
    if kc is None or not kc["kernels"] or body is None or not body.get("floor_ms") or not empty:
        return None
    here, there = results.data["ceilings"]["copy_bandwidth_gbs"], ch7.data["ceilings"]["copy_bandwidth_gbs"]
    return {"us": loop_bound(results)["one_token_us"], "kernels": kc["kernels"], "empty_us": empty * 1e3,
            "launches_us": kc["kernels"] * empty * 1e3, "bytes_us": body["floor_ms"] * there / here * 1e3}


def kernel_count_bound(card: str = "H200") -> dict[str, Any] | None:
    """The scoreboard's other bound on this loop, beside :func:`loop_bound` (its row on ``card``,
    :func:`book.scoreboard.entry_rows`): each forward's kernels, counted in a separate run, at an empty kernel's
    time, at the shipped step's forwards per output token (``us``, per token; ``kernels``, a forward's). ``binds`` is the bound
    the scoreboard divides by ("forward" where the forward-time bound is the longer, "latency" where this one is);
    None where the card has no such row or no kernel count."""
    from book import scoreboard as sb

    entry = next(e for e in sb.ENTRIES if e.number == 8)
    row = next((r for r in sb.entry_rows(entry) if "missing" not in r and sb.short_card(r["card"]) == card), None)
    if row is None or row.get("latency_floor_ms") is None:
        return None
    kernels = re.match(r"(\d+) dependent kernels", row["latency_what"])
    return {"us": row["latency_floor_ms"] * 1e3, "kernels": int(kernels.group(1)) if kernels else None,
            "binds": row["binding"], "bound_us": row["binding_floor_ms"] * 1e3}


def bound_rows(results) -> list[dict[str, Any]]:
    """Per batch and workload: the shipped step (3) against chapter 07's step 3, the ratio of their median times per output token
    over every request timed (``ratio``, the headline's statistic; the headline at batch 1 keeps only the requests
    that close their JSON, :func:`capped`) and the requests' own ratios (median, slowest, ``max_speedup``), the
    forward ratio and the chunk-length forecast (``forecast``: each forward priced at its chunk length's measured
    time, each drafting call at its own; :func:`studylog.speculate.report.bound`); the requests timed
    (``requests``); at batch 1, ``closed``: the same figures over the requests the headline keeps (:func:`closed_rows`;
    None at batch 8, where a batch is timed whole); beside them the same ratio on the second H200 (``second_ratio``, :func:`second_run`; None
    without it) and how far the two runs are apart (``runs_apart``: the larger ratio over the smaller, less one)."""
    again = second_run()
    out = []
    for r in summary(results.rows):
        b, w = r["batch"], r["workload"]
        ratio = median_ms(results, b, w, "ch7_step03") / median_ms(results, b, w, SHIPPED)
        second = _ratio(again, b, w) if again is not None else None
        out.append(r | {"ratio": ratio, "max_speedup": max(speedups(results.rows, b, w)),
                        "requests": len(_rows(results, b, w, SHIPPED)),
                        "second_ratio": second,
                        "runs_apart": max(second, ratio) / min(second, ratio) - 1 if second else None,
                        "closed": _closed_summary(results, w) if b == 1 else None})
    return out


def _closed_summary(results, workload: str) -> dict[str, Any]:
    """:func:`bound_rows`' figures at batch 1 over the requests the headline keeps (:func:`closed_rows`)."""
    rows = closed_rows(results, workload)
    r = next(x for x in summary(rows) if x["batch"] == 1 and x["workload"] == workload)
    return r | {"ratio": closed_ratio(results, SHIPPED, workload),
                "max_speedup": max(speedups(rows, 1, workload)),
                "requests": len(report.closed_requests(results.rows, workload))}


def closed_rows(results, workload: str = "extraction") -> list[dict]:
    """The run's rows with the batch-1 ``workload`` requests the headline leaves out (:func:`capped`: the shipped
    step's output ran to the cap) dropped, every series alike; every other row kept (the layers' timings, batch 8)."""
    kept = report.closed_requests(results.rows, workload)
    return [r for r in results.rows if not (r["params"].get("batch") == 1 and r["params"].get("workload") == workload
                                            and r["params"].get("request") not in kept)]


def kept_results(results, workload: str = "extraction"):
    """``results`` with only the batch-1 ``workload`` requests the headline keeps (:func:`closed_rows`), as a results
    object: the steps', drafts' and time breakdown's tables read it, so the page's loop numbers have one basis."""
    from studylog.plotting import Results

    return Results(results.path, {**results.data, "measurements": closed_rows(results, workload)})


def prefill_words(results, batch: int = 1) -> dict[str, Any]:
    """The first step of a request, the prompt's forward, in both loops (chapter 07's step 3 and the shipped step) at
    ``batch``: the prompts' lengths (``tokens``: least, most: the first chunk), the largest graph-captured chunk
    (``chunk``: a longer chunk runs eagerly, :meth:`studylog.decode.loop.Decoder._body`) and the median first step
    over both loops' requests (``ms``)."""
    import inspect

    from studylog.speculate.loop import SpeculativeDecoder

    rows = [r for r in report.rows_of(results.rows, batch=batch) if r["series"] in ("ch7_step03", SHIPPED)]
    chunk = inspect.signature(SpeculativeDecoder.__init__).parameters["chunk_sizes"].default[-1]
    first = [r["chunk_lengths"][0] for r in rows]
    return {"tokens": (min(first), max(first)), "chunk": chunk,
            "ms": statistics.median(r["first_step_ms"] for r in rows)}


def median_pairing(results, batch: int = 8, workload: str = "extraction") -> dict[str, Any]:
    """Why the ratio of two medians and the median of the requests' (or batches') own ratios part: the request whose
    time is chapter 07's median (``ch7``), the one whose time is the shipped step's (``ours``), the two statistics
    (``ratio_of_medians``, ``median_ratio``) and how many requests or batches there are (``n``)."""
    ch7 = {r["params"]["request"]: r["ms"] for r in _rows(results, batch, workload, "ch7_step03")}
    ours = {r["params"]["request"]: r["ms"] for r in _rows(results, batch, workload, SHIPPED)}
    names = sorted(set(ch7) & set(ours))

    def median_of(times: dict[str, float]) -> str:  # the request at the median (an odd count: one of them)
        ranked = sorted(names, key=times.get)
        return ranked[len(ranked) // 2]

    return {"ch7": median_of(ch7), "ours": median_of(ours), "n": len(names),
            "ratio_of_medians": statistics.median(ch7[n] for n in names) / statistics.median(ours[n] for n in names),
            "median_ratio": statistics.median(ch7[n] / ours[n] for n in names)}


def kept_requests(results, workload: str = "extraction") -> set[str]:
    """The names of the batch-1 ``workload`` requests the headline keeps (those that close their JSON)."""
    return set(report.closed_requests(results.rows, workload))


def closed_median_ms(results, series: str, workload: str = "extraction") -> float:
    """The median request's milliseconds per output token of ``series`` at batch 1, over the requests the headline
    keeps (:func:`closed_rows`)."""
    return _median(closed_rows(results, workload), 1, workload, series)


def closed_ratio(results, series: str = SHIPPED, workload: str = "extraction") -> float:
    """Chapter 07's step 3 over ``series`` at batch 1, the ratio of their median times per output token over the
    requests the headline keeps (:func:`studylog.speculate.report.closed_requests`: the shipped step's output closed its JSON)."""
    return closed_median_ms(results, "ch7_step03", workload) / closed_median_ms(results, series, workload)


def forecasts(results, workload: str = "extraction") -> list[dict[str, Any]]:
    """The page's three forecasts of the shipped step against chapter 07's step 3 at batch 1, each beside what was measured,
    on the requests the headline keeps (``value``, ``measured``) and on all the workload's requests (``value_all``,
    ``measured_all``; None for the time per token, which the scoreboard gives on the kept ones only). The time per
    token is named "our loop's forward-time bound": it prices this loop's own forwards, so it bounds the loop, not the task
    (no floor). ``unit``:
    "x" for a ratio, "us" for microseconds per token. The forward ratio and the chunk-length forecast are
    :func:`studylog.speculate.report.bound` on the rows of the kept requests; the time per token is
    :func:`loop_bound`."""
    on_kept, on_all = bound(closed_rows(results, workload), 1, workload), bound(results.rows, 1, workload)
    measured = closed_ratio(results, SHIPPED, workload)
    measured_all = median_ms(results, 1, workload, "ch7_step03") / median_ms(results, 1, workload, SHIPPED)
    loop = loop_bound(results, 1, workload)
    return [{"forecast": "forward ratio", "unit": "x", "value": on_kept["forwards"], "value_all": on_all["forwards"],
             "measured": measured, "measured_all": measured_all,
             "assumes": "a verifying forward costs a one-token forward; drafting and the host's work cost nothing"},
            {"forecast": "chunk-length forecast", "unit": "x", "value": on_kept["forecast"],
             "value_all": on_all["forecast"], "measured": measured, "measured_all": measured_all,
             "assumes": "each forward costs its chunk length's measured GPU time, each drafting call its own; "
                        "the host's work costs nothing"},
            {"forecast": "our loop's forward-time bound", "unit": "us", "value": loop["bound_us"], "value_all": None,
             "measured": loop["measured_us"], "measured_all": None,
             "assumes": f"step 3's {loop['forwards']:.2f} forwards per token (the median request's), each at a "
                        f"one-token forward's GPU time ({loop['one_token_us']:.1f} µs); drafting and the host's work "
                        "cost nothing"}]


def request_words(name: str) -> str:
    """A request as the prose names it: an extraction document by what it is and its number (``contact_2``:
    ``contact card 2``), any other request by its schema's name in words (``the weather call request``)."""
    if name in requests.document_names():
        return f"{requests.document(name)['what']} {name.rsplit('_', 1)[1]}"
    return f"the {name.replace('_', ' ')} request"


def low_copy_counts(results, batch: int = 1) -> dict[str, int]:
    """How many requests the low-copy workload holds at ``batch`` (``low_copy``, from the results) and how many
    real requests chapter 07 runs (``chapter7``: one per entry of its request list): the low-copy set is the JSON
    ones among them whose answers the prompt mostly does not hold."""
    from studylog.decode.requests import INSTRUCTIONS

    return {"low_copy": len(_rows(results, batch, "low_copy", SHIPPED)), "chapter7": len(INSTRUCTIONS)}


def batch_makeup(batch: int = 8) -> dict[str, int]:
    """What one row of the results holds at ``batch`` (a batch of ``batch`` sequences, timed as one, as
    :func:`studylog.speculate.report.groups_of` forms it): on extraction, one kind's documents repeated to fill the
    batch (``extraction``: how many batches; ``documents``: the fewest distinct documents a batch holds;
    ``repeated``: the most sequences of a batch that repeat a document); on low-copy, one request's instructions in
    turn (``low_copy``: how many batches)."""
    groups = report.groups_of("extraction", batch)
    distinct = [len(set(names)) for names in groups]
    return {"batch": batch, "extraction": len(groups), "documents": min(distinct), "repeated": batch - min(distinct),
            "low_copy": len(report.groups_of("low_copy", batch))}


def draft_cost(results, batch: int = 1, workload: str = "extraction") -> dict[str, float]:
    """What drafting and the grammar's walk cost against a verifying step, in the loop's instrumented runs
    (wall clock, the prefill left out). The loop's drafting component also holds the step's bookkeeping (each
    sequence's pending tokens and room), which step 1 times too without drafting: drafting's cost is the shipped
    step's component less step 1's per step, per drafting call (``loop_us``). ``step_us``: the rest of a step of
    the shipped step (body, head, sampling, acceptance, bookkeeping). Beside them, one drafting call alone (host clock: it
    waits for its result) and a verifying forward of two tokens alone (GPU clock)."""
    call = next(r for r in report.rows_of(results.rows, batch=batch) if r["series"] == "draft_call")

    def per_step(series: str, key: str) -> tuple[float, int]:  # ms summed over the requests, and their steps
        rows = _rows(results, batch, workload, series)
        return (sum(r["breakdown_ms_per_token"][key] * r["tokens"] for r in rows),
                sum(len(r["chunk_lengths"]) for r in rows))

    plain, plain_steps = per_step("step01", "draft")
    component, steps = per_step(SHIPPED, "draft")
    rows = _rows(results, batch, workload, SHIPPED)
    drafting = component - steps * plain / plain_steps
    rest = sum(r["breakdown_ms_per_token"]["wall"] * r["tokens"] - r["first_step_ms"] for r in rows) - drafting
    loop_ms = drafting / sum(r["draft_calls"] for r in rows)
    step_ms = rest / sum(len(r["chunk_lengths"]) - 1 for r in rows)
    verify = next(d for d in layer_table(results, batch) if d["chunk"] == 2)
    verify_us = verify[verify["used"]]
    tokens = sum(r["tokens"] for r in rows)
    steps = sum(len(r["chunk_lengths"]) - 1 for r in rows)  # the decode steps, after each request's prefill
    prefill = sum(r["first_step_ms"] for r in rows)
    wall = sum(r["breakdown_ms_per_token"]["wall"] * r["tokens"] for r in rows)
    return {"call_us": call["host_ms"] * 1e3, "loop_us": loop_ms * 1e3, "bookkeeping_us": plain / plain_steps * 1e3,
            "step_us": step_ms * 1e3, "verify_us": verify_us, "loop_share": loop_ms / step_ms,
            "forward_share": loop_ms * 1e3 / verify_us,
            # how a decode step's time becomes the time per token: the steps, drafting included, and the prefills,
            # each spread over every token the requests write (together: the pooled time per token)
            "decode_step_us": (wall - prefill) / steps * 1e3, "tokens_per_step": tokens / steps,
            "decode_us_per_token": (wall - prefill) / tokens * 1e3, "prefill_us_per_token": prefill / tokens * 1e3,
            "pooled_us_per_token": wall / tokens * 1e3}


#: Where the runs the page cites beside the committed one keep their files, from the repository's root.
LAB_RESULTS = "lab/speculate/results/nvidia-h200"


def _lab_file(name: str) -> dict[str, Any]:
    """A file of :data:`LAB_RESULTS`."""
    import json

    from studylog.paths import REPO_ROOT

    return json.loads((REPO_ROOT / LAB_RESULTS / name).read_text())


#: The committed run's benchmark repeated with the same code on a second H200, in ``lab/speculate/results/``.
SECOND_RUN = "speculate_second_host_run.json"
#: How far apart two runs' headline ratios may be before a page must say so (``how_we_measure.md``).
RUNS_APART = 0.10


def second_run() -> list[dict] | None:
    """The rows of :data:`SECOND_RUN`, or None where the file is missing."""
    try:
        return _lab_file(SECOND_RUN)["measurements"]
    except FileNotFoundError:
        return None


def _ratio(rows, batch: int, workload: str) -> float:
    """Chapter 07's step 3 over the shipped step: the ratio of their median times per output token, the headline's statistic."""
    return _median(rows, batch, workload, "ch7_step03") / _median(rows, batch, workload, SHIPPED)


def step3_over_step2() -> list[dict[str, Any]]:
    """Step 3 against step 2 in each run there is (the committed one, then :data:`SECOND_RUN`), at each batch and
    workload: the ratio of their median times per output token over every request timed (``ratio``, > 1: step 3 is
    faster)."""
    again = second_run()
    runs = [("first", committed().rows)] + ([("second", again)] if again is not None else [])
    return [{"run": name, "batch": b, "workload": w,
             "ratio": _median(rows, b, w, "step02") / _median(rows, b, w, "step03")}
            for name, rows in runs for b in (1, 8) for w in report.WORKLOADS]


def second_machine(batch: int = 1, workload: str = "extraction") -> dict[str, float]:
    """The same benchmark, the same code, run again on a second H200 (:data:`SECOND_RUN`): the shipped step against chapter
    7's step 3 there and in the committed run, at ``batch`` (:func:`_ratio`)."""
    return {"second": _ratio(second_run(), batch, workload), "first": _ratio(committed().rows, batch, workload)}


#: Steps 1 and 2 with the verifying forward on either layer, in one run (``lab/speculate/verify_layer_split.py``).
SPLIT_RUN = "verify_layer_split.json"
#: Step 2's chain, one row per link: its label, the decoder and step of :data:`SPLIT_RUN` timed for it, and the one
#: change it adds to the row above. ``tuned`` is the benchmark's decoder (two-token forwards on the six-launch layer);
#: ``nine`` keeps the six-launch layer for one-token forwards only, as chapter 07's loop does. The first row is
#: step 1 (the anchor), the last step 2 itself, both timed in the same run.
STEP02_CHAIN = (("step 1", "tuned", "step01", "chapter 07's loop with every position's hidden state"),
                ("2a", "nine", "step02", "+ drafts cut by the grammar, verified on the nine-launch layer"),
                ("2b = step 2", "tuned", "step02", "+ two-token verifying forwards on the six-launch layer"))


def step02_chain(results, batch: int = 1, workload: str = "extraction",
                 requests: set[str] | None = None) -> dict[str, Any]:
    """Step 2's chain (:data:`STEP02_CHAIN`) from :data:`SPLIT_RUN`, which times it on the extraction requests at
    batch 1 (raises ``FileNotFoundError`` where the run is not committed: the page has no other source). ``rows``:
    per link its label, change, the median request's µs per output token and its ratio to the row above's
    (``x_previous``, None on the anchor); ``requests``; ``gap``: the larger of the two anchors' gaps to the same
    steps in the chapter's run (:func:`steps_table`, the same statistic), as a fraction of the chapter's time, and
    ``gap_step``, which anchor; ``same_tokens``: whether the two decoders wrote the same tokens. ``requests``: only
    those requests of the run (the headline's, with ``results`` from :func:`kept_results`); None: every one."""
    run = _lab_file(SPLIT_RUN)
    taken = [r for r in run["rows"] if requests is None or r["request"] in requests]
    rows, prev = [], None
    for label, variant, step, change in STEP02_CHAIN:
        ms = [r["ms_per_token"] for r in taken if r["variant"] == variant and r["step"] == step]
        if not ms:
            raise ValueError(f"{SPLIT_RUN} lacks {variant} {step}")
        us = statistics.median(ms) * 1e3
        rows.append({"row": label, "change": change, "us": us, "x_previous": prev / us if prev else None})
        prev = us
    own = {r["step"]: r["ms_per_token"] * 1e3 for r in steps_table(results, batch, workload)}
    # the gap of the times as the two tables print them (whole µs), so that it is the one a reader computes
    gaps = [(abs(round(rows[i]["us"]) / round(own[CHAPTER.step(s).name]) - 1), rows[i]["row"])
            for i, s in ((0, "step01"), (-1, "step02"))]
    gap, where = max(gaps)
    return {"rows": rows, "requests": len({r["request"] for r in taken}), "gap": gap, "gap_step": where,
            "same_tokens": bool(run["same_tokens_in_both_variants"])}


#: Step 2's chain table's one case, as its column names it (:func:`step02_chain_rows`).
CHAIN_CASE = "batch 1, extraction"


def step02_chain_rows(chain: dict[str, Any]) -> list[ChainRow]:
    """:func:`step02_chain`'s rows for the book's chain table (:func:`book.common.chain_table`, its one case
    :data:`CHAIN_CASE`, µs per output token)."""
    return [ChainRow(r["row"], r["change"], {CHAIN_CASE: r["us"]}) for r in chain["rows"]]


def step02_chain_ratio_table(chain: dict[str, Any]) -> str:
    """Step 2's chain as the page's open table (Markdown): per link its label, its one change and its "× previous"
    only (:func:`book.common.chain_factor`). The chain's times are another run's, so its step 1 and step 2 sit a
    little off the steps table's; the page folds them (:func:`step02_chain_rows`), so each configuration shows one
    time in the open text."""
    from book.common import chain_factor

    rows = step02_chain_rows(chain)
    lines = [f"| row | the one change | {CHAIN_CASE}: × previous |", "|---|---|---|"]
    for i, row in enumerate(rows):
        cell = "anchor" if i == 0 else chain_factor(rows[i - 1].us[CHAIN_CASE], row.us[CHAIN_CASE])
        lines.append(f"| {row.label} | {row.change} | {cell} |")
    return "\n".join(lines)


def prefill_probe() -> dict[str, float]:
    """The first step's median milliseconds of the ``classifier`` request at batch 1 in chapter 07's loop and in step
    4, run in alternating order (``lab/speculate/prefill_probe.py``; its file in ``lab/speculate/results/``)."""
    loops = _lab_file("prefill_probe.json")["loops"]
    return {k: loops[k]["first_step_ms"]["median"] for k in ("ch7_step03", "step04")}


def agreement(results) -> dict[str, Any]:
    """The checks against chapter 07: sequences compared, identical, divergences and the largest gap over its
    rounding bound."""
    checks = [c for c in results.data["checks"] if c["name"].startswith("same tokens as")]
    divs = [d for c in checks for d in c.get("divergences", [])]
    return {"checks": len(checks), "sequences": sum(c["sequences"] for c in checks),
            "identical": sum(c["identical"] for c in checks), "divergences": len(divs),
            "all_inside": all(d["inside"] for d in divs) and all(c["passed"] for c in checks),
            "largest_gap_over_bound": max((d["gap"] / d["bound"] for d in divs if d["bound"]), default=0.0)}


def differing(results, batch: int, workload: str, requests: set[str] | None = None) -> dict[str, int]:
    """The shipped step's outputs against chapter 07's step 3, at ``batch`` on ``workload`` (only ``requests``, when
    given): ``sequences`` compared and ``differ``, those whose tokens part from chapter 07's (each at a near tie:
    :func:`agreement`)."""
    checks = [c for c in results.data["checks"] if c["name"].startswith("same tokens as chapter 7's step 3")
              and c["params"]["batch"] == batch and c["params"]["workload"] == workload
              and c["params"]["series"] == SHIPPED and (requests is None or c["params"]["request"] in requests)]
    return {"sequences": sum(c["sequences"] for c in checks),
            "differ": sum(c["sequences"] - c["identical"] for c in checks)}


#: The course's tie rule (How we measure): a ratio that prints, at two decimals, from 0.97x to 1.03x is a tie.
TIE_BAND = (0.97, 1.03)


def ratio_cell(x: float | None) -> str:
    """A step table's ratio as printed, with "(tie)" where the course's tie rule (:data:`TIE_BAND`) calls it one."""
    if x is None:
        return "–"
    shown = f"{x:.2f}"
    return f"{shown}×" + (" (tie)" if TIE_BAND[0] <= float(shown) <= TIE_BAND[1] else "")


def at_par(results, request: str, workload: str = "low_copy", batch: int = 1) -> dict[str, float]:
    """How far one request can move its workload's ratio (chapter 07's step 3 over the shipped step, the median
    requests'): ``ratio`` as measured, ``at_par`` with that request's shipped time set to chapter 07's (a speedup of
    1.00x), ``without`` with the request left out of both loops."""
    ref = {r["params"]["request"]: r["ms"] for r in _rows(results, batch, workload, "ch7_step03")}
    mine = {r["params"]["request"]: r["ms"] for r in _rows(results, batch, workload, SHIPPED)}

    def ratio(theirs: dict, ours: dict) -> float:
        return statistics.median(theirs.values()) / statistics.median(ours.values())

    rest = [n for n in ref if n != request]
    return {"ratio": ratio(ref, mine), "at_par": ratio(ref, mine | {request: ref[request]}),
            "without": ratio({n: ref[n] for n in rest}, {n: mine[n] for n in rest})}


def validity(results) -> dict[str, int]:
    checks = [c for c in results.data["checks"] if c["name"].startswith("outputs that ended")]
    return {"ended": sum(c["ended"] for c in checks), "valid": sum(c["valid"] for c in checks)}


def copying(results, workload: str, batch: int = 1) -> dict[str, float]:
    """What a workload's drafts copy, summed over its batch-1 requests (pass :func:`kept_results` for the headline's
    basis): ``copied``, the share of step 2's output tokens that are accepted draft tokens (step 2 drafts only what
    the matcher finds in the prompt); ``cut``, the share of the shipped step's proposed tokens the grammar cuts; ``forced``, the
    share of its verified draft tokens that the automaton forced (step 3's extension); ``accepted``, its
    accepted tokens per draft."""
    two, four = (_rows(results, batch, workload, s) for s in ("step02", SHIPPED))

    def total(rows, key):
        return sum(r[key] for r in rows)

    return {"copied": total(two, "accepted") / total(two, "tokens"),
            "cut": total(four, "cut") / total(four, "proposed"),
            "forced": total(four, "forced_drafted") / total(four, "verified"),
            "accepted": total(four, "accepted") / total(four, "drafts")}


def gate_paused(results, workload: str, batch: int = 1) -> dict[str, Any]:
    """What step 4's gate changed against step 3 on ``workload``: the drafting calls it paused, summed over the
    requests (``paused``), and whether every request ran the same forwards and drafting calls in both (``idle``:
    then any gap in time between the two steps is run-to-run variation)."""
    three = {r["params"]["request"]: r for r in _rows(results, batch, workload, "step03")}
    four = _rows(results, batch, workload, "step04")
    same = all(r["forwards"] == three[r["params"]["request"]]["forwards"]
               and r["draft_calls"] == three[r["params"]["request"]]["draft_calls"] for r in four)
    return {"paused": sum(three[r["params"]["request"]]["draft_calls"] - r["draft_calls"] for r in four),
            "idle": same}


def losses(results, batch: int = 1) -> list[dict[str, Any]]:
    """Every request of either workload with the shipped step's speedup over chapter 07's step 3, slowest first."""
    out = []
    for workload in report.WORKLOADS:
        ref = {r["params"]["request"]: r for r in _rows(results, batch, workload, "ch7_step03")}
        for r in _rows(results, batch, workload, SHIPPED):
            base = ref[r["params"]["request"]]
            out.append({"workload": workload, "request": r["params"]["request"], "tokens": r["tokens"],
                        "forwards": r["forwards"], "ch7_forwards": base["forwards"], "speedup": base["ms"] / r["ms"]})
    return sorted(out, key=lambda d: d["speedup"])


def markdown_table(rows: list[dict[str, Any]], formats: dict[str, str]) -> str:
    """A Markdown table of ``rows`` (dicts), one column per key of ``formats`` (a format spec, or one ending in
    "×" for a ratio that prints its sign; a missing value prints a dash)."""
    def cell(value, spec: str) -> str:
        return "–" if value is None else format(value, spec.removesuffix("×")) + ("×" if spec.endswith("×") else "")

    head = "| " + " | ".join(formats) + " |\n|" + "---|" * len(formats)
    lines = ["| " + " | ".join(cell(r.get(k), f) for k, f in formats.items()) + " |" for r in rows]
    return "\n".join([head] + lines)


def _notes(results, batch: int) -> dict[str, str]:
    """The outputs the benchmark kept (chapter 07's step 3 wrote them), by request, at ``batch``."""
    tag = f" (batch {batch}): "
    return {t.split(tag, 1)[0]: t.split(tag, 1)[1] for t in results.data["notes"] if tag in t}


def sample_outputs(results, batch: int = 1, width: int | None = None) -> list[str]:
    """The page's samples, picked by a rule and not by their quality: the output kept for the first document of
    each kind (``invoice_1``, ``contact_1``, ...), as ``name: output``, cut at ``width`` characters."""
    from studylog.speculate import requests

    notes, seen, out = _notes(results, batch), set(), []
    for doc in requests.workload()["documents"]:
        if doc["kind"] in seen or doc["name"] not in notes:
            continue
        seen.add(doc["kind"])
        out.append(_cut(f"{doc['name']}: {notes[doc['name']]}", width))
    return out



def sample_slips(samples: list[str]) -> list[str]:
    """Slips a reader can check in :func:`sample_outputs`' ``name: output`` lines against the documents: a number the
    document does not hold, or a text field that repeats another field's value (an invoice number that is its
    currency). Not a grader: a 135M model's swapped names, say, pass."""
    from studylog.speculate import requests

    docs = {d["name"]: d["document"] for d in requests.workload()["documents"]}
    out = []
    for sample in samples:
        name, _, text = sample.partition(": ")
        try:
            fields = json.loads(text)
        except ValueError:  # cut at the cap: not JSON
            continue
        if not isinstance(fields, dict) or name not in docs:
            continue
        for key, v in fields.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if not any(form in docs[name] for form in {f"{v}", f"{v:g}", f"{v:.2f}", f"{v:,.2f}"}):
                    out.append(f"{name}'s {key}, {v:g}, is in no line of its document")
            elif isinstance(v, str):
                keys = list(fields)
                same = [k for k in keys[keys.index(key) + 1:] if fields[k] == v]  # the pair said once, at its first
                if same:
                    out.append(f"{name}'s {key} repeats its {same[0]}, \"{v}\"")
    return out

#: The widest line the page's code blocks show whole (characters): a sample longer than this is cut with an ellipsis.
CODE_WIDTH = 100


def _cut(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[:width - 1] + "…"


def wrapped(text: str, width: int = CODE_WIDTH, lines: int = 2) -> list[str]:
    """``text`` as at most ``lines`` lines of at most ``width`` characters, broken at spaces or hyphens where it can
    (JSON has few spaces: a long word is broken anywhere), each line after the first indented; where the text goes on
    past the last line, that line ends in an ellipsis."""
    import textwrap

    return textwrap.wrap(text, width=width, subsequent_indent="    ", max_lines=lines, placeholder=" …") or [""]


def repeats(text: str, times: int = 4) -> bool:
    """Whether ``text`` holds a phrase of 3 to 80 characters written ``times`` times in a row: the output of a
    model caught in a loop (``Kai-Kai-Kai-Kai-``)."""
    import re

    return re.search(r"(.{3,80}?)\1{%d,}" % (times - 1), text, flags=re.S) is not None


def capped(results, workload: str = "extraction") -> dict[str, Any]:
    """The requests whose shipped step's output ran to the output cap (:data:`studylog.speculate.report.MAX_NEW` tokens)
    instead of closing its JSON, against the rest, at batch 1 (where a row is one sequence; a batch's row sums its
    sequences' tokens). ``rows``: each such request, its speedup over chapter 07's step 3,
    whether its kept output repeats a phrase (:func:`repeats`) and that output; largest speedup first. ``top``: how
    many of the workload's largest speedups, as many as there are capped requests, are capped ones. Without them:
    the median of the requests' own speedups (``median_without``) and the ratio of the median times
    (``ratio_without``, the headline's statistic), beside ``median_all`` and ``ratio_all``. ``in_both``: the request
    ran to the cap in chapter 07's loop too, so its two outputs are the same text and its speedup like for like; a
    request capped only under drafting also carries where its tokens first left chapter 07's (``position``, from the
    checks; ``near_tie``: inside the rounding bound), the steps that ran it to the cap (``steps``) and chapter 07's
    token count (``ch7_tokens``), and ``ratio_with_drafting_only`` is the headline's ratio with such requests kept.
    ``top`` counts, among as many of the largest speedups as requests capped in both loops, those ones. The
    excluded set is the shipped step's capped requests; a request capped in chapter 07's loop but not there raises."""
    ref = {r["params"]["request"]: r for r in _rows(results, 1, workload, "ch7_step03")}
    mine = {r["params"]["request"]: r for r in _rows(results, 1, workload, SHIPPED)}
    speed = {name: ref[name]["ms"] / r["ms"] for name, r in mine.items() if name in ref}
    notes = _notes(results, 1)
    closed = report.closed_requests(results.rows, workload)  # the headline's rule: the rest ran to the cap
    hit = sorted((n for n in mine if n not in closed and n in speed), key=lambda n: -speed[n])
    both = [n for n in hit if ref[n]["tokens"] >= report.MAX_NEW]  # capped in chapter 07's loop as well
    if any(r["tokens"] >= report.MAX_NEW and n not in hit for n, r in ref.items() if n in speed):
        # the page calls the excluded set "the requests capped in either loop": it must hold chapter 07's too
        raise ValueError("a request ran to the cap in chapter 07's loop but not in the shipped step's")
    rest = [n for n in speed if n not in hit]
    largest = sorted(speed, key=lambda n: -speed[n])[:len(both)]
    checks = [c for c in results.data.get("checks", []) if c["name"].startswith("same tokens as chapter 7's step 3")
              and c["params"].get("batch") == 1 and c["params"].get("workload") == workload]

    def ratio(names) -> float:
        return statistics.median(ref[n]["ms"] for n in names) / statistics.median(mine[n]["ms"] for n in names)

    def parted(name: str) -> dict[str, Any]:  # where the shipped step's tokens first left chapter 07's, and which steps cap
        div = [d for c in checks if c["params"]["request"] == name and c["params"]["series"] == SHIPPED
               for d in c.get("divergences", [])]
        steps = [s for s in SERIES if any(r["tokens"] >= report.MAX_NEW for r in _rows(results, 1, workload, s)
                                          if r["params"]["request"] == name)]
        return {"position": div[0]["position"] if div else None, "near_tie": bool(div) and div[0]["inside"],
                "steps": steps, "ch7_tokens": ref[name]["tokens"]}

    return {"cap": report.MAX_NEW, "requests": len(speed),
            "rows": [{"request": n, "speedup": speed[n], "repeats": repeats(notes.get(n, "")),
                      "output": notes.get(n, ""), "in_both": n in both} | ({} if n in both else parted(n))
                     for n in hit],
            "top": sum(n in both for n in largest),
            "median_all": statistics.median(speed.values()), "ratio_all": ratio(list(speed)),
            "median_without": statistics.median(speed[n] for n in rest) if rest else None,
            "ratio_without": ratio(rest) if rest else None,
            "ratio_with_drafting_only": ratio(rest + [n for n in hit if n not in both]) if rest else None}


def slowest(results, batch: int, workload: str, series: str) -> float:
    """The slowest request's speedup over chapter 07's step 3."""
    return min(speedups(results.rows, batch, workload, series))


__all__ = ["LAB_RESULTS", "RUNS_APART", "SPLIT_RUN", "STEP02_CHAIN", "SECOND_RUN", "START_LABEL", "STEP_LABELS", "agreement", "batch_makeup", "copying", "gate_paused", "bound_rows",
           "breakdown_table", "capped", "closed_ratio", "committed", "forecasts", "draft_cost", "drafts_table", "layer_table", "loop_bound", "kernel_count_bound", "losses",
           "low_copy_counts", "markdown_table", "request_words", "median_ms", "prefill_probe", "repeats", "sample_outputs",
           "second_machine", "second_run", "slowest", "steps_table", "tuned_layers", "two_digits", "validity",
           "step02_chain", "step02_chain_rows", "step02_chain_ratio_table", "CHAIN_CASE", "closed_median_ms", "closed_rows", "kept_results", "kept_requests",
           "gate_diff", "walk_code", "walk_diff", "wrapped"]


def _without_checks(text: str) -> str:
    """Python source without its argument checks, which are not the lesson: an ``if`` whose whole body is a
    ``raise`` and a call of a ``check_*`` function, each dropped with its lines, and a trailing comment that speaks
    of the checks (``# ... checked ...``)."""
    import ast

    drop: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        guard = (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1
                 and isinstance(node.body[0], ast.Raise))
        check = (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", "").startswith("check_"))
        if guard or check:
            drop.update(range(node.lineno, node.end_lineno + 1))
    lines = text.splitlines()
    left = "\n".join("" if i in drop else line for i, line in enumerate(lines, 1))
    loaded = {n.id for n in ast.walk(ast.parse(left)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(ast.parse(left)):  # a name only the checks read: its assignment goes too
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id not in loaded):
            drop.update(range(node.lineno, node.end_lineno + 1))
    kept = []
    for i, line in enumerate(lines, 1):
        if i in drop:
            continue
        code, sep, comment = line.partition("  # ")
        kept.append(code.rstrip() if sep and "checked" in comment else line)
    return "\n".join(kept)


def _without_branch(text: str, name: str) -> str:
    """Python source without the branch on ``name`` (``if name is not None:`` and its body) and the assignment of
    ``name``: a function as it runs when that branch is never taken."""
    import ast

    drop: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        assigns = (isinstance(node, ast.Assign) and len(node.targets) == 1
                   and getattr(node.targets[0], "id", None) == name)
        branch = (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                  and getattr(node.test.left, "id", None) == name)
        if assigns or branch:
            drop.update(range(node.lineno, node.end_lineno + 1))
    lines = text.splitlines()
    for i in sorted(drop):  # a comment line just above a dropped line speaks of it
        if i > 1 and lines[i - 2].lstrip().startswith("#"):
            drop.add(i - 1)
    return "\n".join(line for i, line in enumerate(lines, 1) if i not in drop)


def walk_code(extend: bool):
    """Step 2a's walk (``studylog.speculate.walk_draft``) as a ``studylog.source.Code``, its argument checks left
    out: with ``extend`` off (step 2), without the branch that adds forced chains; with it on, the whole walk."""
    from studylog import speculate
    from studylog.source import Code

    text = listing(speculate.walk_draft).text
    return Code(text if extend else _without_branch(text, "jump"), "python", None)


def walk_diff():
    """Step 3's change to the walk: the branch that adds the forced chain of every state the walk reaches, as a
    ``studylog.source.Diff`` from :func:`walk_code` without it to the walk with it."""
    from studylog.source import Diff

    return Diff(walk_code(False).text, walk_code(True).text, "the walk, step 2", "step 3", 1)


def listing(obj, title: str | None = None):
    """A function's or class's source as the page lists it (a ``studylog.source.Code``): without its docstrings,
    which the prose around the listing replaces (and whose cross-reference roles would show raw), without its
    argument checks (:func:`_without_checks`), and with lines past :data:`CODE_WIDTH` cut inside their brackets
    (:func:`book.decode.resolve.wrapped_line`), a long line's comment moved above it, so that none runs off the
    page's column."""
    import inspect
    import textwrap

    from book.common import without_docstrings
    from book.decode.resolve import wrapped_line
    from studylog.source import Code

    def fitted(line: str) -> list[str]:  # a long line's trailing comment goes above it, wrapped
        code, sep, comment = line.partition("  # ")
        if len(line) <= CODE_WIDTH or not sep or '"' in code or "'" in code:
            return wrapped_line(line, CODE_WIDTH)
        indent = " " * (len(code) - len(code.lstrip()))
        return (textwrap.wrap(comment, CODE_WIDTH, initial_indent=indent + "# ", subsequent_indent=indent + "# ")
                + wrapped_line(code.rstrip(), CODE_WIDTH))

    text = _without_checks(without_docstrings(textwrap.dedent(inspect.getsource(obj))))
    return Code("\n".join(piece for line in text.splitlines() for piece in fitted(line)), "python", title)


def token_axis_diff():
    """Step 2b's change to chapter 07's product kernel (``studylog.decode.kernels.gemv_kernel``), read from the
    library: the three lines that give the grid a second axis, one program row per token (``m``), each moving the
    input and output pointers to its token. With one token (``m = 0``) they do nothing, so the kernel without them
    is the one-token launch; a ``studylog.source.Diff`` from that to the library's kernel, docstring left out."""
    import inspect

    from book.common import without_docstrings
    from studylog.decode import kernels
    from studylog.source import Diff

    new = without_docstrings(inspect.getsource(kernels.gemv_kernel.fn)).splitlines()
    axis = [ln for ln in new if "program_id(1)" in ln or ln.strip().startswith(("x_ptr += m", "out_ptr += m"))]
    old = [ln for ln in new if ln not in axis]
    return Diff("\n".join(old), "\n".join(new), "one token a launch", "a token per row of the grid", 1)


#: Step 4's test before each drafting call, as the loop writes it: with the gate None (steps 2 and 3) it always passes.
_GATE_ASKS = " and (gate is None or gate.allows(b, pending[b]))"


def gate_diff():
    """Step 4's whole change, as one ``studylog.source.Diff`` from step 3 with no context lines: the gate
    (``studylog.speculate.DraftGate``, as :func:`listing` lists it) added, and its three uses in the loop
    (``SpeculativeDecoder._run`` as step 4's configuration runs it, :func:`book.decode.resolve.resolved`): built once
    for the batch, asked before each drafting call, told how each verified draft did. Step 3's side is the same loop
    without those uses: there the gate is None, so the test before drafting always passes and the update never runs
    (raises ``ValueError`` where the two configurations' loops differ in more than the gate's line)."""
    from book.decode.resolve import resolved
    from studylog import speculate
    from studylog.source import Diff
    from studylog.speculate.loop import CONFIGS, SpeculativeDecoder

    names = list(CONFIGS)  # the steps' configurations, in order: step 1 first
    step3, step4 = (resolved(SpeculativeDecoder._run, CONFIGS[names[i]], quiet=True) for i in (2, 3))
    built = "gate = DraftGate(B, min_accepted=self.gate_threshold)"
    if step4.count(built) != 1 or step4.replace(built, "gate = None") != step3 or step3.count(_GATE_ASKS) != 1:
        raise ValueError("steps 3 and 4 differ in more than building the gate; the page's diff would hide it")
    old = _without_branch(step3, "gate").replace(_GATE_ASKS, "")
    new = listing(speculate.DraftGate).text + "\n\n" + step4
    return Diff(old, new, "step 3", "step 4: the gate, and the loop's three uses of it", 0)


def step_diff(step: int):
    """What step ``step`` (2, 3 or 4) changes in the loop (``SpeculativeDecoder._run``), as a diff from the step before,
    both configurations' tests resolved (:func:`book.decode.resolve.config_diff`): step 2 asks for drafts, step 3
    lets the walk extend them with forced chains, step 4 builds the gate."""
    from book.decode.resolve import config_diff
    from studylog.speculate.loop import CONFIGS, SpeculativeDecoder

    names = list(CONFIGS)  # the steps' configurations, in order: step 1 first
    if step not in (2, 3, 4):
        raise ValueError(f"steps 2 to 4 change the loop; step {step} is not one of them")
    return config_diff(SpeculativeDecoder._run, CONFIGS[names[step - 2]], CONFIGS[names[step - 1]],
                       (f"step {step - 1}", f"step {step}"), context=1)


def step3_low_copy_spread(batch: int = 1, workload: str = "low_copy") -> dict[str, Any]:
    """How firm step 3's gain over step 2 is on ``workload`` at ``batch``, from the runs the files hold (the
    committed one and :func:`second_run`): each run's ratio of the medians (``runs``, the steps table's statistic),
    each request's own ratio over both runs (``least``, ``most``), how many requests (``requests``), and the largest
    spread of one request's timed repeats within a run, step 2 or step 3 (``repeat_spread``: most less least over the
    median) and the median of those spreads (``repeat_median``)."""
    again = second_run()
    out = {"runs": [], "ratios": [], "spreads": [], "requests": 0}
    for rows in [committed().rows] + ([again] if again is not None else []):
        sel = [r for r in rows if r["params"].get("batch") == batch and r["params"].get("workload") == workload
               and r["series"] in ("step02", "step03")]
        by: dict[str, dict[str, dict]] = {}
        for r in sel:
            by.setdefault(r["params"]["request"], {})[r["series"]] = r
        pairs = [v for v in by.values() if len(v) == 2]
        out["requests"] = len(pairs)
        out["runs"].append(_median(rows, batch, workload, "step02") / _median(rows, batch, workload, "step03"))
        out["ratios"] += [v["step02"]["ms"] / v["step03"]["ms"] for v in pairs]
        out["spreads"] += [(r["spread_ms"][-1] - r["spread_ms"][0]) / r["ms"] for v in pairs for r in v.values()
                           if r.get("spread_ms")]
    return {"runs": out["runs"], "least": min(out["ratios"]), "most": max(out["ratios"]),
            "requests": out["requests"], "repeat_spread": max(out["spreads"]) if out["spreads"] else None,
            "repeat_median": statistics.median(out["spreads"]) if out["spreads"] else None}
