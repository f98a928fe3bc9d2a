"""What the chapter 7 and 8 tests share: a recorder like ``studylog.bench.BenchRun`` without a GPU, and a Hugging Face
Llama checkpoint folder or module read into a model (the layout conversion the real model's loader and the peer go
through)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from studylog.decode.model import LlamaModel, ModelConfig, hf_config, load_state_dict_hf, state_dict_hf


class LocalRun:
    """Records like ``BenchRun`` (its rows have the same fields): the CPU sweeps of the tests. Its timings say how
    the loop spends a CPU's time, nothing about a GPU."""

    quick = False

    def __init__(self):
        self.rows: list[dict] = []
        self.checks: list[dict] = []
        self.notes: list[str] = []

    def record(self, series: str, ms, *, params: dict, role: str = "kernel", clock: str | None = None, **extra):
        row = {"series": series, "role": role, "params": dict(params), "ms": ms.median, "clock": "cpu",
               "spread_ms": ms.spread, **extra}
        self.rows.append(row)
        return row

    def check(self, name: str, passed: bool, *, params: dict | None = None, **detail) -> bool:
        self.checks.append({"name": name, "passed": bool(passed), "params": params or {}, **detail})
        return bool(passed)

    def note(self, text: str) -> None:
        self.notes.append(text)


def save_checkpoint(model: LlamaModel, folder: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the Hugging Face Llama layout."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(model.config, model.dtype), indent=1) + "\n")
    save_file({k: t.cpu() for k, t in state_dict_hf(model).items()}, str(folder / "model.safetensors"))
    return folder


def load_checkpoint(folder: str | Path, *, device=None, dtype: torch.dtype | None = None) -> LlamaModel:
    """A :class:`LlamaModel` from a local Hugging Face Llama checkpoint folder (``config.json`` and one or
    more ``*.safetensors`` files); ``dtype`` defaults to the checkpoint's."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json: not a Hugging Face checkpoint folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors file")
    hf = json.loads((folder / "config.json").read_text())
    cfg = config_from_hf(hf, name=folder.name)
    if dtype is None:
        dtype = getattr(torch, str(hf.get("torch_dtype", "bfloat16")), torch.bfloat16)
    tensors: dict[str, Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    model = LlamaModel(cfg, device=device, dtype=dtype, seed=None)
    return load_state_dict_hf(model, tensors, where=str(folder))


def config_from_hf(hf: dict[str, Any], name: str = "checkpoint") -> ModelConfig:
    """A :class:`ModelConfig` from a Hugging Face Llama ``config.json``; refuses what this model lacks."""
    if hf.get("model_type") != "llama":
        raise ValueError(f"config.json: model_type must be 'llama', got {hf.get('model_type')!r}")
    scaling = hf.get("rope_scaling")
    if scaling not in (None, {}):
        raise ValueError(f"config.json: rope_scaling {scaling!r} is not implemented by this model")
    rope = hf.get("rope_parameters") or {}  # newer transformers keep rope_theta here
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: rope_type {rope['rope_type']!r} is not implemented by this model")
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise ValueError(f"config.json: {key}=true is not implemented by this model")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: hidden_act must be 'silu', got {hf.get('hidden_act')!r}")
    try:
        return ModelConfig(
            name=hf.get("studylog_name", name), vocab_size=hf["vocab_size"], hidden=hf["hidden_size"],
            layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
            kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]), intermediate=hf["intermediate_size"],
            head_dim=hf.get("head_dim") or 0, rope_theta=theta,
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    except KeyError as exc:
        raise ValueError(f"config.json has no {exc.args[0]!r}") from None




def from_module(module: nn.Module, *, device=None, dtype: torch.dtype | None = None) -> LlamaModel:
    """A :class:`LlamaModel` with the weights of a Hugging Face ``LlamaForCausalLM`` (or a module with its names)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    inner = getattr(module, "model", None)
    missing = [n for n, ok in (("model", inner is not None),
                               ("model.embed_tokens", hasattr(inner, "embed_tokens")),
                               ("model.layers", hasattr(inner, "layers")), ("model.norm", hasattr(inner, "norm")),
                               ("lm_head", hasattr(module, "lm_head"))) if not ok]
    if missing:
        raise ValueError(f"{type(module).__name__} is not a Llama-style causal LM: it has no {', '.join(missing)}")
    hf = getattr(getattr(module, "config", None), "to_dict", lambda: None)()
    if hf is None:
        raise ValueError(f"{type(module).__name__} has no Hugging Face config (module.config.to_dict())")
    cfg = config_from_hf(hf, name=type(module).__name__)
    first = next(module.parameters())
    model = LlamaModel(cfg, device=device or first.device, dtype=dtype or first.dtype, seed=None)
    return load_state_dict_hf(model, dict(module.state_dict()), where=type(module).__name__)
