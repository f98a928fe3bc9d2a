"""What the n-gram matcher reads and writes, its parameters, and the checks every step runs first. Token ids are
int64, every per-slot length int32."""

from __future__ import annotations

from dataclasses import dataclass, fields
import torch
from jaxtyping import Int32, Int64
from torch import Tensor

from studylog.checks import check_int, check_tensor

#: Largest n the kernels accept (``NGRAM_MAX`` in ``ngram_common.cuh``).
NGRAM_MAX = 32
#: "No match" as a key: larger than every real key.
NONE_KEY = (1 << 64) - 1
#: The deployed default budget of the n-gram proposer, and the hybrid (MTP + n-gram) one.
DEFAULT_THRESHOLD = 128
HYBRID_DEFAULT_THRESHOLD = 1024

_INT32_MAX = 2**31 - 1


@dataclass
class NgramInputs:
    """What the matcher reads (the state it updates in place, ``draft_tokens`` and ``seq_lens_this_time``, is passed
    beside it, as the deployed operator did).

    * ``prompt_ids[b, :prompt_lens[b]]``: slot ``b``'s prompt.
    * ``generated_ids[b, :step_idx[b] + 1]``: its generated tokens; the newest is at ``step_idx[b]``
      (the deployed convention), so the pattern of size ``n`` is ``generated_ids[b, step+1-n : step+1]``.
    * ``draft_token_num[b]``: drafts wanted (ngram variant); ``max_dec_len[b]``: the request's length
      limit, which caps the drafts at ``max_dec_len - step_idx - 1``.
    * ``seq_lens_encoder[b] > 0``: the slot is in prefill; ``seq_lens_decoder[b] == 0``: empty slot."""

    prompt_ids: Int64[Tensor, "batch prompt_width"]
    prompt_lens: Int32[Tensor, " batch"]
    generated_ids: Int64[Tensor, "batch gen_width"]
    step_idx: Int32[Tensor, " batch"]
    draft_token_num: Int32[Tensor, " batch"]
    max_dec_len: Int32[Tensor, " batch"]
    seq_lens_encoder: Int32[Tensor, " batch"]
    seq_lens_decoder: Int32[Tensor, " batch"]

    def to(self, device: torch.device | str) -> "NgramInputs":
        return NgramInputs(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def batch(self) -> int:
        return int(self.prompt_ids.shape[0])


@dataclass(frozen=True)
class NgramConfig:
    """The operator's parameters, checked when made. ``hybrid=False`` is the n-gram proposer: active slots restart
    at one token, drafts go to ``draft_tokens[b, 1:]``, capped by ``draft_token_num[b]``. ``hybrid=True`` runs after
    MTP drafting: a slot keeps its ``seq_lens_this_time`` tokens and drafts go after them, capped by
    ``max_draft_tokens - seq_lens_this_time + 1``; ``seq_lens_encoder`` is ignored. Same kernels, one flag."""

    max_ngram_size: int = 3
    min_ngram_size: int = 1
    threshold: int = DEFAULT_THRESHOLD
    hybrid: bool = False
    max_draft_tokens: int = 10

    def __post_init__(self):
        check_int("max_ngram_size", self.max_ngram_size, low=1, high=NGRAM_MAX)
        check_int("min_ngram_size", self.min_ngram_size, low=1)
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(f"min_ngram_size={self.min_ngram_size} is larger than max_ngram_size="
                             f"{self.max_ngram_size}: the matcher tries n from max_ngram_size down to min_ngram_size")
        check_int("threshold", self.threshold, low=-(2**31), high=_INT32_MAX)
        check_int("max_draft_tokens", self.max_draft_tokens, low=0, high=_INT32_MAX - 1)

    @classmethod
    def hybrid_variant(cls, max_ngram_size: int = 3, min_ngram_size: int = 1,
                       threshold: int = HYBRID_DEFAULT_THRESHOLD, max_draft_tokens: int = 10) -> "NgramConfig":
        return cls(max_ngram_size, min_ngram_size, threshold, True, max_draft_tokens)


_ID_FIELDS = ("prompt_ids", "generated_ids")
_LEN_FIELDS = ("prompt_lens", "step_idx", "draft_token_num", "max_dec_len", "seq_lens_encoder", "seq_lens_decoder")


def validate(inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, config: NgramConfig,
             *, check_values: bool = True) -> None:
    """Raise an error naming the argument for any input the kernels cannot take: shapes, dtypes, devices and
    contiguity always; with ``check_values``, the per-slot lengths' ranges too (a device sync on the GPU)."""
    if not isinstance(inputs, NgramInputs):
        raise TypeError(f"inputs must be an NgramInputs, got {type(inputs).__name__}")
    if not isinstance(config, NgramConfig):  # its values were checked when it was made
        raise TypeError(f"config must be an NgramConfig, got {type(config).__name__}")
    named = {n: getattr(inputs, n) for n in _ID_FIELDS + _LEN_FIELDS}
    named |= {"draft_tokens": draft_tokens, "seq_lens_this_time": seq_lens_this_time}
    for name, t in named.items():  # token ids int64 [batch, width], lengths int32 [batch]
        ids = name in _ID_FIELDS or name == "draft_tokens"
        check_tensor(name, t, dtype=torch.int64 if ids else torch.int32, ndim=2 if ids else 1, contiguous=True)
    batch, device = inputs.prompt_ids.shape[0], inputs.prompt_ids.device
    for name, t in named.items():
        if t.shape[0] != batch:
            raise ValueError(f"{name} has batch size {t.shape[0]} but prompt_ids has {batch}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but prompt_ids is on {device}")
    prompt_width, gen_width = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
    draft_width = draft_tokens.shape[1]
    if prompt_width >= 2**31 or gen_width >= 2**31:
        raise ValueError("prompt_ids and generated_ids must have fewer than 2**31 columns")
    if batch and gen_width < 1:
        raise ValueError("generated_ids must have at least one column (the newest token)")
    if batch and draft_width < 1:
        raise ValueError("draft_tokens must have at least one column (the slot's own token)")
    if config.hybrid and batch and config.max_draft_tokens >= draft_width:
        raise ValueError(f"max_draft_tokens={config.max_draft_tokens} does not fit draft_tokens "
                         f"with {draft_width} columns (needs max_draft_tokens < columns)")
    if not check_values or batch == 0:
        return

    # the lengths are a few int32 a slot: one copy to the host (one sync) and every rule checked there
    names = _LEN_FIELDS + ("seq_lens_this_time",)
    host = dict(zip(names, torch.cat([named[name] for name in names]).cpu().numpy().reshape(len(names), batch)))
    rules = [(name, host[name] < 0, "has negative values") for name in names]
    rules += [("prompt_lens", host["prompt_lens"] > prompt_width, f"exceeds prompt_ids' width {prompt_width}"),
              ("step_idx", host["step_idx"] >= gen_width, f"must index generated_ids' columns (< {gen_width}): the "
               "newest token is generated_ids[b, step_idx]")]
    if not config.hybrid:
        rules.append(("draft_token_num", host["draft_token_num"] >= draft_width,
                      f"must be < draft_tokens' width {draft_width} (drafts go to columns 1..draft_token_num)"))
    for name, bad, what in rules:
        if bad.any():
            slot = int(bad.argmax())
            raise ValueError(f"{name} {what} (slot {slot} has {int(host[name][slot])})")


def same_state(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> bool:
    """Whether two (draft_tokens, seq_lens_this_time) pairs are bit-identical (on any devices)."""
    return bool(torch.equal(a[0].cpu(), b[0].cpu()) and torch.equal(a[1].cpu(), b[1].cpu()))
