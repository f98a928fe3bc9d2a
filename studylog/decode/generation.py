"""What a decode run is and what it returns: the configurations the chapter compares (:data:`CONFIGS`), a
request's result (:class:`Generation`), the seeded sampling noise every configuration shares, and the model check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from studylog.decode.model import LlamaModel

JUMPS = ("none", "token", "char")
HEADS = ("dense", "masked")
MASKS = ("xgrammar", "automaton")
SAMPLES = ("allowed", "all")
#: The logit bias given to the token a :class:`~studylog.decode.grammar.Writer` names: far above any
#: logit of the model, so the writer decides, and still a finite number added to a computed logit.
STEER = 1.0e4


@dataclass(frozen=True)
class DecodeConfig:
    """How a request is run. ``jump``: ``"none"`` (one forward per token), ``"token"`` (chapter 1's
    forced-token chains appended without a forward), ``"char"`` (forced bytes appended and the output
    retokenized); ``head``: ``"dense"`` or ``"masked"`` (chapter 2); ``mask``: who computes the allowed
    tokens, ``"xgrammar"`` or ``"automaton"`` (chapter 1's, precomputed per state); ``sample``: which logits
    the sampler reads after the masked head, ``"allowed"`` (only the allowed ids',
    :func:`~studylog.decode.kernels.allowed_argmax` when greedy) or ``"all"`` (the whole row, as after the dense
    head; the same token, since the masked head writes ``-inf`` elsewhere). A dense head has no allowed ids: its
    sampler reads the whole row either way."""

    name: str
    jump: str = "none"
    head: str = "dense"
    mask: str = "xgrammar"
    title: str = ""
    sample: str = "allowed"

    def __post_init__(self):
        for key, allowed in (("jump", JUMPS), ("head", HEADS), ("mask", MASKS), ("sample", SAMPLES)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"DecodeConfig.{key} must be one of {allowed}, got {getattr(self, key)!r}")
        if self.head == "masked" and self.mask != "automaton":
            raise ValueError("the masked head reads allowed sets per automaton state: use mask='automaton'")

    @property
    def uses_automaton(self) -> bool:
        return self.jump != "none" or self.mask == "automaton"


CONFIGS: dict[str, DecodeConfig] = {
    "baseline": DecodeConfig("baseline", "none", "dense", "xgrammar",
                             "dense head, xgrammar bitmask, one forward per token"),
    "jump_forward": DecodeConfig("jump_forward", "token", "dense", "xgrammar",
                                 "+ forced-token jumps (chapter 1)"),
    "masked_head": DecodeConfig("masked_head", "token", "masked", "automaton",
                                "+ masked LM head on the automaton's allowed sets, sampled among them (chapter 2)"),
    "automaton_mask": DecodeConfig("automaton_mask", "token", "dense", "automaton",
                                   "jumps and the automaton's masks, dense head (separates the two gains)"),
    "char_jump": DecodeConfig("char_jump", "char", "dense", "xgrammar",
                              "forced-byte jumps with retokenization (output may differ)"),
}


@dataclass
class Generation:
    """What one request produced, and what it cost: ``ids[b]``, sequence ``b``'s output tokens (EOS excluded);
    ``forwards`` of the batch (the first is the prefill); ``passes[b]``, forwards ``b`` was active in; ``jumped[b]``,
    tokens appended without a forward; ``retokenized[b]``, tokens a retokenization replaced; ``ms``, milliseconds
    per component summed over the steps (:meth:`Decoder.generate`); ``first_step_ms``, the first step's wall time."""

    config: str
    ids: list[list[int]]
    text: list[bytes]
    finished: list[bool]
    forwards: int
    passes: list[int]
    jumped: list[int]
    retokenized: list[int]
    chunk_lengths: list[int]
    ms: dict[str, float]
    first_step_ms: float
    instrumented: bool
    #: With ``record=True``: per sequence, output position -> (the hidden state the token was sampled from, as
    #: float64 on the CPU; the token, EOS included; the steered token or -1). What :mod:`.agreement` reads.
    records: list[dict[int, tuple[Tensor, int, int]]] | None = None
    temperature: float = 0.0
    seed: int = 0

    @property
    def tokens(self) -> int:
        """Output tokens of all sequences (EOS not counted)."""
        return sum(len(i) for i in self.ids)

    @property
    def ms_per_token(self) -> float:
        """End-to-end time per output token: the request's wall time (prefill included) over its tokens."""
        return self.ms["wall"] / max(self.tokens, 1)

    def breakdown_per_token(self) -> dict[str, float]:
        """The components of :attr:`ms` per output token (all but ``mask_host`` and ``head_host``, host work
        that overlaps the device's, add up to ``wall``)."""
        n = max(self.tokens, 1)
        return {k: v / n for k, v in self.ms.items()}


def check_model(model: Any) -> LlamaModel:
    """The model the loop can run: a :class:`LlamaModel` (see ``model.from_module`` for other modules)."""
    if isinstance(model, LlamaModel):
        return model
    parts = ("embed_tokens", "layers", "norm", "lm_head", "new_cache")
    missing = [p for p in parts if not hasattr(model, p)]
    raise TypeError(f"model must be a studylog.decode.LlamaModel, got {type(model).__name__}"
                    + (f", which has no {', '.join(missing)}" if missing else "")
                    + "; convert a Hugging Face Llama with studylog.decode.from_module")


def hashed_uniform(seed: int, seq: Tensor, position: Tensor, ids: Tensor, salt: int = 0) -> Tensor:
    """Uniform numbers in (0, 1), ``[R, K]``, for sequence ``seq[r]`` at output position ``position[r]`` and token
    ``ids[k]``: a 32-bit hash of (``seed``, sequence, position, token, ``salt``) on the device, without a generator's
    state, so a configuration that skips forwards draws the same number for the same position."""
    M = 0xFFFFFFFF
    x = (ids[None, :] * 0x2C1B3C6D + position[:, None] * 0x297A2D39 + seq[:, None] * 0x5F356495
         + ((seed * 0x1B873593 + salt * 0x68E31DA4) & M)) & M
    for mul in (0x7FEB352D, 0x046C2A3F):  # xor-shift-multiply rounds; multipliers below 2**31 keep int64 exact
        x = ((x ^ (x >> 16)) * mul) & M
    x = x ^ (x >> 15)
    # 23 bits, so that the largest value plus a half is exact in fp32 and u < 1 (24 bits rounded it to 1.0,
    # whose noise is +inf, and -inf + inf is NaN: a disallowed token could then be sampled)
    return ((x >> 9).to(torch.float32) + 0.5) / float(1 << 23)


def gumbel_noise(seed: int, position: Tensor, vocab_ids: Tensor) -> Tensor:
    """Gumbel noise ``[B, V]`` that depends only on ``seed``, the sequence, its output position and the token."""
    rows = torch.arange(position.shape[0], device=position.device)
    return -torch.log(-torch.log(hashed_uniform(seed, rows, position, vocab_ids)))


__all__ = ["CONFIGS", "DecodeConfig", "Generation", "HEADS", "JUMPS", "MASKS", "SAMPLES", "STEER", "check_model", "gumbel_noise", "hashed_uniform"]
