"""The chapter's benchmark and headline, a table of what is measured (:func:`table`) and one loop that measures it
(:func:`sweep`): the ~1B shape, the ~8B cost model (both steered to a valid sample) and SmolLM2-135M-Instruct, batch 1
and 8, every schema of chapter 1's suite in every configuration (:data:`ORDER`); beside them each component alone on
the GPU clock (:func:`component_cases`)."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Sequence

import numpy as np
import torch

from studylog.decode.grammar import Grammar, suite_names, suite_sample
from studylog.decode import agreement, kernels, peers, pieces
from studylog.decode.generation import STEER, Generation
from studylog.decode.loop import Decoder
from studylog.decode import requests as real_requests
from studylog.decode.model import CL100K_SIZE, LlamaModel, dense_logits, describe, load_smollm2, model_config

#: The configurations measured, in the lesson's order: the three steps, then the two comparisons.
ORDER = ("baseline", "jump_forward", "masked_head", "automaton_mask", "char_jump")
STEP_OF = {"baseline": 1, "jump_forward": 2, "masked_head": 3}
PROMPT = "Reply with one JSON value or string that follows the format you are given. Request number {i}."
#: The real model (``studylog.smollm2``), and the cache its requests (instruction + schema) need.
REAL_MODEL = "smollm2"
REAL_MAX_SEQ = 1024
#: Regexes whose alternations list a shorter branch first (as a schema's integer range does): checked every run.
AMBIGUOUS_REGEXES = (r"(-(?:[1-9]|[1-3][0-9]|40)|(?:[0-9]|[1-9][0-9]|1[01][0-9]|12[0-5]))", r"(a|ab|abc)d?",
                     r"([1-9]|1[0-9])( items)?")
#: Allowed counts per sequence at which the masked head is timed alone (a forced token; a key; a number or a string).
HEAD_COUNTS = (1, 48, 6000)
#: The bodies timed alone: series -> ``fused`` and ``gemv`` of :meth:`Decoder.body_call`.
BODIES = {"body": (True, None), "body_cublas": (True, False), "body_unfused": (False, None)}


def series_of(config: str, attr: str = "series") -> str:
    """A configuration's benchmark series (``step01``; ``attr="name"``: ``step01_baseline``), or its own name."""
    from studylog.decode import CHAPTER

    return getattr(CHAPTER.step(STEP_OF[config]), attr) if config in STEP_OF else config


def component_cases(chunk_sizes: Sequence[int], padded: bool) -> list[tuple[str, dict]]:
    """The components timed alone at one (model, batch), in order: (series, the params beside model and batch).
    ``padded``: the head has cl100k's rows padded, so it is timed unpadded too (what the padding buys)."""
    chunks = sorted({1, 8, max(chunk_sizes)} & set(chunk_sizes))
    return [*(("body", {"chunk": T}) for T in chunks), ("body_cublas", {"chunk": 1}), ("body_unfused", {"chunk": 1}),
            ("dense_head", {}), *[("dense_head_unpadded", {"rows": CL100K_SIZE})] * padded,
            *(("masked_logits", {"allowed": n}) for n in HEAD_COUNTS), ("mask_apply", {}), ("sampling", {}),
            *(("sampling_allowed", {"allowed": n}) for n in HEAD_COUNTS)]


def jobs_of(shape: str, batch: int, schemas: Sequence[str], both_whitespaces_at=None) -> list[tuple[str, str]]:
    """The requests of one (model, batch): (schema, whitespace), compact first; the JSON ones in the default
    whitespace too at ``both_whitespaces_at``."""
    wss = ["compact", "default"] if both_whitespaces_at == (shape, batch) else ["compact"]
    return [(n, w) for w in wss for n in schemas if w == wss[0] or n in suite_names("json")]


def table(plans: Sequence[dict], *, chunk_sizes: Sequence[int], cuda: bool = True,
          hf: bool = True) -> list[tuple[str, dict]]:
    """Every row a run of ``plans`` (:func:`plan`) records, in order, as (series, params): on a GPU (``cuda``) the
    components per (model, batch), then each request in every configuration, then at batch 1 on the real model
    Hugging Face's ``generate`` (``hf``: transformers is installed)."""
    out = []
    for kw in plans:
        for shape in kw["shapes"]:
            real = shape == REAL_MODEL
            padded = not real and model_config(shape).vocab_size > CL100K_SIZE
            for batch in kw["batches"]:
                base = {"model": shape, "batch": batch}
                out += [(s, {**base, **p}) for s, p in component_cases(chunk_sizes, padded)] if cuda else []
                for name, ws in jobs_of(shape, batch, kw["schemas"], kw.get("both_whitespaces_at")):
                    case = {**base, "schema": name, "whitespace": ws}
                    out += [(series_of(c), {**case, "config": c}) for c in ORDER]
                    out += [("hf_generate", {**case, "config": "hf_generate"})] if real and hf and batch == 1 else []
    return out


def requests(name: str, batch: int, decoder: Decoder, whitespace: str = "compact") -> tuple[list[list[int]], list[str]]:
    """Prompts and steering targets of a batch: sequence ``i`` writes sample ``i`` of the schema."""
    prompts = [decoder.vocab.encode(PROMPT.format(i=i)) for i in range(batch)]
    return prompts, [suite_sample(name, seed=i, whitespace=whitespace) for i in range(batch)]


def measure(decoder: Decoder, grammar: Grammar, config: str, prompts, targets, *, max_new_tokens: int,
            repeats: int) -> tuple[list[Generation], Generation]:
    """A warm-up run, then with Python's collector paused ``repeats`` timed runs and one instrumented run."""
    from studylog.bench import collector_paused

    def go(instrument: bool) -> Generation:
        return decoder.generate(grammar, prompts, config, max_new_tokens=max_new_tokens, targets=targets,
                                instrument=instrument)

    go(False)
    with collector_paused():
        return [go(False) for _ in range(repeats)], go(True)


def sweep(run, *, device: str | torch.device, shapes: Sequence[str], batches: Sequence[int], schemas: Sequence[str],
          repeats: int = 3, max_new_tokens: int = 160, max_seq: int = 512, dtype: torch.dtype = torch.bfloat16,
          both_whitespaces_at: tuple[str, int] | None = None) -> None:
    """Decode every request of :func:`jobs_of` in every configuration and record it with ``run``, after the
    components on a GPU: the rows of :func:`table`, and the checks of each."""
    from studylog.bench import Timing

    cuda = torch.device(device).type == "cuda"
    for shape in shapes:
        real = shape == REAL_MODEL
        hf = None
        if real:  # the real model answers real requests on its own: no steering
            from studylog import smollm2

            model = load_smollm2(device=device, dtype=dtype)
            vocab, tokenizer = smollm2.vocabulary(), smollm2.tokenizer()
            try:
                hf = peers.hf_model(model)  # the Hugging Face copy hf_peer runs
            except ImportError as exc:  # transformers is in the peers extra
                run.note(f"hf_generate skipped: {exc}")
        else:
            model = LlamaModel(model_config(shape), device=device, dtype=dtype, seed=0)
            vocab, tokenizer = None, None
        run.note(f"model {shape}: {describe(model.config)}")
        for batch in batches:
            decoder = Decoder(model, vocab, batch=batch, max_seq=REAL_MAX_SEQ if real else max_seq)
            decoder.capture()
            if cuda:
                components(run, decoder, shape)
            jobs = jobs_of(shape, batch, schemas, both_whitespaces_at)
            progress = getattr(run, "progress", None)
            for name, ws in progress(jobs, f"{shape} batch {batch}") if progress else jobs:
                grammar = Grammar.from_suite(name, decoder.vocab, whitespace=ws)
                if real:
                    prompts, targets = real_requests.batch_ids(name, tokenizer, batch), None
                else:
                    prompts, targets = requests(name, batch, decoder, ws)
                first, case = None, {"model": shape, "batch": batch, "schema": name, "whitespace": ws}
                for config in ORDER:
                    runs, timed = measure(decoder, grammar, config, prompts, targets,
                                          max_new_tokens=max_new_tokens, repeats=repeats)
                    first = first or timed
                    same = timed.ids == first.ids
                    params = {**case, "config": config}
                    role = "kernel" if config in STEP_OF else "baseline"
                    row = run.record(series_of(config), Timing.of([g.ms_per_token for g in runs], clock="wall"),
                                     params=params, role=role, tokens=timed.tokens, forwards=timed.forwards,
                                     passes=sum(timed.passes), jumped=sum(timed.jumped),
                                     retokenized=sum(timed.retokenized), finished=all(timed.finished),
                                     same_tokens_as_step01=same, chunk_lengths=timed.chunk_lengths,
                                     breakdown_ms_per_token=timed.breakdown_per_token(),
                                     instrumented_ms_per_token=timed.ms_per_token,
                                     compile_seconds=grammar.compile_seconds)
                    if real:
                        summary = real_requests.summarize([name] * batch, timed.text, timed.finished)
                        row.update(finished_share=summary["finished"] / batch, valid=summary["valid"],
                                   invalid=summary["invalid"])
                        run.check("finished outputs valid for their schema", not summary["invalid"],
                                  params=params, **summary)
                    elif config in ("jump_forward", "masked_head", "automaton_mask"):
                        run.check("same tokens as step01_baseline", same, params=params)
                if hf is not None and batch == 1:
                    hf_peer(run, hf, grammar, prompts[0], first, max_new_tokens=max_new_tokens, repeats=repeats,
                            params={**case, "config": "hf_generate"})
                if real or batch == 1:
                    near_ties(run, decoder, grammar, prompts, max_new_tokens=max_new_tokens if real else 48,
                              params=case)
            if batch == 1 and not real:
                for regex in AMBIGUOUS_REGEXES:
                    grammar = Grammar.from_regex(regex, decoder.vocab)
                    near_ties(run, decoder, grammar, requests("us_phone", 1, decoder)[0], max_new_tokens=16,
                              params={"model": shape, "batch": 1, "regex": regex})
            del decoder
        del model, hf
        if cuda:
            torch.cuda.empty_cache()


def hf_peer(run, hf, grammar: Grammar, prompt: list[int], step01: Generation, *, max_new_tokens: int,
            repeats: int, params: dict) -> None:
    """Hugging Face ``generate`` with xgrammar's processor on the same request, and whether it wrote step 1's tokens."""
    from studylog.bench import Timing

    timing = peers.time_hf(hf, grammar, prompt, max_new_tokens=max_new_tokens, repeats=repeats)
    run.record("hf_generate", Timing.of(timing.per_repeat, clock="wall"), params=params, role="peer",
               tokens=len(timing.ids), same_tokens_as_step01=timing.ids == step01.ids[0])


def near_ties(run, decoder: Decoder, grammar: Grammar, prompts, *, max_new_tokens: int, params: dict) -> None:
    """Steps 2 and 3 against step 1, unsteered: the same tokens, or a divergence inside the rounding bound."""
    outs = {c: decoder.generate(grammar, prompts, c, max_new_tokens=max_new_tokens, instrument=False, record=True)
            for c in ("baseline", "jump_forward", "masked_head")}
    for c in ("jump_forward", "masked_head"):
        r = agreement.compare(outs["baseline"], outs[c], decoder.model.lm_head)
        run.check("same tokens as step01_baseline, or a near-tie inside the bound", r["all_inside"],
                  params={**params, "config": c, "steered": False}, identical=r["identical"],
                  sequences=r["sequences"], divergences=r["divergences"])


def count_kernels(fn) -> dict[str, int]:
    """CUDA kernels one call of ``fn`` launches, by name (torch's profiler, after a call that compiles)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    names = [e.name() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]
    return dict(Counter(n for n in names if "memcpy" not in n.lower() and "memset" not in n.lower()))


def body_kernels(run, shapes: Sequence[str], device: str | torch.device = "cuda",
                 dtype: torch.dtype = torch.bfloat16) -> None:
    """The kernels one forward of each body launches (batch 1, one token), added to the body rows at chunk 1. Called
    after every timing: a process that has profiled stays slower (pytorch/pytorch#144455)."""
    for shape in shapes:
        cfg = model_config(shape)
        model = LlamaModel(cfg, device=device, dtype=dtype, seed=0)
        decoder = Decoder(model, batch=1, max_seq=64)
        for series, (fused, gemv) in BODIES.items():
            n = sum(count_kernels(decoder.body_call(1, fused=fused, gemv=gemv)).values())
            for row in run.rows:
                if row["series"] == series and row["params"] == {"model": shape, "batch": 1, "chunk": 1}:
                    row.update(kernels_per_forward=n, kernels_per_layer=n / cfg.layers)
        del decoder, model
        torch.cuda.empty_cache()


def components(run, decoder: Decoder, shape: str) -> None:
    """The rows of :func:`component_cases` on the GPU clock: the bodies (with their floor), both heads (with their
    host time per call), the bitmask's application and both samplings (the masked ones checked)."""
    import xgrammar as xgr

    B, V = decoder.batch, decoder.V
    model, dev = decoder.model, decoder.device
    floor = run.floor_ms(model.config.parameter_counts()["body"] * model.dtype.itemsize)  # the weights read once
    hidden = torch.randn(B, model.config.hidden, device=dev, dtype=model.dtype)
    logits = torch.randn(B, V, device=dev, dtype=torch.float32)
    bits = torch.full((B, (V + 31) // 32), -1, dtype=torch.int32, device=dev)
    tok = torch.empty(B, dtype=torch.int64, device=dev)
    steer = torch.full((B,), -1, dtype=torch.int64, device=dev)
    head = pieces.masked_head_kernel if decoder.head_impl == "kernel" else pieces.masked_head_torch
    rng = np.random.default_rng(0)

    def body(series, params):
        call = decoder.body_call(params["chunk"], *BODIES[series])
        run.measure(series, lambda: [call], params=params, role="baseline", floor_ms=floor, min_calls=10, reps=5)

    def dense_head(series, params):
        rows, out = model.lm_head, logits
        if "rows" in params:  # the same head unpadded (cl100k's 100,277 rows)
            rows, out = rows[:CL100K_SIZE], torch.empty(B, CL100K_SIZE, device=dev, dtype=torch.float32)
        dense = lambda: dense_logits(hidden, rows, out=out)  # noqa: E731
        run.measure(series, lambda: [dense], params=params, role="baseline", host=dense, host_calls=100)

    def masked_logits(series, params):
        n = params["allowed"]
        allowed = pieces.AllowedTokens.from_ids([np.sort(rng.choice(V, n, replace=False)) for _ in range(B)], V,
                                                device=dev)
        masked = lambda: head(hidden, model.lm_head, allowed, logits)  # noqa: E731
        run.measure(series, lambda: [masked], params=params, role="baseline", host=masked, host_calls=100,
                    union=allowed.union_count)
        ref = dense_logits(hidden, model.lm_head).masked_fill_(~allowed.mask, float("-inf"))
        masked()
        run.check("masked head = dense head on the allowed ids", bool(torch.allclose(logits, ref, rtol=1e-3,
                  atol=1e-3, equal_nan=False) and torch.equal(torch.isinf(logits), torch.isinf(ref))), params=params)

    def sampling_allowed(series, params):  # the greedy token among the masked head's ids only (step 3's sampling)
        n = params["allowed"]
        ids = torch.from_numpy(np.sort(rng.choice(V, n, replace=False)).astype(np.int32)).to(dev)
        few = torch.full_like(logits, float("-inf"))  # the masked head's output: finite at the allowed ids only
        few[:, ids.long()] = torch.randn(B, n, device=dev)
        pick = lambda: kernels.allowed_argmax(few, ids, n, steer, STEER, out=tok)  # noqa: E731
        run.measure(series, lambda: [pick], params=params, role="baseline")
        pick()
        run.check("allowed_argmax = argmax over the vocabulary", bool(torch.equal(tok, few.argmax(dim=1))),
                  params=params)

    calls = {"mask_apply": lambda: xgr.apply_token_bitmask_inplace(logits, bits, vocab_size=V),
             "sampling": lambda: torch.argmax(logits, dim=1, out=tok)}
    how = {**dict.fromkeys(BODIES, body), "dense_head": dense_head, "dense_head_unpadded": dense_head,
           "masked_logits": masked_logits, "sampling_allowed": sampling_allowed}
    padded = decoder.vocab.name.startswith("cl100k_base") and V > CL100K_SIZE
    for series, extra in component_cases(decoder.chunk_sizes, padded):
        params = {"model": shape, "batch": B, **extra}
        if series in calls:
            run.measure(series, lambda call=calls[series]: [call], params=params, role="baseline")
        else:
            how[series](series, params)


def plan(quick: bool) -> list[dict[str, Any]]:
    """The sweeps (keyword arguments of :func:`sweep`); five repetitions at the headline's shape, where one slow run
    would move a median (the loop waits on the host every step)."""
    schemas = suite_names()[:4] if quick else suite_names()
    return [dict(shapes=("1b",), batches=(1, 8), schemas=schemas, repeats=2 if quick else 5,
                 both_whitespaces_at=("1b", 1)),
            dict(shapes=("8b",), batches=(1, 8), schemas=schemas, repeats=2),
            dict(shapes=(REAL_MODEL,), batches=(1, 8), schemas=schemas, repeats=2 if quick else 3)]


def bench(run) -> None:  # run: studylog.bench.BenchRun
    quick = getattr(run, "quick", False)
    run.note("Every request is steered to a valid sample of its schema (a bias of 1e4 on the tokenizer's next "
             "token of the sample): random weights would write gibberish, and gibberish inside a JSON string "
             "never ends. Every logit is still computed as the model computes it.")
    run.note("The 8b shape is a cost model: 32 layers share one layer's weights (each reads them from DRAM, "
             "a layer being far larger than L2), with an untied head of the cl100k vocabulary.")
    run.note("The body runs the fused path (studylog.decode.kernels: six launches per layer for a step of one "
             "token, nine with cuBLAS's products for more), captured in a CUDA graph per chunk length, "
             "in every configuration; body_cublas is the nine-launch layer at one token and body_unfused torch's "
             "eager composition of the same math, both timed alone. The masked head runs "
             "eagerly (its launch depends on the allowed set); its host time per call is in masked_logits' host_ms "
             "and, per step, in the breakdown's head_host.")
    for kwargs in plan(quick):
        sweep(run, device="cuda", **kwargs)
    body_kernels(run, [shape for kwargs in plan(quick) for shape in kwargs["shapes"] if shape != REAL_MODEL])


def rows_of(results_rows: Sequence[dict], *, series: str | None = None, **params: Any) -> list[dict]:
    """The rows whose params hold ``params`` (of one ``series``, or of all)."""
    return [r for r in results_rows if (series is None or r["series"] == series)
            and all(r["params"].get(k) == v for k, v in params.items())]


def headline(results) -> list[dict]:
    """Step 3 (and step 2) over step 1 per output token: the ratio of the medians over the JSON schemas (cost models)
    or the requests (the real model)."""
    import ast

    json_names = set(suite_names("json"))
    compact = rows_of(results.rows, whitespace="compact")
    # (model, batch, schema) -> the first baseline row; model -> its head's rows, from the run's note on it
    baselines = {(p["model"], p["batch"], p["schema"]): r for r in reversed(compact)
                 if (p := r["params"]).get("config") == "baseline"}
    head_rows = {n[6:].split(": ", 1)[0]: ast.literal_eval(n.split(": ", 1)[1]).get("vocab_size")
                 for n in results.data.get("notes", []) if n.startswith("model ")}
    out = []
    for model, batch in (("1b", 1), ("1b", 8), ("8b", 1), ("8b", 8), ("smollm2", 1), ("smollm2", 8)):
        real = model == "smollm2"
        # on the real model also 3a (step 2 with the automaton's allowed sets, cached: host work, a dense head)
        for config in ("masked_head", "automaton_mask", "jump_forward") if real else ("masked_head", "jump_forward"):
            mine, theirs, host = [], [], []
            for r in rows_of(compact, model=model, batch=batch, config=config):
                base = baselines.get((model, batch, r["params"]["schema"]))
                if base and (real or r["params"]["schema"] in json_names):
                    mine.append(r["ms"])
                    theirs.append(base["ms"])
                    parts = r.get("breakdown_ms_per_token") or {}
                    if "host" in parts:  # the step's time outside every timed part: host overhead, per token
                        host.append(parts["host"])
            if mine:
                rows = head_rows.get(model)
                who = "SmolLM2-135M-Instruct, real requests" if real else \
                    f"{model.upper()} cost model" + (f" (head of {rows:,} rows)" if rows else "")
                what = (f"{who}, batch {batch}, end to end per output token, median of {len(mine)} "
                        + ("requests" if real else "JSON schemas (compact whitespace)"))
                k, b = statistics.median(mine), statistics.median(theirs)
                out.append({"kernel": series_of(config, "name"), "baseline": series_of("baseline", "name"),
                            "clock": "wall", "case": what, "speedup": b / k, "kernel_ms": k, "baseline_ms": b,
                            **({"host_ms": statistics.median(host)} if host else {})})
    return out

