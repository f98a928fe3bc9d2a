"""What this chapter takes from chapters 1 (``studylog.fsm``) and 2 (``studylog.masked_lm_head``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from studylog import masked_lm_head as _ch2
from studylog.fsm import TokenVocabulary, compile_fsm, load_vocabulary  # noqa: F401 (the loop's default)


class Automaton:
    """Chapter 1's automaton of one regex over one vocabulary, seen through the few operations the loop uses."""

    def __init__(self, regex: str, vocab: TokenVocabulary, name: str = ""):
        fsm = self.fsm = compile_fsm(regex, vocab, name)
        self.initial: int = fsm.initial
        #: Seconds: building the token index (outlines-core), and precomputing the jump tables.
        self.build_seconds: float = fsm.build_seconds
        self.precompute_seconds: float = fsm.precompute_seconds
        self.vocab_size: int = vocab.vocab_size
        self.n_states, self.n_token_forced = len(fsm.states), len(fsm.token_jumps)
        #: The state after a token (None where it is not allowed), and the states after each prefix of some ids.
        self.next, self.walk = fsm.next_state, fsm.walk
        #: :meth:`next` without its check of the id, for a walk over ids checked once (chapter 8's draft walk).
        self.transition = fsm.index.get_next_state
        #: A final state where only EOS is allowed: decoding ends there without a forward pass.
        self.only_eos = fsm.only_eos
        #: The forced chains (chapter 1's ``Jump``) from a state, of tokens and of bytes, or None.
        self.token_jump, self.char_jump = fsm.token_jumps.get, fsm.char_jumps.get

    def allowed_ids(self, state: int) -> np.ndarray:
        """The sorted allowed token ids of a state (EOS included in final states)."""
        return self.fsm.allowed(state).numpy()

    def token_states(self) -> list[int]:
        """The states a token can lead to (those with an allowed set)."""
        return [s for s in self.fsm.states if self.fsm.index.get_allowed_tokens(s) is not None]


AllowedTokens = _ch2.AllowedTokens


def allowed_batch(mask: Tensor, union: np.ndarray, counts: tuple[int, ...]) -> AllowedTokens:
    """Chapter 2's allowed sets of a batch from checked parts (mask, host-sorted union, counts): no round trip."""
    union_ids = torch.from_numpy(np.ascontiguousarray(union, dtype=np.int32)).to(mask.device, non_blocking=True)
    few = tuple(int(i) for i in union) if len(union) <= _ch2.FEW_IDS_MAX else None
    return AllowedTokens(vocab_size=mask.shape[1], mask=mask, union_ids=union_ids, counts=counts, few_ids=few)


def masked_head_kernel(h: Tensor, weight: Tensor, allowed: AllowedTokens, out: Tensor) -> Tensor:
    """Chapter 2's masked LM head (its dispatch): fp32 logits for the allowed tokens, ``-inf`` elsewhere."""
    return _ch2.masked_logits(h, weight, allowed, out=out)


def masked_head_torch(h: Tensor, weight: Tensor, allowed: AllowedTokens, out: Tensor) -> Tensor:
    """The same contract in torch (a CPU's path): only the rows of the allowed sets' union, ``-inf`` elsewhere."""
    ids = allowed.union_ids.long()
    out.fill_(float("-inf"))
    if ids.numel():
        rows = weight.index_select(0, ids)
        out.index_copy_(1, ids, torch.mm(h.float(), rows.float().t()))
        if allowed.batch > 1:
            out.masked_fill_(~allowed.mask, float("-inf"))
    return out

