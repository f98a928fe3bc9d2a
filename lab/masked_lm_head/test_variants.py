"""Tests of the variants kept in lab/ (not part of the library's suite):

    PYTHONPATH=$PWD python -m pytest -p no:cacheprovider lab/masked_lm_head/test_variants.py

Each variant against a float64 reference on fresh random inputs, with the output poisoned (NaN) first, at
sizes that are not multiples of any block; on a GPU also at full size.
"""

import numpy as np
import pytest
import torch

from studylog import masked_lm_head as mlh
from studylog import runtime
from variants import eviction, persistent

DEV = runtime.device()
V, D = 203, 77
SMALL_ROWS = mlh.formats.Tiles(block_b=1, block_v=4, block_d=32, fill_block=64, num_warps=4, num_stages=1)
MASK_KINDS = ["random", "empty", "all", "last", "few"]


@pytest.fixture
def gen():
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed: {seed}")
    return np.random.default_rng(seed)


def inputs(gen, kind, vocab=V, hidden=D):
    g = torch.Generator().manual_seed(int(gen.integers(2**31)))
    h = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(DEV)
    weight = torch.randn(vocab, hidden, generator=g).to(torch.bfloat16).to(DEV)
    ids = {"random": lambda: np.flatnonzero(gen.random(vocab) < 0.1), "empty": lambda: np.array([], dtype=np.int64),
           "all": lambda: np.arange(vocab), "last": lambda: np.array([vocab - 1]),
           "few": lambda: gen.choice(vocab, size=3, replace=False)}[kind]()
    return h, weight, mlh.AllowedTokens.from_ids([ids], vocab, device=DEV)


def assert_logits(out, h, weight, allowed):
    result = mlh.check_logits(out, h, weight, allowed)
    assert result["passed"], result


def poisoned(vocab=V):
    return torch.full((1, vocab), float("nan"), device=DEV)


@pytest.mark.parametrize("programs", [1, 2, 5])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_persistent(kind, programs, gen):
    """Few programs, so each loops over many blocks of ids."""
    h, weight, allowed = inputs(gen, kind)
    out = persistent.persistent(h, weight, allowed, out=poisoned(), tiles=SMALL_ROWS, programs=programs)
    assert_logits(out, h, weight, allowed)


def test_persistent_default_launch_and_refusals(gen):
    h, weight, allowed = inputs(gen, "random", vocab=97, hidden=1100)
    assert_logits(persistent.persistent(h, weight, allowed, out=poisoned(97)), h, weight, allowed)
    with pytest.raises(ValueError, match="eviction must be one of"):
        persistent.persistent(h, weight, allowed, eviction="evict_sometimes")
    with pytest.raises(ValueError, match="at least 1"):
        persistent.persistent(h, weight, allowed, programs=0)


@pytest.mark.parametrize("policy", ["", "evict_last", "evict_first"])
@pytest.mark.parametrize("kind", ["random", "few", "all"])
def test_other_eviction_policies(kind, policy, gen):
    h, weight, allowed = inputs(gen, kind)
    out = eviction.stream(h, weight, allowed, eviction=policy, out=poisoned(), tiles=SMALL_ROWS)
    assert_logits(out, h, weight, allowed)
    if allowed.few_ids is not None:
        out = eviction.few_ids(h, weight, allowed, eviction=policy, out=poisoned())
        assert_logits(out, h, weight, allowed)
    with pytest.raises(ValueError, match="eviction must be one of"):
        eviction.stream(h, weight, allowed, eviction="evict_sometimes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("count", [3, 1000, 10_000])
def test_full_size(count, gen):
    weight = (torch.randn(mlh.VOCAB, mlh.HIDDEN, device="cuda") * 0.02).to(torch.bfloat16)
    h = torch.randn(1, mlh.HIDDEN, device="cuda").to(torch.bfloat16)
    allowed = mlh.AllowedTokens.from_ids(mlh.masks.random_sets(count, mlh.VOCAB, 1, gen), mlh.VOCAB, device="cuda")
    runs = {"stream_no_hint": lambda out: eviction.stream(h, weight, allowed, eviction="", out=out)}
    for rows, per_sm in ((1, 4), (2, 8)):
        t = mlh.formats.Tiles(block_b=1, block_v=rows, num_warps=4, num_stages=1)
        runs[f"persistent_{rows}_{per_sm}"] = (
            lambda out, t=t, k=per_sm: persistent.persistent(h, weight, allowed, out=out, tiles=t, programs_per_sm=k))
    if allowed.few_ids is not None:
        runs["few_ids_no_hint"] = lambda out: eviction.few_ids(h, weight, allowed, eviction="", out=out)
    for name, fn in runs.items():
        out = fn(poisoned(mlh.VOCAB))
        torch.cuda.synchronize()
        result = mlh.check_logits(out, h, weight, allowed)
        assert result["passed"], (name, result)
