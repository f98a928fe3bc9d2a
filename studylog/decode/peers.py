"""What practitioners would run instead: Hugging Face ``generate`` with ``xgrammar.contrib.hf.LogitsProcessor``,
xgrammar's documented integration, on a copy of the model (:func:`hf_model`), timed as the loop's rows are timed."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, NamedTuple, Sequence

import torch

from studylog.decode.grammar import Grammar
from studylog.decode.generation import check_model, positive_int, token_ids
from studylog.decode.model import LlamaModel, hf_config, state_dict_hf


def _rope_theta(config: Any) -> float | None:
    """The rope theta a transformers config holds (``rope_parameters`` in 5.x, ``rope_theta`` before)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", float("nan")))


@torch.no_grad()
def hf_model(model: LlamaModel):
    """A ``transformers.LlamaForCausalLM`` holding a copy of ``model`` (weights, config, device, dtype), in eval mode,
    built as ``from_pretrained`` builds one and loaded strictly."""
    import transformers  # the peers extra

    model = check_model(model)
    cfg = model.config
    tensors = state_dict_hf(model)  # ValueError for a shared-layers config
    config = transformers.LlamaConfig(**hf_config(cfg, model.dtype))
    # the generation defaults of a bare LlamaConfig (bos 1, eos 2) mean nothing for this vocabulary
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    theta = _rope_theta(config)
    if theta != cfg.rope_theta:
        raise RuntimeError(f"transformers {transformers.__version__} read rope theta {theta} from the config, "
                           f"the model has {cfg.rope_theta}")
    major = int(transformers.__version__.split(".")[0])
    kwargs = {"dtype" if major >= 5 else "torch_dtype": model.dtype}  # renamed in transformers 5
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: random initialisation, overwritten below
        no_init_weights = contextlib.nullcontext
    with torch.device(model.device), no_init_weights():
        hf = transformers.LlamaForCausalLM._from_config(config, **kwargs)
    hf.tie_weights()  # no_init_weights also skips the tying that initialisation does (a no-op when untied)
    if cfg.tie_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"LlamaForCausalLM and LlamaModel disagree on tensors: missing {missing[:6]}, "
                           f"unexpected {unexpected[:6]}")
    if cfg.tie_embeddings and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("the Hugging Face model did not tie its LM head to its embedding")
    first = next(hf.parameters())
    if first.device != model.device or first.dtype != model.dtype:
        raise RuntimeError(f"the Hugging Face model is on {first.device} in {first.dtype}, the model on "
                           f"{model.device} in {model.dtype}")
    return hf.eval()


def _request(hf: Any, grammar: Any, prompt_ids: Any, max_new_tokens: Any) -> list[int]:
    """The checked prompt ids of one request of ``hf`` under ``grammar``."""
    import transformers

    if not isinstance(hf, transformers.PreTrainedModel) or not hasattr(hf, "generate"):
        raise TypeError(f"hf must be a transformers causal LM (hf_model(model) builds one), got {type(hf).__name__}"
                        + ("; convert a studylog LlamaModel with hf_model(model)" if isinstance(hf, LlamaModel)
                           else ""))
    head = hf.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(hf).__name__} has no LM head (get_output_embeddings() is None)")
    rows = head.weight.shape[0]
    if not isinstance(grammar, Grammar):
        raise TypeError(f"grammar must be a studylog.decode.Grammar, got {type(grammar).__name__}")
    V = grammar.xgrammar.tokenizer_info.vocab_size
    if V != rows:
        raise ValueError(
            f"grammar {grammar.name!r} was compiled for the vocabulary {grammar.vocab.name!r} of {V} ids, but the "
            f"model's LM head has {rows} rows: they must match (a grammar of another vocabulary allows other ids; "
            "and over a head padded past the vocabulary, xgrammar's processor masks only the first "
            f"{V} logits and leaves the padded ids allowed)")
    positive_int("max_new_tokens", max_new_tokens)
    return token_ids("prompt_ids", prompt_ids, rows)


def hf_generate(hf, grammar: Grammar, prompt_ids: Sequence[int], *, max_new_tokens: int) -> list[int]:
    """The greedy constrained output ids of ``hf`` for one prompt, EOS (the grammar's vocabulary's) excluded."""
    ids = _request(hf, grammar, prompt_ids, max_new_tokens)
    return _generate(hf, grammar, ids, max_new_tokens, _inputs(hf, grammar, ids))


def _inputs(hf, grammar: Grammar, ids: list[int]) -> tuple:
    """The prompt and its attention mask on the model's device, and a new xgrammar processor (one per call: it holds
    the matchers' state)."""
    from xgrammar.contrib.hf import LogitsProcessor

    input_ids = torch.tensor([ids], dtype=torch.int64, device=next(hf.parameters()).device)
    return input_ids, torch.ones_like(input_ids), LogitsProcessor(grammar.xgrammar)


@torch.no_grad()
def _generate(hf, grammar: Grammar, ids: list[int], max_new_tokens: int, inputs: tuple) -> list[int]:
    input_ids, mask, processor = inputs
    eos = grammar.vocab.eos_id
    out = hf.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                      logits_processor=[processor], eos_token_id=eos, pad_token_id=eos)
    new = out[0, len(ids):].tolist()
    return new[:new.index(eos)] if eos in new else new


class HFTiming(NamedTuple):
    """:func:`time_hf`'s result: the median ms per output token, each repeat's, and the first repeat's ids."""

    ms_per_token: float
    per_repeat: list[float]
    ids: list[int]
    #: whether every repeat wrote the same tokens (on a GPU, bf16 near-ties may go either way between runs)
    repeatable: bool = True


def time_hf(hf, grammar: Grammar, prompt_ids: Sequence[int], *, max_new_tokens: int, repeats: int = 3) -> HFTiming:
    """Milliseconds per output token of :func:`hf_generate` (prefill included, the processor built before the clock):
    a warm-up, then ``repeats`` timed with Python's collector paused."""
    from studylog.bench import collector_paused

    ids = _request(hf, grammar, prompt_ids, max_new_tokens)
    positive_int("repeats", repeats)
    cuda = next(hf.parameters()).device.type == "cuda"
    hf_generate(hf, grammar, ids, max_new_tokens=max_new_tokens)  # a warm-up
    per_repeat, outputs = [], []
    with collector_paused():
        for _ in range(repeats):
            inputs = _inputs(hf, grammar, ids)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = _generate(hf, grammar, ids, max_new_tokens, inputs)
            if cuda:
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            per_repeat.append(ms / max(len(out), 1))
            outputs.append(out)
    # on a GPU greedy generate need not repeat itself (bf16 logits): each repeat is timed over its own tokens
    return HFTiming(statistics.median(per_repeat), per_repeat, outputs[0], all(o == outputs[0] for o in outputs))
