"""The chapter's benchmark and headline (the figures are the book's: ``book.decode.figures``).

``bench(run)`` (GPU): for the ~1B shape and the ~8B shape's cost model, at batch 1 and 8, every schema of
chapter 1's suite is decoded in every configuration; each request is steered to a valid sample of the schema
(:class:`~studylog.decode.grammar.Writer`), so the outputs, and the forced tokens in them, are realistic.
Recorded per (shape, batch, schema, configuration): the end-to-end time per output token (wall clock of
the whole request, prefill included, repeated), the time per component of an instrumented run, the forward
passes and whether the tokens equal step 1's. Beside them, each component alone on the GPU clock
(:func:`components`: the body on its fused path and on torch's operations with its floor, both heads with their
host time per call, the mask's application, the sampling); the book reads the Amdahl bound of each chapter from
them (``book.decode.results``). The same sweep runs on a CPU at the tiny
shape (:func:`sweep` with any object that records like ``BenchRun``), which is what the tests and the
notebook do.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from studylog.decode.grammar import Grammar, suite_names, suite_sample
from studylog.decode import kernels
from studylog.decode.generation import STEER, Generation
from studylog.decode.loop import COMPONENTS, Decoder
from studylog.decode import requests as real_requests
from studylog.decode.model import CL100K_SIZE, LlamaModel, dense_logits, describe, model_config

#: The configurations measured, in the lesson's order: the three steps, then the two comparisons.
ORDER = ("baseline", "jump_forward", "masked_head", "automaton_mask", "char_jump")
STEP_OF = {"baseline": 1, "jump_forward": 2, "masked_head": 3}
PROMPT = "Reply with one JSON value or string that follows the format you are given. Request number {i}."


def series_of(config: str) -> str:
    """The benchmark series of a configuration: a step's series (``step01``) or the configuration's name."""
    from studylog.decode import CHAPTER

    return CHAPTER.step(STEP_OF[config]).series if config in STEP_OF else config


def wall_clock() -> str:
    """The clock of an end-to-end row: ``"wall"`` where the harness knows it, else ``"host"`` (the host's
    time per call; in a loop that waits for the device once per step it is the wall time)."""
    from studylog.bench import CLOCKS

    return "wall" if "wall" in CLOCKS else "host"


def requests(name: str, batch: int, decoder: Decoder, whitespace: str = "compact") -> tuple[list[list[int]], list[str]]:
    """Prompts and steering targets of a batch: sequence ``i`` writes sample ``i`` of the schema."""
    prompts = [decoder.vocab.encode(PROMPT.format(i=i)) for i in range(batch)]
    return prompts, [suite_sample(name, seed=i, whitespace=whitespace) for i in range(batch)]


def measure(decoder: Decoder, grammar: Grammar, config: str, prompts, targets, *, max_new_tokens: int,
            repeats: int) -> tuple[list[Generation], Generation]:
    """``repeats`` uninstrumented runs of a request (their wall times) and one instrumented (its components),
    after one warm-up run (graph captures, the automaton's per-state sets). The timed runs run with Python's
    garbage collector paused (``bench.collector_paused``): a full collection walks the grammars' tables, tens
    of milliseconds that would land in one repetition of one configuration and not in another."""
    from studylog.bench import collector_paused

    decoder.generate(grammar, prompts, config, max_new_tokens=max_new_tokens, targets=targets, instrument=False)
    with collector_paused():
        runs = [decoder.generate(grammar, prompts, config, max_new_tokens=max_new_tokens, targets=targets,
                                 instrument=False) for _ in range(repeats)]
        timed = decoder.generate(grammar, prompts, config, max_new_tokens=max_new_tokens, targets=targets,
                                 instrument=True)
    return runs, timed


def sweep(run, *, device: str | torch.device, shapes: Sequence[str], batches: Sequence[int],
          schemas: Sequence[str], configs: Sequence[str] = ORDER, repeats: int = 3, max_new_tokens: int = 160,
          max_seq: int = 512, dtype: torch.dtype = torch.bfloat16, head_impl: str | None = None,
          whitespaces: Sequence[str] = ("compact",), both_whitespaces_at: tuple[str, int] | None = None) -> None:
    """Decode every schema in every configuration and record it with ``run`` (a ``BenchRun``, or any object
    with its ``record``, ``check`` and ``note``). JSON schemas are compiled with each of ``whitespaces``
    (chapter 1's ``"compact"``: no space between JSON tokens; ``"default"``: an optional one, which leaves
    fewer tokens forced); ``both_whitespaces_at`` = ``(shape, batch)`` adds the other one at that case."""
    from studylog.bench import Timing

    clock = wall_clock()
    for shape in shapes:
        real = shape == REAL_MODEL
        if real:  # the real model answers real requests on its own: no steering
            from studylog import smollm2
            from studylog.decode.model import load_smollm2

            model, vocab, tokenizer = load_smollm2(device=device, dtype=dtype), smollm2.vocabulary(), smollm2.tokenizer()
            cfg = model.config
            hf = hf_twin(run, model)
        else:
            cfg = model_config(shape)
            model, vocab, tokenizer = LlamaModel(cfg, device=device, dtype=dtype, seed=0), None, None
            hf = None
        run.note(f"model {shape}: {describe(cfg)}")
        for batch in batches:
            decoder = Decoder(model, vocab, batch=batch, max_seq=REAL_MAX_SEQ if real else max_seq,
                              head_impl=head_impl)
            decoder.capture()
            if torch.device(device).type == "cuda":
                components(run, decoder, shape)
            wss = list(whitespaces)
            if both_whitespaces_at == (shape, batch):
                wss += [w for w in ("compact", "default") if w not in wss]
            jobs = [(n, w) for w in wss for n in schemas if w == wss[0] or n in suite_names("json")]
            progress = getattr(run, "progress", None)
            for name, ws in progress(jobs, f"{shape} batch {batch}") if progress else jobs:
                grammar = Grammar.from_suite(name, decoder.vocab, whitespace=ws)
                if real:
                    prompts, targets = real_requests.batch_ids(name, tokenizer, batch), None
                else:
                    prompts, targets = requests(name, batch, decoder, ws)
                first = None
                for config in configs:
                    runs, timed = measure(decoder, grammar, config, prompts, targets,
                                          max_new_tokens=max_new_tokens, repeats=repeats)
                    first = first or timed
                    same = timed.ids == first.ids
                    params = {"model": shape, "batch": batch, "schema": name, "whitespace": ws, "config": config}
                    role = "kernel" if config in STEP_OF else "baseline"
                    run.record(series_of(config), Timing.of([g.ms_per_token for g in runs], clock=clock),
                               params=params, role=role, tokens=timed.tokens, forwards=timed.forwards,
                               passes=sum(timed.passes), jumped=sum(timed.jumped),
                               retokenized=sum(timed.retokenized), finished=all(timed.finished),
                               same_tokens_as_step01=same, chunk_lengths=timed.chunk_lengths,
                               breakdown_ms_per_token=timed.breakdown_per_token(),
                               instrumented_ms_per_token=timed.ms_per_token,
                               compile_seconds=grammar.compile_seconds)
                    if real:
                        row = run.rows[-1] if hasattr(run, "rows") else None
                        summary = real_requests.summarize([name] * batch, timed.text, timed.finished)
                        if row is not None:
                            row.update(finished_share=summary["finished"] / batch, valid=summary["valid"],
                                       invalid=summary["invalid"])
                        run.check("finished outputs valid for their schema", not summary["invalid"],
                                  params=params, **summary)
                    elif config in ("jump_forward", "masked_head", "automaton_mask"):
                        run.check("same tokens as step01_baseline", same, params=params)
                if hf is not None and batch == 1:
                    hf_peer(run, hf, grammar, prompts[0], first, max_new_tokens=max_new_tokens, repeats=repeats,
                            params={"model": shape, "batch": 1, "schema": name, "whitespace": ws,
                                    "config": "hf_generate"})
                if real or batch == 1:
                    near_ties(run, decoder, grammar, prompts, max_new_tokens=max_new_tokens if real else 48,
                              params={"model": shape, "batch": batch, "schema": name, "whitespace": ws})
            if batch == 1 and not real:
                for regex in AMBIGUOUS_REGEXES:
                    grammar = Grammar.from_regex(regex, decoder.vocab)
                    near_ties(run, decoder, grammar, requests("us_phone", 1, decoder)[0], max_new_tokens=16,
                              params={"model": shape, "batch": 1, "regex": regex})
            del decoder
        del model, hf
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


#: The real model of the benchmark (``studylog.smollm2``), and the cache its requests (instruction + schema) need.
REAL_MODEL = "smollm2"
REAL_MAX_SEQ = 1024
#: Regexes whose alternations list a shorter branch first (an integer range as a schema writes one, among them):
#: the automaton lost their longer branches once, so the benchmark checks the steps on them every run.
AMBIGUOUS_REGEXES = (r"(-(?:[1-9]|[1-3][0-9]|40)|(?:[0-9]|[1-9][0-9]|1[01][0-9]|12[0-5]))", r"(a|ab|abc)d?",
                     r"([1-9]|1[0-9])( items)?")


def hf_twin(run, model: LlamaModel):
    """The Hugging Face copy of ``model`` that :func:`hf_peer` runs, or None (with a note) without transformers."""
    from studylog.decode import peers

    try:
        return peers.hf_model(model)
    except ImportError as exc:  # transformers is in the peers extra
        run.note(f"hf_generate skipped: {exc}")
        return None


def hf_peer(run, hf, grammar: Grammar, prompt: list[int], step01: Generation, *, max_new_tokens: int,
            repeats: int, params: dict) -> None:
    """What practitioners would run instead, on the same model (``hf``: :func:`hf_twin`) and request: Hugging
    Face ``generate`` with xgrammar's logits processor (:mod:`~studylog.decode.peers`), its time per output token
    on the same clock as the loop's rows, and whether it wrote step 1's tokens (its logits are rounded to the
    model's dtype before the mask, so a near-tie may go the other way)."""
    from studylog.bench import Timing
    from studylog.decode import peers

    timing = peers.time_hf(hf, grammar, prompt, max_new_tokens=max_new_tokens, repeats=repeats)
    run.record("hf_generate", Timing.of(timing.per_repeat, clock=wall_clock()), params=params, role="peer",
               tokens=len(timing.ids), same_tokens_as_step01=timing.ids == step01.ids[0])


def near_ties(run, decoder: Decoder, grammar: Grammar, prompts, *, max_new_tokens: int, params: dict) -> dict:
    """Steps 2 and 3 against step 1 on the model's own choices (no steering), greedy, with the hidden states kept:
    the same tokens, or a divergence at a gap inside the bound of :mod:`~studylog.decode.agreement`. A check
    per comparison, with the divergences found (untimed runs)."""
    from studylog.decode import agreement

    outs = {c: decoder.generate(grammar, prompts, c, max_new_tokens=max_new_tokens, instrument=False, record=True)
            for c in ("baseline", "jump_forward", "masked_head")}
    report = {}
    for c in ("jump_forward", "masked_head"):
        report[c] = agreement.compare(outs["baseline"], outs[c], decoder.model.lm_head)
        run.check("same tokens as step01_baseline, or a near-tie inside the bound", report[c]["all_inside"],
                  params={**params, "config": c, "steered": False}, identical=report[c]["identical"],
                  sequences=report[c]["sequences"], divergences=report[c]["divergences"])
    return report


#: Allowed counts per sequence at which the masked head is timed alone (one id: a forced token; a few dozen:
#: a key or an enum; thousands: a number or the start of a string; inside a string most of the vocabulary).
HEAD_COUNTS = (1, 48, 6000)


def body_floor_ms(run, cfg, dtype: torch.dtype = torch.bfloat16) -> float:
    """The least time a forward of the body can take: its weights read once from DRAM at the run's copy
    bandwidth (the ``8b`` cost model reads its shared layer once per layer, as the full model would)."""
    return run.floor_ms(cfg.parameter_counts()["body"] * torch.finfo(dtype).bits // 8)


def count_kernels(fn) -> dict[str, int]:
    """CUDA kernels one call of ``fn`` launches, by name (torch's profiler, after a call that compiles)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    counts: dict[str, int] = {}
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name().lower() \
                and "memset" not in e.name().lower():
            counts[e.name()] = counts.get(e.name(), 0) + 1
    return counts


def body_kernels(run, shapes: Sequence[str], device: str | torch.device = "cuda",
                 dtype: torch.dtype = torch.bfloat16) -> None:
    """The kernels one forward of each body launches (fused, fused with cuBLAS's products, and torch's; batch 1,
    one token), added to the ``body``, ``body_cublas`` and ``body_unfused`` rows of ``run`` at batch 1, chunk 1.
    Counted by torch's profiler, so called after every timing of the process: once it has profiled, a process keeps NVIDIA's profiling interface
    attached (PyTorch does not tear it down, pytorch/pytorch#144455), and every kernel it launches afterwards
    is slower, enough to add a tenth of a millisecond to a decode step of the ~1B shape
    (``lab/decode/profiler_residue.py``)."""
    for shape in shapes:
        cfg = model_config(shape)
        model = LlamaModel(cfg, device=device, dtype=dtype, seed=0)
        decoder = Decoder(model, batch=1, max_seq=64)
        for series, fused, gemv in (("body", True, None), ("body_cublas", True, False), ("body_unfused", False, None)):
            n = sum(count_kernels(decoder.body_call(1, fused=fused, gemv=gemv)).values())
            for row in run.rows:
                if row["series"] == series and row["params"] == {"model": shape, "batch": 1, "chunk": 1}:
                    row.update(kernels_per_forward=n, kernels_per_layer=n / cfg.layers)
        del decoder, model
        torch.cuda.empty_cache()


def components(run, decoder: Decoder, shape: str, *, chunks: Sequence[int] | None = None) -> None:
    """Each component alone, replayed in a CUDA graph (the harness's GPU clock): the body at chunk lengths 1, 8
    and the largest (its floor beside it; its kernels per forward at batch 1: :func:`body_kernels`, after every
    timing), at chunk length 1 the fused body's nine-launch layer (``body_cublas``) and torch's unfused body, the
    dense head, chapter 2's masked head at :data:`HEAD_COUNTS` allowed ids per sequence (both heads with their
    host time per call: the masked head runs eagerly in the loop), the bitmask's application, the sampling
    (argmax over the vocabulary) and step 3's sampling over the allowed ids at the same counts, checked against
    the argmax. ``run`` is a ``BenchRun`` (or an object with its ``gpu_time``, ``measure``, ``record``, ``check``
    and ``floor_ms``)."""
    import numpy as np
    import xgrammar as xgr

    from studylog.decode import pieces

    B, V = decoder.batch, decoder.V
    model = decoder.model
    base = {"model": shape, "batch": B}
    floor = body_floor_ms(run, model.config, model.dtype)
    hidden = torch.randn(B, model.config.hidden, device=decoder.device, dtype=model.dtype)
    logits = torch.randn(B, V, device=decoder.device, dtype=torch.float32)
    bits = torch.full((B, (V + 31) // 32), -1, dtype=torch.int32, device=decoder.device)
    chunks = sorted(set(chunks or (1, 8, decoder.max_chunk)) & set(decoder.chunk_sizes))
    bodies = [("body", True, None, chunks), ("body_cublas", True, False, (1,)), ("body_unfused", False, None, (1,))]
    for series, fused, gemv, lengths in bodies:
        for T in lengths:
            call = decoder.body_call(T, fused=fused, gemv=gemv)
            timing = run.gpu_time(lambda call=call: [call], repeats=3, min_calls=10, reps=5)
            run.record(series, timing, params={**base, "chunk": T}, role="baseline", floor_ms=floor)
    dense = lambda: dense_logits(hidden, model.lm_head, out=logits)  # noqa: E731
    run.measure("dense_head", lambda: [dense], params=base, role="baseline", host=dense, host_calls=100)
    if decoder.vocab.name.startswith("cl100k_base") and V > CL100K_SIZE:
        # the same head unpadded (cl100k's 100,277 rows, as the baseline ran before): what the padding buys
        rows = model.lm_head[:CL100K_SIZE]
        narrow = torch.empty(B, CL100K_SIZE, device=decoder.device, dtype=torch.float32)
        odd = lambda: dense_logits(hidden, rows, out=narrow)  # noqa: E731
        run.measure("dense_head_unpadded", lambda: [odd], params={**base, "rows": CL100K_SIZE}, role="baseline",
                    host=odd, host_calls=100)
    rng = np.random.default_rng(0)
    for n in HEAD_COUNTS:
        sets = [np.sort(rng.choice(V, n, replace=False)) for _ in range(B)]
        if B == 1:
            allowed = pieces.allowed_from_ids(sets[0], V, decoder.device)
        else:
            mask = torch.zeros(B, V, dtype=torch.bool)
            for b, ids in enumerate(sets):
                mask[b, torch.from_numpy(ids)] = True
            allowed = pieces.allowed_batch(mask.to(decoder.device), np.unique(np.concatenate(sets)), (n,) * B)
        head = pieces.masked_head_kernel if decoder.head_impl == "kernel" else pieces.masked_head_torch
        masked = lambda allowed=allowed: head(hidden, model.lm_head, allowed, logits)  # noqa: E731
        row = run.measure("masked_logits", lambda masked=masked: [masked], params={**base, "allowed": n},
                          role="baseline", host=masked, host_calls=100, union=allowed.union_count)
        ref = dense_logits(hidden, model.lm_head).masked_fill_(~allowed.mask, float("-inf"))
        masked()
        run.check("masked head = dense head on the allowed ids", bool(torch.allclose(logits, ref, rtol=1e-3,
                  atol=1e-3, equal_nan=False) and torch.equal(torch.isinf(logits), torch.isinf(ref))),
                  params=row["params"])
    run.measure("mask_apply", lambda: [lambda: xgr.apply_token_bitmask_inplace(logits, bits, vocab_size=V)],
                params=base, role="baseline")
    tok = torch.empty(B, dtype=torch.int64, device=decoder.device)
    run.measure("sampling", lambda: [lambda: torch.argmax(logits, dim=1, out=tok)], params=base, role="baseline")
    # the greedy token among the masked head's ids only (step 3's sampling), at the head's allowed counts
    steer = torch.full((B,), -1, dtype=torch.int64, device=decoder.device)
    for n in HEAD_COUNTS:
        ids = torch.from_numpy(np.sort(rng.choice(V, n, replace=False)).astype(np.int32)).to(decoder.device)
        few = torch.full_like(logits, float("-inf"))  # the masked head's output: finite at the allowed ids only
        few[:, ids.long()] = torch.randn(B, n, device=decoder.device)
        pick = lambda ids=ids, few=few, n=n: kernels.allowed_argmax(few, ids, n, steer, STEER, out=tok)  # noqa: E731
        run.measure("sampling_allowed", lambda pick=pick: [pick], params={**base, "allowed": n}, role="baseline")
        pick()
        run.check("allowed_argmax = argmax over the vocabulary", bool(torch.equal(tok, few.argmax(dim=1))),
                  params={**base, "allowed": n})


def plan(quick: bool) -> list[dict[str, Any]]:
    """The benchmark's sweeps (keyword arguments of :func:`sweep`): the ~1B shape on every schema of the suite
    (both whitespace patterns at batch 1), the ~8B cost model and the real model (SmolLM2-135M-Instruct on real
    requests), at batch 1 and 8. ``quick``: the first four
    schemas, fewer repetitions. Sized to the time budget: a 1B step is about a millisecond and an 8B one
    several, each request is run once to warm up, ``repeats`` times timed and once instrumented, in each of
    the five configurations."""
    schemas = suite_names()[:4] if quick else suite_names()
    # five timed repetitions at the headline's shape: the loop waits on the host every step, and one slow
    # repetition of three moves a median on a busy host
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
        sweep(run, device="cuda", whitespaces=("compact",), **kwargs)
    body_kernels(run, [shape for kwargs in plan(quick) for shape in kwargs["shapes"] if shape != REAL_MODEL])


class LocalRun:
    """Records like ``BenchRun`` without a GPU (its rows have the same fields): the CPU sweep of the tests and
    the notebook. Its timings say how the loop spends a CPU's time, nothing about a GPU."""

    quick = False

    def __init__(self):
        self.rows: list[dict] = []
        self.checks: list[dict] = []
        self.notes: list[str] = []

    def record(self, series: str, ms, *, params: dict, role: str = "kernel", clock: str | None = None, **extra):
        row = {"series": series, "role": role, "params": dict(params), "ms": ms.median, "clock": "cpu",
               "spread_ms": ms.spread, **extra}
        self.rows.append(row)
        return row

    def check(self, name: str, passed: bool, *, params: dict | None = None, **detail) -> bool:
        self.checks.append({"name": name, "passed": bool(passed), "params": params or {}, **detail})
        return bool(passed)

    def note(self, text: str) -> None:
        self.notes.append(text)


# --------------------------------------------------------------------------------------------------------
# Reading the results
# --------------------------------------------------------------------------------------------------------

def rows_of(results_rows: Sequence[dict], **params: Any) -> list[dict]:
    return [r for r in results_rows if all(r["params"].get(k) == v for k, v in params.items())]


def series_label(config: str) -> str:
    """A configuration's legend label: its step's name (``step01_baseline``) or its own name."""
    from studylog.decode import CHAPTER

    return CHAPTER.step(STEP_OF[config]).name if config in STEP_OF else config


def _head_rows(results, model: str) -> int | None:
    """The head's rows of ``model`` in a run, from the run's note on the model (None where it has none)."""
    import ast

    for note in results.data.get("notes", []):
        if note.startswith(f"model {model}: "):
            return ast.literal_eval(note.split(": ", 1)[1]).get("vocab_size")
    return None


def headline(results) -> list[dict]:
    """Step 3 (and step 2) over step 1, end to end per output token: on the cost models the median over the suite's
    JSON schemas (the case names the head's rows: a run whose head was not padded is another case), on the real
    model the median over its requests."""
    json_names = set(suite_names("json"))
    out = []
    for model, batch in (("1b", 1), ("1b", 8), ("8b", 1), ("8b", 8), ("smollm2", 1), ("smollm2", 8)):
        real = model == "smollm2"
        for config in ("masked_head", "jump_forward"):
            ratios, mine, theirs, host = [], [], [], []
            for r in rows_of(results.rows, model=model, batch=batch, config=config, whitespace="compact"):
                base = rows_of(results.rows, model=model, batch=batch, config="baseline", whitespace="compact",
                               schema=r["params"]["schema"])
                if base and (real or r["params"]["schema"] in json_names):
                    ratios.append(base[0]["ms"] / r["ms"])
                    mine.append(r["ms"])
                    theirs.append(base[0]["ms"])
                    parts = r.get("breakdown_ms_per_token") or {}
                    if "host" in parts:  # the step's time outside every timed part: host overhead, per token
                        host.append(parts["host"])
            if ratios:
                # the speedup is the median of the schemas' ratios; the times beside it are the medians of the
                # schemas' times per output token (a ratio of medians need not equal the median of ratios)
                rows = _head_rows(results, model)
                what = (f"SmolLM2-135M-Instruct, real requests, batch {batch}, end to end per output token, median "
                        f"of {len(ratios)} requests" if real else
                        f"{model} shape{f' (head of {rows:,} rows)' if rows else ''}, batch {batch}, end to end per "
                        f"output token, median "
                        f"of {len(ratios)} JSON schemas (compact whitespace)")
                out.append({"kernel": series_label(config), "baseline": series_label("baseline"), "clock": "wall",
                            "case": what, "speedup": statistics.median(ratios), "kernel_ms": statistics.median(mine),
                            "baseline_ms": statistics.median(theirs),
                            **({"host_ms": statistics.median(host)} if host else {})})
    return out


__all__ = ["HEAD_COUNTS", "LocalRun", "ORDER", "bench", "body_floor_ms", "body_kernels",
           "components", "count_kernels", "headline", "measure", "plan", "requests", "series_label",
           "series_of", "sweep", "wall_clock"]
