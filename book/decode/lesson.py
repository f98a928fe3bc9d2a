"""What notebook 07 reads from the results, in one place: the numbers its prose quotes (in hidden ``say``
paragraphs), the steps table, the result against the baseline loop, each step's change to the loop as a diff, and the tables the
page no longer shows (the Amdahl view, the body against its floor, every configuration, the components alone, the
targets per card and what did not help), which ``python -m book.decode.lesson`` prints for ``lab/decode/README.md``.

Two files can feed it. The chapter's committed benchmark (``assets/bench/<gpu>/decode.json``, written by
``python -m studylog bench decode``) is read first; where it does not exist yet, the earlier run kept in
``lab/decode/`` (a quick benchmark from before the body was fused: its body, torch's eager operations, is the
``body_unfused`` series) is read instead and every title and caption says so. Every function reads series by the
names the benchmark writes; where a file lacks a series a table says so and a prose number reads :data:`PENDING`
instead of failing.
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path
from typing import Any

from book.common import PENDING, ChainRow, fmt, is_tie
from book.decode.results import TARGET_SPEEDUP, amdahl, breakdown, median_bound, schema_bounds, target_report
from studylog.decode import report
from studylog.decode.grammar import suite_names
from studylog.decode.model import model_config

__all__ = ["PENDING", "CHAIN_CASES", "EARLIER_FILE", "EARLIER_GPU", "EARLIER_WHAT", "STEP03_CHAIN", "STEP_LABELS", "amdahl_table",
           "body_table", "chain_anchor_gap", "step03_chain", "step03_chain_rows", "step03_chain_run",
           "bound_excess", "char_jump_case", "char_jump_table", "result_table", "gemv_tile_answer", "range_top", "step03_past_head_bound", "committed", "components_table", "earlier_run", "forwards_per_token", "gemv_findings",
           "head_share_table", "jump_counts", "measurement_findings", "step03_changes_rows", "step03_changes_table",
           "steps_rows", "real_steps_rows", "real_step03_parts", "real_head_runs", "grammar_setup", "steps_table", "padding_table",
           "prose_numbers", "real_model_table",
           "results_table", "shapes_table", "targets_by_card", "tried_table", "public_shapes"]

#: ``lab/decode/results/<gpu>/<name>.json``: the quick benchmark from before the body was fused.
EARLIER_FILE, EARLIER_GPU = "decode_bench_unfused_quick", "nvidia-h100-80gb-hbm3"
#: How titles name that run.
EARLIER_WHAT = "Earlier run, body before fusion: "
#: The public vocabulary of Llama 3 (its model cards' config: 128,256 ids).
LLAMA3_VOCAB = 128_256


def committed():
    """The chapter's committed benchmark results (the newest GPU's), or None where none is committed."""
    from studylog.plotting import load_results

    try:
        return load_results("decode")
    except FileNotFoundError:
        return None


def earlier_run():
    """The earlier quick run from ``lab/decode/`` as :class:`~studylog.plotting.Results`; None where the file is
    missing."""
    from studylog.plotting import Results, load_lab
    from studylog import paths

    try:
        data = load_lab("decode", EARLIER_FILE, gpu=EARLIER_GPU)
    except FileNotFoundError:
        return None
    return Results(Path(paths.lab_results("decode", EARLIER_GPU)) / f"{EARLIER_FILE}.json", data)


def public_shapes() -> dict[str, Any]:
    """The chapter's two cost models, each a public model's shape (Llama 3.2 1B: hidden 2048, 16 layers, tied head;
    Llama 3.1 8B: hidden 4096, 32 layers, untied head) with chapter 01's cl100k head. Llama 3's own vocabulary
    (:data:`LLAMA3_VOCAB`) is in :func:`prose_numbers`, not in the page's table: the page uses these two."""
    return {"1B cost model (Llama 3.2 1B's shape, cl100k head)": model_config("1b"),
            "8B cost model (Llama 3.1 8B's shape, cl100k head)": model_config("8b")}


def shapes_table() -> str:
    """The chapter's model shapes and their parameter counts."""
    from studylog.decode.model import CONFIGS, describe

    lines = ["| shape | hidden | layers | heads (KV heads) | MLP | parameters of the body | of the head |",
             "|---|---|---|---|---|---|---|"]
    for name, cfg in CONFIGS.items():
        d = describe(cfg)
        lines.append(f"| `{name}` | {cfg.hidden} | {cfg.layers} | {cfg.heads} ({cfg.kv_heads}) | {cfg.intermediate} | "
                     f"{d['params_body'] / 1e9:.3f} B | {d['params_head'] / 1e9:.3f} B |")
    return "\n".join(lines)


def head_share_table() -> str:
    """The head's share of the bytes a batch-1 step reads, and the most a head that took no time could buy."""
    lines = ["| model shape | body parameters | head parameters | head's share of a batch-1 step's bytes | "
             "step speedup if the head took no time (the rest held fixed) |", "|---|---|---|---|---|"]
    for name, cfg in public_shapes().items():
        c, s = cfg.parameter_counts(), cfg.head_share()
        lines.append(f"| {name} | {c['body'] / 1e9:.2f} B | {c['head'] / 1e9:.3f} B | {s:.1%} | {1 / (1 - s):.3f}× |")
    return "\n".join(lines)


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _json_rows(results, config: str, model: str, batch: int, whitespace: str = "compact") -> list[dict]:
    names = set(suite_names("json"))
    return [r for r in report.rows_of(results.rows, model=model, batch=batch, config=config, whitespace=whitespace)
            if r["params"]["schema"] in names]


def forwards_per_token(results, config: str, model: str = "1b", batch: int = 1, whitespace: str = "compact"):
    """Forwards per output token, median over the JSON schemas (None where not measured)."""
    return _median(r["forwards"] / max(r["tokens"], 1) for r in _json_rows(results, config, model, batch, whitespace))


def _speedup(results, config: str, model: str, batch: int, over: str = "baseline", how=statistics.median):
    ratios = []
    for r in _json_rows(results, config, model, batch):
        base = report.rows_of(results.rows, model=model, batch=batch, config=over, whitespace="compact",
                              schema=r["params"]["schema"])
        if base:
            ratios.append(base[0]["ms"] / r["ms"])
    return how(ratios) if ratios else None


def _bandwidth(results) -> float:
    return results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9


def _floor_ms(results, model: str, head: bool) -> float:
    """One forward's weights read once at the run's copy bandwidth: the body's, plus the head's if ``head``."""
    c = model_config(model).parameter_counts()
    return (c["body"] + (c["head"] if head else 0)) * 2 / _bandwidth(results) * 1e3


def _body_row(results, series: str, model: str, batch: int, chunk: int = 1) -> dict | None:
    rows = report.rows_of([r for r in results.rows if r["series"] == series], model=model, batch=batch, chunk=chunk)
    return rows[0] if rows else None


def body_table(results) -> str:
    """The body alone at one token per sequence (GPU clock, graph replay): the fused path (at batch 1 its
    six-launch layer of ``gemv``), the same with cuBLAS's products and nine launches a layer (``body_cublas``,
    timed at batch 1 and 8) and torch's eager operations, each against the floor of reading the body's weights
    once; kernels per layer where the run counted them."""
    series = ("body", "body_cublas", "body_unfused")
    lines = ["| shape | batch | fused body (ms) | with cuBLAS's products (ms) | torch's eager body (ms) | floor (ms) | "
             "fused / floor | cuBLAS's / floor | torch's / floor | kernels per layer (fused; cuBLAS's; torch's) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    any_row = False
    for model in ("1b", "8b"):
        for batch in (1, 8):
            rows = [_body_row(results, name, model, batch) for name in series]
            if not any(rows):
                continue
            any_row = True
            floor = _floor_ms(results, model, head=False)
            cells = " | ".join(f"{r['ms']:.3f}" if r else "–" for r in rows)
            ratios = " | ".join(f"{r['ms'] / floor:.2f}" if r else "–" for r in rows)
            kernels = "; ".join(f"{r['kernels_per_layer']:.1f}" if r and "kernels_per_layer" in r else "–"
                                for r in rows)
            lines.append(f"| `{model}` | {batch} | {cells} | {floor:.3f} | {ratios} | {kernels} |")
    return "\n".join(lines) if any_row else f"({PENDING}: this file holds no body series)"


def results_table(results) -> str:
    """Per shape and batch, each configuration's end-to-end time per output token (median over the JSON
    schemas, compact whitespace), the output tokens per second it makes (of all the batch's sequences together),
    its forwards per output token, the floor of those forwards, and step 3 over step 1."""
    lines = ["| shape | batch | configuration | ms per token | tokens per second | forwards per token | "
             "floor (ms per token) | over step 1 |", "|---|---|---|---|---|---|---|---|"]
    for model in ("1b", "8b"):
        for batch in (1, 8):
            for config in report.ORDER:
                rows = _json_rows(results, config, model, batch)
                if not rows:
                    continue
                ms = _median(r["ms"] for r in rows)
                fwd = forwards_per_token(results, config, model, batch)
                floor = fwd * _floor_ms(results, model, head=config != "masked_head")
                up = _speedup(results, config, model, batch)
                lines.append(f"| `{model}` | {batch} | `{report.series_of(config, 'name')}` | {ms:.3f} | "
                             f"{1e3 / ms:,.0f} | {fwd:.2f} | {floor:.3f} | {up:.2f}× |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file holds no decode series)"


def components_table(results) -> str:
    """Each component alone on the GPU clock (graph replay), with its host time per call where measured: the
    dense head, chapter 02's masked head at a few allowed counts (``masked_logits``), the bitmask's application,
    the sampling over the vocabulary and step 3's over the allowed ids (``sampling_allowed``)."""
    lines = ["| shape | batch | component | GPU time (ms) | host time per call (ms) |", "|---|---|---|---|---|"]
    for model in ("1b", "8b"):
        for batch in (1, 8):
            for series in ("dense_head", "masked_logits", "mask_apply", "sampling", "sampling_allowed"):
                for r in report.rows_of([r for r in results.rows if r["series"] == series], model=model, batch=batch):
                    what = series + (f", {r['params']['allowed']} allowed" if "allowed" in r["params"] else "")
                    host = f"{r['host_ms']:.4f}" if "host_ms" in r else "–"
                    lines.append(f"| `{model}` | {batch} | {what} | {r['ms']:.4f} | {host} |")
    has_masked = any(r["series"] == "masked_logits" for r in results.rows)
    note = "" if has_masked else (f"\n\n(masked_logits: {PENDING}; this file predates the masked head's timing "
                                  "alone)")
    return "\n".join(lines) + note


def amdahl_table(parts: dict[str, dict[str, float]]) -> str:
    """Each chapter's share of the baseline's step, the speedup bound it gives and the measured speedup."""
    b = amdahl(parts)
    if "chapter1_share" not in b or "masked_head" not in parts:
        return f"({PENDING}: this file lacks a configuration)"
    base, jump, masked = (parts[c]["wall"] for c in ("baseline", "jump_forward", "masked_head"))
    return "\n".join([
        "| what | share of the baseline's time per token | bound | measured |", "|---|---|---|---|",
        f"| chapter 01: the forwards its jumps save | {b['chapter1_share']:.1%} | {b['chapter1_bound']:.2f}× | "
        f"{base / jump:.2f}× (`step02_jump_forward` over step 1) |",
        f"| chapter 02: the LM head, the mask's application and the sampling | {b['chapter2_share']:.1%} | "
        f"{b['chapter2_bound']:.2f}× "
        f"| {jump / masked:.2f}× (`step03_masked_head` over step 2) |",
        f"| both | | {b['both_bound']:.2f}× | {base / masked:.2f}× (`step03_masked_head` over step 1) |",
        f"| no chapter touches: the body | {b['body_share']:.1%} | | |",
        f"| no chapter touches: the host (waiting, bookkeeping, the mask not hidden) | {b['host_share']:.1%} | | |"])


def tried_table(current, earlier) -> str:
    """What was tried and did not help, one line each, with the measured effect and where the details are."""
    lines = ["| what | measured effect | details |", "|---|---|---|"]
    src = current or earlier
    if earlier is not None:
        u = _body_row(earlier, "body_unfused", "1b", 1)
        fused = _body_row(current, "body", "1b", 1) if current is not None else None
        effect = (f"{u['ms'] / _floor_ms(earlier, '1b', False):.1f}× the body's floor at `1b`, batch 1 "
                  + (f"(the fused body: {fused['ms'] / _floor_ms(current, '1b', False):.2f}×)" if fused else
                     f"(the fused body: {PENDING})")) if u else PENDING
        lines.append(f"| torch's eager operations as the body, replayed from a CUDA graph | {effect} | "
                     "`lab/decode/README.md`, `lab/decode/profile_body.py` |")
    if src is not None:
        j, c = forwards_per_token(src, "jump_forward"), forwards_per_token(src, "char_jump")
        same = [r.get("same_tokens_as_step01") for r in _json_rows(src, "char_jump", "1b", 1)]
        if j and c:
            lines.append(f"| character-level jumps as a step (forced bytes, then retokenize) | {c:.2f} forwards per "
                         f"token against {j:.2f} with token-level jumps; steered to the tokenizer's own split, the "
                         f"tokens were step 1's in {sum(bool(s) for s in same)} of {len(same)} JSON schemas, but a "
                         "model's own choices need not be: kept beside the steps | the `char_jump` rows of the "
                         "results |")
        d = forwards_per_token(src, "jump_forward", whitespace="default")
        d0 = forwards_per_token(src, "baseline", whitespace="default")
        if d and d0 and j:
            base = forwards_per_token(src, "baseline")
            lines.append(f"| token-level jumps on a schema compiled with optional whitespace | saves {1 - d / d0:.1%} "
                         f"of the forwards, against {1 - j / base:.1%} with compact whitespace | the "
                         "`whitespace: default` rows of the results |")
        a = _speedup(src, "automaton_mask", "1b", 1, over="jump_forward")
        if a:
            why = ("the host's mask was already hidden behind the body" if a < 1.02 else
                   "the precomputed masks save host time that the body does not hide")
            lines.append(f"| the automaton's precomputed masks with the dense head | {a:.2f}× over step 2 at `1b`, "
                         f"batch 1: {why} | the `automaton_mask` rows |")
    lines += gemv_findings()
    lines += measurement_findings()
    return "\n".join(lines)


#: ``lab/decode/results/<gpu>/gemv_tiles.json``: the grid of tiles behind :func:`~studylog.decode.kernels.gemv_tiles`.
GEMV_TILES_FILE = "gemv_tiles"


def gemv_findings(gpu: str = "nvidia-h100-80gb-hbm3") -> list[str]:
    """Rows for :func:`tried_table` from the sweep of the one-token product's tiles (``lab/decode/gemv_tiles.py``):
    the tensor-core tile that lost to the CUDA cores, and the first tile the library used, against the tile it uses
    now (summed over the eight weights of the two shapes, each at its best configuration in the grid)."""
    from studylog.decode.kernels import gemv_tiles
    from studylog.plotting import load_lab

    try:
        data = load_lab("decode", GEMV_TILES_FILE, gpu=gpu)
    except FileNotFoundError:
        return []
    cases = data["cases"]

    def at(case, **tile):
        ms = [t["ms"] for t in case["gemv"] if t["ms"] is not None and t["correct"]
              and all(t[k] == v for k, v in tile.items())]
        return min(ms) if ms else None

    tiles = [gemv_tiles(c["N"], c["K"]) for c in cases]
    chosen = [at(c, BLOCK_N=t["BLOCK_N"], BLOCK_K=t["BLOCK_K"]) for c, t in zip(cases, tiles)]
    dot = [c["best_dot_tile"]["ms"] if c.get("best_dot_tile") else None for c in cases]
    first = [c["library_ms"] for c in cases]
    cublas = [c["cublas_ms"] for c in cases]
    rows = []
    if None not in chosen and None not in dot:
        lost = sum(d > g for d, g in zip(dot, chosen))
        rows.append(f"| the one-token product on tensor cores (the token padded to a 16-row tile, the first version "
                    f"of `gemv`) | {sum(dot) * 1e3:.0f} µs over the eight weights of the two shapes at its best tile, "
                    f"against {sum(chosen) * 1e3:.0f} µs on the CUDA cores and {sum(cublas) * 1e3:.0f} µs with cuBLAS; "
                    f"slower than the CUDA cores on {lost} of {len(cases)} weights | `lab/decode/gemv_tiles.py` |")
    if None not in chosen:
        old, now = cases[0]["library_tiles"], max(tiles, key=lambda t: t["BLOCK_K"])
        rows.append(f"| `gemv`'s first tile, {old['BLOCK_N']} rows × {old['BLOCK_K']} columns a program | "
                    f"{sum(first) * 1e3:.0f} µs over the eight weights, against {sum(chosen) * 1e3:.0f} µs with "
                    f"{now['BLOCK_N']} rows × up to {now['BLOCK_K']} columns | `lab/decode/gemv_tiles.py` |")
    return rows


def gemv_tile_answer(gpu: str = "nvidia-h100-80gb-hbm3", model: str = "1b") -> dict | None:
    """Exercise 5's recorded answer, from the sweep of the one-token product's tiles (``lab/decode/gemv_tiles.py``):
    per weight of ``model`` (``q/k/v``, ``o``, ``gate/up``, ``down``), its ``[N, K]``, the time (µs) of the library's
    tile (two rows a program) and of the best sixteen-row tile with the same columns (over the grid's warps and
    stages), and how many programs each launches. ``gpu``: the card's name as the file gives it. None where the sweep
    is not committed for ``gpu``."""
    from studylog.decode.kernels import gemv_tiles
    from studylog.plotting import load_lab

    try:
        data = load_lab("decode", GEMV_TILES_FILE, gpu=gpu)
    except FileNotFoundError:
        return None
    names = {"qkv": "q/k/v", "o": "o", "gate_up": "gate/up", "down": "down"}
    rows = []
    for c in data["cases"]:
        if c["model"] != model:
            continue
        lib = gemv_tiles(c["N"], c["K"])
        us = {}
        for rows_a_program in (lib["BLOCK_N"], 16):
            ms = [t["ms"] for t in c["gemv"] if t["ms"] is not None and t["correct"]
                  and t["BLOCK_N"] == rows_a_program and t["BLOCK_K"] == lib["BLOCK_K"]]
            us[rows_a_program] = min(ms) * 1e3 if ms else None
        if None in us.values():
            return None
        rows.append({"weight": names.get(c["weight"], c["weight"]), "N": c["N"], "K": c["K"],
                     "rows": lib["BLOCK_N"], "columns": lib["BLOCK_K"], "us": us[lib["BLOCK_N"]], "us16": us[16],
                     "programs": -(-c["N"] // lib["BLOCK_N"]), "programs16": -(-c["N"] // 16)})
    return {"gpu": data["gpu"], "rows": rows} if rows else None


def targets_by_card(root: Path | None = None) -> str:
    """The chapter's targets on every card's committed run, one row per card (:func:`book.decode.results.target_report`): at
    batch 1 step 3 over step 1, the median of the JSON schemas, beside the median of the schemas' own bounds of
    chapters 01 and 02; at batch 8 the slowest schema. Where a target is missed the row says by how much."""
    from studylog.plotting import DEFAULT_OUT, load_results, result_files

    root = Path(root) if root is not None else DEFAULT_OUT
    lines = [f"| card | batch 1: median of the JSON schemas (target ≥ {TARGET_SPEEDUP:.2f}×) | bound of "
             "chapters 01 and 02 (median of the schemas' own) | batch 8: slowest schema (target ≥ 1×) |", "|---|---|---|---|"]
    for f in result_files("decode", root):
        card = load_results("decode", gpu=f.parent.name, root=root)
        v = target_report(card.rows)
        if 1 not in v or 8 not in v:
            continue
        b1, b8 = v[1], v[8]
        first = (f"**{b1['median']:.2f}×**, met" if b1["met"] else
                 f"**{b1['median']:.2f}×**, missed by {TARGET_SPEEDUP / b1['median'] - 1:.0%}")
        eighth = f"**{b8['min']:.2f}×**, " + ("met" if b8["met"] else "missed")
        lines.append(f"| {card.gpu} ({card.date}) | {first} | {b1['bound']:.2f}× | {eighth} |")
    return "\n".join(lines)


def measurement_findings(gpu: str = "nvidia-h100-80gb-hbm3") -> list[str]:
    """Rows for :func:`tried_table` from the two timing experiments kept in ``lab/decode/results/<gpu>/``: the
    garbage collector paused while timing (``gc_pauses``) and the profiler's residue (``profiler_residue``)."""
    from studylog.plotting import load_lab

    rows = []
    try:
        gc = load_lab("decode", "gc_pauses", gpu=gpu)
    except FileNotFoundError:
        gc = None
    if gc is not None:
        on = [r for r in gc["rows"] if r["mode"] == "collector on"]
        full = sum(sum(r["full_collections"]) for r in on)
        runs = sum(len(r["ms_per_token"]) for r in on)
        pause = max(max(r["gc_ms_per_token"]) for r in on)
        rows.append(f"| Python's garbage collector paused while a request is timed (as `timeit` runs) | "
                    f"{full} full collections and at most {pause:.3f} ms per token of collector time in {runs} "
                    f"requests with it on, although one full collection takes {gc['full_collection_ms']:.0f} ms "
                    f"with the suite's grammars in memory: the loop allocates too little for the collector to "
                    "run; the benchmark keeps it paused all the same | `lab/decode/gc_pauses.py` |")
    try:
        pr = load_lab("decode", "profiler_residue", gpu=gpu)
    except FileNotFoundError:
        pr = None
    if pr is not None:
        def med(stage):
            return _median([statistics.median(r["ms_per_token"]) for r in pr["rows"] if r["stage"] == stage])

        before, after = med("never profiled"), med("after the profiler")
        if before and after:
            rows.append(f"| counting the body's kernels with torch's profiler before the timed requests (the "
                        f"benchmark's earlier order) | {after - before:+.3f} ms per token in every configuration "
                        f"({before:.3f} → {after:.3f} ms, median of the requests): the profiler stays attached "
                        "after it ends; the benchmark now counts kernels after every timing | "
                        "`lab/decode/profiler_residue.py` |")
    return rows


def padding_table(results) -> str:
    """The dense head alone (GPU clock) with cl100k's 100,277 rows as the tokenizer has them and padded to a
    multiple of 128 (100,352, as real checkpoints pad their vocabulary): the baseline every step is compared with."""
    lines = ["| shape | batch | 100,277 rows (ms) | padded to 100,352 (ms) | unpadded / padded |", "|---|---|---|---|---|"]
    for model in ("1b", "8b"):
        for batch in (1, 8):
            u = report.rows_of([r for r in results.rows if r["series"] == "dense_head_unpadded"], model=model,
                               batch=batch)
            p = report.rows_of([r for r in results.rows if r["series"] == "dense_head"], model=model, batch=batch)
            if u and p:
                lines.append(f"| `{model}` | {batch} | {u[0]['ms']:.4f} | {p[0]['ms']:.4f} | "
                             f"{u[0]['ms'] / p[0]['ms']:.2f}× |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file holds no unpadded head)"


def _chunk_bucket(n: int) -> int:
    return 1 if n == 1 else 8 if n <= 8 else 64


def chunk_forecast(results, row: dict, model: str, batch: int) -> float | None:
    """The body's GPU time of a request's forwards after its prompt, each at the time the benchmark measured
    for its chunk length alone (one token: the six-launch layer; more: the nine-launch layer), in ms."""
    body = {r["params"]["chunk"]: r["ms"] for r in report.rows_of(
        [r for r in results.rows if r["series"] == "body"], model=model, batch=batch)}
    try:
        return sum(body[_chunk_bucket(n)] for n in row["chunk_lengths"][1:])
    except KeyError:
        return None


def _real_rows(results, batch: int) -> list[tuple[str, dict, dict, dict]]:
    """(schema, step 1, step 2, step 3) rows of the real model's requests at ``batch``."""
    out = []
    for r3 in report.rows_of(results.rows, model=REAL, batch=batch, config="masked_head"):
        name = r3["params"]["schema"]
        r1, r2 = (report.rows_of(results.rows, model=REAL, batch=batch, config=c, schema=name)
                  for c in ("baseline", "jump_forward"))
        if r1 and r2:
            out.append((name, r1[0], r2[0], r3))
    return out


#: The real model's name in the benchmark's rows.
REAL = "smollm2"


def real_model_table(results, batch: int = 1) -> str:
    """SmolLM2's real requests, one row per schema: output tokens, forwards of step 1 and step 3, each step's time
    per output token, step 3 over step 1, the ratio its chunk lengths forecast (:func:`chunk_forecast`), and Hugging
    Face ``generate`` with xgrammar's logits processor (batch 1)."""
    hf = {r["params"]["schema"]: r for r in results.rows if r["series"] == "hf_generate"}
    lines = ["| request (schema) | tokens | forwards, step 1 → 3 | step 1 (ms/token) | step 2 | step 3 | step 3 over 1 | "
             "chunk-length forecast | HF generate (ms/token) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r1, r2, r3 in _real_rows(results, batch):
        f1, f3 = chunk_forecast(results, r1, REAL, batch), chunk_forecast(results, r3, REAL, batch)
        fc = f"{f1 / f3:.2f}×" if f1 and f3 else "–"
        h = f"{hf[name]['ms']:.1f}" if batch == 1 and name in hf else "–"
        lines.append(f"| `{name}` | {r1['tokens']} | {r1['forwards']} → {r3['forwards']} | {r1['ms']:.3f} | "
                     f"{r2['ms']:.3f} | {r3['ms']:.3f} | {r1['ms'] / r3['ms']:.2f}× | {fc} | {h} |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file holds no real-model requests)"


#: ``lab/decode/results/nvidia-h200/<name>.json``: the whole benchmark run again on a fresh machine, for
#: ``bench verify`` (its report beside it, ``<name>_verify.md``).
SECOND_RUN_FILE = "decode_second_run"


def second_run():
    """The second H200 run of the benchmark kept in ``lab/decode/`` (None where the file is missing)."""
    from studylog import paths
    from studylog.plotting import Results, load_lab

    try:
        data = load_lab("decode", SECOND_RUN_FILE, gpu="nvidia-h200")
    except FileNotFoundError:
        return None
    return Results(Path(paths.lab_results("decode", "nvidia-h200")) / f"{SECOND_RUN_FILE}.json", data)


#: ``lab/decode/results/nvidia-h200/<name>.json``: steps 2, 3a and 3 on SmolLM2 interleaved request by request over
#: rounds (``lab/decode/head_interleaved.py``), the run that resolves chapter 02's head on the real model.
HEAD_INTERLEAVED_FILE = "head_interleaved"


def head_interleaved(batch: int = 1) -> dict | None:
    """Chapter 02's head on SmolLM2 with the host's drift cancelled (:data:`HEAD_INTERLEAVED_FILE`): per round, step
    3a's and step 3's medians over the requests and their ratio; the ratio's median, least and most over the rounds
    (``x``, ``least``, ``most``), the ``rounds`` and ``requests`` counted, and whether every generation wrote step
    2's tokens (``same_tokens``). None without the file or its rows at ``batch``."""
    import statistics

    from studylog.plotting import load_lab

    try:
        data = load_lab("decode", HEAD_INTERLEAVED_FILE, gpu="nvidia-h200")
    except FileNotFoundError:
        return None
    rows = {(r["params"]["schema"], r["params"]["config"]): r["per_round_ms"] for r in data["measurements"]
            if r["series"] == "head_interleaved" and r["params"]["batch"] == batch}
    schemas = sorted({s for s, _ in rows})
    if not schemas or any((s, c) not in rows for s in schemas for c in ("automaton_mask", "masked_head")):
        return None
    n = min(len(v) for v in rows.values())
    per_round = [(statistics.median(rows[(s, "automaton_mask")][i] for s in schemas),
                  statistics.median(rows[(s, "masked_head")][i] for s in schemas)) for i in range(n)]
    ratios = [a / b for a, b in per_round]
    same = all(c["passed"] for c in data["checks"] if c["params"].get("batch") == batch)
    return {"x": statistics.median(ratios), "least": min(ratios), "most": max(ratios), "rounds": n,
            "requests": len(schemas), "same_tokens": same, "per_round_ms": per_round}


def interleaved_table(h: dict) -> str:
    """:func:`head_interleaved`'s rounds as a Markdown table: each round's medians over the requests of 3a and of
    step 3 (µs per token) and their ratio, in the order they ran."""
    lines = ["| round | 3a: µs per token | step 3: µs per token | 3a ÷ step 3 |", "|---|---|---|---|"]
    lines += [f"| {i} | {a * 1e3:,.0f} | {b * 1e3:,.0f} | {a / b:.2f}× |"
              for i, (a, b) in enumerate(h["per_round_ms"], 1)]
    return "\n".join(lines)

def interleaved_word(h: dict) -> str:
    """What :func:`head_interleaved`'s ratio says by the course's tie rule: "pays", "loses" or "tie"."""
    from book.common import is_tie

    return "tie" if is_tie(h["x"]) else "pays" if h["x"] > 1 else "loses"

def real_model_numbers(results) -> dict[str, str]:
    """The real model's numbers the prose quotes (``dec_real_*``)."""
    out: dict[str, str] = {}
    checks = [c for c in results.data.get("checks", []) if c["params"].get("model") == REAL]
    valid = [c for c in checks if c["name"] == "finished outputs valid for their schema"]
    same = [c for c in checks if c["name"].startswith("same tokens as step01")]
    out["dec_real_valid"] = f"{sum(c['valid'] for c in valid)} of {sum(c['finished'] for c in valid)}"
    out["dec_real_finished"] = f"{sum(c['finished'] for c in valid)} of {sum(c['requests'] for c in valid)}"
    out["dec_real_same"] = f"{sum(c['identical'] for c in same)} of {sum(c['sequences'] for c in same)}"
    out["dec_real_divergences"] = str(sum(len(c["divergences"]) for c in same))
    for batch in (1, 8):
        rows = _real_rows(results, batch)
        ratios = [r1["ms"] / r3["ms"] for _, r1, _, r3 in rows]
        pairs = [(chunk_forecast(results, r1, REAL, batch), chunk_forecast(results, r3, REAL, batch))
                 for _, r1, _, r3 in rows]
        fc = [f1 / f3 for f1, f3 in pairs if f1 and f3]
        b = amdahl(breakdown(results.rows, REAL, batch, kind=None))
        three = _median(r3["ms"] for _, _, _, r3 in rows)
        out[f"dec_real_step03_b{batch}"] = fmt(_median(r1["ms"] for _, r1, _, _ in rows) / three if three else None,
                                               ".2f", "×")  # the ratio of the two median times
        out[f"dec_real_forecast_b{batch}"] = fmt(_median(fc), ".2f", "×")
        out[f"dec_real_bound_b{batch}"] = fmt(median_bound(results.rows, REAL, batch, kind=None), ".2f", "×")
        out[f"dec_real_share1_b{batch}"] = fmt(b.get("chapter1_share"), ".0%")
        out[f"dec_real_share2_b{batch}"] = fmt(b.get("chapter2_share"), ".1%")
        if rows:
            worst = min(rows, key=lambda t: t[1]["ms"] / t[3]["ms"])
            out[f"dec_real_min_b{batch}"] = f"{worst[1]['ms'] / worst[3]['ms']:.2f}×"
            out[f"dec_real_min_schema_b{batch}"] = worst[0]
        ms1 = _median(r1["ms"] for _, r1, _, _ in rows)
        out[f"dec_real_ms_b{batch}"] = fmt(ms1, ".2f", " ms")
    body = {(r["params"]["batch"], r["params"]["chunk"]): r["ms"] for r in results.rows
            if r["series"] == "body" and r["params"].get("model") == REAL}
    out["dec_real_body_1"] = fmt(body.get((1, 1)), ".2f", " ms")
    out["dec_real_body_8"] = fmt(body.get((1, 8)), ".2f", " ms")
    hf = [(r["ms"], report.rows_of(results.rows, model=REAL, batch=1, config="baseline",
                                   schema=r["params"]["schema"])) for r in results.rows if r["series"] == "hf_generate"]
    hf_ratio = [ms / b[0]["ms"] for ms, b in hf if b]
    out["dec_real_hf_ms"] = fmt(_median(ms for ms, _ in hf), ".1f", " ms")
    out["dec_real_hf_over_step01"] = fmt(_median(hf_ratio), ".0f", "×")
    return out



def prose_numbers(current, earlier) -> dict[str, str]:
    """Every number the notebook's prose quotes, formatted, keyed by name (``dec_*``)."""
    out: dict[str, str] = {}
    for key, cfg in (("1b", model_config("1b")), ("8b", model_config("8b")),
                     ("llama1b", model_config("1b", vocab_size=LLAMA3_VOCAB)),
                     ("llama8b", model_config("8b", vocab_size=LLAMA3_VOCAB))):
        s = cfg.head_share()
        out[f"dec_head_share_{key}"] = f"{s:.1%}"
        out[f"dec_head_bound_{key}"] = f"{1 / (1 - s):.2f}×"
    src = current or earlier
    out["dec_source"] = ("one benchmark run" if current is not None else
                         "an earlier quick run, from before the body was fused")
    out["dec_gpu"] = src.gpu if src is not None else PENDING
    out["dec_status"] = ("measured" if current is not None else
                         f"{PENDING}: the fused body's GPU measurement is not committed yet")
    if src is None:
        return out
    base_fwd, jump_fwd = forwards_per_token(src, "baseline"), forwards_per_token(src, "jump_forward")
    char_fwd = forwards_per_token(src, "char_jump")
    saved = 1 - jump_fwd / base_fwd if base_fwd and jump_fwd else None
    out["dec_fwd_base"] = fmt(base_fwd, ".2f")
    out["dec_fwd_jump"] = fmt(jump_fwd, ".2f")
    out["dec_fwd_char"] = fmt(char_fwd, ".2f")
    out["dec_fwd_saved"] = fmt(saved, ".1%")
    out["dec_fwd_bound"] = fmt(1 / (1 - saved) if saved is not None else None, ".2f", "×")
    out["dec_char_saved"] = fmt(1 - char_fwd / base_fwd if base_fwd and char_fwd else None, ".1%")
    for model in ("1b", "8b"):
        for batch in (1, 8):
            tag = f"{model}_b{batch}"
            parts = breakdown(src.rows, model, batch)
            b = amdahl(parts)
            out[f"dec_share_body_{tag}"] = fmt(b.get("body_share"), ".0%")
            out[f"dec_share_head_{tag}"] = fmt(b.get("chapter2_share"), ".1%")
            out[f"dec_share_host_{tag}"] = fmt(b.get("host_share"), ".1%")
            out[f"dec_bound_both_{tag}"] = fmt(median_bound(src.rows, model, batch), ".2f", "×")
            out[f"dec_step03_{tag}"] = fmt(_speedup(src, "masked_head", model, batch), ".2f", "×")
            out[f"dec_step02_{tag}"] = fmt(_speedup(src, "jump_forward", model, batch), ".2f", "×")
            out[f"dec_step03_min_{tag}"] = fmt(_speedup(src, "masked_head", model, batch, how=min), ".2f", "×")
            out[f"dec_step03_over02_{tag}"] = fmt(_speedup(src, "masked_head", model, batch, over="jump_forward"),
                                                   ".2f", "×")
            base = _median(r["ms"] for r in _json_rows(src, "baseline", model, batch))
            out[f"dec_ms_base_{tag}"] = fmt(base, ".2f", " ms")
    out["dec_target"] = f"{TARGET_SPEEDUP:g}×"
    bound = median_bound(src.rows, "1b", 1)
    out["dec_target_vs_bound"] = (PENDING if bound is None else
                                  "above what the parts they remove can give at batch 1" if bound < TARGET_SPEEDUP
                                  else "within what the parts they remove can give at batch 1")
    # torch's eager body from the page's own run where it timed one, else from the earlier run
    unfused = next((r for r in (current, earlier) if r is not None and _body_row(r, "body_unfused", "1b", 1)), None)
    u = _body_row(unfused, "body_unfused", "1b", 1) if unfused is not None else None
    out["dec_unfused_vs_floor"] = fmt(u["ms"] / _floor_ms(unfused, "1b", False) if u else None, ".1f", "×")
    f = _body_row(current, "body", "1b", 1) if current is not None else None
    out["dec_fused_vs_floor"] = fmt(f["ms"] / _floor_ms(current, "1b", False) if f else None, ".2f", "×")
    out["dec_fused_kernels"] = fmt(f.get("kernels_per_layer") if f else None, ".0f")
    c = _body_row(current, "body_cublas", "1b", 1) if current is not None else None
    out["dec_cublas_vs_floor"] = fmt(c["ms"] / _floor_ms(current, "1b", False) if c else None, ".2f", "×")
    out["dec_cublas_kernels"] = fmt(c.get("kernels_per_layer") if c else None, ".0f")
    for model in ("1b", "8b"):
        g, c = (_body_row(current, n, model, 1) if current is not None else None for n in ("body", "body_cublas"))
        out[f"dec_gemv_gain_{model}"] = fmt(c["ms"] / g["ms"] if g and c else None, ".2f", "×")
    rows = {(r["series"], r["params"].get("allowed")): r["ms"] for r in src.rows
            if r["series"] in ("sampling", "sampling_allowed") and r["params"].get("model") == "1b"
            and r["params"].get("batch") == 1}
    out["dec_sampling_us"] = fmt(rows[("sampling", None)] * 1e3 if ("sampling", None) in rows else None, ".0f",
                                  " µs")
    out["dec_sampling_allowed_us"] = fmt(rows[("sampling_allowed", 48)] * 1e3 if ("sampling_allowed", 48) in rows
                                          else None, ".1f", " µs")
    parts = breakdown(src.rows, "1b", 1)
    for config in ("baseline", "masked_head"):
        v = parts.get(config, {}).get("sampling")
        out[f"dec_sampling_loop_{config}"] = fmt(v * 1e3 if v is not None else None, ".0f", " µs")
    out["dec_floor_1b"] = fmt(_floor_ms(src, "1b", False), ".3f", " ms")
    out["dec_bandwidth"] = f"{src.data['ceilings']['copy_bandwidth_gbs']:,.0f} GB/s"
    for model in ("1b", "8b"):
        for batch in (1, 8):
            u, p = (report.rows_of([r for r in src.rows if r["series"] == n], model=model, batch=batch)
                    for n in ("dense_head_unpadded", "dense_head"))
            out[f"dec_pad_{model}_b{batch}"] = fmt(u[0]["ms"] / p[0]["ms"] if u and p else None, ".2f", "×")
    out.update(real_model_numbers(src))
    again = second_run() if current is not None else None
    if again is not None:
        out.update({k.replace("dec_real_", "dec_real2_"): v for k, v in real_model_numbers(again).items()})
    return out


# --------------------------------------------------------------------------------------------------------
# The page's steps table, its result against the baseline loop, and the loop's code each step turns on
# --------------------------------------------------------------------------------------------------------

#: The lesson's three steps, as the benchmark's configurations.
STEP_CONFIGS = ("baseline", "jump_forward", "masked_head")
#: What each step changes, for the steps table (step 3 bundles three changes, timed one at a time in
#: :func:`step03_chain_rows`).
#: Each step's row label in the steps table: its number and a short name, as its section is titled.
STEP_LABELS = {"baseline": "step 1: the baseline loop", "jump_forward": "step 2: jump forward",
               "masked_head": "step 3: the masked head"}
STEP_CHANGES = {"baseline": "dense head, xgrammar's bitmask, one forward per token",
                "jump_forward": "forced tokens appended without a forward (chapter 01)",
                "masked_head": "3a's cached allowed sets, then chapter 02's masked head and argmax (3b, 3c)"}


#: Step 3's other changes, in a table where 3a has its own row (:func:`steps_table`).
STEP_3BC = "chapter 02's masked head and the argmax over the allowed ids (3b, 3c)"


def steps_rows(results, model: str = "1b", batch: int = 1, with_3a: bool = False) -> list[dict]:
    """One row per step at ``model`` and ``batch`` (``label``: "step N: short name", the table's row label): the
    median over the JSON schemas of the time per output token (µs), its ratio to the previous row's (``x_previous``:
    the ratio of the table's own column), and its ratio to the step's floor (its forwards per output token, each
    reading the body's weights, and the head's for a dense head, once at the run's copy bandwidth). ``with_3a``: 3a
    (``automaton_mask``, the allowed sets precomputed; dense head) its own row between step 2 and step 3, where the
    run timed it, step 3's ratio then over 3a."""
    has_3a = with_3a and bool(_json_rows(results, "automaton_mask", model, batch))
    configs = STEP_CONFIGS[:2] + ("automaton_mask",) + STEP_CONFIGS[2:] if has_3a else STEP_CONFIGS
    labels = {**STEP_LABELS, "automaton_mask": STEP_3A[0]}
    changes = {**STEP_CHANGES, "automaton_mask": STEP_3A[1]} | ({"masked_head": STEP_3BC} if has_3a else {})
    rows, prev = [], None
    for config in configs:
        ms = _median(r["ms"] for r in _json_rows(results, config, model, batch))
        if ms is None:
            continue
        fwd = forwards_per_token(results, config, model, batch)
        floor = fwd * _floor_ms(results, model, head=config != "masked_head")
        rows.append({"step": report.series_of(config, "name"), "label": labels[config], "change": changes[config],
                     "us": ms * 1e3,
                     "x_previous": prev / ms if prev else None, "x_floor": ms / floor, "floor_us": floor * 1e3,
                     "forwards": fwd})
        prev = ms
    return rows


#: How the steps table heads a shape's columns.
STEPS_TABLE_SHAPES = {"1b": "1B cost model", "8b": "8B cost model"}


def real_steps_rows(results, batch: int = 1) -> list[dict]:
    """The three steps on the real model's requests at ``batch`` (the result table's requests, regexes included):
    the median of each step's time per output token (µs) and its ratio to the previous row's (``x_previous``)."""
    rows, prev = [], None
    real = _real_rows(results, batch)
    for i, config in enumerate(STEP_CONFIGS, start=1):
        ms = _median(r[i]["ms"] for r in real)
        if ms is None:
            continue
        rows.append({"label": STEP_LABELS[config], "us": ms * 1e3, "x_previous": prev / ms if prev else None,
                     "forwards": _median(r[i]["forwards"] / max(r[i]["tokens"], 1) for r in real)})
        prev = ms
    return rows


def real_forced(results, batch: int = 1) -> dict | None:
    """What step 2 skips on the real model's requests at ``batch`` (SmolLM2's vocabulary, its own answers): the
    requests (JSON schemas and regexes), their output tokens, the tokens appended without a forward (``jumped``),
    and the forwards saved (the jumped tokens plus, per request, the last forward, where only EOS is left)."""
    from book.decode.results import suite_names

    real = _real_rows(results, batch)
    if not real:
        return None
    json_names = set(suite_names("json"))
    return {"requests": len(real), "json": sum(name in json_names for name, *_ in real),
            "tokens": sum(r2["tokens"] for _, _, r2, _ in real), "jumped": sum(r2["jumped"] for _, _, r2, _ in real),
            "forwards_step1": sum(r1["forwards"] for _, r1, _, _ in real),
            "saved": sum(r1["forwards"] - r2["forwards"] for _, r1, r2, _ in real),
            "ch01_real_saved": _ch01_real_saved()}


def _ch01_real_saved() -> float | None:
    """Chapter 01's passes saved by exact token jumps on its SchemaStore sample (random walks, cl100k)."""
    from book.results import fsm_peers_real, passes_saved

    return passes_saved(fsm_peers_real(), "ours/tokens")


#: The real model's steps table row for step 3's first change, timed on its own by the chapter's benchmark.
STEP_3A = ("3a: allowed sets precomputed", "the automaton's allowed sets, built once per grammar, as the mask "
           "instead of xgrammar's matcher (host work, no chapter's: the base step 3 is measured against)")


def real_steps_rows_3a(results, batch: int = 1) -> list[dict]:
    """:func:`real_steps_rows` with 3a (``automaton_mask``, the allowed sets precomputed) between step 2 and step 3,
    each row's ``x_previous`` over the row above it (step 3's is then over 3a: chapter 02's head and argmax, 3b
    with 3c); without 3a's rows, :func:`real_steps_rows` as it is."""
    reals = real_steps_rows(results, batch)
    real = _real_rows(results, batch)
    a = [report.rows_of(results.rows, model=REAL, batch=batch, config="automaton_mask", schema=name)
         for name, *_ in real]
    if len(reals) < 3 or not all(a):
        return reals
    ms = _median(x[0]["ms"] for x in a)
    mid = {"label": STEP_3A[0], "us": ms * 1e3, "x_previous": reals[1]["us"] / (ms * 1e3),
           "forwards": _median(x[0]["forwards"] / max(x[0]["tokens"], 1) for x in a)}
    last = dict(reals[2], x_previous=ms * 1e3 / reals[2]["us"])
    return [reals[0], reals[1], mid, last]


def real_body(results) -> dict | None:
    """What SmolLM2's body is, at batch 1: one token's forward on the GPU clock, graph replay (``us``, the
    benchmark's ``body`` row), the kernels a forward launches (``kernels``, counted by chapter 08's run, its
    scoreboard row) and, on the requests chapter 08 times again with this chapter's step 1 (its low-copy ones), the
    share of step 1's time that is each request's prefill (``prefill_share``, pooled over ``prefill_requests``)."""
    from book.speculate import lesson as spec

    one = next((r["ms"] for r in results.rows if r["series"] == "body" and r["params"].get("model") == REAL
                and r["params"].get("batch") == 1 and r["params"].get("chunk") == 1), None)
    if one is None:
        return None
    count = spec.kernel_count_bound()
    later = spec.committed()
    rows = [r for r in report.rows_of(later.rows, batch=1, workload="low_copy") if r["series"] == "ch7_step01"] \
        if later is not None else []
    wall = sum(r["breakdown_ms_per_token"]["wall"] * r["tokens"] for r in rows)
    return {"us": one * 1e3, "kernels": count["kernels"] if count else None,
            "prefill_share": sum(r["first_step_ms"] for r in rows) / wall if wall else None,
            "prefill_requests": len(rows)}


#: Chapter 01's count on SmolLM2's own answers (lab/fsm/smollm2_answer_passes.py): each answer's text in its
#: tokenizer's split, under each jump policy.
FSM_SMOLLM2 = "fsm_peers_smollm2.json"


def smollm2_split(batch: int = 1) -> dict | None:
    """Chapter 01's count on the real model's answers at ``batch`` (the same greedy answers the chapter's benchmark
    times): the tokens of their text in the tokenizer's split (``tokens``), the passes without jumps (``none``), and
    the passes each policy saves (``saved``: exact token jumps, ``ours/tokens``; llguidance's fast-forward tokens,
    ``llguidance/tokens``), as shares of ``none``. None where the file is missing."""
    import json

    from studylog import paths

    path = paths.DATA / FSM_SMOLLM2
    if not path.is_file():
        return None
    reqs = [r for r in json.loads(path.read_text())["requests"] if r["request"].endswith(f"/b{batch}")]
    none = sum(r["none"] for r in reqs)
    return {"answers": sum(r["answers"] for r in reqs), "tokens": sum(r["tokens"] for r in reqs), "none": none,
            "saved": {k: 1 - sum(r[k] for r in reqs) / none for k in ("ours/tokens", "llguidance/tokens")},
            "forced": none - sum(r["ours/tokens"] for r in reqs)}


def real_step03_parts(results, batch: int = 1) -> dict | None:
    """Step 3 on the real model split where the chapter's benchmark allows: it times 3a (``automaton_mask``) on the
    real model's requests too, but not 3b alone (the chain's run, :func:`step03_chain_run`, builds random-weight
    cost models only). Over :func:`real_steps_rows`' requests, with its statistic (the ratio of medians): 3a over
    step 2 (``x_3a``) and step 3 over 3a, 3b and 3c together (``x_3bc``). None where a request lacks 3a."""
    real = _real_rows(results, batch)
    a = [report.rows_of(results.rows, model=REAL, batch=batch, config="automaton_mask", schema=name)
         for name, *_ in real]
    if not real or not all(a):
        return None
    two, three = (_median(r[i]["ms"] for r in real) for i in (2, 3))
    mid = _median(x[0]["ms"] for x in a)
    return {"x_3a": two / mid, "x_3bc": mid / three, "requests": len(real)}


def real_head_runs(results, batch: int = 1) -> dict | None:
    """Chapter 02's head and argmax on the real model (3b with 3c, step 3 over 3a: :func:`real_step03_parts`) in the
    chapter's run (``results``) and in the second H200 run (:func:`second_run`), each run's 3a and step 3 medians
    (µs per token; ``us_3a``, ``us_3``, ``us2_3a``, ``us2_3``), and how far a breakdown bar's end sits from its
    tick on SmolLM2 in the chapter's run (``bar_tick``: least and most, µs per token, over the real model's figure's
    bars, :func:`book.decode.figures.instrumentation_cost`): the spread the page sets beside the head's ratio there.
    None without the second run or without 3a in either."""
    from book.decode.figures import DRAWN_REAL, instrumentation_cost

    again = second_run()
    if again is None:
        return None
    runs = [real_steps_rows_3a(r, batch) for r in (results, again)]
    if any(len(r) < 4 for r in runs):
        return None
    panels = [{c: p for c, p in breakdown(results.rows, REAL, b, kind=None).items() if c in DRAWN_REAL}
              for b in (1, 8)]
    lo, hi = instrumentation_cost([p for p in panels if p])
    (one, two) = runs
    return {"x_3bc": one[3]["x_previous"], "x2_3bc": two[3]["x_previous"], "us_3a": one[2]["us"],
            "us_3": one[3]["us"], "us2_3a": two[2]["us"], "us2_3": two[3]["us"],
            "x_3a_step1": one[0]["us"] / one[2]["us"], "x2_3a_step1": two[0]["us"] / two[2]["us"],
            "x_3_step1": one[0]["us"] / one[3]["us"], "x2_3_step1": two[0]["us"] / two[3]["us"],
            "bar_tick": (lo * 1e3, hi * 1e3)}


def grammar_setup(results, model: str = REAL, batch: int = 1) -> dict | None:
    """What a grammar costs before a request's first step, on ``model``'s requests at ``batch`` (step 3's rows,
    compact whitespace), medians in ms: the automaton's compile (outlines-core's index and the forced chains:
    ``automaton_ms``), xgrammar's compile (step 1's: ``xgrammar_ms``), and a whole request's decode under step 3
    (its time per token times its tokens, the prefill included: ``decode_ms``). Both compiles, and building every
    state's allowed ids on the device (not timed), run before the timed steps. None where the rows lack the times."""
    rows = [r for r in report.rows_of(results.rows, model=model, batch=batch, config="masked_head")
            if r["params"].get("whitespace", "compact") == "compact" and r.get("compile_seconds")]
    if not rows:
        return None
    sec = [r["compile_seconds"] for r in rows]
    return {"automaton_ms": _median((s["automaton_index"] + s.get("automaton_jumps", 0.0)) * 1e3 for s in sec),
            "xgrammar_ms": _median(s["xgrammar"] * 1e3 for s in sec),
            "decode_ms": _median(r["ms"] * r["tokens"] for r in rows), "requests": len(rows)}


def outlines_coverage() -> tuple[int, int] | None:
    """Chapter 01's SchemaStore sample (``realworld_cl100k_base.json``): how many schemas outlines-core, which builds
    this chapter's automaton, compiled, and of how many (the rest it refused or timed out on). None where the file
    is missing."""
    import json

    from book.results import FSM_REAL

    if not FSM_REAL.is_file():
        return None
    s = json.loads(FSM_REAL.read_text())["summary"]["outlines-core"]
    return s["compiled"], s["schemas"]


def steps_table(results, model: str = "1b", batch: int = 1, also: str | None = None, with_3a: bool = True) -> str:
    """:func:`steps_rows` as the cost models' steps table (Markdown): one row per step, and 3a its own row where the
    run timed it on every shape shown and ``with_3a`` (3b and 3c, timed one at a time in :func:`step03_chain_rows`,
    stay in step 3's row; without 3a, step 3's ratio is over step 2, and 3a's on the cost models is the chain's
    alone). ``also``: a second model whose three columns follow, each group headed by its shape. "× previous" says
    "(tie)" from 0.97× to 1.03× as printed (the course's tie rule)."""
    cols = "µs per token | × previous | × floor (its forwards' weight bytes)"
    shapes = [model] + ([also] if also else [])
    rows = {m: steps_rows(results, m, batch, with_3a=with_3a) for m in shapes}
    if len({len(r) for r in rows.values()}) > 1:  # 3a timed on one shape only: no 3a row
        rows = {m: steps_rows(results, m, batch) for m in shapes}
    if also:
        head = " | ".join(f"{STEPS_TABLE_SHAPES.get(m, m)}: {cols}" for m in shapes)
    else:
        head = cols
    lines = [f"| step | what changes | {head} |", "|---|---|" + "---|---|---|" * len(shapes)]
    if not rows[model]:
        return f"({PENDING}: this file holds no decode series)"
    for i, r in enumerate(rows[model]):
        cells = [r["label"], r["change"]]
        if r["step"] == "automaton_mask" and any(round(rows[m][i]["x_previous"], 2) <= 1.03 for m in shapes):
            cells[1] += "; kept where it does not pay: step 3's masked head reads these sets"
        for x in (rows[m][i] for m in shapes):
            cells += [f"{x['us']:,.0f}", "–" if x["x_previous"] is None else _tie_or(
                lambda a, b: f"{a / b:.2f}×", x["x_previous"], 1.0), f"{x['x_floor']:.2f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def jump_counts(results, model: str = "1b", batch: int = 1) -> dict[str, float] | None:
    """The forwards chapter 01's jumps save in this chapter's loop on the JSON schemas (compact), counted two ways.
    The page's way: forwards per output token, the median over the schemas, token jumps (``jump_forward``) and
    character jumps (``char_jump``) against the baseline (``saved_token``, ``saved_char``). Chapter 01's way
    (``ch1_saved_token``, ``ch1_saved_char``): forwards summed over the documents, and the baseline's forwards
    that pick EOS where nothing else is allowed left out (its forwards beyond one per token): chapter 01's step 1
    never spends them, and the jump configurations stop there without one. ``eos_forwards``: how many those are;
    ``documents``: one per schema; ``passes_base``, ``passes_token``: chapter 01's sums behind ``ch1_saved_token``
    (the baseline's forwards less ``eos_forwards``, and the token jumps' forwards). None where a configuration is
    missing."""
    rows = {c: _json_rows(results, c, model, batch) for c in ("baseline", "jump_forward", "char_jump")}
    if not all(rows.values()):
        return None
    per_token = {c: forwards_per_token(results, c, model, batch) for c in rows}
    base = rows["baseline"]
    eos = sum(r["forwards"] - r["tokens"] for r in base)
    passes = sum(r["forwards"] for r in base) - eos
    total = {c: sum(r["forwards"] for r in rows[c]) for c in ("jump_forward", "char_jump")}
    return {"fwd_base": per_token["baseline"], "fwd_token": per_token["jump_forward"],
            "saved_token": 1 - per_token["jump_forward"] / per_token["baseline"],
            "saved_char": 1 - per_token["char_jump"] / per_token["baseline"],
            "ch1_saved_token": 1 - total["jump_forward"] / passes, "ch1_saved_char": 1 - total["char_jump"] / passes,
            "eos_forwards": eos, "documents": len(base), "passes_base": passes, "passes_token": total["jump_forward"]}


def _case(results, model: str, batch: int) -> dict | None:
    """Step 1 and step 3 on one case: medians of the time per token (µs), their ratio (the headline's statistic),
    the median, smallest and largest of the requests' own ratios, and the two chapters' bound: the median of the
    requests' own bounds (:func:`~book.decode.results.median_bound`)."""
    if model == REAL:
        rows = _real_rows(results, batch)
        one = [r1["ms"] for _, r1, _, _ in rows]
        three = [r3["ms"] for _, _, _, r3 in rows]
        ratios = [r1["ms"] / r3["ms"] for _, r1, _, r3 in rows]
        bound = median_bound(results.rows, REAL, batch, kind=None)
    else:
        one = [r["ms"] for r in _json_rows(results, "baseline", model, batch)]
        three = [r["ms"] for r in _json_rows(results, "masked_head", model, batch)]
        ratios = [] if not one else [_speedup(results, "masked_head", model, batch, how=lambda v: v)][0] or []
        bound = median_bound(results.rows, model, batch)
    if not one or not three:
        return None
    a, b = _median(one), _median(three)
    return {"step1_us": a * 1e3, "step3_us": b * 1e3, "ratio": a / b, "median_request": _median(ratios),
            "requests": len(three),
            "slowest": min(ratios) if ratios else None, "fastest": max(ratios) if ratios else None,
            "bound": bound}


def range_top(results, model: str, batch: int) -> dict | None:
    """The JSON schema at the top of a case's per-schema range of step 1 over step 3 (the result table's "most"):
    its name (``schema``), the ratio, its output tokens and the forwards step 1 and step 3 spend on them
    (``forwards_step1``, ``forwards_step3``). A request's time per output token is its whole time, the prompt's
    prefill included, over its output tokens, so the shortest outputs give the extremes. None where the case is not
    measured."""
    top = None
    for r3 in _json_rows(results, "masked_head", model, batch):
        base = report.rows_of(results.rows, model=model, batch=batch, config="baseline", whitespace="compact",
                              schema=r3["params"]["schema"])
        if base and (top is None or base[0]["ms"] / r3["ms"] > top["ratio"]):
            top = {"schema": r3["params"]["schema"], "ratio": base[0]["ms"] / r3["ms"], "tokens": base[0]["tokens"],
                   "forwards_step1": base[0]["forwards"], "forwards_step3": r3["forwards"]}
    return top


def bound_excess(results, model: str, batch: int) -> dict | None:
    """Why a case's measurement can pass its bound: how many of its requests beat their own bound, and the host's
    own work (the loop's ``host`` component, µs per output token, median of the requests) in step 1 and step 3,
    which the bound holds fixed with the rest of the host's part of a step. None where the case is not measured."""
    kind = None if model == REAL else "json"
    bounds = schema_bounds(results.rows, model, batch, kind=kind)
    above = 0
    for name, b in bounds.items():
        one, three = (report.rows_of(results.rows, model=model, batch=batch, config=c, whitespace="compact",
                                     schema=name) for c in ("baseline", "masked_head"))
        if one and three and one[0]["ms"] / three[0]["ms"] > b["both_bound"]:
            above += 1
    parts = breakdown(results.rows, model, batch, kind=kind)
    if not bounds or "baseline" not in parts or "masked_head" not in parts:
        return None
    host = {c: parts[c]["host"] * 1e3 for c in ("baseline", "masked_head")}
    return {"above": above, "requests": len(bounds), "host_step1_us": host["baseline"],
            "host_step3_us": host["masked_head"]}


def step03_past_head_bound(results, model: str = "1b", batch: int = 1) -> dict | None:
    """Why step 3 over step 2 (the steps table's ``× previous``) can pass the most chapter 02's head can buy,
    ``1 / (1 - s)`` for the head's share ``s`` of the bytes: that bound holds the host's own work fixed, and step 3
    also shortens it. ``ratio``: the steps table's step 3 over step 2; ``bound``: the head's bound at ``model``;
    ``host_step2_us``, ``host_step3_us``: the loop's ``host`` component (µs per output token, median of the
    requests, as :func:`bound_excess` reads it). None where a step is not measured."""
    rows = {r["step"]: r for r in steps_rows(results, model, batch)}
    parts = breakdown(results.rows, model, batch, kind="json")
    two, three = report.series_of("jump_forward", "name"), report.series_of("masked_head", "name")
    if two not in rows or three not in rows or "jump_forward" not in parts or "masked_head" not in parts:
        return None
    return {"ratio": rows[three]["x_previous"], "bound": 1 / (1 - model_config(model).head_share()),
            "host_step2_us": parts["jump_forward"]["host"] * 1e3, "host_step3_us": parts["masked_head"]["host"] * 1e3}


def host_table(results, models=("1b", "8b"), batch: int = 1) -> str:
    """The host's part of a step for steps 1 to 3 (Markdown), µs per output token, medians over the JSON schemas
    (:func:`~book.decode.results.breakdown`): its own work (the loop's ``host`` component, the time no device part
    covers) and the time the LM head's call holds it (``head_host``: the head launches eagerly every step), per
    shape."""
    parts = {m: breakdown(results.rows, m, batch, kind="json") for m in models}
    head = " | ".join(f"{STEPS_TABLE_SHAPES.get(m, m)}: {what}" for m in models
                      for what in ("host's own work", "host time the head's call holds"))
    lines = [f"| step | {head} |", "|---|" + "---|" * (2 * len(models))]
    for config in STEP_CONFIGS:
        if not all(config in parts[m] for m in models):
            continue
        cells = [f"{parts[m][config][k] * 1e3:,.0f}" for m in models for k in ("host", "head_host")]
        lines.append(f"| {STEP_LABELS[config]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file holds no decode series)"


#: The cases of the result table: (label, model, batch).
CASES = (("SmolLM2-135M, real requests", REAL, 1), ("SmolLM2-135M, real requests", REAL, 8),
         ("1B cost model, JSON schemas", "1b", 1), ("1B cost model, JSON schemas", "1b", 8),
         ("8B cost model (synthetic weights), JSON schemas", "8b", 1),
         ("8B cost model (synthetic weights), JSON schemas", "8b", 8))


def result_rows(results) -> list[dict]:
    """:func:`_case` for every case of :data:`CASES` the file holds, labelled."""
    out = []
    for label, model, batch in CASES:
        c = _case(results, model, batch)
        if c is not None:
            out.append({"case": label, "model": model, "batch": batch, **c})
    return out


def char_jump_case(results, model: str = "8b", batch: int = 1) -> dict | None:
    """Chapter 01's character-level jumps (``char_jump``, not exact) in step 3's place on one cost model's case, as
    :func:`_case` gives step 3: medians over the JSON schemas of step 1's time per token (``step1_us``), step 3's
    (``step3_us``) and the jumps' (``char_us``), step 1's over the jumps' (``ratio``), step 3's over the jumps'
    (``x_step3``) and the schemas' own ratios to step 1 (``slowest``, ``median_request``, ``fastest``). None where
    the case lacks a series."""
    ratios, one, three, char = [], [], [], []
    for r in _json_rows(results, "char_jump", model, batch):
        a, c = (report.rows_of(results.rows, model=model, batch=batch, config=k, whitespace="compact",
                               schema=r["params"]["schema"]) for k in ("baseline", "masked_head"))
        if a and c:
            one.append(a[0]["ms"]), three.append(c[0]["ms"]), char.append(r["ms"]), ratios.append(a[0]["ms"] / r["ms"])
    if not ratios:
        return None
    a, b, c = _median(one), _median(three), _median(char)
    return {"model": model, "batch": batch, "requests": len(ratios), "step1_us": a * 1e3, "step3_us": b * 1e3,
            "char_us": c * 1e3, "ratio": a / c, "x_step3": b / c, "slowest": min(ratios),
            "median_request": _median(ratios), "fastest": max(ratios)}


def result_table(results) -> str:
    """Step 3 against the fair baseline (step 1) on every case, with the chapters' Amdahl forecast (the median of the
    requests' own, :func:`~book.decode.results.median_bound`; host time held at step 1's, so a measurement can pass
    it) (Markdown): the medians of the time per token (µs) over the case's requests (the cost models' nine JSON
    schemas; the real model's requests), their ratio (the statistic the headline uses), and the requests' own
    ratios: the least, the median and the most. Short headers; the page explains the columns under the table.
    Chapter 01's character-level jumps have a table of their own, :func:`char_jump_table`."""
    lines = ["| case | batch | requests | step 1, µs | step 3, µs | step 1 / step 3 | per request | Amdahl forecast |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result_rows(results):
        each = "–" if r["slowest"] is None else (f"{r['slowest']:.2f}×, {r['median_request']:.2f}×, "
                                                 f"{r['fastest']:.2f}×")
        bound = "–" if r["bound"] is None else f"{r['bound']:.2f}×"
        lines.append(f"| {r['case']} | {r['batch']} | {r['requests']} | {r['step1_us']:,.0f} | {r['step3_us']:,.0f} | "
                     f"**{r['ratio']:.2f}×** | {each} | {bound} |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file holds no decode series)"


def char_jump_table(results, model: str = "8b", batch: int = 1) -> str:
    """Chapter 01's character-level jumps (SGLang's policy, not exact) in step 3's place on one cost model's case
    (:func:`char_jump_case`), as a table of its own (Markdown, one row): the medians over the JSON schemas of step
    1's, step 3's and the jumps' time per token (µs), and step 1's and step 3's over the jumps'. Empty where the
    case has no ``char_jump`` series."""
    cj = char_jump_case(results, model, batch)
    if cj is None:
        return ""
    label = next(label for label, m, b in CASES if (m, b) == (model, batch))
    head = ("| case | batch | requests | step 1, µs | step 3, µs | character-level jumps (not exact), µs | "
            "step 1 / jumps | step 3 / jumps |")
    row = (f"| {label} | {cj['batch']} | {cj['requests']} | {cj['step1_us']:,.0f} | {cj['step3_us']:,.0f} | "
           f"{cj['char_us']:,.0f} | {cj['ratio']:.2f}× | **{cj['x_step3']:.2f}×** |")
    return "\n".join([head, "|---|---|---|---|---|---|---|---|", row])


def peer_numbers(results) -> dict[str, float] | None:
    """Hugging Face ``generate`` with xgrammar's logits processor against steps 1 and 3 on the real model's
    requests at batch 1, the same requests and GPU: medians of the time per output token (ms) and of the
    requests' own ratios, and how many of those requests ``generate`` answered with step 1's tokens (``same``). None
    where the file holds no ``hf_generate`` rows."""
    hf = {r["params"]["schema"]: r for r in results.rows if r["series"] == "hf_generate"}
    rows = [(hf[name]["ms"], r1["ms"], r3["ms"]) for name, r1, _, r3 in _real_rows(results, 1) if name in hf]
    if not rows:
        return None
    same = sum(bool(hf[name].get("same_tokens_as_step01")) for name, _, _, _ in _real_rows(results, 1) if name in hf)
    return {"hf_ms": _median(h for h, _, _ in rows), "step1_ms": _median(a for _, a, _ in rows),
            "step3_ms": _median(c for _, _, c in rows), "hf_over_step1": _median(h / a for h, a, _ in rows),
            "hf_over_step3": _median(h / c for h, _, c in rows), "requests": len(rows), "same": same}


def char_jump_numbers(results) -> dict | None:
    """Chapter 01's character-level jumps (``char_jump``: forced bytes appended, then retokenized), which are not a
    step: at each cost model's shape, batch 1, the figures' timed totals (µs per output token, JSON schemas) of step
    1, step 3 and the jumps, and how many of the JSON schemas' steered outputs were step 1's tokens; on the real
    model's JSON requests at batch 1, how many wrote step 1's tokens and how many finished valid. None where the
    file holds no ``char_jump`` rows."""
    out = {}
    for model in ("1b", "8b"):
        wall = {c: p["wall"] * 1e3 for c, p in breakdown(results.rows, model, 1).items()}
        rows = _json_rows(results, "char_jump", model, 1)
        if not rows or "char_jump" not in wall:
            return None
        out[model] = {"step1_us": wall["baseline"], "step3_us": wall["masked_head"], "char_us": wall["char_jump"],
                      "x_step1": wall["baseline"] / wall["char_jump"],
                      "x_step3": wall["masked_head"] / wall["char_jump"],
                      "same": sum(bool(r.get("same_tokens_as_step01")) for r in rows), "requests": len(rows)}
    real = _json_rows(results, "char_jump", REAL, 1)
    if not real:
        return None
    out[REAL] = {"same": sum(bool(r.get("same_tokens_as_step01")) for r in real),
                 "valid": sum(int(r.get("valid") or 0) for r in real), "requests": len(real)}
    return out


#: Step 3's changes added one at a time (``lab/decode/step03_changes.py``, series ``step03_changes``): each
#: configuration and the change it adds to the row above.
STEP03_CHANGES = (("jump_forward", "step 2: jumps, dense head, xgrammar's bitmask"),
                  ("automaton_mask", "+ automaton masks"), ("masked_full_argmax", "+ masked head"),
                  ("masked_head", "+ allowed-only argmax (step 3)"))


def step03_changes_rows(rows, model: str, batch: int) -> list[dict]:
    """One row per configuration of :data:`STEP03_CHANGES` measured at ``model`` and ``batch`` (rows of series
    ``step03_changes``): the median over the schemas of the time per output token (µs), its ratio to the row
    above's (``x_previous``), the instrumented parts each change targets (µs per token, medians: ``mask``, the
    host's mask not hidden and its application; ``head``; ``sampling``), the schemas, and whether every request
    wrote step 1's tokens."""
    out, prev = [], None
    for config, change in STEP03_CHANGES:
        sel = [r for r in rows if r["series"] == "step03_changes" and r["params"].get("model") == model
               and r["params"].get("batch") == batch and r["params"].get("config") == config]
        if not sel:
            continue
        ms = statistics.median(r["ms"] for r in sel)

        def part(*keys, sel=sel):
            return statistics.median(sum(r["breakdown_ms_per_token"].get(k, 0.0) for k in keys) for r in sel) * 1e3

        out.append({"config": config, "change": change, "us": ms * 1e3, "x_previous": prev / ms if prev else None,
                    "mask_us": part("mask_wait", "mask_apply"), "head_us": part("head"),
                    "sampling_us": part("sampling"), "host_us": part("host"), "schemas": len(sel),
                    "same_tokens": all(r.get("same_tokens_as_step01") for r in sel)})
        prev = ms
    return out


def step03_changes_table(rows, models=("1b", "8b"), batches=(1, 8), chapter=None) -> str:
    """:func:`step03_changes_rows` at each shape and batch the rows hold, as one Markdown table. With ``chapter``
    (the chapter's results), the rows whose configuration is one of the steps (step 2, step 3) give in brackets
    the chapter's own median over the JSON schemas (:func:`steps_rows`' statistic), since the two runs differ in
    schemas and in time."""
    lines = ["| shape | batch | change | µs per token | × previous | mask (µs/token) | head (µs/token) | "
             "sampling (µs/token) | step 1's tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        for batch in batches:
            for r in step03_changes_rows(rows, model, batch):
                prev = "–" if r["x_previous"] is None else f"{r['x_previous']:.2f}×"
                ref = (_median(x["ms"] for x in _json_rows(chapter, r["config"], model, batch))
                       if chapter is not None and r["config"] in STEP_CONFIGS else None)
                us = f"{r['us']:,.0f}" + ("" if ref is None else f" [{ref * 1e3:,.0f}]")
                lines.append(f"| `{model}` | {batch} | {r['change']} | {us} | {prev} | {r['mask_us']:.1f} | "
                             f"{r['head_us']:.1f} | {r['sampling_us']:.1f} | "
                             f"{'yes' if r['same_tokens'] else 'NO'} ({r['schemas']} schemas) |")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: no step03_changes rows)"


#: ``lab/decode/results/<gpu>/<name>.json``: step 2, then step 3's changes added one at a time, in one run
#: (``lab/decode/step03_changes.py``).
CHAIN_FILE = "step03_changes"
#: Step 3's chain, one row per link: its label, the configuration the run times for it, and the one change it adds
#: to the row above. The first row is step 2 (the anchor); the last adds 3c and is step 3 itself (``masked_head``,
#: the library's step 3, timed in the same run).
STEP03_CHAIN = (("step 2", "jump_forward", "jumps, dense head, xgrammar's bitmask"),
                ("3a", "automaton_mask", "+ the automaton's allowed sets as the mask (dense head still; host work only)"),
                ("3b", "masked_full_argmax", "+ chapter 02's masked head: only the allowed rows' logits"),
                ("3c = step 3", "masked_head", "+ the greedy token picked among the allowed ids only"))
#: The chain table's cases: (column label, shape, batch): the steps table's case and the headline's.
CHAIN_CASES = (("1B cost model", "1b", 1), ("8B cost model", "8b", 1))


def step03_chain_run(gpu: str = "nvidia-h200") -> list[dict]:
    """The rows of :data:`CHAIN_FILE` (series ``step03_changes``). Raises ``FileNotFoundError`` where the run is not
    committed: the page's chain table has no other source."""
    from studylog.plotting import load_lab

    return load_lab("decode", CHAIN_FILE, gpu=gpu)["measurements"]


def step03_chain(changes, cases=CHAIN_CASES) -> list[dict]:
    """Step 3's chain (:data:`STEP03_CHAIN`) from one run's rows: per link, its label and change, and per case the
    median over the schemas of the time per output token (``us``, keyed by the case's label), its ratio to the row
    above's (``x_previous``: above 1 the change pays; None on the anchor), the instrumented parts each change
    targets (:func:`step03_changes_rows`: ``head_us``, ``sampling_us``, and ``host_us``, the host's own work), and
    whether every request wrote step 1's tokens. Raises ``ValueError`` where a link is missing at a case."""
    per_case = {}
    for label, model, batch in cases:
        got = {r["config"]: r for r in step03_changes_rows(changes, model, batch)}
        missing = [config for _, config, _ in STEP03_CHAIN if config not in got]
        if missing:
            raise ValueError(f"step 3's chain lacks {missing} at {model}, batch {batch}")
        per_case[label] = got
    out, prev = [], None
    for row, config, change in STEP03_CHAIN:
        cells = {label: per_case[label][config] for label in per_case}
        out.append({"row": row, "config": config, "change": change,
                    "us": {k: c["us"] for k, c in cells.items()},
                    "x_previous": {k: (prev[k]["us"] / c["us"] if prev else None) for k, c in cells.items()},
                    "head_us": {k: c["head_us"] for k, c in cells.items()},
                    "sampling_us": {k: c["sampling_us"] for k, c in cells.items()},
                    "host_us": {k: c["host_us"] for k, c in cells.items()},
                    "same_tokens": all(c["same_tokens"] for c in cells.values())})
        prev = cells
    return out


def step03_chain_rows(changes, cases=CHAIN_CASES) -> list[ChainRow]:
    """:func:`step03_chain` as the rows of the book's chain table (:func:`book.common.chain_table`, its cases the
    labels of ``cases``, µs per output token)."""
    return [ChainRow(r["row"], r["change"], dict(r["us"])) for r in step03_chain(changes, cases)]


def _tie_or(factor, before: float, after: float) -> str:
    """``factor(before, after)``, or "x.xx× (tie)" where the ratio as printed is from 0.97× to 1.03×."""
    x = before / after
    return f"{x:.2f}× (tie)" if is_tie(x) else factor(before, after)


def chain_anchor_gap(changes, results, cases=CHAIN_CASES) -> dict:
    """How far the chain's two anchors (step 2 and step 3, timed in the chain's run) sit from the same steps in the
    chapter's run (:func:`steps_rows`, the same statistic): the largest gap over the cases, as a fraction of the
    chapter's time (``gap``), and which step and case it is."""
    chain = step03_chain(changes, cases)
    worst = None
    for label, model, batch in cases:
        own = {r["step"]: r["us"] for r in steps_rows(results, model, batch)}
        for r in (chain[0], chain[-1]):
            ref = own[report.series_of(r["config"], "name")]
            gap = abs(r["us"][label] / ref - 1)
            if worst is None or gap > worst["gap"]:
                worst = {"gap": gap, "step": r["row"], "case": label}
    return worst


def _function_body(fn) -> list[str]:
    """A function's source lines without its docstring."""
    import inspect

    from book.common import without_docstrings

    return without_docstrings(textwrap.dedent(inspect.getsource(fn))).splitlines()


def _between(lines: list[str], first: str, last: str) -> list[str]:
    """The lines from the first that contains ``first`` to the next that contains ``last``, both kept."""
    i = next(k for k, ln in enumerate(lines) if first in ln)
    j = next(k for k in range(i, len(lines)) if last in lines[k])
    return lines[i:j + 1]


#: The loop's test for chapter 02's kernels (the GPU path; on a CPU the same contract runs in torch).
_ON_GPU = 'self.head_impl == "kernel"'


def _on_gpu(text: str) -> str:
    """A resolved loop body (:func:`book.decode.resolve.resolved`) as it runs on a GPU: every ``if`` on
    :data:`_ON_GPU` keeps its first branch, so the diff shows chapter 02's kernels and not the torch fallback."""
    import ast

    from book.decode.resolve import wrapped_line

    class OnGpu(ast.NodeTransformer):
        def visit_If(self, node):
            self.generic_visit(node)
            return node.body if ast.unparse(node.test).replace("'", '"') == _ON_GPU else node

    tree = ast.fix_missing_locations(OnGpu().visit(ast.parse(text)))
    return "\n".join(piece for stmt in tree.body for line in ast.unparse(stmt).splitlines()
                     for piece in wrapped_line(line))


def _gpu_diff(fn, old_cfg, new_cfg, names: tuple[str, str]):
    """:func:`book.decode.resolve.config_diff` of the loop as it runs on a GPU (:func:`_on_gpu`)."""
    from book.decode.resolve import resolved
    from studylog.source import Diff

    return Diff(_on_gpu(resolved(fn, old_cfg, quiet=True)), _on_gpu(resolved(fn, new_cfg, quiet=True)), *names, 2)


def step_code(step: int) -> list:
    """What a step changes in the loop, read from the library's ``studylog/decode/loop.py`` when the page runs: each
    function the step's configuration runs differently, as a diff from the step before
    (:func:`book.decode.resolve.config_diff`: both configurations' tests resolved), titled in words. Step 2: what
    happens after each token. 3a: where the mask comes from (the automaton's sets instead of xgrammar's matcher).
    Step 3, from 3a: the allowed ids instead of bitmask words and the head's launch (3b), then, as a listing, the
    sampler's branch that step 3's allowed set turns on (3c: the argmax among the allowed ids)."""
    from studylog.decode.generation import CONFIGS
    from studylog.decode.loop import Decoder
    from studylog.source import Code

    from book.decode.resolve import config_diff

    if step == 2:
        return [config_diff(Decoder._settle, CONFIGS["baseline"], CONFIGS["jump_forward"],
                            ("step 1, after each token", "step 2"))]
    if step == "3a":  # the mask's source only: the automaton's sets, as xgrammar's bitmask words
        return [_gpu_diff(Decoder._host_mask, CONFIGS["jump_forward"], CONFIGS["automaton_mask"],
                          ("step 2, the next position's mask", "3a"))]
    if step == 3:
        old, new = CONFIGS["automaton_mask"], CONFIGS["masked_head"]
        sample = _between(_function_body(Decoder._sample), "if temperature == 0 and", "return")
        sample = [line.replace(f" and {_ON_GPU}", "") for line in sample]
        return [_gpu_diff(Decoder._host_mask, old, new, ("3a, the next position's mask", "step 3")),
                _gpu_diff(Decoder._run, old, new, ("3a, each step after the body", "step 3")),
                Code(textwrap.dedent("\n".join(sample)), "python",
                     "the sampler, given an allowed set (3c): the greedy token among its ids")]
    raise ValueError(f"steps 2, 3a and 3 change the loop; step {step} is the loop itself")


def appendix() -> str:
    """The tables the chapter page does not show, from the committed run (and the earlier one where a table reads
    it), as Markdown: what ``lab/decode/README.md`` keeps."""
    import json

    from studylog import paths
    from book.fsm import realworld

    current, earlier = committed(), earlier_run()
    shown = current or earlier
    out = [f"Generated by `python -m book.decode.lesson` from {shown.caption() if shown else PENDING}"]

    def section(title: str, body: str) -> None:
        out.extend([f"### {title}", body])

    section("Every configuration (the JSON schemas, compact whitespace; 'over step 1' is the median of the "
            "schemas' own ratios)", results_table(shown))
    for batch in (1, 8):
        section(f"Each chapter against its Amdahl bound, `1b`, batch {batch}",
                amdahl_table(breakdown(shown.rows, "1b", batch)))
        section(f"SmolLM2-135M's real requests, batch {batch}", real_model_table(shown, batch))
    section("The targets on each card", targets_by_card())
    section("The body alone against its floor", body_table(current) if current is not None else PENDING)
    if earlier is not None:
        section(EARLIER_WHAT + "the body alone", body_table(earlier))
    section("The dense head unpadded and padded", padding_table(shown))
    section("The components alone", components_table(shown))
    section("The model shapes", shapes_table())
    section("What was tried and did not help", tried_table(current, earlier))
    for vocab_name in ("cl100k_base", "smollm2"):
        doc = json.loads((paths.DATA / f"realworld_{vocab_name}.json").read_text())
        section(f"Grammar engines on SchemaStore schemas, {vocab_name}", realworld.results_table(doc))
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    print(appendix())


#: The one steps table's shorter "what changes" cells: each row's one change (3a its own row, then 3b with 3c).
STEPS_ONE_CHANGE = (STEP_CHANGES["baseline"], STEP_CHANGES["jump_forward"],
                    "the automaton's allowed sets, built once per grammar, as the mask (host work, no chapter's: "
                    "the base step 3 is measured against)",
                    STEP_3BC)


def steps_runs(results, second, batch: int = 1, also: str = "8b") -> list[dict]:
    """The page's one steps table as rows: step 1, step 2, 3a and step 3, on the real model in the chapter's run
    (``real``: :func:`real_steps_rows_3a`, each row's time, ``x_previous`` over the row above, forwards per token)
    and in the second H200 run (``real2``, the same rows, or None where ``second`` is None or lacks 3a), and on the
    cost model ``also`` in the chapter's run (``cost``: :func:`steps_rows` with 3a, its time, ``x_previous`` and
    ``x_floor``). ``bound``: the real model's time over its forward-time bound (its forwards, each at a one-token
    forward's GPU time: :func:`real_body`), None where the run did not time that forward. Empty where the real
    model's steps lack 3a."""
    real = real_steps_rows_3a(results, batch)
    if len(real) < 4:
        return []
    real2 = real_steps_rows_3a(second, batch) if second is not None else None
    if real2 is not None and len(real2) < 4:
        real2 = None
    cost = steps_rows(results, also, batch, with_3a=True)
    if len(cost) < 4:
        cost = [None] * 4
    body = real_body(results) if batch == 1 else None
    out = []
    for i, (change, r) in enumerate(zip(STEPS_ONE_CHANGE, real)):
        out.append({"label": r["label"], "change": change, "real": r, "real2": real2[i] if real2 else None,
                    "cost": cost[i],
                    "bound": r["us"] / (r["forwards"] * body["us"]) if body else None})
    return out


def _ratio_cell(x: float | None) -> str:
    """A "× previous" cell: "–" on the first row, "(tie)" from 0.97× to 1.03× as printed (the course's tie rule)."""
    return "–" if x is None else _tie_or(lambda a, b: f"{a / b:.2f}×", x, 1.0)


def runs_verdict(x: float | None, x2: float | None) -> str:
    """What two runs' "× previous" say together: "pays" or "loses" where both are past the course's tie band on the
    same side, "tie" where both are ties, "runs disagree" otherwise (one a tie, or opposite sides); "–" without
    both."""
    if x is None or x2 is None:
        return "–"
    from book.common import is_tie

    if is_tie(x) and is_tie(x2):
        return "tie"
    if not is_tie(x) and not is_tie(x2) and (x > 1) == (x2 > 1):
        return "pays" if x > 1 else "loses"
    return "runs disagree"


def real_verdict(x: float | None, x2: float | None = None, interleaved: dict | None = None) -> dict | None:
    """What a step buys on SmolLM2 over the row above, by the one rule every page that quotes it uses (chapter 07's
    steps table and answer, chapter 02's opening, the results and landing pages). Whole runs of the benchmark drift
    apart by more than the masked head saves of a SmolLM2 step, so a whole run's ratio cannot resolve the head; rounds
    that alternate 3a and step 3 request by request (:func:`head_interleaved`) cancel that drift. So: where an
    interleaved run is given, its median ratio is the step's number; without one, the whole runs decide: two runs
    by :func:`runs_verdict` (run 1's ratio quoted, both where they disagree), one run by the course's tie rule.

    Returns ``x`` (the ratio quoted), ``word`` ("pays", "loses", "tie" or "runs disagree"), ``source``
    ("interleaved", "two runs" or "one run"), ``least`` and ``most`` (the interleaved rounds' range, else None),
    ``x2`` (run 2's ratio, None without it) and ``cell`` (the number and its source in a few words, as a table
    cell). None without ``x`` or an interleaved run."""
    from book.common import is_tie

    def word(v: float) -> str:
        return "tie" if is_tie(v) else "pays" if v > 1 else "loses"

    if interleaved is not None:
        v = interleaved["x"]
        return {"x": v, "word": word(v), "source": "interleaved", "least": interleaved["least"],
                "most": interleaved["most"], "x2": x2,
                "cell": f"{_ratio_cell(v)}, interleaved rounds "
                        f"({interleaved['least']:.2f}–{interleaved['most']:.2f}×)"}
    if x is None:
        return None
    if x2 is None:
        return {"x": x, "word": word(x), "source": "one run", "least": None, "most": None, "x2": None,
                "cell": _ratio_cell(x)}
    verdict = runs_verdict(x, x2)
    cell = _ratio_cell(x) if verdict != "runs disagree" else (
        f"{_ratio_cell(x)} in run 1, {'a tie' if is_tie(x2) else f'{x2:.2f}×'} in run 2")
    return {"x": x, "word": verdict, "source": "two runs", "least": None, "most": None, "x2": x2, "cell": cell}


def run_drift(results, second, batch: int = 1) -> dict | None:
    """How far the real model's two H200 runs (the chapter's and :func:`second_run`) are apart, over the steps table's
    rows: each step's time in the chapter's run over the second's, less one (``time``: least, most), and each
    "× previous" likewise (``ratio``: the largest, either way). None without both runs' four rows."""
    if second is None:
        return None
    one, two = real_steps_rows_3a(results, batch), real_steps_rows_3a(second, batch)
    if len(one) < 4 or len(two) < 4:
        return None
    times = [a["us"] / b["us"] - 1 for a, b in zip(one, two)]
    ratios = [max(a["x_previous"], b["x_previous"]) / min(a["x_previous"], b["x_previous"]) - 1
              for a, b in zip(one[1:], two[1:])]
    return {"time": (min(times), max(times)), "ratio": max(ratios)}


def steps_runs_table(results, second, batch: int = 1) -> str:
    """:func:`steps_runs` as the real model's steps table (Markdown), one number a step: per row its one change,
    SmolLM2's time in the chapter's run, its "× previous" by :func:`real_verdict` (the head's from
    :func:`head_interleaved` where that run exists, each other step's from the whole runs), and the time over the
    forward-time bound (the chapter's run). Both whole runs side by side: :func:`steps_both_runs_table`. The cost
    models have tables of their own (:func:`steps_table`)."""
    rows = steps_runs(results, second, batch)
    if not rows:
        return f"({PENDING}: this file holds no real-model requests with 3a)"
    n = len(_real_rows(results, batch))
    interleaved = head_interleaved(batch)
    lines = [f"| step | the one change | SmolLM2-135M ({n} requests): µs per token, run 1 | × previous | "
             "× forward-time bound |", "|---|---|---|---|---|"]
    for r in rows:
        x, x2 = r["real"]["x_previous"], (r["real2"] or {}).get("x_previous")
        v = real_verdict(x, x2, interleaved if r is rows[-1] else None)
        cells = [r["label"], r["change"], f"{r['real']['us']:,.0f}", "–" if v is None else v["cell"],
                 "–" if r["bound"] is None else f"{r['bound']:.2f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def steps_both_runs_table(results, second, batch: int = 1) -> str:
    """The real model's steps in both whole runs (Markdown): per row SmolLM2's time and "× previous" in the
    chapter's run and in :func:`second_run` (each ratio the ratio of its own column's times) and what the two say
    together (:func:`runs_verdict`, each run's own word where they disagree). "(not run)" without the second run."""
    rows = steps_runs(results, second, batch)
    if not rows or rows[0]["real2"] is None:
        return "(not run)"
    from book.common import is_tie

    lines = ["| step | run 1: µs per token | × previous | run 2: µs per token | × previous "
             "| the two runs together |", "|---|---|---|---|---|---|"]
    for r in rows:
        x, x2 = r["real"]["x_previous"], r["real2"]["x_previous"]
        verdict = runs_verdict(x, x2)
        if verdict == "runs disagree":  # each run's own word, said plainly
            verdict = ", ".join(f"{'a tie' if is_tie(v) else 'pays' if v > 1 else 'loses'} in run {i}"
                                for i, v in ((1, x), (2, x2)))
        lines.append(f"| {r['label']} | {r['real']['us']:,.0f} | {_ratio_cell(x)} | {r['real2']['us']:,.0f} | "
                     f"{_ratio_cell(x2)} | {verdict} |")
    return "\n".join(lines)


def real_runs_ranges(results, second, batch: int = 1) -> dict | None:
    """The real model's ratios over both H200 runs (the chapter's and the second), each as (least, most): the jumps
    (step 2 over step 1, ``jumps``), 3a over step 2 (``x_3a``), the head and argmax (step 3 over 3a, ``head``), the two
    together (step 3 over step 2, ``both``) and step 3 over step 1 (``step3``); ``main``: the chapter's run's four, under the same keys. None without both."""
    if second is None:
        return None
    runs = [real_steps_rows_3a(r, batch) for r in (results, second)]
    if any(len(r) < 4 for r in runs):
        return None
    each = [{"jumps": r[1]["x_previous"], "x_3a": r[2]["x_previous"], "head": r[3]["x_previous"],
             "both": r[1]["us"] / r[3]["us"], "step3": r[0]["us"] / r[3]["us"]} for r in runs]
    out = {k: (min(e[k] for e in each), max(e[k] for e in each)) for k in each[0]}
    out["main"] = each[0]
    out["second"] = each[1]
    return out


def real_parts_without_body(results, batch: int = 1) -> dict[str, float]:
    """The real model's breakdown bars without the body, as the figure's "without the body" panel sums them: per
    configuration, the instrumented parts other than the body (mask not hidden, head, mask application, sampling,
    host overhead), µs per output token."""
    from studylog.decode.loop import COMPONENTS

    parts = breakdown(results.rows, REAL, batch, kind=None)
    return {c: sum(max(p[k], 0.0) for k in COMPONENTS if k != "body") * 1e3 for c, p in parts.items()}


def second_run_ratios(second) -> str:
    """The real model's step 1 over step 3 in the second H200 run (:func:`second_run`), per batch, in the result
    table's statistic (:func:`_case`), as the words the table's note gives ("1.25× at batch 1, ..."); "not run"
    where the file is missing."""
    if second is None:
        return "not run"
    cases = [(b, _case(second, REAL, b)) for b in (1, 8)]
    return ", ".join(f"{c['step1_us']:,.0f} and {c['step3_us']:,.0f} µs, {c['ratio']:.2f}× at batch {b}"
                     for b, c in cases if c is not None) or "not run"
