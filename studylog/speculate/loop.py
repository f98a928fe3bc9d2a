"""The speculative loop: draft, walk, verify in one forward, accept the longest agreeing prefix.

A step, for every sequence of the batch: (1) chapter 3's matcher drafts; (2) chapter 1's automaton cuts the draft
at the first forbidden token and, from step 3 on, extends it with forced chains; (3) one forward on *pending tokens
+ draft* returns every position's hidden state; (4) chapter 2's masked head runs on each verified position with its
own state's allowed set; (5) sampling, and the host waits; (6) the draft's longest prefix that agrees with the
model is kept, then the model's own token.

Greedy, every accepted token is the allowed argmax at its position, so the outputs are chapter 7's wherever the
logits' rounding allows. Sampled, a drafted ``x`` is accepted with probability ``p(x)`` and otherwise the token is
drawn from ``p`` without ``x``: every output keeps the model's probability."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from studylog.checks import check_int
from studylog.decode import kernels, pieces
from studylog.decode.generation import DecodeConfig, Generation, gumbel_noise, hashed_uniform
from studylog.decode.grammar import Grammar
from studylog.decode.loop import Decoder, Marks
from studylog.decode.model import GEMV_MAX_TOKENS, LlamaModel
from studylog.speculate.draft import DraftGate, NgramDrafter, walk_draft
from studylog.runtime import cuda_graph, staged


@dataclass(frozen=True)
class SpecConfig(DecodeConfig):
    """Chapter 7's step 3 plus drafting: ``draft`` (n-gram proposals verified in one forward), ``extend`` (forced
    chains join the draft), ``gate`` (drafting switches itself off where it does not pay)."""

    draft: bool = True
    extend: bool = False
    gate: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.jump != "token" or self.head != "masked":
            raise ValueError("a speculative configuration builds on chapter 7's step 3: jump='token', head='masked'")


def _config(name: str, **kw) -> SpecConfig:
    return SpecConfig(name, "token", "masked", "automaton", **kw)


#: The chapter's configurations, in the lesson's order (step 1 is chapter 7's step 3 run by this loop: no drafts).
CONFIGS: dict[str, SpecConfig] = {
    "masked_head": _config("masked_head", draft=False),
    "ngram_draft": _config("ngram_draft"),
    "forced_draft": _config("forced_draft", extend=True),
    "gated_draft": _config("gated_draft", extend=True, gate=True),
}

#: Components of a speculative step (see the module docstring), in the order they run.
SPEC_COMPONENTS = ("draft", "body", "head", "sampling", "host")


@dataclass
class SpecGeneration(Generation):
    """A :class:`~studylog.decode.generation.Generation` with what the drafts did, per sequence (``drafts``: steps
    that verified one); ``trace``: each sequence's output length and state after every step."""

    proposed: list[int] = field(default_factory=list)
    cut: list[int] = field(default_factory=list)
    forced_drafted: list[int] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    draft_calls: int = 0
    trace: list[list[tuple[int, int | None]]] | None = None

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per step that verified a draft."""
        return sum(self.accepted) / max(sum(self.drafts), 1)


class SpeculativeDecoder(Decoder):
    """Chapter 7's :class:`~studylog.decode.loop.Decoder` whose body returns every position's hidden state, with
    chapter 3's matcher bound to its batch (or a ``drafter(outputs, room) -> drafts``), running :data:`CONFIGS`."""

    every_position = True

    def __init__(self, model: LlamaModel, vocab: pieces.TokenVocabulary | None = None, *, batch: int = 1,
                 max_seq: int = 512, draft_len: int = 8, chunk_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                 graphs: bool | None = None, head_impl: str | None = None, drafter: Callable | None = None):
        super().__init__(model, vocab, batch=batch, max_seq=max_seq, chunk_sizes=chunk_sizes, graphs=graphs,
                         head_impl=head_impl)
        check_int("draft_len", draft_len, low=1)
        if draft_len > self.max_chunk - 1:
            raise ValueError(f"draft_len={draft_len} does not fit the largest chunk ({self.max_chunk} tokens, one of "
                             f"them the token sampled last): use at most {self.max_chunk - 1}, or larger chunk_sizes")
        self.draft_len = draft_len
        #: The accepted tokens per draft below which step 4's gate stops drafting (:meth:`tune` measures it).
        self.gate_threshold = 0.5
        #: Chunk lengths whose verifying forward runs the six-launch layer (:meth:`tune` measures them).
        self.gemv_chunks = frozenset(T for T in self.chunk_sizes if batch * T == 1)
        self.ngram = NgramDrafter(batch, max_seq, max_seq, draft_len, self.device) if drafter is None else None
        self.drafter = drafter or self.ngram.propose
        R = batch * self.max_chunk  # verified rows at most: every position of every chunk
        self._rows_host, self._rows = staged(R, dtype=torch.int64, device=self.device)
        self._rows_np = self._rows_host.numpy()
        self._vlogits = torch.empty(R, self.V, dtype=torch.float32, device=self.device)
        self._vtok_host, self._vtok = staged(3, R, dtype=torch.int64, device=self.device)
        self._no_steer = torch.full((R,), -1, dtype=torch.int64, device=self.device)

    def _body_eager(self, T: int) -> Tensor:
        return self.verify_call(T)()

    def verify_call(self, T: int, gemv: bool | None = None):
        """The body on a chunk of ``T`` tokens per sequence, returning every position's hidden state (graph-safe): on
        the six-launch layer where ``T`` is in :attr:`gemv_chunks` (or ``gemv``), else on cuBLAS's nine-launch one."""
        C = self.max_chunk
        if gemv is None:
            gemv = T in self.gemv_chunks
        return lambda: self.model(self._inp[:, :T], self._inp[:, C], self._inp[:, C + 1], self.cache, every=True,
                                  gemv=gemv)

    def tune(self, reps: int = 20) -> dict[int, dict[str, float]]:
        """Pick the verifying forward's layer per chunk length by timing both in a graph (before :meth:`capture`), and
        the gate's threshold: a two-token forward's extra cost in one-token forwards. Returns ``{T: {layer: ms}}``."""
        if self.device.type != "cuda" or not self.model.uses_fused():
            return {}
        if self._graphs:
            raise RuntimeError("tune() picks the layer the body's graphs capture: call it before capture()")
        times: dict[int, dict[str, float]] = {}
        for T in self.chunk_sizes:
            if self.batch * T > GEMV_MAX_TOKENS:
                continue
            times[T] = {}
            for name, gemv in (("gemv", True), ("cublas", False)):
                graph, _ = cuda_graph(self.verify_call(T, gemv), warmups=1)
                graph.replay()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    graph.replay()
                end.record()
                end.synchronize()
                times[T][name] = start.elapsed_time(end) / reps
                del graph
        self.gemv_chunks = frozenset(T for T, t in times.items() if t["gemv"] < t["cublas"])
        if 1 in times and 2 in times:
            one, two = min(times[1].values()), min(times[2].values())
            self.gate_threshold = max(0.0, two / one - 1.0)
        return times

    def capture(self) -> None:
        """Capture the body's graphs and the drafter's round trip now (else on first use)."""
        super().capture()
        if self.ngram is not None:
            self.ngram.capture()

    def generate(self, grammar: Grammar, prompts: Sequence, config: SpecConfig | str = "forced_draft", *,
                 trace: bool = False, **options) -> SpecGeneration:
        """Decode one request as ``config`` (default: step 3, the chapter's loop; ``"gated_draft"`` adds step 4's
        gate, for requests whose drafts keep failing) with :meth:`Decoder.generate`'s options but ``targets``."""
        config = CONFIGS.get(config, config) if isinstance(config, str) else config
        if not isinstance(config, SpecConfig):
            raise ValueError(f"config must be a SpecConfig or one of {sorted(CONFIGS)}; chapter 7's configurations "
                             f"run on studylog.decode.Decoder, got {config!r}")
        if options.get("targets") is not None:
            raise ValueError("targets steer the model to a given output; a drafting configuration verifies drafts "
                             "against the model's own tokens: run it without targets")
        self._trace = trace
        return super().generate(grammar, prompts, config, **options)

    def _run(self, rows, grammar: Grammar, cfg: DecodeConfig, max_new: int, temperature: float, seed: int,
             instrument: bool, record: bool = False) -> Generation:
        records: list[dict] | None = [{} for _ in rows] if record else None
        B = len(rows)
        if self.ngram is not None:
            self.ngram.admit([r.prompt for r in rows])
        cuda = self.device.type == "cuda"
        auto = grammar.automaton
        gate = DraftGate(B, min_accepted=self.gate_threshold) if cfg.gate else None
        stats = {k: [0] * B for k in ("proposed", "cut", "forced_drafted", "verified", "accepted", "drafts")}
        trace: list | None = [] if self._trace else None
        times = dict.fromkeys((*SPEC_COMPONENTS, "wall"), 0.0)
        chunk_lengths, forwards, draft_calls, first_step = [], 0, 0, 0.0
        C = self.max_chunk
        while not all(r.finished for r in rows):
            t_step = time.perf_counter()
            marks = Marks(self.device, instrument)
            # 1-2. draft and walk
            pend = [r.pending() if not r.finished else [0] for r in rows]
            pending = [len(p) for p in pend]
            room = [0 if r.finished else min(max_new - len(r.ids) - 1, C - pending[b],
                                             self.max_seq - r.kv_len - pending[b] - 1)
                    for b, r in enumerate(rows)]
            asks = [r.ids if cfg.draft and room[b] > 0 and r.ids and (gate is None or gate.allows(b, pending[b]))
                    else None for b, r in enumerate(rows)]
            proposals = [[] for _ in rows]
            if any(a is not None for a in asks):
                proposals = self.drafter(asks, room)
                draft_calls += 1
            walked = []
            for b, r in enumerate(rows):
                if r.finished:
                    walked.append(None)
                    continue
                w = walk_draft(auto, r.states[-1], proposals[b][:max(room[b], 0)], max(room[b], 0),
                               extend=cfg.extend and asks[b] is not None, eos=self.vocab.eos_id)
                stats["proposed"][b] += len(proposals[b])
                stats["cut"][b] += w.cut
                stats["forced_drafted"][b] += w.forced
                walked.append(w)
            t_draft = time.perf_counter()
            # 3. the body on pending + draft
            chunks = [pend[b] + walked[b].tokens if not r.finished else [0] for b, r in enumerate(rows)]
            chunk_lengths.append(max(len(c) for c in chunks))
            marks()
            hidden = self._body(rows, chunks)
            marks()
            Tg = hidden.shape[1]
            verify_states, row_index, owners = [], [], []
            for b, r in enumerate(rows):
                if r.finished:
                    continue
                first = pending[b] - 1
                for i, s in enumerate(walked[b].states):
                    row_index.append(b * Tg + first + i)
                    verify_states.append(s)
                    owners.append((b, len(r.ids) + i))
            R = len(row_index)
            self._rows_np[:R] = row_index
            if self._rows is not self._rows_host:
                self._rows[:R].copy_(self._rows_host[:R], non_blocking=True)
            h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self._rows[:R])
            # 4. the masked head, one allowed set per verified position
            allowed = grammar.allowed(verify_states, self.device)
            logits = self._vlogits[:R]
            head = pieces.masked_head_kernel if self.head_impl == "kernel" else pieces.masked_head_torch
            head(h, self.model.lm_head, allowed, logits)
            marks()
            # 5. sampling
            drafted = [t for b in range(B) if not rows[b].finished for t in walked[b].tokens + [-1]]
            self._choose(logits, allowed, R, temperature, seed, owners, drafted)
            marks()
            if cuda:
                torch.cuda.current_stream().synchronize()
            chosen = self._vtok_host[:, :R].tolist()
            kept = h.detach().double().cpu() if records is not None else None
            forwards += 1
            # 6. accept
            k = 0
            for b, r in enumerate(rows):
                if r.finished:
                    continue
                w = walked[b]
                n = len(w.tokens)
                a = 0
                if temperature > 0:
                    while a < n and chosen[1][k + a] == 1:
                        a += 1
                    token = chosen[2][k + a] if a < n else chosen[0][k + a]
                else:
                    while a < n and chosen[0][k + a] == w.tokens[a]:
                        a += 1
                    token = chosen[0][k + a]
                k += n + 1
                r.kv_len += pending[b] + a  # the pending tokens and the accepted draft are in the cache
                r.passes += 1
                verified, accepted = sum(w.proposed), sum(w.proposed[:a])
                stats["verified"][b] += verified
                stats["accepted"][b] += accepted
                stats["drafts"][b] += verified > 0
                if gate is not None:
                    gate.update(b, verified, accepted)
                if records is not None:  # the hidden state each kept token was chosen from (agreement.compare)
                    for i in range(a + 1):
                        records[b][len(r.ids) + i] = (kept[k - n - 1 + i], w.tokens[i] if i < a else token, -1)
                for t in w.tokens[:a]:
                    self._emit(r, t, grammar)
                self._accept(r, token, grammar, cfg, max_new, self.vocab.eos_id)
            if trace is not None:
                trace.append([(len(r.ids), r.states[-1]) for r in rows])
            wall = (time.perf_counter() - t_step) * 1e3
            first_step = first_step or wall
            times["wall"] += wall
            times["draft"] += (t_draft - t_step) * 1e3
            if instrument:
                m = marks.ms()
                for i, part in enumerate(SPEC_COMPONENTS[1:4]):  # body, head, sampling: between the marks
                    times[part] += m[i + 1] - m[i]
        if instrument:
            times["host"] = times["wall"] - sum(times[k] for k in SPEC_COMPONENTS[:-1])
        return SpecGeneration(cfg.name, [r.ids for r in rows], [bytes(r.text) for r in rows],
                              [r.finished for r in rows], forwards, [r.passes for r in rows],
                              [r.jumped for r in rows], [r.retokenized for r in rows], chunk_lengths, times,
                              first_step, instrument, records, draft_calls=draft_calls, trace=trace, **stats)

    def _choose(self, logits: Tensor, allowed, R: int, temperature: float, seed: int,
                owners: list[tuple[int, int]], drafted: list[int]) -> None:
        """Row 0 of ``_vtok``: each verified position's token (the allowed argmax, or a draw). Sampled, row 1:
        whether the drafted token is accepted (``u < p(x)``), row 2: a draw without that token."""
        out = self._vtok[:, :R]
        n = allowed.union_count
        if temperature == 0:
            if self.head_impl == "kernel" and 1 <= n <= kernels.ALLOWED_ARGMAX_MAX:
                kernels.allowed_argmax(logits, allowed.kernel_ids, n, self._no_steer[:R], 0.0, out=out[0])
            else:
                torch.argmax(logits, dim=1, out=out[0])
        else:
            seq = torch.tensor([o[0] for o in owners], dtype=torch.int64, device=self.device)
            pos = torch.tensor([o[1] for o in owners], dtype=torch.int64, device=self.device)
            x = torch.tensor(drafted, dtype=torch.int64, device=self.device)
            scaled = logits / temperature
            logp = torch.log_softmax(scaled, dim=1)
            gumbel = gumbel_noise(seed, pos, self._vocab_ids, seq)
            out[0] = torch.argmax(scaled + gumbel, dim=1)
            has = x >= 0
            p_x = torch.where(has, logp.gather(1, x.clamp(min=0)[:, None])[:, 0].exp(), torch.zeros_like(logp[:, 0]))
            u = hashed_uniform(seed, seq, pos, self._vocab_ids[:1], salt=1)[:, 0]
            out[1] = (u < p_x).to(torch.int64)
            residual = scaled.scatter(1, x.clamp(min=0)[:, None], float("-inf"))
            residual = torch.where(has[:, None], residual, scaled)
            out[2] = torch.argmax(residual + gumbel, dim=1)
        if self._vtok_host is not self._vtok:  # greedy needs row 0 only
            rows = slice(None) if temperature > 0 else slice(0, 1)
            self._vtok_host[rows, :R].copy_(out[rows], non_blocking=True)


__all__ = ["CONFIGS", "SPEC_COMPONENTS", "SpecConfig", "SpecGeneration", "SpeculativeDecoder"]
