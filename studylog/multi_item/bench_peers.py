"""The benchmark's peers: each setting of FlexAttention and FlashInfer checked against the float32 reference,
the best one measured."""

from __future__ import annotations

import torch

from studylog.multi_item.report import FLASHINFER, FLEX, STEP05, flex_variants, graph_calls_for


def bench_flex(run, batch, q, k, v, sm_scale, check, measure, rotated) -> None:
    """FlexAttention at each block size of the sweep (one graph timing each), the best one measured."""
    from torch.nn.attention.flex_attention import flex_attention

    from studylog.multi_item.peers import flex_block_mask

    flex = torch.compile(flex_attention, dynamic=False)
    gqa = k.shape[0] != q.shape[0]  # grouped-query attention: FlexAttention's enable_gqa

    def call(qkv, block_mask, options):
        return flex(*(x[None] for x in qkv), block_mask=block_mask, scale=sm_scale, kernel_options=options,
                    enable_gqa=gqa)

    def make_calls(block_mask, options):
        return rotated(lambda *qkv: lambda: call(qkv, block_mask, options))

    sweep, masks = {}, {}
    try:
        for variant, block, options in flex_variants(run.quick):
            masks[variant] = (flex_block_mask(batch, block), options)
            if not check(f"{FLEX} ({variant})", call((q, k, v), *masks[variant])[0]):
                continue
            calls = make_calls(*masks[variant])()
            sweep[variant] = run.gpu_time(lambda: calls, repeats=1, min_calls=graph_calls_for(1.0), reps=5).median
            del calls
    except Exception as err:  # a peer's failure costs its rows, not the chapter's run
        run.note(f"{FLEX} on {batch.describe()}: {type(err).__name__}: {err}")
    if not sweep:
        return
    best = min(sweep, key=sweep.get)
    block_mask, options = masks[best]
    measure(FLEX, make_calls(block_mask, options), "baseline", block_size=best, sweep_ms=sweep,
            flex_block_density=float((block_mask.to_dense() != 0).float().mean()))  # blocks it computes


def bench_flashinfer(run, module, batch, q, k, v, ours_out, sm_scale, check, measure, rotated, params) -> None:
    """FlashInfer at each (backend, page size), also checked against our output; the best one measured."""
    from studylog.multi_item.peers import flashinfer_backends, flashinfer_inputs, flashinfer_prefill

    heads = q.shape[0]
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    sweep, setups = {}, {}
    backends = flashinfer_backends(module)  # its default backend, one-token pages, in a quick run
    for backend, page in [(backends[0], 1)] if run.quick else [(b, p) for b in backends for p in (1, 16)]:
        key = f"{backend}, page {page}"
        try:
            inputs = flashinfer_inputs(q, k, v, batch, page)
            wrapper = flashinfer_prefill(module, inputs, heads, sm_scale, backend, workspace)
            got = wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache)).transpose(0, 1)
            ok = check(f"{FLASHINFER} ({key})", got)
            diff = (got.float() - ours_out.float()).abs()
            run.check(f"{FLASHINFER} ({key}) matches {STEP05.name} within bf16 rounding", bool(
                (diff <= 1e-2 + 1.6e-2 * ours_out.float().abs()).all()), params=params, max_abs_err=float(diff.max()))
            if not ok:
                continue

            def call(qq, kk, vv, page=page, backend=backend):
                x = flashinfer_inputs(qq, kk, vv, batch, page)
                w = flashinfer_prefill(module, x, heads, sm_scale, backend, workspace)
                o = torch.empty_like(x.q)
                return lambda: w.run(x.q, (x.k_cache, x.v_cache), out=o)

            make_calls = rotated(call)
            setups[key] = (inputs, wrapper, make_calls, backend, page)
            sweep[key] = run.gpu_time(make_calls, repeats=1, min_calls=graph_calls_for(1.0), reps=5).median
        except Exception as err:  # a peer's failure costs its rows, not the chapter's run
            run.note(f"{FLASHINFER} ({key}) on {batch.describe()}: {type(err).__name__}: {err}")
    if not sweep:
        return
    best = min(sweep, key=sweep.get)
    inputs, wrapper, make_calls, backend, page = setups[best]
    out = torch.empty_like(inputs.q)
    measure(FLASHINFER, make_calls, "peer", host=lambda: wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache),
                                                                     out=out),
            backend=backend, page_size=page, sweep_ms=sweep, rule="flashinfer",
            max_item_len=[int(x) for x in batch.max_item_lens_t.tolist()])
