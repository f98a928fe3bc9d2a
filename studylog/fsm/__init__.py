"""Chapter 1: compressing the automaton of constrained decoding.

A constrained decoder walks an automaton built from a regex (or a JSON schema turned into a regex) over
a tokenizer's vocabulary: ``outlines_core.Index`` maps every state to the tokens allowed there. Each
generated token normally costs one forward pass of the model. The chapter measures how many passes two
compressions save on a real 100k-token BPE vocabulary (cl100k_base, shipped offline by ``bpe-openai``).
Its steps are three decode loops (``CHAPTER.steps``):

1. ``step01_uncompressed``: one forward pass per token;
2. ``step02_token_jumps``: a state whose only allowed token is forced (a final state also allows EOS, so
   it is never forced); chains of forced states collapse into one jump that appends several tokens;
3. ``step03_char_jumps``: character-level jumps with retokenization (SGLang's compressed FSM): a state
   whose next *bytes* are forced jumps over the whole forced string; the output text is then re-encoded
   with the tokenizer, which can change tokens already emitted and can leave a split the model would not
   have produced.

The modules: :mod:`~studylog.fsm.vocabulary` (token bytes and EOS), :mod:`~studylog.fsm.automaton`
(regexes from schemas, :class:`ConstrainedFSM` and its jump tables), :mod:`~studylog.fsm.decoding` (the
steps, :func:`decode`, two deterministic stand-ins for a model), :mod:`~studylog.fsm.schemas` (the suite),
:mod:`~studylog.fsm.report` (the suite's measurement and its table), :mod:`~studylog.fsm.masks`
(the mask file of chapter 2), :mod:`~studylog.fsm.matchers` and :mod:`~studylog.fsm.peers` (the same regexes
in xgrammar and llguidance, optional packages of the ``peers`` extra: forced strings, masks, passes and CPU
times beside ours). The chapter has no GPU
benchmark; its figure is the book's (``book.fsm.figures``). Command line: ``python -m studylog.fsm export-masks |
report``; the SchemaStore survey is the book's (``python -m book.fsm.realworld``).
"""

from __future__ import annotations

from studylog import runtime  # noqa: F401  (package convention: the runtime is selected first)
from studylog.chapter import Chapter, Step
from studylog.fsm.automaton import (ConstrainedFSM, Jump, ascii_digit_classes, compile_fsm, forced_chains,
                                    regex_from_schema)
from studylog.fsm.decoding import (MODES, STEP_OF_MODE, DecodeResult, Event, Mode, NextLogits, check_logits,
                                   decode, greedy, step01_uncompressed, step02_token_jumps, step03_char_jumps,
                                   toy_model, writer_model)
from studylog.fsm.masks import COMMITTED_MASKS_ASCII_DIGITS, export_masks, select_masks
from studylog.fsm.matchers import peer_versions
from studylog.fsm.peers import compare_peers, jump_forward_decode, viable_prefix
from studylog.fsm.report import (MASKBENCH_FORCED_SHARE, EntryResult, extra_tokens, measure_entry, run_suite,
                                 savings_table)
from studylog.fsm.vocabulary import TokenVocabulary, byte_vocabulary, load_vocabulary, make_vocabulary

CHAPTER = Chapter(
    name="fsm", number=1, notebooks=("01_fsm_compression",),
    title="FSM compression for constrained decoding",
    steps=(
        Step(1, "uncompressed", "one forward pass per token (masked greedy argmax)", "python",
             function=step01_uncompressed, source=step01_uncompressed),
        Step(2, "token_jumps", "chains of states that allow one token are appended without a pass", "python",
             function=step02_token_jumps, source=step02_token_jumps),
        Step(3, "char_jumps", "forced strings are appended and the text retokenized (SGLang's compressed FSM)",
             "python", function=step03_char_jumps, source=step03_char_jumps),
    ),
    bench=None,
    headline=None,
)

#: What a reader imports after the lesson. The other names above stay attributes of the package, and every
#: name is reachable by its module.
__all__ = [
    "CHAPTER",
    # the steps and the general entry point
    "step01_uncompressed", "step02_token_jumps", "step03_char_jumps", "decode", "MODES", "DecodeResult",
    "toy_model", "writer_model",
    # vocabularies
    "TokenVocabulary", "load_vocabulary", "make_vocabulary",
    # regexes and automata
    "regex_from_schema", "compile_fsm", "ConstrainedFSM", "Jump",
    # the suite's measurement
    "EntryResult", "run_suite", "savings_table",
    # beside xgrammar and llguidance (studylog.fsm.peers)
    "compare_peers", "jump_forward_decode",
]
