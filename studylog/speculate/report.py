"""The chapter's benchmark and headline: SmolLM2-135M-Instruct (bf16), batch 1 and 8, every request of
:data:`WORKLOADS` in every step and in chapter 7's steps 3 and 1 on its own decoder; beside them, on the GPU clock, the
body at every chunk length (``verify``) and one drafting call (``draft_call``)."""

from __future__ import annotations

import itertools
import statistics
from typing import Any, Collection, Sequence

import torch

from studylog.checks import check_choice
from studylog.decode import requests as decode_requests
from studylog.decode.grammar import Grammar
from studylog.decode.loop import Decoder
from studylog.decode.report import measure, rows_of
from studylog.speculate import requests
from studylog.decode.model import GEMV_MAX_TOKENS
from studylog.speculate.loop import SpecGeneration, SpeculativeDecoder

#: Series of the configurations: the steps, then chapter 7's two on its own decoder.
SERIES = {"masked_head": "step01", "ngram_draft": "step02", "forced_draft": "step03", "gated_draft": "step04"}
CH7 = {"masked_head": "ch7_step03", "baseline": "ch7_step01"}
#: The chapter's final loop: step 3 (step 4's gate is switched on where drafts fail; where they pay it only costs).
SHIPPED = "step03"
WORKLOADS = ("extraction", "low_copy")
MAX_NEW = 160
MAX_SEQ = 1024
#: What the drafts did, summed over a request's sequences (:class:`SpecGeneration`'s lists).
DRAFT_COUNTS = ("proposed", "cut", "forced_drafted", "verified", "accepted", "drafts")


def groups_of(workload: str, batch: int) -> list[list[str]]:
    """The requests of ``workload`` as batches of one grammar each, by name (extraction: each document alone at
    batch 1, else one batch of each kind's documents in turn; low-copy: each request repeated)."""
    check_choice("workload", workload, WORKLOADS)
    if workload == "low_copy":
        return [[name] * batch for name in requests.LOW_COPY]
    out = []
    for kind in sorted({requests.document(n)["kind"] for n in requests.document_names()}):
        names = requests.document_names(kind)
        out += [[n] for n in names] if batch == 1 else [(names * batch)[:batch]]
    return out


def batches_of(workload: str, batch: int, tokenizer) -> list[tuple[list[str], list[list[int]]]]:
    """:func:`groups_of` with each batch's prompts: (names, prompts)."""
    if workload == "low_copy":
        return [(g, decode_requests.batch_ids(g[0], tokenizer, batch)) for g in groups_of(workload, batch)]
    return [(g, [requests.chat_ids(n, tokenizer) for n in g]) for g in groups_of(workload, batch)]


def verify_cases(chunk_sizes: Sequence[int], gemv_chunks: Collection[int], batch: int) -> list[tuple[int, bool]]:
    """The verifying forwards timed alone, as (chunk, gemv): the layer the loop runs at each chunk length, and the
    other where it has one (the six-launch layer runs at most ``GEMV_MAX_TOKENS`` tokens)."""
    return [(T, gemv) for T in chunk_sizes
            for gemv in sorted({T in gemv_chunks, False} if batch * T <= GEMV_MAX_TOKENS else {False})]


def table(batches: Sequence[int], workloads: Sequence[str], *, chunk_sizes: Sequence[int],
          gemv_chunks: dict[int, Collection[int]], limit: int | None = None,
          cuda: bool = True) -> list[tuple[str, dict]]:
    """Every row a run records, in order, as (series, params): on a GPU (``cuda``) per batch the verifying forwards
    (``gemv_chunks[batch]``: the chunk lengths :meth:`SpeculativeDecoder.tune` gives the six-launch layer) and one
    drafting call, then each request of :func:`groups_of` (the first ``limit``) in chapter 7's and every step."""
    out = []
    for batch in batches:
        base = {"model": "smollm2", "batch": batch}
        if cuda:
            out += [("verify", {**base, "chunk": T, "layer": "gemv" if gemv else "cublas"})
                    for T, gemv in verify_cases(chunk_sizes, gemv_chunks[batch], batch)] + [("draft_call", base)]
        for workload in workloads:
            for names in groups_of(workload, batch)[:limit]:
                params = {**base, "workload": workload, "request": names[0]}
                out += [(series, {**params, "config": c}) for c, series in (*CH7.items(), *SERIES.items())]
    return out


def grammar_for(workload: str, name: str, vocab, cache: dict) -> Grammar:
    key = (workload, requests.document(name)["kind"] if workload == "extraction" else name)
    if key not in cache:
        cache[key] = (Grammar.from_schema(requests.schema(name), vocab, name=key[1], whitespace="compact")
                      if workload == "extraction" else Grammar.from_suite(name, vocab, whitespace="compact"))
    return cache[key]


def sweep(run, *, device, batches: Sequence[int] = (1, 8), workloads: Sequence[str] = WORKLOADS, repeats: int = 3,
          model=None, vocab=None, tokenizer=None, limit: int | None = None, max_new: int = MAX_NEW) -> None:
    """Run every request of ``workloads`` (the first ``limit``) in every configuration and batch; record to ``run``."""
    from studylog.bench import Timing

    if model is None:
        from studylog import smollm2
        from studylog.decode.model import load_smollm2

        model, vocab, tokenizer = load_smollm2(device=device, dtype=torch.bfloat16), smollm2.vocabulary(), \
            smollm2.tokenizer()
    cache: dict = {}
    for batch in batches:
        spec = SpeculativeDecoder(model, vocab, batch=batch, max_seq=MAX_SEQ)
        ch7 = Decoder(model, vocab, batch=batch, max_seq=MAX_SEQ, chunk_sizes=spec.chunk_sizes)
        tuned = spec.tune()
        if tuned:
            run.note(f"batch {batch}: the verifying forward runs the six-launch layer at chunk lengths "
                     f"{sorted(spec.gemv_chunks)} (measured, graph replay, ms: {tuned}); the gate's threshold is "
                     f"{spec.gate_threshold:.3f} accepted tokens per draft")
        spec.capture()
        ch7.capture()
        if torch.device(device).type == "cuda":
            costs(run, spec, batch)
        for workload in workloads:
            jobs = batches_of(workload, batch, tokenizer)[:limit]
            progress = getattr(run, "progress", None)
            for names, prompts in progress(jobs, f"{workload} batch {batch}") if progress else jobs:
                grammar = grammar_for(workload, names[0], vocab, cache)
                params = {"model": "smollm2", "batch": batch, "workload": workload, "request": names[0]}
                outs = {}
                for decoder, configs in ((ch7, CH7), (spec, SERIES)):
                    for config, series in configs.items():
                        runs, timed = measure(decoder, grammar, config, prompts, None,
                                              max_new_tokens=max_new, repeats=repeats)
                        outs[series] = timed
                        extra = {**{k: sum(getattr(timed, k)) for k in DRAFT_COUNTS}, "draft_calls": timed.draft_calls,
                                 "mean_accepted": timed.mean_accepted} if isinstance(timed, SpecGeneration) else {}
                        run.record(series, Timing.of([g.ms_per_token for g in runs], clock="wall"),
                                   params={**params, "config": config}, role="kernel" if series in
                                   SERIES.values() else "baseline", tokens=timed.tokens, forwards=timed.forwards,
                                   jumped=sum(timed.jumped), finished=all(timed.finished),
                                   chunk_lengths=timed.chunk_lengths, first_step_ms=timed.first_step_ms,
                                   breakdown_ms_per_token=timed.breakdown_per_token(), **extra)
                ref3 = outs["ch7_step03"]
                for series in SERIES.values():
                    agreement(run, "chapter 7's step 3", ch7, spec, grammar, prompts, "masked_head", series, outs,
                              {**params, "series": series}, max_new)
                agreement(run, "chapter 7's step 1", ch7, spec, grammar, prompts, "baseline", SHIPPED, outs,
                          {**params, "series": SHIPPED}, max_new)
                ended = [f and len(i) < max_new for f, i in zip(ref3.finished, ref3.ids)]
                valid = requests.valid if workload == "extraction" else decode_requests.valid
                checks = [(n, *valid(n, t)) for n, t, e in zip(names, ref3.text, ended) if e]
                run.check("outputs that ended valid for their schema", all(ok for _, ok, _ in checks), params=params,
                          ended=sum(ended), valid=sum(ok for _, ok, _ in checks),
                          invalid=[(n, why) for n, ok, why in checks if not ok])
                if workload == "extraction":
                    run.note(f"{names[0]} (batch {batch}): " + ref3.text[0].decode("utf-8", "replace")[:300])
        del spec, ch7
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def agreement(run, name: str, ch7: Decoder, spec: SpeculativeDecoder, grammar, prompts, ref_config: str,
              series: str, outs: dict, params: dict, max_new: int = MAX_NEW) -> None:
    """Check that ``series`` wrote chapter 7's ``ref_config``'s tokens or diverged at a near tie."""
    from studylog.decode.agreement import compare

    ref = outs[CH7[ref_config]]
    same = outs[series].ids == ref.ids
    detail: dict[str, Any] = {"identical": sum(a == b for a, b in zip(outs[series].ids, ref.ids)),
                              "sequences": len(ref.ids)}
    if not same:
        config = next(c for c, s in SERIES.items() if s == series)
        a = ch7.generate(grammar, prompts, ref_config, max_new_tokens=max_new, instrument=False, record=True)
        b = spec.generate(grammar, prompts, config, max_new_tokens=max_new, instrument=False, record=True)
        found = compare(a, b, spec.model.lm_head)
        detail.update(divergences=found["divergences"], all_inside=found["all_inside"])
    run.check(f"same tokens as {name} wherever the rounding bound allows", same or detail["all_inside"],
              params=params, **detail)


def costs(run, decoder: SpeculativeDecoder, batch: int) -> None:
    """On the GPU clock: the body at every chunk length, and one drafting call (with its host time: the loop waits)."""
    base = {"model": "smollm2", "batch": batch}
    for T, gemv in verify_cases(decoder.chunk_sizes, decoder.gemv_chunks, batch):
        call = decoder.verify_call(T, gemv)
        run.measure("verify", lambda call=call: [call], params={**base, "chunk": T, "layer": "gemv" if gemv
                    else "cublas"}, role="baseline", min_calls=10, reps=5, used=gemv == (T in decoder.gemv_chunks))
    d = decoder.ngram
    prompt = list(range(11, 611))
    d.admit([prompt] * batch)
    outputs = [prompt[100:140]] * batch
    room = [decoder.draft_len] * batch
    drafts = d.propose(outputs, room)
    run.check("the drafting call proposes what follows the n-gram", all(x == prompt[140:140 + len(x)] and x
              for x in drafts), params=base)
    run.measure("draft_call", lambda: [lambda: d.matcher()], params=base, role="baseline",
                host=lambda: d.propose(outputs, room), host_calls=200)


def plan(quick: bool) -> dict[str, Any]:
    return dict(batches=(1, 8), repeats=2 if quick else 3, limit=2 if quick else None)


def bench(run) -> None:  # run: studylog.bench.BenchRun
    run.note("SmolLM2-135M-Instruct (bf16) answers each request on its own (no steering); every configuration "
             "is checked against chapter 7's step 3, and the shipped step (step03) against its step 1 too: a "
             "sequence passes with the same tokens, or where its first differing token is a near tie inside the "
             "rounding bound (the checks count the identical sequences). step01 is chapter 7's step 3 run by this "
             "chapter's loop; ch7_step03 and ch7_step01 are chapter 7's decoder on the same requests.")
    sweep(run, device="cuda", **plan(getattr(run, "quick", False)))


def closed_requests(rows: Sequence[dict], workload: str, series: str = SHIPPED) -> set[str]:
    """The batch-1 requests whose ``series`` output closed before the :data:`MAX_NEW`-token cap: one that runs to the
    cap has looped, and drafts that copy a loop say little of speculation."""
    return {r["params"]["request"] for r in rows_of(rows, series=series, batch=1, workload=workload)
            if r["tokens"] < MAX_NEW}


def headline(results) -> list[dict]:
    """Step 3 against chapter 7's step 3 on each workload at batch 1 and 8 (extraction first): the ratio of the
    medians over requests of the time per output token, at batch 1 over the :func:`closed_requests` only (a batch of
    8 is timed whole)."""
    rows = results.rows
    out = []
    for workload, batch in itertools.product(("extraction", "low_copy"), (1, 8)):
        kept = closed_requests(rows, workload) if batch == 1 else None
        ms = {series: [r["ms"] for r in rows_of(rows, series=series, batch=batch, workload=workload)
                       if kept is None or r["params"]["request"] in kept] for series in (SHIPPED, "ch7_step03")}
        if not all(ms.values()):
            continue
        ms = {series: statistics.median(v) for series, v in ms.items()}
        which = (f"median of the {len(kept)} requests that close their JSON" if kept is not None
                 else f"median over its batches of {batch} requests, each timed whole")
        out.append({"kernel": "step03_forced_draft", "baseline": "chapter 7's step 3 (ch7_step03)",
                    "case": f"SmolLM2-135M, {workload.replace('_', '-')}, batch {batch}, per output token, {which}",
                    "speedup": ms["ch7_step03"] / ms[SHIPPED], "clock": "wall", "kernel_ms": ms[SHIPPED],
                    "baseline_ms": ms["ch7_step03"]})
    return out


__all__ = ["CH7", "MAX_NEW", "SERIES", "SHIPPED", "WORKLOADS", "agreement", "batches_of", "bench", "closed_requests",
           "costs", "groups_of", "headline", "plan", "rows_of", "sweep", "table", "verify_cases"]
