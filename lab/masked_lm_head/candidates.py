"""The batch-1 candidates and the tile sweeps behind the chapter's default tiles (GPU only).

    python lab/masked_lm_head/candidates.py [--quick]

writes ``lab/masked_lm_head/results/<gpu>/candidates_<commit>.json`` (the ``BenchRun`` format). Until commit
69a3b83 this was the ``tile_sweep`` part of the chapter's benchmark; the series it measures (new names,
and the names they had in that benchmark) are listed in ``lab/masked_lm_head/README.md``. Every series is
checked against float64 on a poisoned output before it is timed, as in the benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the frozen variants beside this script

from studylog import bench as harness  # noqa: E402
from studylog import paths  # noqa: E402
from studylog.masked_lm_head import (CHAPTER, HIDDEN, VOCAB, AllowedTokens, step03_row_skip,  # noqa: E402
                                     step04_compact, step07_stream, step08_few_ids, step10_batched)
from studylog.masked_lm_head.formats import Tiles, batch_tile  # noqa: E402
from studylog.masked_lm_head.masks import clustered_sets, random_sets  # noqa: E402
from variants import eviction, persistent  # noqa: E402


def main(quick: bool) -> Path:
    S = {n: CHAPTER.step(n).series for n in range(14)}
    run = harness.BenchRun("masked_lm_head", command="python lab/masked_lm_head/candidates.py"
                           + (" --quick" if quick else ""), quick=quick)
    vocab, hidden, dev = VOCAB, HIDDEN, torch.device("cuda")
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(vocab, hidden, device=dev) * 0.02).to(torch.bfloat16)
    row_bytes = hidden * weight.element_size()
    times = {"warmup": 5, "rep": 30}

    def measure(series, fn, params, h, allowed, **extra):
        out = fn(torch.full((h.shape[0], vocab), float("nan"), device=dev))  # poisoned
        torch.cuda.synchronize()
        w64 = weight.double()
        ref = h.double() @ w64.t()
        bound = hidden * 2.0**-24 * (h.double().abs() @ w64.abs().t()) + 1e-30
        got, mask = out.double(), allowed.mask
        err = (got - ref).abs()[mask]
        res = {"nan": int(torch.isnan(got).sum()), "not_minus_inf": int((got[~mask] != float("-inf")).sum()),
               "over_bound": int((err > bound[mask]).sum())}
        run.check(series, all(v == 0 for v in res.values()), params=params | {"series": series}, **res)
        ms = run.time(lambda: fn(None), **times)
        run.record(series, ms, params=params, floor_ms=max(run.floor_ms(allowed.union_count * row_bytes),
                                                           run.empty_launch_ms), **extra)

    h1 = torch.randn(1, hidden, device=dev).to(torch.bfloat16)
    # batch 1 candidates, each measured on the same set as steps 4 and 7
    for count in [1, 3, 8, 1000, 10_000] if quick else [1, 3, 8, 100, 1000, 3000, 10_000, 44_026]:
        for kind in ("random", "clustered") if count == 10_000 else ("random",):
            sets = (random_sets if kind == "random" else clustered_sets)(count, vocab, 1, gen)
            a = AllowedTokens.from_ids(sets, vocab, device=dev)
            p = {"batch": 1, "kind": kind, "allowed": count}
            cands = {f"cand_{S[4]}": lambda out: step04_compact(h1, weight, a, out=out),
                     f"cand_{S[7]}": lambda out: step07_stream(h1, weight, a, out=out),
                     f"cand_{S[7]}_no_hint": lambda out: eviction.stream(h1, weight, a, eviction="", out=out)}
            if a.few_ids is not None:
                cands[f"cand_{S[8]}"] = lambda out: step08_few_ids(h1, weight, a, out=out)
                cands[f"cand_{S[8]}_no_hint"] = lambda out: eviction.few_ids(h1, weight, a, eviction="", out=out)
            for series, fn in cands.items():
                measure(series, fn, p, h1, a)
            if a.few_ids is not None:  # step 8's launch shape: fewer warps, smaller fill chunks
                for warps, fill in ((1, 1024), (2, 1024), (2, 2048), (4, 1024), (4, 2048), (8, 8192)):
                    t = Tiles(block_b=1, block_v=1, fill_block=fill, num_warps=warps, num_stages=1)
                    measure(f"{S[8]}_tiles", lambda out, t=t: step08_few_ids(h1, weight, a, out=out, tiles=t),
                            p | {"num_warps": warps, "fill_block": fill}, h1, a)
            run.record("cand_index_select", run.time(lambda: torch.matmul(h1, weight.index_select(0, a.union_ids).t()),
                                                      **times), params=p, role="baseline")
            for rows, warps, per_sm in ((1, 4, 4), (2, 4, 4), (2, 4, 8)):
                t = Tiles(block_b=1, block_v=rows, fill_block=4096, num_warps=warps, num_stages=1)
                measure("cand_persistent",
                        lambda out, t=t, k=per_sm: persistent.persistent(h1, weight, a, out=out, tiles=t,
                                                                         programs_per_sm=k),
                        p | {"rows": rows, "num_warps": warps, "programs_per_sm": per_sm}, h1, a)
    for count in [1000, 10_000] if quick else [1000, 10_000, 40_000]:
        a = AllowedTokens.from_ids(random_sets(count, vocab, 1, gen), vocab, device=dev)
        p = {"batch": 1, "kind": "random", "allowed": count}
        for rows in (1, 2, 4):
            for warps in (2, 4, 8):
                t = Tiles(block_b=1, block_v=rows, fill_block=4096, num_warps=warps, num_stages=1)
                measure(f"{S[7]}_tiles", lambda out, t=t: step07_stream(h1, weight, a, out=out, tiles=t),
                        p | {"rows": rows, "num_warps": warps}, h1, a)
        for rows in (1, 2, 4, 8):
            for warps in (4, 8):
                t = Tiles(block_b=1, block_v=rows, block_d=1024, fill_block=4096, num_warps=warps, num_stages=1)
                measure(f"{S[4]}_tiles", lambda out, t=t: step04_compact(h1, weight, a, out=out, tiles=t),
                        p | {"rows": rows, "num_warps": warps}, h1, a)
    for batch, count in ((8, 10), (64, 128)):  # step 10 at a small union and at 0.1% of V per sequence
        hb = torch.randn(batch, hidden, device=dev).to(torch.bfloat16)
        a = AllowedTokens.from_ids(random_sets(count, vocab, batch, gen), vocab, device=dev)
        for block_v, block_d, stages in ((16, 256, 3), (16, 128, 4), (32, 128, 4), (64, 64, 4)):
            t = Tiles(block_b=batch_tile(batch), block_v=block_v, block_d=block_d, fill_block=4096, num_warps=4,
                      num_stages=stages)
            measure(f"{S[10]}_tiles", lambda out, t=t: step10_batched(hb, weight, a, out=out, tiles=t),
                    {"batch": batch, "kind": "random", "allowed": count, "block_v": block_v, "block_d": block_d,
                     "num_stages": stages}, hb, a, union=a.union_count)
    a = AllowedTokens.from_ids([np.arange(vocab)], vocab, device=dev)
    for block_v, block_d, stages in ((64, 128, 4), (32, 256, 3), (128, 64, 4), (64, 256, 3)):
        t = Tiles(block_b=16, block_v=block_v, block_d=block_d, num_warps=4, num_stages=stages)
        measure(f"{S[3]}_tiles", lambda out, t=t: step03_row_skip(h1, weight, a, out=out, tiles=t),
                {"batch": 1, "kind": "random", "allowed": vocab, "block_v": block_v, "block_d": block_d,
                 "num_stages": stages}, h1, a)

    data = run.to_json()
    folder = paths.lab_results("masked_lm_head", harness.gpu_slug(run.device["name"]))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"candidates_{data['git_commit'][:7]}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer counts, for trying the script out")
    print(main(parser.parse_args().quick))
