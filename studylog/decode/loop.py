"""The decode loop: one constrained request, run every configuration's way on the same model.

A step: (1) the tokens not yet in the cache go to the device in one copy; (2) one forward of the body on them (a CUDA
graph per chunk length); (3) the host computes the allowed tokens while the body runs; (4) the LM head, dense or
chapter 2's masked head (eager: its launch depends on the allowed set); (5) the bitmask applied (dense head only);
(6) sampling, then the step's one wait, for the token; (7) the grammar advances, forced tokens join the next chunk."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.checks import check_choice
from studylog.decode import kernels, pieces
from studylog.decode.generation import (CONFIGS, STEER, DecodeConfig, Generation, check_model, gumbel_noise,
                                         positive_int, token_ids)
from studylog.decode.grammar import Grammar, continues_utf8
from studylog.decode.model import LlamaModel, dense_logits
from studylog.fsm.decoding import Writer
from studylog.runtime import cuda_graph, staged


class _Row:
    def __init__(self, prompt: list[int], grammar: Grammar, cfg: DecodeConfig, target: str | None):
        self.prompt = prompt
        self.ids: list[int] = []
        self.text = bytearray()
        self.kv_len = 0
        self.finished = False
        self.passes = self.jumped = self.retokenized = 0
        self.matcher = grammar.matcher() if cfg.mask == "xgrammar" else None
        self.states = [grammar.automaton.initial] if cfg.jump != "none" or cfg.mask == "automaton" else None
        self.writer = Writer(grammar.vocab, target) if target is not None else None

    def pending(self) -> list[int]:
        """Tokens not in the cache yet: the prompt, then the last sampled token and the forced ones after it."""
        n = len(self.prompt)
        return self.ids[self.kv_len - n:] if self.kv_len >= n else self.prompt[self.kv_len:] + self.ids

    def steer(self) -> int:
        """The token the writer favours next (-1: none)."""
        tok = self.writer.next_token(bytes(self.text)) if self.writer is not None and not self.finished else None
        return -1 if tok is None else tok


class Marks:
    """Timestamps on the device's stream (CUDA events) or, on a CPU, the host's clock."""

    def __init__(self, device: torch.device, on: bool):
        self.cuda, self.on, self.marks = device.type == "cuda", on, []

    def __call__(self) -> None:
        if self.on and self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        elif self.on:
            self.marks.append(time.perf_counter())

    def ms(self) -> list[float]:
        if not self.marks:
            return []
        if self.cuda:
            self.marks[-1].synchronize()
            return [self.marks[0].elapsed_time(m) for m in self.marks]
        return [(t - self.marks[0]) * 1e3 for t in self.marks]


#: Components of a step, in the order the device's stream runs them (see the module docstring).
COMPONENTS = ("body", "mask_wait", "head", "mask_apply", "sampling", "host")
_MARKS_PER_STEP = 7


class Decoder:
    """A model, a KV cache for ``batch`` sequences of up to ``max_seq`` tokens, and the loop's buffers. ``graphs``
    replays the body per chunk length (padded to the next of ``chunk_sizes``); ``head_impl``: ``"kernel"`` or
    ``"torch"``."""

    def __init__(self, model: LlamaModel, vocab: pieces.TokenVocabulary | None = None, *, batch: int = 1,
                 max_seq: int = 512, chunk_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
                 graphs: bool | None = None, head_impl: str | None = None):
        self.model = check_model(model)
        V = self.model.config.vocab_size
        if vocab is None:  # cl100k, over the head's rows when the model pads it
            vocab = pieces.load_vocabulary("cl100k_base")
            vocab = vocab.padded(V) if V > vocab.vocab_size else vocab
        self.vocab = vocab
        if vocab.vocab_size != V:
            hint = f" (pass vocab.padded({V}) for a head padded past the vocabulary)" if V > vocab.vocab_size else ""
            raise ValueError(f"the vocabulary {vocab.name!r} has {vocab.vocab_size} ids but the model's LM head has "
                             f"{V} rows: they must match{hint}")
        positive_int("batch", batch)
        positive_int("max_seq", max_seq)
        self.chunk_sizes = tuple(sorted(set(int(c) for c in chunk_sizes)))
        if not self.chunk_sizes or self.chunk_sizes[0] != 1:
            raise ValueError(f"chunk_sizes must include 1 (a plain decode step), got {chunk_sizes!r}")
        self.device = self.model.device
        cuda = self.device.type == "cuda"
        self.graphs = cuda if graphs is None else bool(graphs)
        if self.graphs and not cuda:
            raise ValueError("graphs=True needs the model on a CUDA device")
        self.head_impl = head_impl or ("kernel" if cuda else "torch")
        check_choice("head_impl", self.head_impl, ("kernel", "torch"))
        if self.head_impl == "kernel" and self.model.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"head_impl='kernel' runs chapter 2's kernels, which read bf16 or fp16 weights; the "
                             f"model is {self.model.dtype}: convert it (model.to(torch.bfloat16)) or use "
                             "head_impl='torch'")
        self.batch, self.max_seq, self.V = batch, max_seq, V
        C = self.max_chunk = self.chunk_sizes[-1]
        self.cache = self.model.new_cache(batch, max_seq + C)
        #: per sequence: chunk tokens [0, C), then start, last, steered token, tokens written so far
        self._inp_host, self._inp = staged(batch, C + 4, dtype=torch.int64, device=self.device)
        self._inp_np = self._inp_host.numpy()  # the same memory
        self._bits_host, self._bits = staged(batch, (V + 31) // 32, dtype=torch.int32, device=self.device)
        self._logits = torch.empty(batch, V, dtype=torch.float32, device=self.device)
        self._tok_host, self._tok = staged(batch, dtype=torch.int64, device=self.device)
        self._vocab_ids = torch.arange(V, device=self.device, dtype=torch.int64)
        self._graphs: dict[int, tuple[Any, Tensor]] = {}
        self._pool = self._batch_matcher = None
        self._prepared: dict[int, Grammar] = {}

    #: Whether the body returns every chunk position's hidden state (a verifier of drafts) or the last one's.
    every_position = False

    def _body_eager(self, T: int) -> Tensor:
        return self.body_call(T)()

    def _graph(self, T: int) -> tuple[Any, Tensor]:
        """The body for chunk length ``T`` in a CUDA graph, captured on first use."""
        if T not in self._graphs:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            self._graphs[T] = cuda_graph(lambda: self._body_eager(T), pool=self._pool)
        return self._graphs[T]

    def body_call(self, T: int = 1, fused: bool | None = None, gemv: bool | None = None):
        """A graph-safe call of the body on the static input buffers at chunk length ``T``."""
        if T > self.max_chunk:
            raise ValueError(f"T must be at most the largest chunk size {self.max_chunk}, got {T}")
        C = self.max_chunk
        return lambda: self.model(self._inp[:, :T], self._inp[:, C], self._inp[:, C + 1], self.cache,
                                  every=self.every_position, fused=fused, gemv=gemv)

    def prepare(self, grammar: Grammar, config: DecodeConfig | str = "masked_head") -> None:
        """Build every state's allowed set and compile the masked head's and the sampler's variants now (once per
        grammar), not inside the first request's steps."""
        cfg = CONFIGS[config] if isinstance(config, str) else config
        if cfg.head != "masked" or self.head_impl != "kernel" or self._prepared.get(id(grammar)) is grammar:
            return  # the torch head (a CPU's) compiles nothing, and builds a state's set in microseconds
        hidden = torch.zeros(1, self.model.config.hidden, device=self.device, dtype=self.model.dtype)
        out = torch.empty(1, self.V, device=self.device, dtype=torch.float32)
        for state in grammar.automaton.token_states():
            allowed = grammar.allowed([state], self.device)  # built and kept per state
            if self.batch == 1:
                pieces.masked_head_kernel(hidden, self.model.lm_head, allowed, out)
        logits = torch.zeros(self.batch, self.V, device=self.device, dtype=torch.float32)
        ids = torch.arange(kernels.ALLOWED_ARGMAX_MAX, device=self.device, dtype=torch.int32)
        for n in (1, kernels.ALLOWED_ARGMAX_MAX):
            kernels.allowed_argmax(logits, ids, n, self._tok.new_full((self.batch,), -1), STEER, self._tok)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._prepared[id(grammar)] = grammar

    def capture(self) -> None:
        """Capture the body's graph of every chunk length now (else on first use)."""
        if self.graphs:
            for T in self.chunk_sizes:
                self._graph(T)

    def _body(self, rows: list[_Row], chunks: list[list[int]], steers: list[int] | None = None) -> Tensor:
        """One forward on a chunk per sequence, a finished one riding along (one dummy token after its end): the
        hidden state ``[B, D]`` (``[B, T, D]`` with :attr:`every_position`)."""
        T = max(len(c) for c in chunks)
        C = self.max_chunk
        # a numpy store into the pinned buffer (far cheaper than torch's __setitem__); the previous step's copy
        # from it has finished, since its token was waited for
        host = self._inp_np
        for b, (r, c) in enumerate(zip(rows, chunks)):
            if T <= C:
                host[b, :len(c)] = c
            host[b, C:C + 4] = ((min(r.kv_len, self.max_seq), 0, -1, 0) if r.finished else
                                (r.kv_len, len(c) - 1, steers[b] if steers else -1, len(r.ids)))
        if self._inp is not self._inp_host:
            self._inp.copy_(self._inp_host, non_blocking=True)
        if T > C:  # a long prompt: eager, at its exact length
            toks = torch.zeros(self.batch, T, dtype=torch.int64)
            for b, c in enumerate(chunks):
                toks[b, :len(c)] = torch.tensor(c)
            return self.model(toks.to(self.device), self._inp[:, C], self._inp[:, C + 1], self.cache,
                              every=self.every_position)
        if self.graphs:
            graph, out = self._graph(next(s for s in self.chunk_sizes if s >= T))
            graph.replay()
            return out
        return self._body_eager(T)

    def generate(self, grammar: Grammar, prompts: Sequence[Sequence[int] | str], config: DecodeConfig | str,
                 *, max_new_tokens: int = 64, targets: Sequence[str | None] | None = None,
                 temperature: float = 0.0, seed: int = 0, instrument: bool = True, record: bool = False) -> Generation:
        """Decode one request: ``prompts`` (ids or text per sequence) under ``grammar``, run as ``config``.
        ``targets`` steer sequences to given texts; sampled (``temperature`` above 0), the noise depends only on
        ``seed``, sequence, position and token, so every configuration draws the same. ``instrument`` splits the time
        into :data:`COMPONENTS`; ``record`` keeps each sampled position's hidden state (``agreement.compare``)."""
        cfg = CONFIGS[config] if isinstance(config, str) and config in CONFIGS else config
        if not isinstance(cfg, DecodeConfig):
            raise ValueError(f"config must be a DecodeConfig or one of {sorted(CONFIGS)}, got {config!r}")
        if not isinstance(grammar, Grammar):
            raise TypeError(f"grammar must be a studylog.decode.Grammar, got {type(grammar).__name__}")
        if grammar.vocab is not self.vocab:
            raise ValueError(f"the grammar was compiled for vocabulary {grammar.vocab.name!r}, not the decoder's")
        if isinstance(prompts, (str, Tensor)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list with one prompt (text or token ids) per sequence, got "
                            f"{type(prompts).__name__}")
        prompts = [token_ids(f"prompt {b}", self.vocab.encode(p) if isinstance(p, str) else p, self.V)
                   for b, p in enumerate(prompts)]
        if len(prompts) != self.batch:
            raise ValueError(f"prompts holds {len(prompts)} sequences; this decoder has batch {self.batch}")
        positive_int("max_new_tokens", max_new_tokens)
        for b, p in enumerate(prompts):
            if len(p) + max_new_tokens > self.max_seq:
                raise ValueError(f"prompt {b} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs "
                                 f"{len(p) + max_new_tokens} positions, longer than the cache's max_seq={self.max_seq}")
        targets = list(targets) if targets is not None else [None] * self.batch
        if len(targets) != self.batch:
            raise ValueError(f"targets holds {len(targets)} entries; this decoder has batch {self.batch}")
        if not (temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.prepare(grammar, cfg)
        self.cache.k.zero_()
        self.cache.v.zero_()
        rows = [_Row(p, grammar, cfg, t) for p, t in zip(prompts, targets)]
        for r in rows:
            self._settle(r, grammar, cfg, max_new_tokens)
        out = self._run(rows, grammar, cfg, max_new_tokens, temperature, seed, instrument, record)
        out.temperature, out.seed = float(temperature), seed
        return out

    def _run(self, rows: list[_Row], grammar: Grammar, cfg: DecodeConfig, max_new: int, temperature: float,
             seed: int, instrument: bool, record: bool = False) -> Generation:
        marks = Marks(self.device, instrument)
        records: list[dict] | None = [{} for _ in rows] if record else None
        V, eos = self.V, self.vocab.eos_id
        mask_host_ms, head_host_ms, wall_steps, chunk_lengths = [], [], [], []
        forwards = 0
        while not all(r.finished for r in rows):
            t_step = time.perf_counter()
            chunks = [r.pending() if not r.finished else [0] for r in rows]
            steers = [r.steer() for r in rows]
            chunk_lengths.append(max(len(c) for c in chunks))
            marks()
            hidden = self._body(rows, chunks, steers)
            marks()
            t0 = time.perf_counter()
            active = [b for b, r in enumerate(rows) if not r.finished]
            allowed = self._host_mask(rows, active, grammar, cfg)
            mask_host_ms.append((time.perf_counter() - t0) * 1e3)
            marks()
            if cfg.head == "dense" and self._bits is not self._bits_host:
                self._bits.copy_(self._bits_host, non_blocking=True)
            marks()
            t0 = time.perf_counter()
            if cfg.head == "dense":
                dense_logits(hidden, self.model.lm_head, out=self._logits)
            elif self.head_impl == "kernel":
                pieces.masked_head_kernel(hidden, self.model.lm_head, allowed, self._logits)
            else:
                pieces.masked_head_torch(hidden, self.model.lm_head, allowed, self._logits)
            head_host_ms.append((time.perf_counter() - t0) * 1e3)
            marks()
            if cfg.head == "dense":
                import xgrammar as xgr

                xgr.apply_token_bitmask_inplace(self._logits, self._bits, vocab_size=V)
            marks()
            self._sample(temperature, seed, allowed)
            if self._tok_host is not self._tok:
                self._tok_host.copy_(self._tok, non_blocking=True)
            marks()
            if self.device.type == "cuda":
                torch.cuda.current_stream().synchronize()  # the one wait per step: the grammar needs the token
            tokens = self._tok_host.tolist()
            forwards += 1
            if records is not None:
                kept = hidden.detach().double().cpu()
                for b in active:
                    records[b][len(rows[b].ids)] = (kept[b], tokens[b], steers[b])
            for b in active:
                r = rows[b]
                r.kv_len += len(chunks[b])
                r.passes += 1
                self._accept(r, tokens[b], grammar, cfg, max_new, eos)
            wall_steps.append((time.perf_counter() - t_step) * 1e3)
        ms = self._account(marks.ms(), wall_steps, mask_host_ms, head_host_ms, instrument)
        return Generation(cfg.name, [r.ids for r in rows], [bytes(r.text) for r in rows], [r.finished for r in rows],
                          forwards, [r.passes for r in rows], [r.jumped for r in rows], [r.retokenized for r in rows],
                          chunk_lengths, ms, wall_steps[0] if wall_steps else 0.0, instrument, records)

    @staticmethod
    def _account(marks: list[float], wall: list[float], mask_host: list[float], head_host: list[float],
                 instrument: bool) -> dict[str, float]:
        """Per-component milliseconds summed over the steps."""
        ms = {"wall": float(sum(wall)), "mask_host": float(sum(mask_host)), "head_host": float(sum(head_host))}
        if not instrument or not wall:
            return ms
        m = np.asarray(marks).reshape(len(wall), _MARKS_PER_STEP)
        parts = {"body": m[:, 1] - m[:, 0], "mask_wait": m[:, 2] - m[:, 1],
                 "mask_apply": (m[:, 3] - m[:, 2]) + (m[:, 5] - m[:, 4]), "head": m[:, 4] - m[:, 3],
                 "sampling": m[:, 6] - m[:, 5]}
        for k in COMPONENTS[:-1]:
            ms[k] = float(parts[k].sum())
        ms["host"] = ms["wall"] - sum(ms[k] for k in COMPONENTS[:-1])
        return ms

    def _host_mask(self, rows: list[_Row], active: list[int], grammar: Grammar, cfg: DecodeConfig):
        """The next position's allowed tokens: the bitmask (dense head) or chapter 2's allowed sets (masked head)."""
        if cfg.head == "masked":
            return grammar.allowed([rows[b].states[-1] if b in active else None for b in range(len(rows))], self.device)
        bits = self._bits_host
        if cfg.mask == "automaton":
            for b in active:
                bits[b].numpy().view(np.uint8)[:] = grammar.state_words(rows[b].states[-1])
        elif len(active) == 1:
            rows[active[0]].matcher.fill_next_token_bitmask(bits, active[0])
        elif active:
            import xgrammar as xgr

            if self._batch_matcher is None:
                self._batch_matcher = xgr.BatchGrammarMatcher()
            self._batch_matcher.batch_fill_next_token_bitmask([rows[b].matcher for b in active], bits, active)
        return None

    def _sample(self, temperature: float, seed: int, allowed: pieces.AllowedTokens | None = None) -> None:
        """Steering bias, then greedy or Gumbel-max sampling of ``_logits`` into ``_tok`` (``allowed``: its union)."""
        C = self.max_chunk
        steer = self._inp[:, C + 2]
        logits = self._logits
        n = allowed.union_count if allowed is not None else 0
        if temperature == 0 and 1 <= n <= kernels.ALLOWED_ARGMAX_MAX and self.head_impl == "kernel":
            kernels.allowed_argmax(logits, allowed.kernel_ids, n, steer, STEER, out=self._tok)
            return
        if 1 <= n <= kernels.ALLOWED_ARGMAX_MAX:
            # the same rule in torch, and seeded sampling: the dense path's numbers in its order of operations
            # (bias, division, the same noise of the same token) at the union's ids only; the rest are -inf
            ids = allowed.union_ids.long()
            vals = logits.index_select(1, ids)
            vals = torch.where(ids[None, :] == steer[:, None], vals + STEER, vals)
            if temperature > 0:
                vals = vals.div_(temperature).add_(gumbel_noise(seed, self._inp[:, C + 3], ids))
            torch.index_select(ids, 0, vals.argmax(dim=1), out=self._tok)
            return
        logits.scatter_add_(1, steer.clamp(min=0)[:, None], (steer >= 0).to(logits.dtype)[:, None] * STEER)
        if temperature > 0:
            logits.div_(temperature).add_(gumbel_noise(seed, self._inp[:, C + 3], self._vocab_ids))
        torch.argmax(logits, dim=1, out=self._tok)

    def _settle(self, r: _Row, grammar: Grammar, cfg: DecodeConfig, max_new: int) -> None:
        """After a token: stop at the cap or where only EOS is allowed, else take the state's jumps (cut at the cap)."""
        auto = grammar.automaton
        while True:
            if len(r.ids) >= max_new:
                r.finished = True
                return
            if cfg.jump == "none":
                return
            state = r.states[-1]
            if auto.only_eos(state):
                r.finished = True
                return
            if cfg.jump == "token":
                jump = auto.token_jump(state)
                if jump is None:
                    return
                toks = jump.tokens[:max_new - len(r.ids)]
                for t in toks:
                    self._emit(r, t, grammar)
                r.jumped += len(toks)
                continue
            jump = auto.char_jump(state)
            if jump is None or not self._char_jump(r, jump, grammar, max_new):
                return

    def _char_jump(self, r: _Row, jump, grammar: Grammar, max_new: int) -> bool:
        """Append the forced bytes and retokenize (cache, matcher back to the first changed token); False: not taken."""
        new_text = bytes(r.text) + jump.data
        try:
            new_ids = self.vocab.encode(new_text.decode("utf-8"))
        except UnicodeDecodeError:  # the output ends inside a multi-byte character
            return False
        if len(new_ids) > max_new:
            return False
        keep = 0
        while keep < min(len(r.ids), len(new_ids)) and r.ids[keep] == new_ids[keep]:
            keep += 1
        if r.matcher is not None and len(r.ids) > keep:
            r.matcher.rollback(len(r.ids) - keep)
        r.retokenized += len(r.ids) - keep
        r.jumped += len(new_ids) - keep
        del r.ids[keep:], r.states[keep + 1:]
        r.text = bytearray(self.vocab.decode(r.ids)) if r.ids else bytearray()
        r.kv_len = min(r.kv_len, len(r.prompt) + keep)
        for t in new_ids[keep:]:
            self._emit(r, t, grammar)
        return True

    def _emit(self, r: _Row, tok: int, grammar: Grammar) -> None:
        r.ids.append(tok)
        r.text += self.vocab.token_bytes[tok]
        if not continues_utf8(r.text, len(self.vocab.token_bytes[tok])):
            # only xgrammar's byte-level mask allows such a token (Grammar.check_agreement): refuse it rather
            # than let the configurations write different outputs
            raise ValueError(f"the model picked token {tok} ({self.vocab.show(tok)!r}), which leaves the output of "
                             f"grammar {grammar.name!r} invalid UTF-8: xgrammar's mask allows it, chapter 1's "
                             "automaton does not, so the configurations would write different tokens")
        if r.matcher is not None and not r.matcher.accept_token(tok):
            raise RuntimeError(f"xgrammar refused token {tok} ({self.vocab.show(tok)!r}) of grammar {grammar.name!r}: "
                               "after a token its mask allowed, its grammar allows nothing (a dead end that chapter "
                               "1's automaton never allows; see Grammar.check_agreement)")
        if r.states is not None:
            nxt = grammar.automaton.next(r.states[-1], tok)
            if nxt is None:
                raise RuntimeError(f"the automaton refused token {tok} ({self.vocab.show(tok)!r}) in state "
                                   f"{r.states[-1]} of grammar {grammar.name!r}")
            r.states.append(nxt)

    def _accept(self, r: _Row, tok: int, grammar: Grammar, cfg: DecodeConfig, max_new: int, eos: int) -> None:
        if tok == eos:
            r.finished = True
            return
        self._emit(r, tok, grammar)
        self._settle(r, grammar, cfg, max_new)


__all__ = ["COMPONENTS", "Decoder", "Marks"]
