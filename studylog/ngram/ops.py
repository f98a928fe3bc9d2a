"""Chapter 3's entry point as a PyTorch operator, ``torch.ops.studylog.ngram_match``, updating ``draft_tokens`` and
``seq_lens_this_time`` in place: on CUDA the step :func:`~studylog.ngram.kernels.final_step` picks (no value read
back: capturable in a CUDA graph), on the CPU step 1's C loop."""

from __future__ import annotations

import torch
from torch import Tensor

from studylog.ngram.cpu_path import cpu_path_inplace
from studylog.ngram.formats import DEFAULT_THRESHOLD, NgramConfig, NgramInputs, validate
from studylog.ngram.kernels import NgramMatcher, final_step


def _parts(prompt_ids, prompt_lens, generated_ids, step_idx, draft_token_num, max_dec_len, seq_lens_encoder,
           seq_lens_decoder, draft_tokens, seq_lens_this_time, max_ngram_size=3, min_ngram_size=1,
           threshold=DEFAULT_THRESHOLD, hybrid=False, max_draft_tokens=10) -> tuple:
    """(inputs, draft_tokens, seq_lens_this_time, config) of the operator's arguments, as its callers pass them
    (``int`` of a traced SymInt specialises it: each value is its own kernel launch)."""
    return (NgramInputs(prompt_ids, prompt_lens, generated_ids, step_idx, draft_token_num, max_dec_len,
                        seq_lens_encoder, seq_lens_decoder), draft_tokens, seq_lens_this_time,
            NgramConfig(int(max_ngram_size), int(min_ngram_size), int(threshold), bool(hybrid), int(max_draft_tokens)))


def _ngram_match(prompt_ids: Tensor, prompt_lens: Tensor, generated_ids: Tensor, step_idx: Tensor,
                 draft_token_num: Tensor, max_dec_len: Tensor, seq_lens_encoder: Tensor, seq_lens_decoder: Tensor,
                 draft_tokens: Tensor, seq_lens_this_time: Tensor, max_ngram_size: int = 3, min_ngram_size: int = 1,
                 threshold: int = DEFAULT_THRESHOLD, hybrid: bool = False, max_draft_tokens: int = 10) -> None:
    """Drafts in place into ``draft_tokens``, ``seq_lens_this_time`` (CUDA: the step final_step picks; CPU: step 1)."""
    cpu_path_inplace(*_parts(**locals()))


ngram_match = torch.library.custom_op("studylog::ngram_match", _ngram_match,
                                      mutates_args=("draft_tokens", "seq_lens_this_time"))
ngram_match.__doc__ = _ngram_match.__doc__


@ngram_match.register_kernel("cuda")
def _(*args, **kwargs) -> None:
    inputs, draft_tokens, seq_lens_this_time, config = _parts(*args, **kwargs)
    # the values are not read (that would wait for the GPU): they must stay in the ranges validate states
    NgramMatcher(final_step(inputs, config), inputs, draft_tokens, seq_lens_this_time, config=config,
                 check_values=False)()


@ngram_match.register_fake
def _(*args, **kwargs) -> None:
    validate(*_parts(*args, **kwargs), check_values=False)
