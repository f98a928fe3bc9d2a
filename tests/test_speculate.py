"""Chapter 8: speculation under a grammar. Greedy, every step writes chapter 7's tokens (tiny model, CPU); after
every step the grammar's state is a fresh walk of the accepted tokens; the walk cuts and extends drafts as its
rule says; chapter 3's matcher drafts what a hand-written prompt lookup drafts; seeded sampling has the model's
distribution (a chi-square test against the exact distribution, enumerated); bad input is refused by name."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import lab_scripts
from book.speculate import lesson
from studylog.decode import Decoder, Grammar, LlamaModel, model_config
from studylog.decode import kernels
from studylog.speculate import (CONFIGS, DraftGate, NgramDrafter, SpeculativeDecoder, step01_masked_head,
                                step02_ngram_draft, step03_forced_draft, step04_gated_draft, walk_draft)
from studylog.speculate import report, requests

STEPS = tuple(CONFIGS)
PROMPT = ('Alice Martin lives at 12 Rue de Rivoli. {"name":"Alice Martin","id":42,"active":true} '
          'Alice Martin, user 42, active.')


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel(model_config("tiny"), dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def spec(tiny):
    return SpeculativeDecoder(tiny, batch=1, max_seq=300)


@pytest.fixture(scope="module")
def ch7(tiny):
    return Decoder(tiny, batch=1, max_seq=300)


def _oracle(truth: list[int], rng: random.Random, wrong: float):
    """A drafter that proposes the true continuation, each token replaced by a wrong one with chance ``wrong``."""
    def propose(outputs, room):
        out = []
        for ids, r in zip(outputs, room):
            if ids is None:
                out.append([])
                continue
            n = len(ids)
            draft = truth[n:n + min(r, rng.randint(1, 6))]
            out.append([t if rng.random() > wrong else (t + 1) % 1000 for t in draft])
        return out
    return propose


# --- the same tokens ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["user_profile", "tool_call", "us_phone", "shopping_list"])
def test_every_step_writes_chapter_7s_tokens(spec, ch7, name):
    grammar = Grammar.from_suite(name, spec.vocab, whitespace="compact")
    ref1 = ch7.generate(grammar, [PROMPT], "baseline", max_new_tokens=48)
    ref3 = ch7.generate(grammar, [PROMPT], "masked_head", max_new_tokens=48)
    for step in (step01_masked_head, step02_ngram_draft, step03_forced_draft, step04_gated_draft):
        out = step(spec, grammar, [PROMPT], max_new_tokens=48, trace=True)
        assert out.ids == ref3.ids == ref1.ids, (name, step.__name__)
        _states_are_fresh_walks(out, grammar)
    assert out.forwards <= ref3.forwards


def test_drafts_that_agree_save_forwards_and_rejections_roll_back(tiny, ch7):
    """An oracle drafter (the true continuation, with planted wrong tokens): the output is unchanged, drafts are
    accepted and rejected, forwards fall, and after every step the state is a fresh walk of the accepted tokens."""
    grammar = Grammar.from_suite("user_profile", ch7.vocab, whitespace="compact")
    ref = ch7.generate(grammar, [PROMPT], "masked_head", max_new_tokens=64)
    for wrong in (0.0, 0.3):
        dec = SpeculativeDecoder(tiny, batch=1, max_seq=300, drafter=_oracle(ref.ids[0], random.Random(3), wrong))
        for config in ("ngram_draft", "forced_draft", "gated_draft"):
            out = dec.generate(grammar, [PROMPT], config, max_new_tokens=64, trace=True)
            assert out.ids == ref.ids, (wrong, config)
            assert sum(out.accepted) > 0 and out.forwards < ref.forwards
            if wrong:
                assert sum(out.accepted) < sum(out.verified)  # some planted tokens reached the verifier
            _states_are_fresh_walks(out, grammar)


def _states_are_fresh_walks(out, grammar):
    auto = grammar.automaton
    assert out.trace
    for step in out.trace:
        for b, (n, state) in enumerate(step):
            assert state == auto.walk(out.ids[b][:n], auto.initial)[-1]


def test_a_batch_writes_what_each_sequence_writes_alone(tiny):
    grammar = Grammar.from_suite("tool_call", whitespace="compact")
    prompts = [PROMPT, "Find flights from SFO to JFK on 2025-03-14 for 2 passengers. SFO JFK 2025-03-14"]
    both = SpeculativeDecoder(tiny, batch=2, max_seq=300).generate(grammar, prompts, "forced_draft",
                                                                  max_new_tokens=40)
    one = SpeculativeDecoder(tiny, batch=1, max_seq=300)
    for b, p in enumerate(prompts):
        assert one.generate(grammar, [p], "forced_draft", max_new_tokens=40).ids[0] == both.ids[b]


def test_a_document_with_no_match_falls_back_to_one_token_per_forward(spec, ch7):
    """Nothing to copy (the drafter proposes nothing): the loop is chapter 7's step 3, forward for forward."""
    grammar = Grammar.from_suite("ipv4", spec.vocab)
    none = SpeculativeDecoder(spec.model, batch=1, max_seq=300, drafter=lambda outputs, room: [[] for _ in room])
    out = none.generate(grammar, ["x"], "gated_draft", max_new_tokens=20)
    ref = ch7.generate(grammar, ["x"], "masked_head", max_new_tokens=20)
    assert out.ids == ref.ids and out.forwards == ref.forwards and sum(out.verified) == 0


# --- the walk, the matcher, the gate ----------------------------------------------------------------------

def test_the_walk_cuts_at_the_first_forbidden_token_and_adds_forced_chains():
    grammar = Grammar.from_regex(r'\{"a":"[a-z]{1,8}","b":"[a-z]{1,8}"\}', name="two_keys")
    auto, vocab = grammar.automaton, grammar.vocab
    start = auto.walk(vocab.encode('{"a":"'), auto.initial)[-1]
    xy, digit = vocab.encode("xy"), vocab.encode("7")
    plain = walk_draft(auto, start, xy + digit + xy, 8, extend=False)
    assert plain.tokens == xy and plain.cut == 1 + len(xy) and all(plain.proposed)
    assert plain.states == auto.walk(xy, start)  # the start, then the state after each kept token
    # a token after which the automaton forces a chain: found by a walk of the allowed tokens from the start
    state, tok, jump = None, None, None
    frontier = [auto.initial]
    for _ in range(6):
        nxt = []
        for s0 in frontier:
            for t in auto.allowed_ids(s0)[:200].tolist():
                s1 = auto.next(s0, t)
                if s1 is None:
                    continue
                if auto.token_jump(s1) is not None and auto.token_jump(s0) is None:
                    state, tok, jump = s0, t, auto.token_jump(s1)
                    break
                nxt.append(s1)
            if jump is not None:
                break
        if jump is not None:
            break
        frontier = nxt[:20]
    assert jump is not None
    chain = list(jump.tokens)
    ext = walk_draft(auto, state, [tok], 16, extend=True)
    assert ext.tokens == [tok] + chain and ext.proposed == [True] + [False] * len(chain) and ext.forced == len(chain)
    assert ext.states == auto.walk([tok] + chain, state)
    other = next(t for t in range(1000) if t != chain[0])
    disagree = walk_draft(auto, state, [tok, other, other], 16, extend=True)
    assert disagree.tokens[:len(chain) + 1] == [tok] + chain and disagree.cut == 2
    assert walk_draft(auto, state, [tok], 16, extend=False).tokens == [tok]  # step 2 does not extend
    assert walk_draft(auto, state, [tok], 2, extend=True).tokens == ([tok] + chain)[:2]  # the room caps it
    assert walk_draft(auto, start, xy + [vocab.eos_id] + xy, 8, extend=False, eos=vocab.eos_id).tokens == xy


def _lookup(prompt: list[int], out: list[int], k: int, n_max: int = 3) -> list[int]:
    """Prompt lookup by hand, as chapter 3's operator does it: for n from n_max down to 1 (with a generated token
    before the last n), the last n output tokens at their leftmost place in the prompt that a token follows, else
    in the output before its newest token; up to k tokens after it."""
    for n in range(n_max, 0, -1):
        if len(out) - 1 < n:
            continue
        pat = out[-n:]
        for hay in (prompt, out[:-1]):
            for i in range(len(hay) - n + 1):
                if hay[i:i + n] == pat and i + n < len(hay):
                    return hay[i + n:i + n + k]
    return []


def test_the_drafter_proposes_what_prompt_lookup_proposes():
    rng = np.random.default_rng(5)
    d = NgramDrafter(3, 70, 40, 5, "cpu")
    for _ in range(20):
        prompts = [rng.integers(0, 9, int(rng.integers(5, 70))).tolist() for _ in range(3)]
        d.admit(prompts)
        outs = [rng.integers(0, 9, int(rng.integers(1, 40))).tolist() for _ in range(3)]
        room = [int(rng.integers(0, 6)) for _ in range(3)]
        got = d.propose(outs, room)
        for p, o, r, g in zip(prompts, outs, room, got):
            assert g == (_lookup(p, o, min(r, 5)) if r else []), (p, o, r)
        # one request's outputs grow a few tokens a step (the drafter stores only the new ones), and a caller may
        # pass an output whose last token changed: every call still drafts what prompt lookup drafts
        grown = [o[:1] for o in outs]
        for _ in range(12):
            grown = [g + rng.integers(0, 9, int(rng.integers(0, 4))).tolist() for g in grown]
            if rng.random() < 0.3:
                grown[0] = grown[0][:-1] + [(grown[0][-1] + 1) % 9]
            room = [int(rng.integers(1, 6)) for _ in range(3)]
            for p, o, r, g in zip(prompts, grown, room, d.propose(grown, room)):
                assert g == _lookup(p, o, min(r, 5)), (p, o, r)


def test_the_gate_backs_off_and_lets_free_drafts_through():
    gate = DraftGate(1, min_accepted=1.0, max_backoff=4)
    assert gate.allows(0, 1)
    gate.update(0, verified=5, accepted=0)  # mean 0.5: off for 1 step
    assert not gate.allows(0, 1) and gate.allows(0, 1)
    gate.update(0, 5, 0)  # off for 2
    assert gate.allows(0, 3)  # a chunk of several tokens drafts for free, and does not spend the wait
    assert not gate.allows(0, 1) and not gate.allows(0, 1) and gate.allows(0, 1)
    for _ in range(4):
        gate.update(0, 5, 0)
    assert gate.backoff[0] == 4
    gate.update(0, 5, 5)  # a draft that pays (a free one, while waiting) ends the wait
    assert gate.backoff[0] == 1 and gate.wait[0] == 0 and gate.allows(0, 1)


def test_the_gemv_kernel_gives_each_token_what_a_one_token_launch_gives():
    """The six-launch layer's product over a few tokens: each row bit for bit a one-token launch (interpreter)."""
    torch.manual_seed(0)
    N, K, M = 37, 50, 3
    w = torch.randn(N, 2 * K)
    nw = torch.randn(2 * K)
    x = torch.randn(M, 2 * K)
    for kw in ({}, {"norm": nw, "eps": 1e-5}):
        many = kernels.gemv(x, w, **kw)
        assert all(torch.equal(many[m], kernels.gemv(x[m:m + 1].contiguous(), w, **kw)[0]) for m in range(M))
        ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * nw.double()
               if kw else x.double()) @ w.double().t()
        assert torch.allclose(many.double(), ref, rtol=1e-4, atol=1e-4)
    w2 = torch.randn(N, K)
    acc = torch.randn(M, N)
    expect = acc.clone() + (torch.nn.functional.silu(x[:, :K]) * x[:, K:]) @ w2.t()
    kernels.gemv(x, w2, swiglu=True, add_to=acc)
    assert torch.allclose(acc, expect, rtol=1e-4, atol=1e-4)


# --- sampling -----------------------------------------------------------------------------------------------

def _exact_distribution(model: LlamaModel, grammar: Grammar, prompt: list[int], temperature: float):
    """Every output's probability, enumerated: the masked softmax at each prefix, from a fresh forward."""
    auto = grammar.automaton
    eos = grammar.vocab.eos_id
    out: dict[tuple[int, ...], float] = {}

    def walk(ids: list[int], state: int, p: float):
        if auto.only_eos(state):
            out[tuple(ids)] = out.get(tuple(ids), 0.0) + p
            return
        seq = prompt + ids
        cache = model.new_cache(1, len(seq) + 1)
        h = model(torch.tensor([seq]), torch.tensor([0]), torch.tensor([len(seq) - 1]), cache)
        allowed = torch.from_numpy(auto.allowed_ids(state))
        logits = (h.double() @ model.lm_head.double()[allowed].t())[0] / temperature
        probs = torch.softmax(logits, 0)
        for t, q in zip(allowed.tolist(), probs.tolist()):
            if t == eos:
                out[tuple(ids)] = out.get(tuple(ids), 0.0) + p * q
            else:
                walk(ids + [t], auto.next(state, t), p * q)

    walk([], auto.initial, 1.0)
    return out


def test_speculative_sampling_has_the_models_distribution():
    """Seeded speculative sampling with random drafts (accepted with probability p(x), else a draw from p without
    x) against the exact distribution of outputs, by a chi-square test; the same counts against the distribution
    at another temperature fail it (the test can tell).

    A vocabulary of its own (a, b, their pairs and two triples; a space and a letter the grammar never allows), so
    that a step's head and noise cover ten ids, not cl100k's 100,277: the same 1,200 draws cost a fraction of
    the time. At this model and temperature the outputs spread over 26 sequences of one to three tokens, 24 of
    them expect five draws or more, and the other temperature's distribution is some 250 units of chi-square
    away (the 1e-3 line is near 50 at these cells)."""
    from studylog.fsm import make_vocabulary

    texts = ("a", "b", "ab", "ba", "aa", "bb", "aab", "bba", " ", "c")
    vocab = make_vocabulary({t: i for i, t in enumerate(texts)}, eos_id=len(texts), name="ab")
    grammar = Grammar.from_regex(r"[ab]{3}", vocab, name="ab3")
    model = LlamaModel(model_config("tiny", vocab_size=vocab.vocab_size), dtype=torch.float32, seed=1)
    letters = [texts.index(s) for s in ("a", "b", "ab", "ba", "aa", "bb")]
    rng = random.Random(11)
    drafter = lambda outputs, room: [[rng.choice(letters) for _ in range(min(r, 3))] for r in room]  # noqa: E731
    B, runs, temperature = 8, 150, 0.5
    dec = SpeculativeDecoder(model, vocab, batch=B, max_seq=40, drafter=drafter, chunk_sizes=(1, 2, 4), draft_len=3)
    prompt = [texts.index(s) for s in ("ab", " ", "ba")]
    counts: dict[tuple[int, ...], int] = {}
    accepted = verified = 0
    for seed in range(runs):
        g = dec.generate(grammar, [prompt] * B, "ngram_draft", max_new_tokens=8, temperature=temperature, seed=seed)
        for ids in g.ids:
            counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
        accepted, verified = accepted + sum(g.accepted), verified + sum(g.verified)
    assert 0 < accepted < verified  # drafts were accepted and rejected
    n = B * runs

    def chi2_p(dist):
        keys = sorted(dist, key=dist.get, reverse=True)
        cells, e, o = [], 0.0, 0
        for k in keys:  # merge the rare outputs so that every cell expects at least 5
            e, o = e + dist[k] * n, o + counts.get(k, 0)
            if e >= 5:
                cells.append((o, e))
                e, o = 0.0, 0
        if cells and e:
            cells[-1] = (cells[-1][0] + o, cells[-1][1] + e)
        stat = sum((o - e) ** 2 / e for o, e in cells)
        return _chi2_sf(stat, len(cells) - 1)

    exact = _exact_distribution(model, grammar, prompt, temperature)
    assert abs(sum(exact.values()) - 1) < 1e-9
    assert set(counts) <= set(exact)
    assert chi2_p(exact) > 1e-3
    assert chi2_p(_exact_distribution(model, grammar, prompt, 2 * temperature)) < 1e-3


def _chi2_sf(x: float, k: int) -> float:
    """The chi-square survival function (Wilson-Hilferty's normal approximation, ample for a test at 1e-3)."""
    if k <= 0:
        return 1.0
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


# --- bad input ----------------------------------------------------------------------------------------------

def test_bad_input_is_refused_by_name(tiny, spec):
    grammar = Grammar.from_suite("ipv4", spec.vocab)
    with pytest.raises(ValueError, match="draft_len"):
        SpeculativeDecoder(tiny, batch=1, max_seq=100, draft_len=0)
    with pytest.raises(ValueError, match="draft_len=40 does not fit the largest chunk"):
        SpeculativeDecoder(tiny, batch=1, max_seq=100, draft_len=40)
    with pytest.raises(ValueError, match="targets"):
        spec.generate(grammar, ["x"], "ngram_draft", targets=["127.0.0.1"])
    with pytest.raises(ValueError, match="chapter 7's configurations run on studylog.decode.Decoder"):
        spec.generate(grammar, ["x"], "baseline")
    with pytest.raises(ValueError, match="max_seq"):
        spec.generate(grammar, [[1] * 290], "ngram_draft", max_new_tokens=20)
    with pytest.raises(ValueError, match="draft_len"):
        NgramDrafter(1, 10, 10, 0, "cpu")


def test_drafts_never_run_past_the_cache_or_the_cap(tiny):
    """A long draft near the end of the cache, or of max_new_tokens, is cut to fit: the output keeps its cap."""
    grammar = Grammar.from_regex(r"[a-z]{1,60}", name="letters")
    greedy = lambda outputs, room: [[grammar.vocab.encode("q")[0]] * 30 for _ in room]  # noqa: E731
    dec = SpeculativeDecoder(tiny, batch=1, max_seq=40, draft_len=31, chunk_sizes=(1, 32), drafter=greedy)
    out = dec.generate(grammar, ["x " * 10], "ngram_draft", max_new_tokens=12)
    assert len(out.ids[0]) <= 12 and max(out.chunk_lengths[1:]) <= 32


# --- the workload and the report ----------------------------------------------------------------------------

def test_the_workload_holds_documents_whose_values_are_copied():
    names = requests.document_names()
    assert len(names) >= 20 and len({requests.document(n)["kind"] for n in names}) == 5
    for n in names:
        msg = requests.message(n)
        assert msg.index(requests.document(n)["document"]) == 0  # the document first: lookup finds it leftmost
    assert requests.valid("invoice_1", "{}")[0] is False
    with pytest.raises(ValueError, match="kind must be one of"):
        requests.document_names("letters")


def test_the_bound_counts_forwards_and_their_measured_costs():
    rows = [{"series": "verify", "params": {"batch": 1, "chunk": c}, "ms": ms} for c, ms in ((1, 1.0), (2, 1.5),
                                                                                            (4, 1.6))]
    rows.append({"series": "draft_call", "params": {"batch": 1}, "ms": 0.01, "host_ms": 0.05})
    base = {"batch": 1, "workload": "extraction", "request": "r"}
    rows.append({"series": "ch7_step03", "params": base, "ms": 2.0, "forwards": 9, "chunk_lengths": [50] + [1] * 8})
    rows.append({"series": "step03", "params": base, "ms": 1.0, "forwards": 4, "chunk_lengths": [50, 3, 3, 1],
                 "draft_calls": 3})
    b = lesson.bound(rows, 1, "extraction")
    assert b["forwards"] == 9 / 4
    assert b["forecast"] == pytest.approx(8.0 / (1.6 + 1.6 + 1.0 + 3 * 0.05))
    assert lesson.speedups(rows, 1, "extraction") == [2.0]


def test_the_benchmark_sweep_records_every_step_and_checks_the_tokens(tiny):
    """The benchmark's sweep on a CPU (the tiny model, cl100k, a chat template of plain text): every step and both
    chapter 7 steps recorded per request, the agreement checks made, and the bound readable from the rows."""
    from studylog.decode import pieces
    from decode_helpers import LocalRun

    vocab = pieces.load_vocabulary("cl100k_base")

    class Chat:  # what report.sweep asks of a tokenizer
        def encode_chat(self, messages):
            return vocab.encode("".join(m["content"] for m in messages)[:400])

    run = LocalRun()
    report.sweep(run, device="cpu", batches=(1,), workloads=("extraction",), repeats=1, model=tiny, vocab=vocab,
                 tokenizer=Chat(), limit=1, max_new=24)
    series = {r["series"] for r in run.rows}
    assert series == {"step01", "step02", "step03", "step04", "ch7_step01", "ch7_step03"}
    assert [(r["series"], r["params"]) for r in run.rows] == report.table((1,), ("extraction",), chunk_sizes=(1,),
                                                                          gemv_chunks={}, limit=1, cuda=False)
    names = {c["name"] for c in run.checks}
    assert "same tokens as chapter 7's step 3 wherever the rounding bound allows" in names
    assert all(c["passed"] for c in run.checks if c["name"].startswith("same tokens"))
    b = lesson.bound(run.rows, 1, "extraction")
    assert b["forwards"] > 0 and "forecast" not in b  # no body costs on a CPU: the forward ratio only


# --- the library path ---------------------------------------------------------------------------------------

def test_hugging_faces_prompt_lookup_under_xgrammars_processor_stops_at_an_assertion():
    """What the chapter says of the library path: Hugging Face ``generate`` drafts by prompt lookup
    (``prompt_lookup_num_tokens``) and filters each draft through the logits processors, calling them on every
    candidate prefix; xgrammar's processor accepts the last token of every sequence it is shown into its matcher,
    with no rollback, and asserts when a token no longer fits. Without lookup the same call decodes. If a release
    of either library fixes this, this test fails and the chapter's sentence must change with it."""
    pytest.importorskip("transformers")
    hf_contrib = pytest.importorskip("xgrammar.contrib.hf")
    from studylog.decode.peers import hf_generate, hf_model
    from studylog.fsm import make_vocabulary

    vocab = make_vocabulary({bytes([b]): b for b in range(256)}, eos_id=256, name="bytes",
                            encoder=lambda text: list(text.encode()))
    model = LlamaModel(model_config("tiny", vocab_size=vocab.vocab_size), dtype=torch.float32, seed=5)
    hf = hf_model(model)
    grammar = Grammar.from_regex(r"[1-9][0-9]{0,11}", vocab, name="digits")
    ids = list(b"call 555 0199 555 0199 555")
    plain = hf_generate(hf, grammar, ids, max_new_tokens=12)
    assert plain and all(48 <= t <= 57 for t in plain)  # without lookup: digits, as the grammar says
    inputs = torch.tensor([ids])
    with pytest.raises(AssertionError):
        hf.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False, max_new_tokens=12,
                    logits_processor=[hf_contrib.LogitsProcessor(grammar.xgrammar)], eos_token_id=256,
                    pad_token_id=256, prompt_lookup_num_tokens=4)


def test_the_walk_is_the_same_on_a_grammar_that_falls_back_to_xgrammar(spec):
    """A schema outlines-core cannot compile runs on xgrammar's matcher (``MatcherAutomaton``): the walk cuts and
    extends drafts there exactly as on chapter 1's automaton of the same grammar."""
    ours = Grammar.from_suite("user_profile", spec.vocab, whitespace="compact")
    fallback = lab_scripts.load("decode", "fallback")
    theirs = fallback.from_suite("user_profile", spec.vocab, whitespace="compact", engine="xgrammar")
    from studylog.decode.grammar import suite_sample

    ids = spec.vocab.encode(suite_sample("user_profile", seed=3, whitespace="compact"))
    states = ours.automaton.walk(ids, ours.automaton.initial)
    fb_states = theirs.automaton.walk(ids, theirs.automaton.initial)
    rng = random.Random(7)
    for i in range(len(ids)):
        draft = ids[i:i + 6]
        if draft and rng.random() < 0.4:
            draft[rng.randrange(len(draft))] = rng.randrange(1000)  # a planted wrong token
        for extend in (False, True):
            a = walk_draft(ours.automaton, states[i], draft, 8, extend=extend, eos=spec.vocab.eos_id)
            b = walk_draft(theirs.automaton, fb_states[i], draft, 8, extend=extend, eos=spec.vocab.eos_id)
            assert (a.tokens, a.proposed, a.cut) == (b.tokens, b.proposed, b.cut), (i, draft, extend)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        walk_draft(theirs.automaton, fb_states[0], [-1], 8, extend=False)
