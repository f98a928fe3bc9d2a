"""The answers to chapter 1's exercises. The notebook does not import this module: read it after trying.

The checks of :mod:`book.fsm.exercises` compare a reader's function with these.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

from studylog.fsm.automaton import ConstrainedFSM, forced_chains
from studylog.fsm.decoding import DecodeResult, NextLogits, check_logits, greedy
from studylog.fsm.vocabulary import TokenVocabulary

__all__ = ["reference_token_jumps", "reference_ff_decode", "reference_replaced_tokens", "reference_ff_tokens"]

Transitions = Mapping[int, Mapping[int, int]]


def reference_token_jumps(transitions: Transitions,
                          finals: frozenset[int] | set[int]) -> dict[int, tuple[tuple[int, ...], int]]:
    """The chapter's answer to exercise 1: ``{state: (tokens, end)}`` for every state that allows exactly one
    token and is not final, the chain of forced tokens that follows it, and the state where the chain ends
    (the first state that is final or allows several tokens)."""
    step = {s: ((t,), b"", n) for s, out in transitions.items() if s not in finals and len(out) == 1
            for t, n in out.items()}
    return {s: (j.tokens, j.end) for s, j in forced_chains(step).items()}


def reference_ff_decode(next_logits: NextLogits, fsm: ConstrainedFSM, ff, *, max_tokens: int = 256) -> DecodeResult:
    """The chapter's answer to exercise 4: step 1's loop with llguidance's rule. In a state whose next bytes are
    forced (``fsm.char_jumps``), append ``ff(forced bytes)``, the tokens that are safe to append (the tokenizer's
    split with the last ones held back), cut at ``max_tokens``; tokens already written are never replaced. Where
    nothing is forced or ``ff`` holds everything back, a forward pass picks the masked argmax."""
    res = DecodeResult([], b"", 0, False)
    ids, states = res.ids, [fsm.initial]
    while len(ids) < max_tokens:
        if fsm.only_eos(states[-1]):
            res.finished = True
            break
        jump = fsm.char_jumps.get(states[-1])
        tokens = list(ff(jump.data))[:max_tokens - len(ids)] if jump is not None else []
        if tokens:
            ids.extend(tokens)
            states.extend(fsm.walk(tokens, states[-1])[1:])
            res.jumped_tokens += len(tokens)
            continue
        res.forward_passes += 1
        tok = greedy(fsm, states[-1], check_logits(next_logits(list(ids)), fsm.vocab.vocab_size))
        if tok == fsm.vocab.eos_id:
            res.finished = True
            break
        ids.append(tok)
        states.append(fsm.index.get_next_state(states[-1], tok))
    res.text = fsm.vocab.decode(ids)
    return res


def reference_replaced_tokens(emitted: Sequence[int], retokenized: Sequence[int]) -> tuple[int, int]:
    """The chapter's answer to exercise 2: ``(replaced, fed)``. The tokens of ``emitted`` from the first
    position where the two differ on are replaced (their KV-cache entries are recomputed), and the tokens of
    ``retokenized`` from there on are fed to the next forward pass."""
    keep = 0
    while keep < min(len(emitted), len(retokenized)) and emitted[keep] == retokenized[keep]:
        keep += 1
    return len(emitted) - keep, len(retokenized) - keep


@functools.lru_cache(maxsize=4)
def _proper_prefixes(vocab: TokenVocabulary) -> frozenset[bytes]:
    """Every byte string that some token of ``vocab`` starts with and is longer than."""
    return frozenset(b[:k] for b in vocab.token_bytes if b is not None for k in range(1, len(b)))


def reference_ff_tokens(forced: bytes, vocab: TokenVocabulary, max_tokens: int = 4) -> list[int]:
    """The chapter's answer to exercise 3, llguidance's rule without its grammar check (the conservative form
    its notes describe): tokenize ``forced``; look at its last ``max_tokens`` tokens and find the first byte
    position among them from which some longer token starts with the rest of ``forced`` (a token that could
    span the end of the forced string); drop the tokens that reach past that position."""
    ids = vocab.encode(forced)
    if not ids:
        return []
    prefixes = _proper_prefixes(vocab)
    span = len(vocab.decode(ids[-max_tokens:]))
    cut = len(forced)
    for idx in range(len(forced) - span, len(forced)):
        if forced[idx:] in prefixes:
            cut = idx
            break
    while ids and len(vocab.decode(ids)) > cut:
        ids.pop()
    return ids
