"""Chapter 8: speculation under a grammar, or drafts the grammar allows.

Extracting fields from a document into JSON copies text. Prompt lookup (chapter 3's n-gram matcher) proposes it;
chapter 1's automaton cuts each proposal at the first forbidden token and extends it with forced tokens; one
forward (:class:`SpeculativeDecoder`) verifies the whole draft with chapter 2's masked head per position; the
longest prefix the model agrees with is kept. The outputs are chapter 7's except at near ties. The chapter's loop
is step 3 (``SpeculativeDecoder.generate``'s default); step 4's gate, which pauses drafting for a sequence whose drafts
keep failing, is there to switch on where drafts fail: on the chapter's workloads they pay, and the gate only costs."""

from __future__ import annotations

from typing import Sequence

from studylog.chapter import Chapter, Step
from studylog.decode.grammar import Grammar
from studylog.speculate.draft import DRAFT_NGRAM, DraftGate, NgramDrafter, Walked, walk_draft
from studylog.speculate.loop import CONFIGS, SPEC_COMPONENTS, SpecConfig, SpecGeneration, SpeculativeDecoder
from studylog.speculate import report, requests


def step01_masked_head(decoder: SpeculativeDecoder, grammar: Grammar, prompts: Sequence, **options):
    """Step 1 (chapter 7's step 3): forced-token jumps and the masked head; one token per forward."""
    return decoder.generate(grammar, prompts, "masked_head", **options)


def step02_ngram_draft(decoder: SpeculativeDecoder, grammar: Grammar, prompts: Sequence, **options):
    """Step 2: the matcher's proposal, cut at the first token the grammar forbids, verified in one forward; the
    longest agreeing prefix and the model's next token are kept."""
    return decoder.generate(grammar, prompts, "ngram_draft", **options)


def step03_forced_draft(decoder: SpeculativeDecoder, grammar: Grammar, prompts: Sequence, **options):
    """Step 3, the chapter's loop: step 2, with the forced chains the walk reaches added to the draft."""
    return decoder.generate(grammar, prompts, "forced_draft", **options)


def step04_gated_draft(decoder: SpeculativeDecoder, grammar: Grammar, prompts: Sequence, **options):
    """Step 4: step 3, with drafting switched off for a sequence whose drafts do not pay (:class:`DraftGate`)."""
    return decoder.generate(grammar, prompts, "gated_draft", **options)


#: The steps, each a configuration of the same loop (a step's source is what it adds, where not its call).
STEPS = (
    Step(1, "masked_head", "chapter 7's result: jumps and the masked head, one token per forward", "python",
         step01_masked_head, step01_masked_head),
    Step(2, "ngram_draft", "n-gram drafts cut by the grammar, verified in one forward", "python",
         step02_ngram_draft, step02_ngram_draft),
    Step(3, "forced_draft", "forced chains join the draft", "python", step03_forced_draft, walk_draft),
    Step(4, "gated_draft", "drafting off where it does not pay", "python", step04_gated_draft, DraftGate),
)
BASELINES = {
    "step01_baseline": "chapter 7's step 1 (dense head, xgrammar's bitmask, one forward per token) on the same "
                       "requests",
    "verify": "the body alone on a chunk of the draft's length, graph replay: a verifying forward's cost",
    "draft_call": "one drafting call alone (copies in, the matcher's launch, copies out, the wait)",
}
CHAPTER = Chapter(name="speculate", number=8, title="Speculation under a grammar",
                  notebooks=("08_speculation_under_a_grammar",), steps=STEPS, bench=report.bench,
                  headline=report.headline, baselines=BASELINES)

__all__ = ["CHAPTER", "CONFIGS", "DRAFT_NGRAM", "DraftGate", "NgramDrafter", "SPEC_COMPONENTS", "SpecConfig",
           "SpecGeneration", "SpeculativeDecoder", "Walked", "step01_masked_head", "step02_ngram_draft",
           "step03_forced_draft", "step04_gated_draft", "walk_draft"]
