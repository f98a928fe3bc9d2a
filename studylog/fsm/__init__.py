"""Chapter 1: compressing the automaton of constrained decoding. A constrained decoder walks an automaton built from
a regex (or a JSON schema's) over a tokenizer's vocabulary, one forward pass a token; the chapter counts the passes
two compressions save on cl100k_base (``python -m studylog.fsm report``; no GPU benchmark)."""

from __future__ import annotations

from studylog import runtime  # noqa: F401  (package convention: the runtime is selected first)
from studylog.chapter import Chapter, Step
from studylog.fsm.automaton import ConstrainedFSM, Jump, compile_fsm, regex_from_schema
from studylog.fsm.decoding import (MODES, DecodeResult, decode, step01_uncompressed, step02_token_jumps,
                                   step03_char_jumps, writer_model)
from studylog.fsm.report import EntryResult, run_suite, savings_table
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary, make_vocabulary

#: Each step's function and what it adds; its slug is the function's name after ``stepNN_``.
_STEPS = ((step01_uncompressed, "one forward pass per token (masked greedy argmax)"),
          (step02_token_jumps, "chains of states that allow one token are appended without a pass"),
          (step03_char_jumps, "forced strings are appended and the text retokenized (SGLang's compressed FSM)"))

CHAPTER = Chapter(
    name="fsm", number=1, notebooks=("01_fsm_compression",),
    title="FSM compression for constrained decoding",
    steps=tuple(Step(n, f.__name__[7:], what, "python", function=f, source=f) for n, (f, what) in enumerate(_STEPS, 1)),
)

__all__ = ["CHAPTER", "step01_uncompressed", "step02_token_jumps", "step03_char_jumps", "decode", "MODES",
           "DecodeResult", "writer_model", "TokenVocabulary", "load_vocabulary", "make_vocabulary",
           "regex_from_schema", "compile_fsm", "ConstrainedFSM", "Jump", "EntryResult", "run_suite", "savings_table"]
