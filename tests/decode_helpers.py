"""What the chapter 7 and 8 tests share: a recorder like ``studylog.bench.BenchRun`` without a GPU, and a Hugging Face
Llama checkpoint folder written and read (the layout conversion the real model's loader and the peer go through)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from studylog.decode.model import LlamaModel, config_from_hf, hf_config, load_state_dict_hf, state_dict_hf


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
