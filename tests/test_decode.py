"""Chapter 7: the decode loop. The three configurations write the same tokens on every schema of the suite
(tiny model, CPU), bad input is refused with an error that names it, checkpoints round-trip (and match
Hugging Face's Llama where transformers is installed), and the pieces the loop rests on (the ASCII regex,
the two libraries' masks, chunked forwards, the masked head's adapter) are checked against references."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from studylog.decode import (CONFIGS, Decoder, Grammar, LlamaModel, model_config, step01_baseline, step02_jump_forward,
                             step03_masked_head, suite_names, suite_sample)
from studylog.decode import pieces, report
import lab_scripts
from decode_helpers import LocalRun, from_module, load_checkpoint, save_checkpoint
from studylog.decode.grammar import ascii_regex
from studylog.decode.generation import gumbel_noise
from book.decode import results as decode_results

STEPS = ("baseline", "jump_forward", "masked_head", "automaton_mask")
SUITE = suite_names()
PROMPT = "Give the answer in the required format."


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel(model_config("tiny"), dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def decoder(tiny):
    return Decoder(tiny, batch=1, max_seq=200)


@pytest.fixture(scope="module")
def decoder2(tiny):
    return Decoder(tiny, batch=2, max_seq=200)


def _run_all(decoder, grammar, prompts, configs=STEPS, **kw):
    return {c: decoder.generate(grammar, prompts, c, **kw) for c in configs}


# --- the same tokens in every configuration ---------------------------------------------------------------

@pytest.mark.parametrize("name", SUITE)
def test_every_configuration_writes_the_same_tokens(decoder, name):
    """Greedy decoding of the random model (its own choices) and of the steered one (a realistic sample): the
    steps write the same tokens; the steered output is the sample, and jumps saved forwards on it."""
    ws = "compact"
    grammar = Grammar.from_suite(name, whitespace=ws)
    free = _run_all(decoder, grammar, [PROMPT], max_new_tokens=24)
    for c, out in free.items():
        assert out.ids == free["baseline"].ids, (name, c, out.text, free["baseline"].text)
        assert len(out.ids[0]) <= 24
    sample = suite_sample(name, seed=3, whitespace=ws)
    steered = _run_all(decoder, grammar, [PROMPT], max_new_tokens=96, targets=[sample])
    base = steered["baseline"]
    assert base.finished == [True] and base.text == [sample.encode()], (base.text, sample)
    assert base.forwards == base.tokens + 1  # one forward per token, and one for EOS
    for c, out in steered.items():
        assert out.ids == base.ids, (name, c)
        if c != "baseline":
            # each jumped token saved a forward, and so did an EOS that was the only token allowed
            assert base.forwards - out.forwards - sum(out.jumped) in (0, 1), (name, c)


def test_the_step_functions_are_the_configurations(decoder):
    grammar = Grammar.from_suite("us_phone")
    sample = suite_sample("us_phone", seed=1)
    outs = [f(decoder, grammar, [PROMPT], targets=[sample]) for f in
            (step01_baseline, step02_jump_forward, step03_masked_head)]
    assert [o.config for o in outs] == ["baseline", "jump_forward", "masked_head"]
    assert all(o.ids == outs[0].ids and o.text == [sample.encode()] for o in outs)
    assert outs[1].forwards < outs[0].forwards


@pytest.mark.parametrize("name", ["tool_call", "shopping_list", "ipv4"])
def test_a_batch_writes_what_each_sequence_writes_alone(decoder, decoder2, name):
    """Batch 2, sequences of different lengths (one finishes first and rides along), steered and free."""
    grammar = Grammar.from_suite(name, whitespace="compact")
    targets = [suite_sample(name, seed=s, whitespace="compact") for s in (0, 5)]
    both = _run_all(decoder2, grammar, [PROMPT, PROMPT + " Be brief."], max_new_tokens=80, targets=targets)
    for c, out in both.items():
        assert out.ids == both["baseline"].ids, c
        assert out.text == [t.encode() for t in targets], c
    alone = decoder.generate(grammar, [PROMPT + " Be brief."], "masked_head", max_new_tokens=80, targets=targets[1:])
    assert alone.ids[0] == both["baseline"].ids[1]
    free = _run_all(decoder2, grammar, [PROMPT, "Another prompt entirely"], max_new_tokens=20)
    assert all(out.ids == free["baseline"].ids for out in free.values())


def test_seeded_sampling_is_the_same_in_every_configuration(decoder2):
    grammar = Grammar.from_suite("weather_call", whitespace="compact")
    outs = _run_all(decoder2, grammar, [PROMPT, PROMPT], max_new_tokens=30, temperature=1.0, seed=7)
    assert all(o.ids == outs["baseline"].ids for o in outs.values())
    again = decoder2.generate(grammar, [PROMPT, PROMPT], "baseline", max_new_tokens=30, temperature=1.0, seed=7)
    other = decoder2.generate(grammar, [PROMPT, PROMPT], "baseline", max_new_tokens=30, temperature=1.0, seed=8)
    greedy = decoder2.generate(grammar, [PROMPT, PROMPT], "baseline", max_new_tokens=30)
    assert again.ids == outs["baseline"].ids
    assert other.ids != again.ids and greedy.ids != again.ids
    assert outs["baseline"].ids[0] != outs["baseline"].ids[1]  # the noise depends on the sequence


def test_jumps_never_write_past_the_cap(decoder):
    """A forced chain longer than what is left of max_new_tokens is cut at the cap (every cap up to the
    sample's length), and the cut output is the baseline's."""
    grammar = Grammar.from_suite("weather_call", whitespace="compact")
    sample = suite_sample("weather_call", seed=0, whitespace="compact")
    n = len(decoder.vocab.encode(sample))
    for cap in range(1, n + 1, 2):
        outs = _run_all(decoder, grammar, [PROMPT], max_new_tokens=cap, targets=[sample])
        assert all(len(o.ids[0]) <= cap and o.ids == outs["baseline"].ids for o in outs.values()), cap


@pytest.mark.parametrize("name", ["weather_call", "calendar_event", "sql_query", "classifier"])
def test_character_jumps_write_the_sample_with_fewer_forwards(decoder, name):
    """Character-level jumps retokenize: the steered output is still the sample's text, in fewer forwards
    than token-level jumps; the tokens may differ from the baseline's."""
    grammar = Grammar.from_suite(name, whitespace="compact")
    sample = suite_sample(name, seed=2, whitespace="compact")
    outs = _run_all(decoder, grammar, [PROMPT], ("jump_forward", "char_jump"), max_new_tokens=96, targets=[sample])
    char = outs["char_jump"]
    assert char.finished == [True] and char.text == [sample.encode()]
    assert char.forwards <= outs["jump_forward"].forwards
    assert grammar.automaton.fsm.matches(char.text[0])


# --- the pieces --------------------------------------------------------------------------------------------

def test_ascii_regex():
    assert ascii_regex(r"\d{4}-\d\d") == "[0-9]{4}-[0-9][0-9]"
    assert ascii_regex(r"[\d.]+\s") == "[0-9.]+[ \\t\\n\\r\\f\\v]"
    assert ascii_regex(r"[\w-]") == "[0-9A-Za-z_-]"
    assert ascii_regex(r"\\d") == r"\\d"  # an escaped backslash, then the letter d
    assert ascii_regex(r"[]\d]") == "[]0-9]"
    assert ascii_regex(r"a\ b\.c") == r"a b\.c"
    with pytest.raises(ValueError, match=r"\\D"):
        ascii_regex(r"\D+")


@pytest.mark.parametrize("name", ["datetime", "tool_call", "article_summary"])
def test_xgrammar_and_the_automaton_allow_the_same_tokens(name):
    """The premise of comparing them: along a sample, xgrammar's bitmask is the automaton's allowed set in
    every state (schemas with dates, where Unicode digits would otherwise differ), but for the tokens xgrammar's
    byte-level matching lets through and its own grammar cannot continue from (invalid UTF-8, or a dead end such
    as " \xe0" before a digit), which ``Grammar.check_agreement`` tolerates and the loop refuses."""
    import xgrammar as xgr

    from studylog.decode.grammar import utf8_prefix

    grammar = Grammar.from_suite(name)
    vocab = grammar.vocab
    ids = vocab.encode(suite_sample(name, seed=4))
    matcher = grammar.matcher()
    bits = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    probe = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    state = grammar.automaton.initial
    for i in range(len(ids) + 1):
        matcher.fill_next_token_bitmask(bits)
        got = np.flatnonzero(np.unpackbits(bits[0].numpy().view(np.uint8), bitorder="little")[:vocab.vocab_size])
        mine = grammar.automaton.allowed_ids(state)
        assert np.isin(mine, got).all(), (name, i)
        for t in np.setdiff1d(got, mine):
            # its mask allows the token; its matcher either refuses it or can go nowhere after it
            if utf8_prefix(vocab.decode(ids[:i]) + vocab.token_bytes[t]) and matcher.accept_token(int(t)):
                matcher.fill_next_token_bitmask(probe)
                assert not probe.any() and not matcher.is_terminated(), (name, i, vocab.show(int(t)))
                matcher.rollback(1)
        if i < len(ids):
            assert matcher.accept_token(ids[i])
            state = grammar.automaton.next(state, ids[i])


def test_batch_allowed_sets_are_the_union_of_the_states():
    grammar = Grammar.from_suite("product", whitespace="compact")
    states = [grammar.automaton.initial]
    for t in grammar.vocab.encode(suite_sample("product", seed=1, whitespace="compact"))[:6]:
        states.append(grammar.automaton.next(states[-1], t))
    pick = [states[1], states[4], None, states[1]]
    allowed = grammar.allowed(pick, "cpu")
    sets = [grammar.automaton.allowed_ids(s) if s is not None else np.zeros(0, np.int64) for s in pick]
    assert allowed.counts == tuple(len(s) for s in sets)
    assert np.array_equal(allowed.union_ids.numpy(), np.unique(np.concatenate(sets)))
    for b, s in enumerate(sets):
        assert np.array_equal(allowed.mask[b].nonzero().flatten().numpy(), s)


def test_masked_head_kernel_matches_its_torch_path(rng):
    """Chapter 2's kernels (Triton's interpreter here) and the torch path give the same logits: one sequence
    with a few ids, one with more, and a batch with its own sets."""
    V, D = 1000, 48
    w = torch.randn(V, D, generator=rng).bfloat16()
    for batch, sizes in ((1, [5]), (1, [70]), (3, [3, 40, 0])):
        h = torch.randn(batch, D, generator=rng).bfloat16()
        sets = [np.sort(np.random.default_rng(int(rng.seed_value) + n).choice(V, n, replace=False)) for n in sizes]
        if batch == 1:
            allowed = pieces.AllowedTokens.from_ids([sets[0]], V, device="cpu")
        else:
            mask = torch.zeros(batch, V, dtype=torch.bool)
            for b, s in enumerate(sets):
                mask[b, torch.from_numpy(s)] = True
            allowed = pieces.allowed_batch(mask, np.unique(np.concatenate(sets)), tuple(sizes))
        a = pieces.masked_head_kernel(h, w, allowed, torch.full((batch, V), 7.0))
        b = pieces.masked_head_torch(h, w, allowed, torch.full((batch, V), 7.0))
        assert torch.equal(torch.isinf(a), torch.isinf(b)) and torch.isinf(a).sum() == batch * V - sum(sizes)
        fin = ~torch.isinf(a)
        torch.testing.assert_close(a[fin], b[fin], rtol=1e-5, atol=1e-5)


def test_a_chunked_forward_equals_token_by_token(rng):
    m = LlamaModel(model_config("tiny", vocab_size=500, layers=3), dtype=torch.float64, seed=2)
    toks = torch.randint(0, 500, (2, 13), generator=rng)
    full = m(toks, torch.zeros(2, dtype=torch.long), torch.tensor([12, 12]), m.new_cache(2, 40))
    cache = m.new_cache(2, 40)
    m(toks[:, :6], torch.zeros(2, dtype=torch.long), torch.tensor([5, 5]), cache)
    for t in range(6, 9):
        m(toks[:, t:t + 1], torch.full((2,), t), torch.zeros(2, dtype=torch.long), cache)
    padded = torch.cat([toks[:, 9:], torch.randint(0, 500, (2, 5), generator=rng)], dim=1)  # 4 real, 5 padding
    step = m(padded, torch.full((2,), 9), torch.tensor([3, 3]), cache)
    torch.testing.assert_close(step, full, rtol=1e-10, atol=1e-10)


# --- the fused body's kernels (Triton's interpreter here), against float64 references ----------------------------

def _attention_reference(q, kc, vc, start, T):
    """float64 attention of q [B, T, H, d] over the cache [B, Hkv, S, d], query t at position start[b] + t."""
    B, _, H, d = q.shape
    Hkv, S = kc.shape[1], kc.shape[2]
    k = kc.double().repeat_interleave(H // Hkv, dim=1)  # [B, H, S, d]
    v = vc.double().repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("bthd,bhsd->bhts", q.double(), k) / d ** 0.5
    pos = start[:, None] + torch.arange(T)
    visible = torch.arange(S)[None, None, :] <= pos[:, :, None]  # [B, T, S]
    p = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1)
    return torch.einsum("bhts,bhsd->bthd", p, v).reshape(B, T, H * d)


@pytest.mark.parametrize("B,T,H,Hkv,hd,S", [(2, 5, 6, 2, 24, 101), (1, 1, 4, 1, 16, 70), (3, 9, 8, 8, 32, 40)])
def test_fused_attention_matches_float64(rng, B, T, H, Hkv, hd, S):
    """Awkward sizes: groups of 3, a head size that is not a power of two, caches that are not a multiple of the
    key block, chunks that reach the cache's end; poisoned cache positions after each chunk's last position
    must not be read."""
    from studylog.decode import kernels

    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        qkv = torch.randn(B, T, (H + 2 * Hkv) * hd, generator=rng).to(dtype)
        kc = torch.randn(B, Hkv, S, hd, generator=rng).to(dtype)
        vc = torch.randn(B, Hkv, S, hd, generator=rng).to(dtype)
        start = torch.randint(0, S - T + 1, (B,), generator=rng)
        start[0] = S - T  # a chunk that ends at the cache's last position
        for b in range(B):  # beyond each chunk's last position: never visible, never read
            kc[b, :, start[b] + T:] = float("nan")
            vc[b, :, start[b] + T:] = float("nan")
        out = torch.full((B, T, H * hd), 7.0, dtype=dtype)
        got = kernels.attention(qkv, kc, vc, start, H, 1 / hd ** 0.5, out=out)
        ref = _attention_reference(qkv.view(B, T, -1, hd)[:, :, :H], kc.nan_to_num(), vc.nan_to_num(), start, T)
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


def test_fused_rope_norm_and_swiglu_match_torch(rng):
    """fp32 (where the rounding steps are exact): the rope + cache write equals the torch path's formula bit for
    bit, the residual add + RMSNorm and SwiGLU agree to fp32 rounding; the gathering norm reads row last[b]
    and leaves x as it is."""
    from studylog.decode import kernels
    from studylog.decode.model import rms_norm, rotate_half

    B, T, H, Hkv, hd, S = 2, 5, 6, 2, 24, 37
    m = LlamaModel(model_config("tiny", vocab_size=50, hidden=H * hd, heads=H, kv_heads=Hkv, head_dim=hd),
                   dtype=torch.float32, seed=1)
    cos, sin = m._rope_tables(S)
    qkv = torch.randn(B, T, (H + 2 * Hkv) * hd, generator=rng)
    start = torch.tensor([3, S - T])
    kc, vc = torch.full((B, Hkv, S, hd), 5.0), torch.full((B, Hkv, S, hd), 5.0)
    pos = start[:, None] + torch.arange(T)
    c, s = cos[pos][:, :, None], sin[pos][:, :, None]
    q, k, v = qkv.view(B, T, -1, hd).split((H, Hkv, Hkv), dim=2)
    want_q, want_k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    got = qkv.clone()
    kernels.rope_cache(got, kc, vc, cos, sin, start, H, Hkv)
    assert torch.equal(got.view(B, T, -1, hd)[:, :, :H], want_q)
    assert torch.equal(got.view(B, T, -1, hd)[:, :, H:], qkv.view(B, T, -1, hd)[:, :, H:])  # k, v untouched there
    for b in range(B):
        assert torch.equal(kc[b][:, pos[b]], want_k[b].transpose(0, 1))
        assert torch.equal(vc[b][:, pos[b]], v[b].transpose(0, 1))
        others = torch.ones(S, dtype=torch.bool)
        others[pos[b]] = False
        assert (kc[b][:, others] == 5.0).all() and (vc[b][:, others] == 5.0).all()
    near_end = torch.full((B, Hkv, S, hd), 5.0)  # a chunk that runs past the cache writes only what fits
    kernels.rope_cache(qkv.clone(), near_end, near_end.clone(), cos, sin, torch.tensor([S - 2, S - 1]), H, Hkv)
    assert (near_end[0, :, S - 2:] != 5.0).all() and (near_end[0, :, :S - 2] == 5.0).all()
    assert (near_end[1, :, S - 1] != 5.0).all() and (near_end[1, :, :S - 1] == 5.0).all()

    D = 200  # not a power of two
    x, a = torch.randn(B, T, D, generator=rng), torch.randn(B, T, D, generator=rng)
    w = torch.rand(D, generator=rng) + 0.5
    x2 = x.clone()
    h = kernels.add_rms_norm(x2, w, 1e-5, add=a)
    assert torch.equal(x2, x + a)
    torch.testing.assert_close(h, rms_norm(x + a, w, 1e-5), rtol=1e-6, atol=1e-6)
    last = torch.tensor([4, 1])
    x3 = x.clone()
    g = kernels.add_rms_norm(x3, w, 1e-5, add=a, last=last)
    assert torch.equal(x3, x)
    torch.testing.assert_close(g, rms_norm((x + a)[torch.arange(B), last], w, 1e-5), rtol=1e-6, atol=1e-6)

    gu = torch.randn(B, T, 2 * 1100, generator=rng) * 4  # more than one column block
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gu), torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("N,K", [(50, 72), (33, 300), (8, 16), (70, 1030)])
def test_gemv_matches_the_composition_it_replaces(rng, N, K):
    """Each form of the one-token product against float64 products of what torch computes in front (RMSNorm,
    SwiGLU, rounded as the model rounds them) and the residual add behind: sizes that are not multiples of the
    tile (and K above one block)."""
    from studylog.decode import kernels
    from studylog.decode.model import rms_norm

    x, w = torch.randn(1, 1, K, generator=rng), torch.randn(N, K, generator=rng) / K ** 0.5
    nw = torch.rand(K, generator=rng) + 0.5
    ref = lambda a: (a.double() @ w.double().t()).float()  # noqa: E731
    torch.testing.assert_close(kernels.gemv(x, w), ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernels.gemv(x, w, norm=nw, eps=1e-5), ref(rms_norm(x, nw, 1e-5)), rtol=1e-5,
                               atol=1e-5)
    gu = torch.randn(1, 1, 2 * K, generator=rng) * 3
    gate, up = gu.chunk(2, dim=-1)
    swiglu = ref(torch.nn.functional.silu(gate) * up)
    torch.testing.assert_close(kernels.gemv(gu, w, swiglu=True), swiglu, rtol=1e-5, atol=1e-5)
    res = torch.randn(1, 1, N, generator=rng)
    got = res.clone()
    assert kernels.gemv(gu, w, swiglu=True, add_to=got) is got
    torch.testing.assert_close(got, res + swiglu, rtol=1e-5, atol=1e-5)
    zeros = torch.zeros(N)  # the add form into zeros is the plain product: every entry is written
    torch.testing.assert_close(kernels.gemv(x, w, add_to=zeros), ref(x).flatten(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=f"rows of {K}"):
        kernels.gemv(torch.randn(2, K + 1), w)
    with pytest.raises(ValueError, match="with swiglu"):
        kernels.gemv(x, w, swiglu=True)
    with pytest.raises(ValueError, match="add_to"):
        kernels.gemv(x, w, add_to=torch.zeros(N + 1))


#: The body's shape where Triton's interpreter runs whole layers: groups of three query heads over one KV head, an
#: MLP width that is not a power of two; the one-token products launch one program per two outputs, so the
#: interpreter's time goes with the widths (160 programs a layer here, 256 at the tiny shape).
SMALL_BODY = dict(hidden=48, heads=3, kv_heads=1, intermediate=72)


def test_the_body_takes_the_gemv_layer_for_one_token_by_default(rng):
    """One token a step runs the six-launch layer, more tokens the nine-launch one unless told (a verifier of a few
    drafted tokens, chapter 8), up to GEMV_MAX_TOKENS; every layer gives the torch path's hidden states, and on
    the six-launch layer each token's state is bit for bit what a one-token forward gives it."""
    from studylog.decode.model import GEMV_MAX_TOKENS

    # one layer: the same kernels as two, at half the interpreter time; the small shape of SMALL_BODY
    m = LlamaModel(model_config("tiny", vocab_size=300, layers=1, **SMALL_BODY), dtype=torch.float32, seed=4)
    tok, start, last = torch.tensor([[7]]), torch.tensor([0]), torch.tensor([0])
    want = m(tok, start, last, m.new_cache(1, 16), fused=False)
    for gemv in (None, False):  # the default, and the nine-launch layer told for one token
        got = m(tok, start, last, m.new_cache(1, 16), fused=True, gemv=gemv)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    two = torch.tensor([[7, 8]])  # the six-launch layer told for two tokens: two rows of every product
    want2 = m(two, start, torch.tensor([1]), m.new_cache(1, 16), fused=False, every=True)
    cache = m.new_cache(1, 16)
    got2 = m(two, start, torch.tensor([1]), cache, fused=True, gemv=True, every=True)
    torch.testing.assert_close(got2, want2, rtol=1e-5, atol=1e-5)
    # one token a step, by default: bit for bit the six-launch layer's row of that token (the nine-launch layer
    # rounds otherwise), so the default for one token is the six-launch layer
    one_by_one = m.new_cache(1, 16)
    for t in range(2):
        h = m(two[:, t:t + 1], torch.tensor([t]), torch.tensor([0]), one_by_one, fused=True)
        assert torch.equal(h[0], got2[0, t])
    with pytest.raises(ValueError, match=f"at most {GEMV_MAX_TOKENS} tokens"):
        m(torch.zeros(1, GEMV_MAX_TOKENS + 1, dtype=torch.long), start, torch.tensor([0]), m.new_cache(1, 32),
          fused=True, gemv=True)


def _dense_greedy(logits, steer, bias):
    """The loop's sampling over the whole vocabulary, written out: the bias added at the steered id with
    ``scatter_add_`` (a negative id adds nothing), then ``torch.argmax`` (ties: the first index)."""
    out = logits.clone()
    out.scatter_add_(1, steer.clamp(min=0)[:, None], (steer >= 0).to(out.dtype)[:, None] * bias)
    return out.argmax(dim=1)


@pytest.mark.parametrize("n", [1, 7, 128, 129, 1000, 2500, 8192])
def test_allowed_argmax_picks_what_the_dense_argmax_picks(rng, n):
    """The greedy sampler of the masked head's logits, run by Triton's interpreter, against the dense argmax on the
    whole row: random sets (sizes around and across the two block sizes), per-row masks inside the union, tied
    logits, a steered id inside the set, outside it, and none; the output is poisoned first."""
    from studylog.decode import kernels

    V, B = 9000, 3
    union = torch.randperm(V, generator=rng)[:n].sort().values
    logits = torch.full((B, V), float("-inf"))
    vals = torch.randint(-4, 4, (B, n), generator=rng).float() * 0.5  # few distinct values: many ties
    logits[:, union] = vals
    if n > 1:
        logits[1, union[torch.randperm(n, generator=rng)[: n // 2]]] = float("-inf")  # row 1 allows fewer
    outside = int(torch.ones(V, dtype=torch.bool).index_fill_(0, union, False).nonzero()[0])
    steer = torch.tensor([int(union[n // 2]), outside, -1])
    for bias in (1.0e4, 0.0):
        out = torch.full((B,), -7, dtype=torch.int64)
        kernels.allowed_argmax(logits, union.to(torch.int32), n, steer, bias, out=out)
        assert out.tolist() == _dense_greedy(logits, steer, bias).tolist(), (n, bias)
    if n == 1:
        return
    # ties broken by the smallest id even when the tied ids sit in different lanes and blocks
    tied = torch.full((1, V), float("-inf"))
    tied[0, union] = 1.0
    out = torch.full((1,), -7, dtype=torch.int64)
    kernels.allowed_argmax(tied, union.to(torch.int32), n, torch.tensor([-1]), 1.0e4, out=out)
    assert int(out) == int(union[0])


def test_allowed_argmax_refuses_what_it_cannot_read():
    from studylog.decode import kernels

    logits, ids = torch.zeros(2, 50), torch.arange(50, dtype=torch.int32)
    steer, out = torch.full((2,), -1), torch.empty(2, dtype=torch.int64)
    for n in (0, 51):
        with pytest.raises(ValueError, match="n must be"):
            kernels.allowed_argmax(logits, ids, n, steer, 1.0, out=out)
    with pytest.raises(ValueError, match="ids int32"):
        kernels.allowed_argmax(logits, ids.long(), 5, steer, 1.0, out=out)
    with pytest.raises(ValueError, match="steer, out"):
        kernels.allowed_argmax(logits, ids, 5, steer[:1], 1.0, out=out)


@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 6e-2)])
def test_the_fused_body_gives_what_the_torch_body_gives(rng, dtype, tol, B):
    """The whole forward, fused kernels against torch's operations: a padded prefill chunk with different starts
    per sequence, then one-token steps (at batch 1 on the six-launch layer of ``gemv``); hidden states and the KV
    cache agree (bf16: to its rounding)."""
    # two layers: the second reads the first's output and its own slot of the cache. fp32: two one-token steps, the
    # second reading the cache rows the first wrote (the same code in every dtype); bf16 (the interpreter's slow
    # dtype): one, its rounding against torch's
    m = LlamaModel(model_config("tiny", vocab_size=500, layers=2, **SMALL_BODY), dtype=dtype, seed=2)
    toks = torch.randint(0, 500, (B, 13), generator=rng)
    caches = m.new_cache(B, 40), m.new_cache(B, 40)
    steps = [(toks, torch.tensor([0, 3])[:B], torch.tensor([12, 9])[:B])]
    one = torch.zeros(B, dtype=torch.long)
    ones = 2 if dtype == torch.float32 else 1
    steps += [(torch.randint(0, 500, (B, 1), generator=rng), torch.full((B,), 13 + t), one) for t in range(ones)]
    for tokens, start, last in steps:
        a = m(tokens, start, last, caches[0], fused=False)
        b = m(tokens, start, last, caches[1], fused=True)
        torch.testing.assert_close(b.float(), a.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(caches[1].k.float(), caches[0].k.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(caches[1].v.float(), caches[0].v.float(), rtol=tol, atol=tol)
    assert not m.uses_fused() and m.uses_fused("cuda")


def test_the_fused_body_reads_strided_positions(rng):
    """The decoder passes ``start`` and ``last`` as columns of one input buffer (views with a stride): the fused
    kernels read them through their stride, as torch's indexing does (a batch above 1 read other columns)."""
    m = LlamaModel(model_config("tiny", vocab_size=500, layers=2), dtype=torch.float32, seed=3)
    B, T, C = 3, 5, 8
    buf = torch.randint(0, 500, (B, C + 4), generator=rng)
    buf[:, C] = torch.tensor([0, 4, 9])  # start
    buf[:, C + 1] = torch.tensor([4, 2, 0])  # last
    start, last = buf[:, C], buf[:, C + 1]
    assert start.stride(0) == C + 4
    caches = m.new_cache(B, 32), m.new_cache(B, 32)
    a = m(buf[:, :T], start.contiguous(), last.contiguous(), caches[0], fused=False)
    b = m(buf[:, :T], start, last, caches[1], fused=True)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1].k, caches[0].k, rtol=1e-5, atol=1e-5)


def test_gumbel_noise_depends_only_on_its_inputs():
    ids = torch.arange(5000)
    a = gumbel_noise(3, torch.tensor([4, 4]), ids)
    assert torch.equal(a, gumbel_noise(3, torch.tensor([4, 4]), ids)) and torch.isfinite(a).all()
    assert not torch.equal(a[0], a[1]) and not torch.equal(a, gumbel_noise(4, torch.tensor([4, 4]), ids))
    assert abs(a.mean().item() - 0.5772) < 0.05  # the Gumbel distribution's mean (Euler's constant)


# --- checkpoints ---------------------------------------------------------------------------------------------

def test_checkpoint_round_trip(tmp_path, tiny, decoder):
    folder = save_checkpoint(tiny, tmp_path / "ckpt")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    loaded = load_checkpoint(folder)
    assert loaded.config == tiny.config and loaded.dtype == torch.float32
    for (n, a), (_, b) in zip(tiny.named_parameters(), loaded.named_parameters()):
        assert torch.equal(a, b), n
    grammar = Grammar.from_suite("ticket_triage")
    again = Decoder(loaded, batch=1, max_seq=200)
    assert again.generate(grammar, [PROMPT], "baseline", max_new_tokens=20).ids == \
        decoder.generate(grammar, [PROMPT], "baseline", max_new_tokens=20).ids


def test_checkpoint_matches_hugging_face_llama(tmp_path, rng):
    transformers = pytest.importorskip("transformers")
    m = LlamaModel(model_config("tiny", vocab_size=700, layers=2, heads=4, kv_heads=2), dtype=torch.float32, seed=3)
    folder = save_checkpoint(m, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    toks = torch.randint(0, 700, (2, 9), generator=rng)
    with torch.no_grad():
        ref = hf(toks).logits[:, -1]
    ours = m.logits(m(toks, torch.zeros(2, dtype=torch.long), torch.tensor([8, 8]), m.new_cache(2, 16)))
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    back = from_module(hf)
    torch.testing.assert_close(back.logits(back(toks, torch.zeros(2, dtype=torch.long), torch.tensor([8, 8]),
                                                back.new_cache(2, 16))), ref, rtol=1e-4, atol=1e-4)


# --- bad input -------------------------------------------------------------------------------------------------

def test_a_schema_that_does_not_compile_is_named():
    with pytest.raises(ValueError, match="schema does not compile.*not valid JSON"):
        Grammar.from_schema("{not json")
    with pytest.raises(ValueError, match="schema does not compile"):
        Grammar.from_schema({"type": "object", "properties": {"a": {"type": "no-such-type"}}})
    with pytest.raises(ValueError, match="regex"):
        Grammar.from_regex("(unclosed")


def test_a_prompt_longer_than_the_cache_is_named(decoder):
    grammar = Grammar.from_suite("classifier")
    with pytest.raises(ValueError, match=r"prompt 0 has 195 tokens.*max_seq=200"):
        decoder.generate(grammar, [[11] * 195], "baseline", max_new_tokens=10)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        decoder.generate(grammar, [[]], "baseline")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decoder.generate(grammar, [[10**6]], "baseline")
    with pytest.raises(ValueError, match="batch 1"):
        decoder.generate(grammar, [PROMPT, PROMPT], "baseline")
    with pytest.raises(ValueError, match="config must be"):
        decoder.generate(grammar, [PROMPT], "no_such_config")


def test_a_vocabulary_that_does_not_fit_the_head_is_named():
    small = LlamaModel(model_config("tiny", vocab_size=1000), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"100277 ids but the model's LM head has 1000 rows"):
        Decoder(small)


def test_a_model_without_the_expected_modules_is_named(tmp_path, tiny):
    with pytest.raises(TypeError, match="Linear, which has no embed_tokens, layers, norm, lm_head"):
        Decoder(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="not a Llama-style causal LM: it has no model"):
        from_module(torch.nn.Linear(4, 4))
    folder = save_checkpoint(LlamaModel(model_config("tiny", vocab_size=300), dtype=torch.float32), tmp_path / "c")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks 1 tensor.*model.layers.1.mlp.down_proj.weight"):
        load_checkpoint(folder)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path)


def _step03_script():
    """``lab/decode/step03_changes.py``, which runs step 3 without its last change on its own decoder."""
    return lab_scripts.load("decode", "step03_changes")


@pytest.mark.parametrize("name", ["tool_call", "us_phone"])
def test_the_masked_head_read_whole_writes_the_same_tokens(tiny, name):
    """The lab script's ``WholeRowDecoder`` with ``whole_row`` set: the masked head's row read whole by the dense
    path's argmax (and its seeded sampling) picks what the sampler over the allowed ids picks, on the torch head of
    a CPU, greedy and sampled; unset, it is the library's decoder."""
    script = _step03_script()
    decoder = script.WholeRowDecoder(tiny, batch=1, max_seq=200)
    whole = script.MASKED_FULL_ARGMAX
    assert whole.name == "masked_full_argmax" and script.knobs(whole)["sample"] == "all"
    assert script.knobs(CONFIGS["masked_head"])["sample"] == "allowed"
    grammar = Grammar.from_suite(name, whitespace="compact")
    sample = suite_sample(name, seed=2, whitespace="compact")
    assert decoder.head_impl == "torch"
    real = Decoder._sample
    given = []  # per sampling call: was the sampler handed the allowed sets (the knob's whole effect)?

    def recorded(self, temperature, seed, allowed=None):
        given.append(allowed is not None)
        return real(self, temperature, seed, allowed)
    for kw in (dict(max_new_tokens=24), dict(max_new_tokens=96, targets=[sample])):
        Decoder._sample = recorded
        try:
            decoder.whole_row = False
            a = decoder.generate(grammar, [PROMPT], CONFIGS["masked_head"], **kw)
            by_default, given[:] = list(given), []
            decoder.whole_row = True
            b = decoder.generate(grammar, [PROMPT], whole, **kw)
        finally:
            Decoder._sample = real
        assert by_default and all(by_default) and given and not any(given), "whole_row reads the whole row"
        given.clear()
        assert b.config == "masked_full_argmax" and a.ids == b.ids and a.forwards == b.forwards, (name, kw)
    decoder2 = script.WholeRowDecoder(tiny, batch=2, max_seq=200)
    out = []
    for whole_row, c in ((False, CONFIGS["masked_head"]), (True, whole)):
        decoder2.whole_row = whole_row
        out.append(decoder2.generate(grammar, [PROMPT, PROMPT], c, max_new_tokens=24, temperature=0.8, seed=5))
    assert out[0].ids == out[1].ids, name


def test_configurations_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="masked head reads allowed sets per automaton state"):
        CONFIGS["baseline"].__class__("x", "token", "masked", "xgrammar")
    with pytest.raises(ValueError, match="jump must be one of"):
        CONFIGS["baseline"].__class__("x", "sometimes")


# --- the report, on the CPU ---------------------------------------------------------------------------------------

def test_the_sweep_records_what_the_figures_read(tiny):
    # a regex and the shortest JSON object whose whitespace can differ (19 tokens compact, 25 default)
    run = LocalRun()
    kw = dict(shapes=("tiny",), batches=(1,), schemas=["us_phone", "ticket_triage"], both_whitespaces_at=("tiny", 1))
    report.sweep(run, device="cpu", repeats=1, dtype=torch.float32, max_new_tokens=64, max_seq=160, **kw)
    assert run.checks and all(c["passed"] for c in run.checks)
    # on a CPU (no components) exactly the rows of the benchmark's table
    assert [(r["series"], r["params"]) for r in run.rows] == report.table([kw], chunk_sizes=(1, 64), cuda=False)
    assert {r["series"] for r in run.rows} == {"step01", "step02", "step03", "automaton_mask", "char_jump"}
    assert {r["params"]["whitespace"] for r in run.rows
            if r["params"]["schema"] == "ticket_triage"} == {"compact", "default"}
    assert {r["params"]["whitespace"] for r in run.rows if r["params"]["schema"] == "us_phone"} == {"compact"}
    parts = decode_results.breakdown(run.rows, "tiny", 1)
    assert list(parts) == list(report.ORDER)
    for p in parts.values():
        assert p["wall"] > 0 and p["body"] > 0
    bounds = decode_results.amdahl(parts)
    assert 0 < bounds["chapter2_share"] < 1 and 0 <= bounds["chapter1_share"] < 1

    class Results:
        rows = [dict(r, params=dict(r["params"], model="1b")) for r in run.rows]
        data = {"notes": [n.replace("model tiny: ", "model 1b: ") for n in run.notes]}

        @staticmethod
        def caption():
            return "CPU"

    heads = report.headline(Results())
    assert [h["kernel"] for h in heads] == ["step03_masked_head", "step02_jump_forward"]
    import matplotlib

    matplotlib.use("Agg")
    from book.decode.figures import figures

    assert set(figures(Results())) == {"breakdown_1b", "speedup"}


class FakeBenchRun(LocalRun):
    """BenchRun's timing methods without a GPU: each call runs once and takes one millisecond."""

    def gpu_time(self, make_calls, **kw):
        from studylog.bench import Timing

        for call in make_calls():
            call()
        return Timing.of([1.0], clock="gpu")

    def host_time(self, fn, **kw):
        from studylog.bench import Timing

        fn()
        return Timing.of([0.5], clock="host")

    def measure(self, series, make_calls, *, params, role="kernel", host=None, floor_ms=None, **extra):
        for key in ("repeats", "min_calls", "reps", "host_calls"):
            extra.pop(key, None)
        if floor_ms is not None:
            extra["floor_ms"] = floor_ms
        row = self.record(series, self.gpu_time(make_calls), params=params, role=role, **extra)
        if host is not None:
            row["host_ms"] = self.host_time(host).median
        return row

    def floor_ms(self, nbytes):
        return nbytes / 3e9


def test_the_components_are_timed_and_checked(tiny):
    """The benchmark's component timings on a CPU with a fake harness: every series and its parameters, the
    floor of the body, the masked head at every allowed count checked against the dense head."""
    run = FakeBenchRun()
    decoder = Decoder(tiny, batch=2, max_seq=64, chunk_sizes=(1, 2, 4))
    report.components(run, decoder, "tiny")
    series = [(r["series"], r["params"].get("chunk", r["params"].get("allowed"))) for r in run.rows]
    assert series == [("body", 1), ("body", 4), ("body_cublas", 1), ("body_unfused", 1), ("dense_head", None),
                      *[("masked_logits", n) for n in report.HEAD_COUNTS], ("mask_apply", None), ("sampling", None),
                      *[("sampling_allowed", n) for n in report.HEAD_COUNTS]]
    body = run.rows[0]
    assert body["floor_ms"] == tiny.config.parameter_counts()["body"] * tiny.dtype.itemsize / 3e9
    assert all(c["passed"] for c in run.checks) and len(run.checks) == 2 * len(report.HEAD_COUNTS)
    assert all("host_ms" in r for r in run.rows if r["series"] in ("dense_head", "masked_logits"))


def test_the_bench_plan_fits_its_time():
    """The plan's sweeps, and their decode steps counted from the suite's token counts (each request: a warm-up,
    the repeats and an instrumented run, in five configurations): a full run stays within a few minutes at a
    1B step of a few milliseconds and an 8B step of ten, a quick run within one and a half."""
    def steps(plan):
        vocab = pieces.load_vocabulary("cl100k_base")
        total = {}
        for sweep in plan:
            names = list(sweep["schemas"])
            extra = [n for n in names if n in suite_names("json")] if sweep.get("both_whitespaces_at") else []
            tokens = sum(len(vocab.encode(suite_sample(n, 0, "compact"))) + 1 for n in names + extra)
            runs = len(report.ORDER) * (sweep["repeats"] + 2) * len(sweep["batches"])
            for shape in sweep["shapes"]:
                total[shape] = total.get(shape, 0) + tokens * runs
        return total

    # generous: steps at the pre-fusion body's speed; the real model's 30 thin layers (1.5 ms a step), and its
    # answers are longer than the samples (up to the cap), so its tokens count three times
    step_ms = {"1b": 2.0, "8b": 10.0, report.REAL_MODEL: 3 * 1.5}
    for quick, budget_s in ((False, 360), (True, 120)):
        seconds = sum(n * step_ms[s] / 1e3 for s, n in steps(report.plan(quick)).items())
        assert seconds < budget_s, (quick, seconds)
    assert [p["shapes"] for p in report.plan(False)] == [("1b",), ("8b",), (report.REAL_MODEL,)]


def test_the_target_report_reads_rows(tiny):
    """Targets on fake rows: the median over JSON schemas at batch 1, the minimum at batch 8, the bound."""
    rows = []
    for batch, ms in ((1, {"baseline": 2.0, "jump_forward": 1.9, "masked_head": 1.8}),
                      (8, {"baseline": 1.0, "jump_forward": 1.0, "masked_head": 1.1})):
        for name in ("classifier", "weather_call", "ipv4"):
            for config, t in ms.items():
                rows.append({"series": config, "params": {"model": "1b", "batch": batch, "schema": name,
                             "whitespace": "compact", "config": config}, "ms": t, "tokens": 10,
                             "forwards": 9 if config != "baseline" else 10,
                             "breakdown_ms_per_token": {"body": t * 0.8, "head": t * 0.1, "mask_apply": 0.0,
                                                        "mask_wait": 0.0, "sampling": 0.0, "host": t * 0.1}})
    out = decode_results.target_report(rows)
    assert out[1]["median"] == pytest.approx(2.0 / 1.8) and not out[1]["met"]
    assert set(out[1]["speedups"]) == {"classifier", "weather_call"}  # JSON schemas only
    assert out[8]["min"] == pytest.approx(1.0 / 1.1) and not out[8]["met"]
    assert out[1]["bound"] == pytest.approx(1 / (0.9 * 0.9))


# --- on a GPU -----------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_graphs_give_what_the_eager_body_gives():
    """The body replayed from CUDA graphs (chunks padded to the graph's length) decodes what the eager body
    decodes, in every configuration, with chapter 2's kernels as the masked head."""
    model = LlamaModel(model_config("tiny", layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256),
                       device="cuda", dtype=torch.bfloat16, seed=0)
    graphed, eager = Decoder(model, batch=2, max_seq=256), Decoder(model, batch=2, max_seq=256, graphs=False)
    assert graphed.graphs and graphed.head_impl == "kernel"
    for name in ("weather_call", "tool_call", "us_phone"):
        grammar = Grammar.from_suite(name, whitespace="compact")
        targets = [suite_sample(name, seed=s, whitespace="compact") for s in (0, 1)]
        for config in STEPS:
            a = graphed.generate(grammar, [PROMPT, PROMPT], config, max_new_tokens=96, targets=targets)
            b = eager.generate(grammar, [PROMPT, PROMPT], config, max_new_tokens=96, targets=targets)
            assert a.ids == b.ids and a.text == [t.encode() for t in targets], (name, config)


@pytest.mark.gpu
def test_the_1b_shape_decodes_the_same_tokens_in_every_configuration():
    """Same tokens everywhere; after a warm-up run of each configuration (which the masked head's prepare makes
    unnecessary at batch 1: its kernels are compiled before the first step), the masked head's time per token
    is below the dense head's."""
    model = LlamaModel(model_config("1b"), device="cuda", dtype=torch.bfloat16, seed=0)
    decoder = Decoder(model, batch=1, max_seq=384)
    for name in ("product", "calendar_event"):
        grammar = Grammar.from_suite(name, decoder.vocab, whitespace="compact")
        sample = suite_sample(name, seed=0, whitespace="compact")
        first = _run_all(decoder, grammar, [PROMPT], max_new_tokens=128, targets=[sample])
        outs = _run_all(decoder, grammar, [PROMPT], max_new_tokens=128, targets=[sample])
        assert all(o.ids == first["baseline"].ids and o.text == [sample.encode()]
                   for o in (*first.values(), *outs.values()))
        per_token = {c: o.breakdown_per_token() for c, o in outs.items()}
        assert per_token["masked_head"]["head"] < per_token["baseline"]["head"], per_token
        # prepare compiled the masked head's launches: the first run's head is not slower than a dense one
        assert first["masked_head"].breakdown_per_token()["head"] < 2 * per_token["baseline"]["head"]


@pytest.mark.gpu
def test_the_fused_body_on_the_gpu_gives_what_torch_gives():
    """1b shape, bf16: the fused kernels and torch's eager operations, each against the same weights computed
    in fp32 (a prefill chunk then one-token steps): the fused body is no further from fp32 than torch's bf16
    body (it rounds where torch rounds, except attention scores, which it keeps in fp32), and picks the same
    greedy token out of the dense head."""
    import copy

    model = LlamaModel(model_config("1b"), device="cuda", dtype=torch.bfloat16, seed=0)
    ref = copy.deepcopy(model).float()  # the bf16 weights, computed in fp32
    gen = torch.Generator(device="cuda").manual_seed(0)
    caches = model.new_cache(2, 128), model.new_cache(2, 128), ref.new_cache(2, 128)
    toks = torch.randint(0, model.config.vocab_size, (2, 17), device="cuda", generator=gen)
    start, last = torch.tensor([0, 5], device="cuda"), torch.tensor([16, 11], device="cuda")

    def rel(x, r):
        return ((x - r).norm(dim=1) / r.norm(dim=1)).max().item()

    agree = []
    for step in range(4):
        r = ref(toks, start, last, caches[2], fused=False)
        a = model(toks, start, last, caches[0], fused=False).float()
        b = model(toks, start, last, caches[1], fused=True).float()
        assert torch.isfinite(b).all()
        assert rel(b, r) <= 1.5 * rel(a, r) + 0.005, (step, rel(b, r), rel(a, r))
        lr, lb = ref.logits(r), model.logits(b.bfloat16())
        agree += (lr.argmax(1) == lb.argmax(1)).tolist()
        start = start + last + 1
        toks, last = lr.argmax(1)[:, None], torch.zeros(2, dtype=torch.long, device="cuda")
    assert sum(agree) >= 6, agree  # the same greedy token almost always (near-ties of a random model aside)
    k_ref = caches[2].k.float()
    k_err = [((c.k.float() - k_ref).norm() / k_ref.norm()).item() for c in caches[:2]]
    assert k_err[1] <= 1.5 * k_err[0] + 0.005, k_err
    assert model.uses_fused()


def test_a_changed_shape_derives_its_own_head_width():
    """Llama 3.2 3B built from the 1B config (hidden 3072, 24 heads): head_dim 3072 / 24 = 128, not the 1B's 64, so
    the body has Llama 3.2 3B's 2.82 B parameters (3.21 B with its tied 128256 x 3072 embedding, as published)."""
    cfg = model_config("1b", vocab_size=128256, hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192)
    assert cfg.head_dim == 128
    counts = cfg.parameter_counts()
    q_o, k_v, mlp = 2 * 3072 * 24 * 128, 2 * 3072 * 8 * 128, 3 * 3072 * 8192
    assert counts["body"] == 28 * (q_o + k_v + mlp + 2 * 3072) + 3072
    assert abs(counts["body"] + counts["head"] - 3.21e9) < 0.01e9
    assert model_config("1b", hidden=3072, heads=24, head_dim=64).head_dim == 64  # an explicit width is kept


def test_the_interleaved_head_run_alternates_and_summarizes_by_hand():
    """``lab/decode/head_interleaved.py``: the three configurations' order reverses every other round, and its
    summary is the per-round median over the requests, the ratio 3a / step 3 per round, and each request's own
    ratio's median over the rounds, checked against sums done by hand on made-up times."""
    script = lab_scripts.load("decode", "head_interleaved")
    order = script.rounds_of(3)
    assert order[0] == ("jump_forward", "automaton_mask", "masked_head") and order[1] == order[0][::-1]
    assert order[2] == order[0]
    times = {("a", "jump_forward"): [3.0, 6.0], ("a", "automaton_mask"): [2.0, 4.0], ("a", "masked_head"): [1.0, 4.0],
             ("b", "jump_forward"): [5.0, 5.0], ("b", "automaton_mask"): [4.0, 3.0], ("b", "masked_head"): [2.0, 2.0],
             ("c", "jump_forward"): [9.0, 7.0], ("c", "automaton_mask"): [6.0, 5.0], ("c", "masked_head"): [3.0, 5.0]}
    s = script.summarize(times, ["a", "b", "c"], 2)
    assert s["median_ms_per_round"]["automaton_mask"] == [4.0, 4.0]
    assert s["median_ms_per_round"]["masked_head"] == [2.0, 4.0]
    assert s["head_ratio"]["per_round"] == [2.0, 1.0] and s["head_ratio"]["least"] == 1.0
    assert s["step3_over_step2"]["most"] == 5.0 / 2.0  # round 1: median of 3, 5, 9 over median of 1, 2, 3
    assert s["head_ratio_per_request"] == {"a": (2.0 + 1.0) / 2, "b": (2.0 + 1.5) / 2, "c": (2.0 + 1.0) / 2}
