"""The configurations the chapter compares, a request's result, and the seeded noise every configuration shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.decode.model import LlamaModel

#: The logit bias given to the token a :class:`~studylog.fsm.decoding.Writer` names: far above any logit of the
#: model, so the writer decides, and still a finite number added to a computed logit.
STEER = 1.0e4


@dataclass(frozen=True)
class DecodeConfig:
    """How a request is run: ``jump`` (forced chains of ``"token"``s, or ``"char"``s retokenized), ``head``, and who
    computes the allowed tokens (``mask``)."""

    name: str
    jump: str = "none"
    head: str = "dense"
    mask: str = "xgrammar"

    def __post_init__(self):
        for key, allowed in (("jump", ("none", "token", "char")), ("head", ("dense", "masked")),
                             ("mask", ("xgrammar", "automaton"))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"DecodeConfig.{key} must be one of {allowed}, got {getattr(self, key)!r}")
        if self.head == "masked" and self.mask != "automaton":
            raise ValueError("the masked head reads allowed sets per automaton state: use mask='automaton'")


#: The chapter's three steps and its two comparisons (``studylog.decode.CHAPTER`` says what each is).
CONFIGS: dict[str, DecodeConfig] = {
    "baseline": DecodeConfig("baseline", "none", "dense", "xgrammar"),
    "jump_forward": DecodeConfig("jump_forward", "token", "dense", "xgrammar"),
    "masked_head": DecodeConfig("masked_head", "token", "masked", "automaton"),
    "automaton_mask": DecodeConfig("automaton_mask", "token", "dense", "automaton"),
    "char_jump": DecodeConfig("char_jump", "char", "dense", "xgrammar"),
}


@dataclass
class Generation:
    """What one request produced and cost: per sequence its ``ids`` (EOS excluded), ``passes``, tokens ``jumped`` and
    ``retokenized``; the batch's ``forwards`` (prefill first) and ``ms`` by part."""

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
    #: With ``record=True``: per sequence, output position -> (the hidden state the token was sampled from, float64
    #: on the CPU; the token, EOS included; the steered token or -1).
    records: list[dict[int, tuple[Tensor, int, int]]] | None = None
    temperature: float = 0.0
    seed: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(i) for i in self.ids)

    @property
    def ms_per_token(self) -> float:
        """The request's wall time (prefill included) over its output tokens."""
        return self.ms["wall"] / max(self.tokens, 1)

    def breakdown_per_token(self) -> dict[str, float]:
        """The components of :attr:`ms` per output token (all but the host parts add up to ``wall``)."""
        n = max(self.tokens, 1)
        return {k: v / n for k, v in self.ms.items()}


def check_model(model: Any) -> LlamaModel:
    """``model`` if it is a :class:`LlamaModel`."""
    if isinstance(model, LlamaModel):
        return model
    parts = ("embed_tokens", "layers", "norm", "lm_head", "new_cache")
    missing = [p for p in parts if not hasattr(model, p)]
    raise TypeError(f"model must be a studylog.decode.LlamaModel, got {type(model).__name__}"
                    + (f", which has no {', '.join(missing)}" if missing else ""))


def positive_int(name: str, v: Any) -> int:
    """``v`` if it is an int of at least 1 (a bool is not)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def token_ids(name: str, ids: Any, V: int) -> list[int]:
    """``ids`` (a sequence, 1-D integer tensor or array) as a non-empty list of ids in ``[0, V)``; floats refused."""
    if isinstance(ids, Tensor):
        if ids.is_meta:
            raise ValueError(f"{name} is a tensor on the meta device, which holds no token ids")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a {ids.dtype} tensor")
        if ids.ndim != 1:
            raise ValueError(f"{name} must be a 1-D tensor of token ids, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    elif isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise TypeError(f"{name} must be a 1-D integer array of token ids, got {ids.dtype} of shape {ids.shape}")
        ids = ids.tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    if not ids:
        raise ValueError(f"{name} is empty")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name} holds {t!r} ({type(t).__name__}) at position {i}; token ids are ints")
        if not 0 <= t < V:
            raise ValueError(f"{name} holds token id {t} at position {i}, outside the vocabulary [0, {V})")
    return [int(t) for t in ids]


def hashed_uniform(seed: int, seq: Tensor, position: Tensor, ids: Tensor, salt: int = 0) -> Tensor:
    """Uniform numbers in (0, 1), ``[R, K]``: a 32-bit hash of (``seed``, ``seq[r]``, ``position[r]``, ``ids[k]``,
    ``salt``), without a generator's state, so a configuration that skips forwards draws the same numbers."""
    M = 0xFFFFFFFF
    x = (ids[None, :] * 0x2C1B3C6D + position[:, None] * 0x297A2D39 + seq[:, None] * 0x5F356495
         + ((seed * 0x1B873593 + salt * 0x68E31DA4) & M)) & M
    for mul in (0x7FEB352D, 0x046C2A3F):  # xor-shift-multiply rounds; multipliers below 2**31 keep int64 exact
        x = ((x ^ (x >> 16)) * mul) & M
    x = x ^ (x >> 15)
    # 23 bits, so that the largest value plus a half is exact in fp32 and u < 1 (24 bits rounded it to 1.0,
    # whose noise is +inf, and -inf + inf is NaN: a disallowed token could then be sampled)
    return ((x >> 9).to(torch.float32) + 0.5) / float(1 << 23)


def gumbel_noise(seed: int, position: Tensor, vocab_ids: Tensor, seq: Tensor | None = None) -> Tensor:
    """Gumbel noise ``[R, V]`` that depends only on ``seed``, the sequence (``seq``; row ``r`` without), its output
    position and the token."""
    seq = torch.arange(position.shape[0], device=position.device) if seq is None else seq
    return -torch.log(-torch.log(hashed_uniform(seed, seq, position, vocab_ids)))

