"""A tokenizer's vocabulary as the automaton sees it: a real one (:func:`load_vocabulary`), a small one
(:func:`make_vocabulary`), and the 256 single bytes (:func:`byte_vocabulary`)."""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
from torch import Tensor


class TokenVocabulary:
    """The bytes of every token id (None for ids that are not text, the EOS id among them), an EOS id, and the
    tokenizer's canonical ``encoder`` (text -> ids; only the character level, which retokenizes, needs it)."""

    def __init__(self, name: str, token_bytes: Sequence[Optional[bytes]], eos_id: Optional[int],
                 encoder: Optional[Callable[[str], list[int]]] = None):
        size = len(token_bytes)
        if eos_id is None:
            raise ValueError(f"vocabulary {name!r} has no EOS token; constrained decoding needs one to end "
                             "generation in a final state")
        if not isinstance(eos_id, int) or not 0 <= eos_id < size:
            raise ValueError(f"EOS token id {eos_id!r} of vocabulary {name!r} is outside the vocabulary [0, {size})")
        if token_bytes[eos_id] is not None:
            raise ValueError(f"EOS token id {eos_id} of vocabulary {name!r} is also a text token "
                             f"({token_bytes[eos_id]!r}); the EOS id must not carry text")
        self.name = name
        self.token_bytes: tuple[Optional[bytes], ...] = tuple(token_bytes)
        self.eos_id = eos_id
        self.encoder = encoder
        self._by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None:
                if not b:
                    raise ValueError(f"token id {i} of vocabulary {name!r} has empty bytes")
                self._by_bytes.setdefault(b, i)
        self._outlines = None

    @property
    def vocab_size(self) -> int:
        """Number of ids (text tokens, EOS and other special or unused ids)."""
        return len(self.token_bytes)

    @property
    def byte_complete(self) -> bool:
        """True when each of the 256 bytes is a token by itself (every byte-level BPE vocabulary is)."""
        return all(bytes([b]) in self._by_bytes for b in range(256))

    def __repr__(self) -> str:
        return f"TokenVocabulary({self.name!r}, {self.vocab_size} ids, eos={self.eos_id})"

    def check_id(self, token_id: int) -> int:
        """``token_id`` as an int, or an error when it is not an id of this vocabulary."""
        if isinstance(token_id, Tensor):
            token_id = token_id.item()
        if not isinstance(token_id, (int, np.integer)) or isinstance(token_id, bool):
            raise TypeError(f"token id must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size}) of {self.name!r}")
        return int(token_id)

    def token_id(self, data: bytes) -> int:
        """The id of the token whose bytes are exactly ``data``."""
        try:
            return self._by_bytes[data]
        except KeyError:
            raise KeyError(f"{data!r} is not a token of {self.name!r}") from None

    def decode(self, ids: Sequence[int]) -> bytes:
        """The bytes of a token sequence (EOS and other non-text ids are refused)."""
        out = []
        for i in ids:
            i = self.check_id(i)
            if (b := self.token_bytes[i]) is None:
                raise ValueError(f"token id {i} of {self.name!r} is not a text token (EOS or special)")
            out.append(b)
        return b"".join(out)

    def show(self, token_id: int) -> str:
        """A short printable form of one token: ``'␣"'`` for the two bytes space and quote, ``<EOS>``."""
        token_id = self.check_id(token_id)
        if token_id == self.eos_id:
            return "<EOS>"
        if (b := self.token_bytes[token_id]) is None:
            return f"<special {token_id}>"
        return b.decode("utf-8", errors="backslashreplace").replace(" ", "␣").replace("\n", "\\n")

    def encode(self, text: str | bytes) -> list[int]:
        """The tokenizer's canonical ids for ``text`` (what the model saw in training)."""
        if self.encoder is None:
            raise ValueError(f"vocabulary {self.name!r} has no encoder; character-level jumps need one to retokenize")
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return list(self.encoder(text))

    @functools.lru_cache(maxsize=8)
    def padded(self, size: int) -> "TokenVocabulary":
        """This vocabulary over ``size`` ids, for an LM head padded to ``size`` rows: the extra ids carry no text."""
        if isinstance(size, bool) or not isinstance(size, int) or size < self.vocab_size:
            raise ValueError(f"size must be an int of at least the vocabulary's {self.vocab_size} ids, got {size!r}")
        if size == self.vocab_size:
            return self
        extra = size - self.vocab_size
        return TokenVocabulary(f"{self.name}+{extra}", list(self.token_bytes) + [None] * extra, self.eos_id,
                               self.encoder)

    def outlines_vocabulary(self):
        """The same vocabulary as an ``outlines_core.Vocabulary`` (built once)."""
        if self._outlines is None:
            from outlines_core import Vocabulary

            mapping: dict[bytes, list[int]] = {}
            for i, b in enumerate(self.token_bytes):
                if b is not None:
                    mapping.setdefault(b, []).append(i)
            self._outlines = Vocabulary(self.eos_id, mapping)
        return self._outlines


@functools.lru_cache(maxsize=4)
def load_vocabulary(name: str = "cl100k_base") -> TokenVocabulary:
    """A real BPE vocabulary shipped offline inside ``bpe-openai`` (``cl100k_base`` or ``o200k_base``; EOS
    ``<|endoftext|>``), or ``smollm2``: SmolLM2-135M-Instruct's (EOS ``<|im_end|>``)."""
    if name == "smollm2":
        from studylog.smollm2 import vocabulary
        return vocabulary()
    import bpe_openai

    try:
        enc = bpe_openai.get_encoding(name)
    except Exception as exc:  # the package raises its own error types for unknown names
        raise ValueError(f"unknown encoding {name!r}; bpe-openai offers {bpe_openai.list_encoding_names()}, "
                         "and studylog 'smollm2'") from exc
    try:
        eos = enc.eot_token
    except KeyError:
        eos = None
    values = enc.token_byte_values()
    token_bytes = [None if (not b or enc.is_special_token(i)) else b for i, b in enumerate(values)]
    return TokenVocabulary(name, token_bytes, eos, encoder=enc.encode_ordinary)


def make_vocabulary(tokens: Mapping[str | bytes, int], eos_id: Optional[int], name: str = "custom",
                    encoder: Optional[Callable[[str], list[int]]] = None) -> TokenVocabulary:
    """A small vocabulary from ``{token text or bytes: id}`` (tests, toys); unlisted ids and ``eos_id`` hold no text."""
    if eos_id is None:
        raise ValueError(f"vocabulary {name!r} has no EOS token; pass eos_id")
    size = max([*tokens.values(), eos_id]) + 1
    table: list[Optional[bytes]] = [None] * size
    for tok, i in tokens.items():
        if i < 0:
            raise ValueError(f"token id {i} of {tok!r} is negative")
        if i == eos_id:
            raise ValueError(f"EOS token id {eos_id} is also given to the text token {tok!r}")
        table[i] = tok.encode() if isinstance(tok, str) else bytes(tok)
    return TokenVocabulary(name, table, eos_id, encoder)


@functools.lru_cache(maxsize=1)
def byte_vocabulary():
    """The 256 bytes and an EOS (256), an ``outlines_core.Vocabulary``: an index over it is a regex's byte automaton."""
    from outlines_core import Vocabulary

    return Vocabulary(256, {bytes([b]): [b] for b in range(256)})
