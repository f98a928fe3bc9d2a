"""The decode loop, one step of the lesson at a time (each a complete greedy loop over a ``next_logits(token_ids)``
callable, one forward pass), :func:`decode` (the step a ``mode`` names) and a deterministic stand-in for a model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from studylog.checks import check_choice, check_int
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.vocabulary import TokenVocabulary

#: The modes of :func:`decode`, in the order of the lesson's steps.
MODES: tuple[str, ...] = ("none", "token", "char")

NextLogits = Callable[[list[int]], Float[Tensor, " vocab"]]


@dataclass
class DecodeResult:
    ids: list[int]
    text: bytes
    forward_passes: int
    finished: bool                 # reached EOS (or a state where only EOS is allowed)
    jumped_tokens: int = 0         # tokens appended without a forward pass (after retokenization in char mode)
    jumped_bytes: int = 0          # bytes emitted by character jumps
    retokenized: int = 0           # tokens already emitted that a retokenization replaced (KV entries to redo)
    skipped_jumps: int = 0         # character jumps not taken because the text ended inside a UTF-8 character


def check_logits(logits: Any, vocab_size: int) -> Tensor:
    """``logits`` if they are one forward pass's output over ``vocab_size`` ids (a 1-D float tensor)."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"next_logits must return a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim != 1 or logits.shape[0] != vocab_size:
        raise ValueError(f"next_logits must return logits of shape ({vocab_size},) (the vocabulary size), "
                         f"got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"next_logits must return floating-point logits, got {logits.dtype}")
    return logits


def greedy(fsm: ConstrainedFSM, state: int, logits: Tensor) -> int:
    """argmax over the allowed tokens, ties to the lowest id (numpy: no thread pool for one small vector)."""
    values = logits.detach().to("cpu", torch.float32).numpy()
    best = int(np.argmax(values))  # first maximum = lowest id; if it is allowed it wins the masked argmax too
    if fsm.is_allowed(state, best):
        return best
    allowed = fsm.allowed_array(state)
    return int(allowed[np.argmax(values[allowed])])


def _start(fsm: ConstrainedFSM, max_tokens: int) -> DecodeResult:
    if not isinstance(fsm, ConstrainedFSM):
        raise TypeError(f"fsm must be a ConstrainedFSM, got {type(fsm).__name__}")
    check_int("max_tokens", max_tokens, low=1)
    return DecodeResult([], b"", 0, False)


def _finish(fsm: ConstrainedFSM, res: DecodeResult) -> DecodeResult:
    res.text = fsm.vocab.decode(res.ids)
    return res


def _ends(fsm: ConstrainedFSM, states: list[int], res: DecodeResult) -> bool:
    """Whether the walk is in a state that allows EOS alone: the decode ends there without a pass."""
    if not fsm.only_eos(states[-1]):
        return False
    res.finished = True
    return True


def forward_pass(next_logits: NextLogits, fsm: ConstrainedFSM, states: list[int], res: DecodeResult) -> bool:
    """One forward pass in the last state: the greedy token appended to ``res.ids`` and its state to ``states``;
    False (and finished) when it is EOS."""
    state = states[-1]
    logits = check_logits(next_logits(list(res.ids)), fsm.vocab.vocab_size)
    res.forward_passes += 1
    tok = greedy(fsm, state, logits)
    if tok == fsm.vocab.eos_id:
        res.finished = True
        return False
    res.ids.append(tok)
    states.append(fsm.index.get_next_state(state, tok))
    return True


def step01_uncompressed(next_logits: NextLogits, fsm: ConstrainedFSM, *, max_tokens: int = 256) -> DecodeResult:
    """Step 1: greedy constrained decoding, one forward pass (``next_logits(ids)``: the ``[vocab]`` logits of the
    token after ``ids``) per token, until EOS, a state where only EOS is allowed, or ``max_tokens`` ids."""
    res = _start(fsm, max_tokens)
    ids, states = res.ids, [fsm.initial]
    while len(ids) < max_tokens and not _ends(fsm, states, res):
        if not forward_pass(next_logits, fsm, states, res):
            break
    return _finish(fsm, res)


def step02_token_jumps(next_logits: NextLogits, fsm: ConstrainedFSM, *, max_tokens: int = 256) -> DecodeResult:
    """Step 2: token-level jumps. In a state that allows exactly one token, any pass would pick it, so the chain
    of such tokens is appended without a pass: the ids of :func:`step01_uncompressed` for any model and any
    ``max_tokens``. The pass after a jump feeds the jumped tokens together (a chunked prefill: one pass)."""
    res = _start(fsm, max_tokens)
    ids, states = res.ids, [fsm.initial]
    while len(ids) < max_tokens and not _ends(fsm, states, res):
        jump = fsm.token_jumps.get(states[-1])
        if jump is not None:
            tokens = jump.tokens[:max_tokens - len(ids)]  # cut at the cap, where step 1 stops too
            ids.extend(tokens)
            states.extend(fsm.walk(tokens, states[-1])[1:])
            res.jumped_tokens += len(tokens)
            continue
        if not forward_pass(next_logits, fsm, states, res):
            break
    return _finish(fsm, res)


def step03_char_jumps(next_logits: NextLogits, fsm: ConstrainedFSM, *, max_tokens: int = 256) -> DecodeResult:
    """Step 3: character-level jumps with retokenization (SGLang's compressed FSM). In a state whose next bytes are
    forced, the forced string is appended and the whole text re-encoded, so the model sees the split it was trained
    on; that can replace tokens already emitted (``retokenized``: KV-cache entries to recompute). The text still
    matches the regex, possibly in other tokens than step 1. A jump past ``max_tokens`` keeps that many ids
    (``finished`` False); from text that ends inside a UTF-8 character a pass picks the next token instead."""
    res = _start(fsm, max_tokens)
    vocab = fsm.vocab
    if vocab.encoder is None:
        raise ValueError(f"character-level jumps retokenize, and vocabulary {vocab.name!r} has no encoder")
    ids, states = res.ids, [fsm.initial]
    while len(ids) < max_tokens and not _ends(fsm, states, res):
        jump = fsm.char_jumps.get(states[-1])
        if jump is not None:
            text = vocab.decode(ids)
            try:
                new_ids = vocab.encode((text + jump.data).decode("utf-8"))
            except UnicodeDecodeError:  # the model stopped inside a multi-byte character
                res.skipped_jumps += 1
            else:
                cut = len(new_ids) > max_tokens
                new_ids = new_ids[:max_tokens]  # a jump is cut at the cap
                keep = 0
                while keep < min(len(ids), len(new_ids)) and ids[keep] == new_ids[keep]:
                    keep += 1
                new_states = states[:keep + 1] + fsm.walk(new_ids[keep:], states[keep])[1:]
                appended = max(0, len(vocab.decode(new_ids)) - len(text))  # all of jump.data unless cut
                if not cut and new_states[-1] != jump.end:
                    raise RuntimeError(f"retokenized text ends in state {new_states[-1]}, the jump in {jump.end}")
                res.retokenized += len(ids) - keep
                res.jumped_tokens += len(new_ids) - keep
                res.jumped_bytes += appended
                ids[:] = new_ids
                states = new_states
                continue
        if not forward_pass(next_logits, fsm, states, res):
            break
    return _finish(fsm, res)


#: The step each mode of :func:`decode` runs.
STEP_OF_MODE: dict[str, Callable[..., DecodeResult]] = {
    "none": step01_uncompressed, "token": step02_token_jumps, "char": step03_char_jumps}


def decode(next_logits: NextLogits, fsm: ConstrainedFSM, mode: str = "none", *, max_tokens: int = 256
           ) -> DecodeResult:
    """Greedy constrained decoding by the step ``mode`` names: ``"token"`` writes the ids of ``"none"``, ``"char"``
    its text, possibly in other tokens; at most ``max_tokens`` ids in every mode."""
    check_choice("mode", mode, MODES)
    return STEP_OF_MODE[mode](next_logits, fsm, max_tokens=max_tokens)


class Writer:
    """The tokenizer's next token of ``text`` after the bytes written so far: the canonical split; left between
    canonical boundaries by a retokenization, the canonical split of the rest of the current canonical token."""

    def __init__(self, vocab: TokenVocabulary, text: str):
        self.vocab, self.target, self.canon = vocab, text.encode(), vocab.encode(text)
        starts = [0, *itertools.accumulate(len(vocab.token_bytes[t]) for t in self.canon)][:-1]
        self._starts = {pos: i for i, pos in enumerate(starts)}  # byte offset -> index of the canonical token there
        self._bounds = sorted(self._starts) + [len(self.target)]

    def next_token(self, written: bytes) -> int | None:
        """The token after ``written``; EOS when the text is complete; None off the text."""
        n = len(written)
        if not self.target.startswith(written):
            return None
        if n == len(self.target):
            return self.vocab.eos_id
        if n in self._starts:
            return self.canon[self._starts[n]]
        nxt = next(b for b in self._bounds if b > n)
        try:
            return self.vocab.encode(self.target[n:nxt].decode("utf-8"))[0]
        except UnicodeDecodeError:
            return self.vocab.token_id(self.target[n:n + 1])


def writer_model(vocab: TokenVocabulary, text: str) -> NextLogits:
    """A deterministic model that writes ``text``: all its mass on :class:`Writer`'s next token."""
    writer = Writer(vocab, text)

    def next_logits(ids: list[int]) -> Float[Tensor, " vocab"]:
        done = vocab.decode(ids)
        if (pick := writer.next_token(done)) is None:
            raise RuntimeError(f"the output {done!r} left the target text {writer.target!r}")
        logits = np.zeros(vocab.vocab_size, dtype=np.float32)
        logits[pick] = 1.0
        return torch.from_numpy(logits)

    return next_logits
