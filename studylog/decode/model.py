"""A Llama-style decoder with a static KV cache (random weights, or :func:`load_smollm2`).

As in a serving engine, q/k/v and gate/up are one weight each. Shapes depend only on ``(B, T)``, so a forward per
chunk length can be captured in a CUDA graph; padded tokens write keys past the sequence's end, which a real token
overwrites before any query sees them (the cache holds ``max_seq + max_chunk`` positions)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from studylog.decode import kernels
from studylog.masked_lm_head.dispatch import dense_logits as chapter2_dense_logits


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-style model. ``shared_layers``: every layer reads the first's weights (from DRAM: they
    exceed L2), each with its own cache: a cost model of a deep model."""

    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 0  # 0: hidden // heads
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    shared_layers: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden", "layers", "heads", "kv_heads", "intermediate"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelConfig.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ValueError(f"ModelConfig.hidden ({self.hidden}) must be a multiple of heads ({self.heads}) "
                                 "unless head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even (rotary pairs), got {self.head_dim}")

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def parameter_counts(self) -> dict[str, int]:
        """Parameters of the body (all layers), the LM head and the embedding."""
        d, i, hd = self.hidden, self.intermediate, self.head_dim
        layer = d * self.qkv_rows + self.heads * hd * d + 3 * d * i + 2 * d
        head = self.vocab_size * d
        return {"body": self.layers * layer + d, "head": head, "embedding": 0 if self.tie_embeddings else head}

    def head_share(self) -> float:
        """Share of the bytes a batch-1 decode step reads that are the LM head's (the embedding reads one row)."""
        c = self.parameter_counts()
        return c["head"] / (c["head"] + c["body"])


CL100K_SIZE = 100_277
#: The cost models' head rows: cl100k padded to a multiple of 128, as real checkpoints pad theirs (an unpadded
#: head runs badly in cuBLAS and would slow the dense baseline by its shape alone). No grammar allows the padding.
CL100K_PADDED = -(-CL100K_SIZE // 128) * 128
#: The chapter's shapes: ``tiny`` (CPU tests, notebook); ``1b``, Llama 3.2 1B's body with a tied cl100k head;
#: ``8b``, Llama 3 8B's layer and untied head, 32 layers sharing one layer's weights.
CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", CL100K_SIZE, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128),
    "1b": ModelConfig("1b", CL100K_PADDED, hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192),
    "8b": ModelConfig("8b", CL100K_PADDED, hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                      tie_embeddings=False, shared_layers=True),
}


def model_config(name: str, **changes: Any) -> ModelConfig:
    """One of :data:`CONFIGS`, with fields changed (a derived head_dim is derived again from a new shape)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; choose from {sorted(CONFIGS)}")
    base = CONFIGS[name]
    derived = base.head_dim == base.hidden // base.heads
    if derived and {"hidden", "heads"} & changes.keys() and "head_dim" not in changes:
        changes["head_dim"] = 0
    return replace(base, **changes)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm: normalise in fp32, scale in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _attention(q: Tensor, kc: Tensor, vc: Tensor, visible: Tensor, scale: float) -> Tensor:
    """Grouped-query attention of ``q [B, T, H, d]`` over the cache, keys masked by ``visible [B, T, S]``, softmax
    in fp32 (on a CPU, faster than torch's masked fused attention)."""
    B, T, H, d = q.shape
    Hkv, S = kc.shape[1], kc.shape[2]
    G = H // Hkv
    qg = q.view(B, T, Hkv, G, d).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, d)
    scores = torch.matmul(qg, kc.transpose(-1, -2)).float().mul_(scale).view(B, Hkv, G, T, S)
    scores = scores.masked_fill_(~visible[:, None, None], float("-inf")).softmax(dim=-1).to(q.dtype)
    out = torch.matmul(scores.view(B, Hkv, G * T, S), vc).view(B, Hkv, G, T, d)
    return out.permute(0, 3, 1, 2, 4).reshape(B, T, H * d)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        d = cfg.hidden
        self.input_norm = nn.Parameter(torch.ones(d, **kw))
        self.qkv = nn.Parameter(torch.empty(cfg.qkv_rows, d, **kw))
        self.o = nn.Parameter(torch.empty(d, cfg.heads * cfg.head_dim, **kw))
        self.post_norm = nn.Parameter(torch.ones(d, **kw))
        self.gate_up = nn.Parameter(torch.empty(2 * cfg.intermediate, d, **kw))
        self.down = nn.Parameter(torch.empty(d, cfg.intermediate, **kw))


@dataclass
class KVCache:
    """Keys and values of every layer, ``[layers, B, Hkv, positions, head_dim]`` each."""

    k: Tensor
    v: Tensor

    @property
    def positions(self) -> int:
        return self.k.shape[3]


#: The most tokens a forward runs on the six-launch layer of matrix-vector products (``gemv=True``).
GEMV_MAX_TOKENS = 16


class LlamaModel(nn.Module):
    """A Llama-style decoder: ``forward`` runs the body on a chunk; :meth:`logits` is the dense LM head (fp32)."""

    def __init__(self, cfg: ModelConfig, *, device=None, dtype=torch.bfloat16, seed: int | None = 0):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"LlamaModel's dtype must be a floating-point torch.dtype (torch.bfloat16, torch.float32, "
                            f"...), got dtype={dtype!r}: weights are trained and stored as floats")
        super().__init__()
        self.config = cfg
        kw = dict(device=device, dtype=dtype)
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden, **kw))
        n_own = 1 if cfg.shared_layers else cfg.layers
        self.layers = nn.ModuleList(Layer(cfg, device, dtype) for _ in range(n_own))
        self.norm = nn.Parameter(torch.ones(cfg.hidden, **kw))
        self.lm_head = (self.embed_tokens if cfg.tie_embeddings
                        else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden, **kw)))
        self._rope: dict[tuple, tuple[Tensor, Tensor]] = {}
        self.requires_grad_(False)  # inference only: no autograd graph is ever built
        if seed is None:  # the caller loads weights
            return
        # random weights (normal, std 0.02; norms at one), drawn on the weights' device from ``seed``
        gen = torch.Generator(device=self.embed_tokens.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if not name.endswith("norm"):
                p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).mul_(0.02))

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def layer(self, i: int) -> Layer:
        return self.layers[0 if self.config.shared_layers else i]

    def new_cache(self, batch: int, positions: int) -> KVCache:
        c = self.config
        shape = (c.layers, batch, c.kv_heads, positions, c.head_dim)
        return KVCache(torch.zeros(shape, device=self.device, dtype=self.dtype),
                       torch.zeros(shape, device=self.device, dtype=self.dtype))

    def _rope_tables(self, positions: int) -> tuple[Tensor, Tensor]:
        key = (positions, self.device, self.dtype)
        if key not in self._rope:
            hd = self.config.head_dim
            inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat((ang, ang), dim=-1)
            self._rope[key] = (ang.cos().to(self.device, self.dtype), ang.sin().to(self.device, self.dtype))
        return self._rope[key]

    def uses_fused(self, device: torch.device | None = None) -> bool:
        """Whether :meth:`forward` runs the fused body by default: on a CUDA device."""
        return torch.device(device or self.device).type == "cuda"

    def forward(self, tokens: Tensor, start: Tensor, last: Tensor, cache: KVCache, *,
                fused: bool | None = None, gemv: bool | None = None, every: bool = False) -> Tensor:
        """The body on ``tokens [B, T]`` at positions ``start[b] + t``, keys and values into ``cache``: the final-normed
        hidden state of token ``last[b]`` (``every``: of every token). ``gemv``: the fused path's six-launch layer
        (default for one token) or the nine-launch one. No host synchronisation on a GPU (graph-safe)."""
        if tokens.device.type == "cpu" and tokens.numel():  # on a GPU a check would wait for the device
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(f"tokens holds id {lo if lo < 0 else hi}, outside the vocabulary "
                                 f"[0, {self.config.vocab_size})")
        if fused if fused is not None else self.uses_fused(tokens.device):
            return self._forward_fused(tokens, start, None if every else last, cache, gemv)
        c = self.config
        B, T = tokens.shape
        S = cache.positions
        pos = start[:, None] + torch.arange(T, device=tokens.device)  # [B, T]
        cos_t, sin_t = self._rope_tables(S)
        cos, sin = cos_t[pos][:, :, None, :], sin_t[pos][:, :, None, :]  # [B, T, 1, hd]
        visible = torch.arange(S, device=tokens.device)[None, None, :] <= pos[:, :, None]  # [B, T, S]
        scale = 1.0 / math.sqrt(c.head_dim)
        rows = torch.arange(B, device=tokens.device)[:, None].expand(B, T)
        x = F.embedding(tokens, self.embed_tokens)
        H, Hkv, hd = c.heads, c.kv_heads, c.head_dim
        for i in range(c.layers):
            w = self.layer(i)
            h = rms_norm(x, w.input_norm, c.norm_eps)
            qkv = F.linear(h, w.qkv).view(B, T, H + 2 * Hkv, hd)
            q, k, v = qkv.split((H, Hkv, Hkv), dim=2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            kc, vc = cache.k[i], cache.v[i]  # [B, Hkv, S, hd]
            kc[rows, :, pos] = k  # advanced indices around a slice: [B, T, Hkv, hd]
            vc[rows, :, pos] = v
            att = _attention(q, kc, vc, visible, scale)
            x = x + F.linear(att, w.o)
            h = rms_norm(x, w.post_norm, c.norm_eps)
            gate, up = F.linear(h, w.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w.down)
        if not every:
            x = x[torch.arange(B, device=tokens.device), last]
        return rms_norm(x, self.norm, c.norm_eps)

    def _forward_fused(self, tokens: Tensor, start: Tensor, last: Tensor | None, cache: KVCache,
                       gemv: bool | None = None) -> Tensor:
        """:meth:`forward` on the fused kernels; ``last`` None: every token's hidden state."""
        c = self.config
        B, T = tokens.shape
        cos_t, sin_t = self._rope_tables(cache.positions)
        scale = 1.0 / math.sqrt(c.head_dim)
        x = F.embedding(tokens, self.embed_tokens)  # [B, T, D], the residual stream
        if gemv is None:
            gemv = B * T == 1
        elif gemv and B * T > GEMV_MAX_TOKENS:
            raise ValueError(f"gemv=True runs at most {GEMV_MAX_TOKENS} tokens a forward (each re-reads the weights "
                             f"from L2), got a batch of {B} x {T} tokens")
        if gemv:
            # the norms and SwiGLU run in front of the products that read them, and the residual adds behind
            # the products that feed them: each weight streamed once, nothing else launched
            for i in range(c.layers):
                w = self.layer(i)
                qkv = kernels.gemv(x, w.qkv, norm=w.input_norm, eps=c.norm_eps)
                kernels.rope_cache(qkv, cache.k[i], cache.v[i], cos_t, sin_t, start, c.heads, c.kv_heads)
                att = kernels.attention(qkv, cache.k[i], cache.v[i], start, c.heads, scale)
                kernels.gemv(att, w.o, add_to=x)
                gate_up = kernels.gemv(x, w.gate_up, norm=w.post_norm, eps=c.norm_eps)
                kernels.gemv(gate_up, w.down, swiglu=True, add_to=x)
            return kernels.add_rms_norm(x, self.norm, c.norm_eps, last=last)
        # more tokens: cuBLAS's products, with the residual stream ``x`` updated in place by the add + norm
        # kernels; the last layer's residual add is done only for the rows the final norm gathers
        delta = None  # what the next add + norm adds to x: the previous sub-layer's output
        for i in range(c.layers):
            w = self.layer(i)
            h = kernels.add_rms_norm(x, w.input_norm, c.norm_eps, add=delta)
            qkv = F.linear(h, w.qkv)  # [B, T, (H + 2 Hkv) hd]
            kernels.rope_cache(qkv, cache.k[i], cache.v[i], cos_t, sin_t, start, c.heads, c.kv_heads)
            att = kernels.attention(qkv, cache.k[i], cache.v[i], start, c.heads, scale)
            h = kernels.add_rms_norm(x, w.post_norm, c.norm_eps, add=F.linear(att, w.o))
            delta = F.linear(kernels.silu_mul(F.linear(h, w.gate_up)), w.down)
        return kernels.add_rms_norm(x, self.norm, c.norm_eps, add=delta, last=last)

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """The dense LM head: fp32 logits ``[B, V]`` of every token (fp32 accumulation)."""
        return dense_logits(hidden, self.lm_head, out=out)


def dense_logits(hidden: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``hidden @ weight.T`` in fp32: on a GPU chapter 2's dense path; on a CPU in fp32 (bf16 would make ties)."""
    B, V = hidden.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty(B, V, device=hidden.device, dtype=torch.float32)
    elif out.shape != (B, V) or out.dtype != torch.float32:  # torch would resize it with a warning, or refuse
        raise ValueError(f"out must be float32 of shape ({B}, {V}) (hidden's rows, the head's rows); got "
                         f"{out.dtype} of shape {tuple(out.shape)}")
    if hidden.device.type != "cuda" or weight.dtype == torch.float32:
        return torch.mm(hidden.float(), weight.float().t(), out=out)
    chapter2_dense_logits(hidden, weight, out)
    return out


# Checkpoints: the Hugging Face Llama layout (config.json + model.safetensors)

_LAYER_KEYS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
               "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
               "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def hf_config(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` of a Hugging Face ``LlamaForCausalLM`` with this shape (not a shared-layers one: see
    :func:`state_dict_hf`)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads, "intermediate_size": cfg.intermediate, "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "max_position_embeddings": 8192, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch."), "studylog_name": cfg.name,
    }


def _hf_views(model: LlamaModel) -> dict[str, Tensor]:
    """The model's weights under Hugging Face Llama names, as views of the fused weights (a copy into one writes
    the model)."""
    c = model.config
    if c.shared_layers:
        raise ValueError(f"config {c.name!r} shares one layer's weights (a cost model); it has no Llama checkpoint")
    out = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm}
    if not c.tie_embeddings:
        out["lm_head.weight"] = model.lm_head
    hd = c.head_dim
    for i, w in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = w.qkv.split((c.heads * hd, c.kv_heads * hd, c.kv_heads * hd))
        gate, up = w.gate_up.chunk(2)
        for key, t in zip(_LAYER_KEYS, (w.input_norm, q, k, v, w.o, w.post_norm, gate, up, w.down)):
            out[p + key] = t
    return {k: t.detach() for k, t in out.items()}


def state_dict_hf(model: LlamaModel) -> dict[str, Tensor]:
    """The model's weights under Hugging Face Llama names (q/k/v and gate/up split again)."""
    return {k: t.contiguous() for k, t in _hf_views(model).items()}


@torch.no_grad()
def load_state_dict_hf(model: LlamaModel, tensors: dict[str, Tensor], where: str = "the checkpoint") -> LlamaModel:
    """Copy Hugging Face Llama tensors into ``model``; a missing, unexpected or mis-shaped tensor is an error."""
    views = _hf_views(model)
    want = {k: tuple(t.shape) for k, t in views.items()}
    optional = {"lm_head.weight"} if model.config.tie_embeddings else set()
    missing = sorted(set(want) - set(tensors))
    unexpected = sorted(set(tensors) - set(want) - optional - {k for k in tensors if k.endswith("rotary_emb.inv_freq")})
    for names, what in ((missing, "lacks {} tensor(s) a Llama model needs"),
                        (unexpected, "holds {} tensor(s) a Llama model does not have")):
        if names:
            raise ValueError(f"{where} {what.format(len(names))}: {names[:6]}" + (" ..." if len(names) > 6 else ""))
    for k, shape in want.items():
        if tuple(tensors[k].shape) != shape:
            raise ValueError(f"{where}: tensor {k} has shape {tuple(tensors[k].shape)}, the config says {shape}")
    for k, view in views.items():
        view.copy_(tensors[k])
    return model


def load_smollm2(*, device=None, dtype: torch.dtype | None = None, path: str | Path | None = None) -> LlamaModel:
    """SmolLM2-135M-Instruct (:mod:`studylog.smollm2`), dequantized, on the GPU in bf16 where there is one."""
    from studylog import runtime, smollm2

    ckpt = smollm2.read(path)
    device = torch.device(device) if device is not None else runtime.device()
    dtype = dtype if dtype is not None else torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = {f.name: getattr(ckpt, f.name) for f in fields(ModelConfig) if f.name not in ("name", "shared_layers")}
    cfg = ModelConfig(name="smollm2-135m", **shape)  # the checkpoint names its config's fields as ModelConfig does
    model = LlamaModel(cfg, device=device, dtype=dtype, seed=None)
    tensors = {name: torch.from_numpy(ckpt.tensor(name)) for name in ckpt.tensor_names()}
    return load_state_dict_hf(model, tensors, where=str(ckpt.path))


def describe(cfg: ModelConfig) -> dict[str, Any]:
    """The config and its parameter counts."""
    counts = cfg.parameter_counts()
    return {**asdict(cfg), **{f"params_{k}": v for k, v in counts.items()},
            "head_share": round(cfg.head_share(), 4), "params_total_b": round(sum(counts.values()) / 1e9, 3)}

