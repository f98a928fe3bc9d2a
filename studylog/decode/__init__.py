"""Chapter 7: constrained decoding end to end, or what the kernels of chapters 1 and 2 buy a real decode loop.

A Llama-style model (:mod:`~studylog.decode.model`) decodes a request constrained by a JSON schema or a regex
(:mod:`~studylog.decode.grammar`) in one loop that runs every configuration alike (:mod:`~studylog.decode.loop`)."""

from __future__ import annotations

from typing import Sequence

from studylog.chapter import Chapter, Step
from studylog.decode.grammar import Grammar, ascii_regex, schema_regex, suite_names, suite_sample
from studylog.decode.generation import CONFIGS, DecodeConfig, Generation, check_model
from studylog.decode.loop import COMPONENTS, Decoder
from studylog.decode import report
from studylog.fsm.decoding import Writer
from studylog.decode.model import (CONFIGS as MODEL_CONFIGS, LlamaModel, ModelConfig, describe, load_smollm2,
                                   model_config)


def step01_baseline(decoder: Decoder, grammar: Grammar, prompts: Sequence, **options) -> Generation:
    """Step 1: every token costs a forward; the LM head computes every logit; xgrammar's matcher fills a
    bitmask on the host and ``apply_token_bitmask_inplace`` writes ``-inf`` over the disallowed logits."""
    return decoder.generate(grammar, prompts, CONFIGS["baseline"], **options)


def step02_jump_forward(decoder: Decoder, grammar: Grammar, prompts: Sequence, **options) -> Generation:
    """Step 2: where chapter 1's automaton forces a chain of tokens, they are appended without a forward;
    the next forward feeds them to the model together with the last sampled token (a chunk, as a chunked
    prefill does), so the cache holds them. The output is the same tokens as step 1's."""
    return decoder.generate(grammar, prompts, CONFIGS["jump_forward"], **options)


def step03_masked_head(decoder: Decoder, grammar: Grammar, prompts: Sequence, **options) -> Generation:
    """Step 3: step 2, with the allowed sets of chapter 1's automaton (precomputed per state, so the host's
    mask is a lookup) and chapter 2's masked LM head, which reads only the allowed rows of the head and
    writes ``-inf`` elsewhere: no bitmask to copy or apply."""
    return decoder.generate(grammar, prompts, CONFIGS["masked_head"], **options)


CHAPTER = Chapter(
    name="decode",
    number=7,
    title="Constrained decoding end to end",
    notebooks=("07_constrained_decoding",),
    steps=(
        Step(1, "baseline", "dense head, xgrammar bitmask, one forward per token", "torch", step01_baseline,
             step01_baseline),
        Step(2, "jump_forward", "forced-token chains appended without a forward (chapter 1)", "torch",
             step02_jump_forward, step02_jump_forward),
        Step(3, "masked_head", "masked LM head on the automaton's allowed sets, sampled among them (chapter 2)",
             "torch", step03_masked_head, step03_masked_head),
    ),
    baselines={
        "automaton_mask": "forced-token jumps and the automaton's masks with the dense head: separates the "
                          "host's mask from the head's gain",
        "char_jump": "forced-byte jumps with retokenization (chapter 1's character level): the output may differ",
        "body": "the model body alone (the fused path the loop runs, graph replay), per chunk length, with its "
                "floor (its weights read once at the copy bandwidth): the floor under any decode step",
        "body_unfused": "the same body in torch's eager operations (about fifty kernels per layer), graph replay",
        "dense_head": "the dense LM head alone (one GEMM, fp32 logits), with its host time per call",
        "masked_logits": "chapter 2's masked head alone (its dispatch) at a few allowed counts per sequence, with "
                         "its host time per call (it runs eagerly in the loop)",
        "mask_apply": "xgrammar's apply_token_bitmask_inplace alone",
        "sampling": "the greedy sampling alone (argmax over fp32 logits)",
    },
    bench=report.bench,
    headline=report.headline,
)

__all__ = ["CHAPTER", "COMPONENTS", "CONFIGS", "DecodeConfig", "Decoder", "Generation", "Grammar", "LlamaModel",
           "MODEL_CONFIGS", "ModelConfig", "Writer", "ascii_regex", "check_model", "describe", "load_smollm2",
           "model_config", "schema_regex", "step01_baseline", "step02_jump_forward", "step03_masked_head",
           "suite_names", "suite_sample"]
