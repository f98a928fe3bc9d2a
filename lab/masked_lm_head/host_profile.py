"""The Python cost of the chapter's entry point (step 12), with the kernel launch itself stubbed out: what the
wrapper spends around the launch (argument checks, tiles, the specialisation key, allocations), on any machine.

    PYTHONPATH=$PWD python lab/masked_lm_head/host_profile.py

Runs on the CPU (Triton's interpreter is never entered: the launcher call is replaced by one that works out the
specialisation key and looks it up, as on the GPU, and launches nothing). Prints µs per call and the torch
operations each call dispatches (an allocation shows as ``empty``), then a cProfile of step 12. The GPU run's
``host_ms`` adds the launcher itself (a few µs) to these.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from studylog import masked_lm_head as mlh


def launch_without_kernel(self, grid, args, constexprs):
    """FastKernel's work on the GPU up to the launcher call: the specialisation key and the cache lookup."""
    spec, _ = mlh.launch.specialization(args)
    self.cached()
    return (spec, tuple(constexprs.items()))


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def per_call_us(fn, n: int = 3000) -> float:
    fn()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return sorted(samples)[2]


def main() -> None:
    mlh.launch.FastKernel.__call__ = launch_without_kernel
    vocab, hidden = mlh.VOCAB, mlh.HIDDEN
    weight = torch.empty(vocab, hidden, dtype=torch.bfloat16)
    h = torch.zeros(1, hidden, dtype=torch.bfloat16)
    out = torch.empty(1, vocab)
    gen = np.random.default_rng(0)
    for n in (1, 1000, 10_000):
        allowed = mlh.AllowedTokens.from_ids([np.sort(gen.choice(vocab, n, replace=False))], vocab, device="cpu")
        allowed.mask_u8, allowed.kernel_ids  # made once per allowed set, as in a decode loop
        # Step 12 alone launches through the compiled launchers (the steps before it use kernel[grid], whose
        # host time is Triton's own), so it is the entry point whose wrapper cost this profile isolates.
        calls = {"step12_dispatch(out=)": lambda: mlh.step12_dispatch(h, weight, allowed, out=out),
                 "step12_dispatch()": lambda: mlh.step12_dispatch(h, weight, allowed)}
        for name, fn in calls.items():
            with Ops() as ops:
                fn()
            print(f"{n:>6} allowed  {name:<24} {per_call_us(fn):6.2f} µs   torch ops per call: {ops.ops}")
    allowed = mlh.AllowedTokens.from_ids([np.arange(1000)], vocab, device="cpu")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20_000):
        mlh.step12_dispatch(h, weight, allowed, out=out)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
    print(text.getvalue())


if __name__ == "__main__":
    main()
