"""The kernel alone against a tuned gather: does torch.compile's fused gather beat the chapter's entry point?

The chapter's kernel-alone rival is torch's ``h @ W.index_select(0, ids).T``: two launches, a copy of the allowed rows
and then a matmul. A practitioner would first hand that expression to ``torch.compile``. This script times, at batch 1
with 1,000 and 10,000 random allowed tokens of the chapter's head (V = 128,256, D = 3,072, bf16), on the GPU clock
(CUDA-graph replay, the head rotated over copies that together exceed four times L2, as the chapter's benchmark does):

- ``step12``: the chapter's entry point (``step12_dispatch``), writing every logit (``-inf`` where not allowed);
- ``index_select``: the eager expression above (the chapter's benchmark's rival);
- ``index_select_compiled``: the same expression through ``torch.compile(mode="max-autotune-no-cudagraphs")``;
- ``gather_dot_compiled``: ``(W.index_select(0, ids).float() * h.float()).sum(-1)`` through the same compile, which
  Inductor turns into one reduction kernel that loads the allowed rows by index (a fused gather-GEMV).

Every output is checked against float64 first (the allowed logits within the fp32 summation bound, plus bf16's
rounding for the bf16 outputs). The rivals compute only the allowed logits; ours also writes ``-inf`` over the rest.

    PYTHONPATH=$PWD python lab/masked_lm_head/compiled_gather.py --out DIR    # GPU -> DIR/<gpu>/compiled_gather.json
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from studylog import runtime  # noqa: F401,I001  (before triton: it selects GPU or interpreter)

import numpy as np
import torch

from studylog.bench import BenchRun, write_lab_output
from studylog.masked_lm_head import CHAPTER, HIDDEN, VOCAB, AllowedTokens, check_logits
from studylog.masked_lm_head.dispatch import choose_path, dispatch_rule
from studylog.masked_lm_head.formats import fp32_gamma
from studylog.masked_lm_head.masks import random_sets

COUNTS = (1000, 10_000)
SEED = 1234
COPY_BUDGET = 48 * 2**30
MODE = "max-autotune-no-cudagraphs"


def index_select(h, w, ids):
    return torch.matmul(h, w.index_select(0, ids).t())


def gather_dot(h, w, ids):
    return (w.index_select(0, ids).float() * h.float()).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    run = BenchRun("masked_lm_head", command="lab/masked_lm_head/compiled_gather.py")
    dev = torch.device("cuda")
    torch.manual_seed(SEED)
    gen = np.random.default_rng(SEED)
    weight = (torch.randn(VOCAB, HIDDEN, device=dev) * 0.02).to(torch.bfloat16)
    head_bytes = weight.numel() * weight.element_size()
    h = torch.randn(1, HIDDEN, device=dev).to(torch.bfloat16)
    rule = dispatch_rule()
    step12 = CHAPTER.step(12).function
    compiled = {"index_select_compiled": torch.compile(index_select, mode=MODE, dynamic=False),
                "gather_dot_compiled": torch.compile(gather_dot, mode=MODE, dynamic=False)}
    rivals = {"index_select": index_select, **compiled}
    copies: list[torch.Tensor] = []

    for count in COUNTS:
        allowed = AllowedTokens.from_ids(random_sets(count, VOCAB, 1, gen), VOCAB, device=dev)
        ids = allowed.union_ids
        n = allowed.union_count
        union_bytes = n * HIDDEN * weight.element_size()
        wanted = run.rotation(union_bytes)
        k = min(wanted, max(1, COPY_BUDGET // head_bytes))
        while len(copies) < k - 1:
            copies.append(weight.clone())
        heads = [weight] + copies[:k - 1]
        params = {"batch": 1, "kind": "random", "allowed": count}
        extra = {"union": n, "copies": k, "read_bytes": union_bytes, "rotation_capped": wanted > k}
        floor = max(run.floor_ms(union_bytes + VOCAB * 4), run.empty_launch_gpu.median)

        # ours: checked on a NaN-poisoned output, then timed
        path = choose_path(1, VOCAB, n, rule)
        summation = "row" if path in ("few_ids", "stream") else "dot"
        out = step12(h, weight, allowed, out=torch.full((1, VOCAB), float("nan"), device=dev))
        res = check_logits(out, h, weight, allowed, summation=summation)
        run.check("step12", bool(res.pop("passed")), params=params | {"series": "step12"}, **res)
        out = torch.empty(1, VOCAB, device=dev)
        run.measure("step12", lambda: [functools.partial(step12, h, w, allowed, out=out) for w in heads],
                    params=params, host=lambda: step12(h, weight, allowed, out=out), floor_ms=floor, path=path,
                    **extra)

        # the rivals: the allowed logits only, against float64 with the fp32 bound (+ bf16 rounding for bf16 outputs)
        rows64 = weight.index_select(0, ids).double()
        ref = (h.double() @ rows64.t()).reshape(-1)
        bound = fp32_gamma(HIDDEN, "dot") * (h.double().abs() @ rows64.abs().t()).reshape(-1) + 1e-30
        for series, fn in rivals.items():
            got = fn(h, weight, ids).reshape(-1)
            torch.cuda.synchronize()
            allowed_err = bound + (2.0 ** -8 * ref.abs() if got.dtype == torch.bfloat16 else 0)
            err = (got.double() - ref).abs()
            run.check(series, bool((err <= allowed_err).all()) and not bool(torch.isnan(got).any()),
                      params=params | {"series": series}, dtype=str(got.dtype).replace("torch.", ""),
                      max_err_over_bound=float((err / allowed_err).max()))
            run.measure(series, lambda fn=fn: [functools.partial(fn, h, w, ids) for w in heads], params=params,
                        role="peer" if series in compiled else "baseline", host=lambda fn=fn: fn(h, weight, ids),
                        floor_ms=floor, **extra)

    run.note(f"torch.compile mode {MODE!r}, dynamic=False (one compile per union size, before timing); "
             "ours writes the [1, V] fp32 logits with -inf where not allowed, the rivals only the allowed logits "
             "(index_select in bf16, gather_dot in fp32).")
    path = write_lab_output(args.out, run.device["name"], "compiled_gather", run.to_json())
    for r in run.rows:
        print(f"{r['series']:>22} {r['params']['allowed']:>6}: {r['ms'] * 1e3:8.2f} µs  host {r['host_ms'] * 1e3:7.1f}")
    print("checks:", [(c["name"], c["passed"]) for c in run.checks], "->", path)


if __name__ == "__main__":
    main()
