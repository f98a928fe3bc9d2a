"""Chapter 3's steps (each launches its own kernels, in place), :class:`NgramMatcher` (a step bound to one batch's
buffers) and :func:`ngram_match` (step 7 or 12, by the batch's shapes and budget: :func:`final_step`)."""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import fields
from typing import Callable

import torch
from jaxtyping import Int32, Int64
from torch import Tensor

from studylog import runtime  # noqa: F401  (first: selects GPU or interpreter)
from studylog import cuda
from studylog.checks import check_int
from studylog.ngram.cpu_path import CpuPathCall
from studylog.ngram.formats import NgramConfig, NgramInputs, validate
from studylog.ngram.models import SCAN_THREADS

THREADS = 256          # threads per search block
TILE = THREADS * 4     # end positions per search tile: ITEMS = 4 per thread in ngram_one_pass.cu

#: Argument kinds of NGRAM_KERNEL_PARAMS (ngram_common.cuh), in order: every kernel takes them all.
SIGNATURE = ["ptr", "ptr", "i64", "ptr", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64",
             "ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"]

#: Loads in flight per thread per tile in steps 9 to 12 (``LOADS`` of ``ngram_stream``).
STREAM_LOADS = 4
#: The instances of ``ngram_stream<LOADS, VEC, EVICT_FIRST, SKIP_REFUSED>`` that steps 9 to 12 launch (``VEC``
#: tokens per load, :func:`stream_vec`: 1 in step 9 and wherever a row is not 16-byte aligned).
STREAM_INSTANCES = tuple(f"ngram_stream<{STREAM_LOADS}, {vec}, {evict_first}, {skip}>"
                         for evict_first, skip in (("false", "false"), ("true", "false"), ("true", "true"))
                         for vec in (2, 1))
cuda.declare_instances("ngram_stream", STREAM_INSTANCES)


def _chunk_len(batch: int, prompt_width: int, gen_width: int, tile: int, min_tiles: int, blocks_per_sm: int,
               chunk_len: int | None) -> int:
    """Whole tiles per block: about ``blocks_per_sm`` blocks per SM, ``min_tiles`` to 8 tiles each (``chunk_len``
    overrides, rounded up to whole tiles), doubled while the chunks exceed gridDim.y's limit."""
    if chunk_len is None:
        tiles = batch * (-(-prompt_width // tile) + -(-gen_width // tile))
        chunk_len = max(min_tiles, min(8, tiles // (blocks_per_sm * runtime.sm_count()))) * tile
    chunk_len = -(-chunk_len // tile) * tile
    while -(-prompt_width // chunk_len) + -(-gen_width // chunk_len) > 65535:
        chunk_len *= 2
    return chunk_len


def fused_chunk_len(batch: int, prompt_width: int, gen_width: int, *, chunk_tiles: int | None = None) -> int:
    """Haystack positions per block of steps 6, 7 and 8: about eight blocks per SM, 1 to 8 tiles of TILE."""
    return _chunk_len(batch, prompt_width, gen_width, TILE, 1, 8, None if chunk_tiles is None else chunk_tiles * TILE)


def stream_chunk_len(batch: int, prompt_width: int, gen_width: int, tile: int, *,
                     chunk_len: int | None = None) -> int:
    """Haystack positions per block of steps 9 to 12: about four blocks per SM, 2 to 8 tiles of ``tile``."""
    return _chunk_len(batch, prompt_width, gen_width, tile, 2, 4, chunk_len)


def stream_vec(*haystacks: Tensor) -> int:
    """2 (16-byte loads) when every row of every haystack starts 16 bytes aligned, else 1."""
    return 2 if all(t.data_ptr() % 16 == 0 and t.shape[1] % 2 == 0 for t in haystacks) else 1


#: The functions of ``ngram_stream.cu`` that :func:`stream_source` shows, in the file's order, and the knob an
#: instance needs on to call each (None: every instance calls it).
_STREAM_SHOWN = (("evict_first_policy", "EVICT_FIRST"), ("load_tokens", None), ("load_tile", None),
                 ("budget_bound_part", "SKIP_REFUSED"), ("add_bound_part", "SKIP_REFUSED"), ("ngram_stream", None))


def stream_source(*, vec: int | None, evict_first: bool, skip_refused: bool) -> str:
    """What an instance of ``ngram_stream`` (steps 9 to 12) compiles: the functions it calls, each ``if constexpr``
    on a knob replaced by the branch it takes (``vec=None``: both load widths, as a step that picks by the rows),
    without the declarations only an off knob's branch uses."""
    from studylog.source import resolve_constexpr, source_of

    knobs = {"VEC": vec, "EVICT_FIRST": evict_first, "SKIP_REFUSED": skip_refused}
    off = [name for name, value in knobs.items() if value is False]  # their own declarations: `// KNOB: ...`
    texts = [source_of("ngram_stream.cu", name)[0] for name, needs in _STREAM_SHOWN if needs is None or knobs[needs]]
    return "\n".join("\n".join(line for line in resolve_constexpr(text.splitlines(), knobs)
                               if not any(re.search(rf"//\s*{name}:", line) for name in off)) + "\n" for text in texts)


def one_pass_source(*functions: str) -> str:
    """What a step of ``ngram_one_pass.cu`` compiles: ``functions`` of the file, in the order given."""
    from studylog.source import source_of

    return "\n".join(source_of("ngram_one_pass.cu", name)[0].rstrip("\n") + "\n" for name in functions)


@functools.lru_cache(maxsize=None)
def _kernel(source: str, name: str, device_index: int) -> cuda.CudaKernel:
    """Kernel ``name`` of ``csrc/<source>.cu``, loaded once per device and shared by the matchers."""
    module = cuda.load(source, name_expressions=STREAM_INSTANCES) if "<" in name else cuda.load(source)
    return module.kernel(name, SIGNATURE)


_BOUND_FIELDS = tuple(f.name for f in fields(NgramInputs))


class NgramMatcher:
    """One step bound to its buffers: validated once (values too, with ``check_values``), then each call runs the
    step in place with nothing checked. A GPU step's call (:attr:`graph_safe`) neither syncs nor allocates: capture
    it (:meth:`capture`), then ``copy_`` new values into the bound tensors (never rebind) before each replay. Shapes
    and ``config`` are fixed (pad with empty slots, ``seq_lens_decoder == 0``); values outside
    :func:`~studylog.ngram.formats.validate`'s ranges make the kernels read out of bounds (:meth:`check`).

    Options: ``chunk_tiles`` (steps 6, 7, 8) and ``chunk_len`` (steps 9 to 12), the haystack positions a block
    scans; ``vec`` (steps 10 to 12), tokens per load, 1 or 2 (the default where the rows allow 16-byte loads)."""

    def __init__(self, step: Callable, inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, *,
                 config: NgramConfig = NgramConfig(), check_values: bool = True, chunk_tiles: int | None = None,
                 chunk_len: int | None = None, vec: int | None = None):
        if step not in _STEPS:
            names = ", ".join(f.__name__ for f in _STEPS)
            raise ValueError(f"step must be one of the chapter's step functions ({names}), got {step!r}")
        (takes, self._launches), name = _STEPS[step], step.__name__
        options = {"chunk_tiles": chunk_tiles, "chunk_len": chunk_len, "vec": vec}
        if extra := sorted(k for k, v in options.items() if v is not None and k not in takes):
            raise ValueError(f"{name} takes no option {extra}")
        for option in ("chunk_tiles", "chunk_len"):
            if options[option] is not None:
                check_int(option, options[option], low=1)
        validate(inputs, draft_tokens, seq_lens_this_time, config, check_values=check_values)
        self.step, self.inputs, self.config = step, inputs, config
        self._bound = {name: getattr(inputs, name) for name in _BOUND_FIELDS}
        self.draft_tokens, self.seq_lens_this_time = draft_tokens, seq_lens_this_time
        self.batch = inputs.batch
        self.graph_safe = step is not step01_cpu_path
        if step is step01_cpu_path:
            self._call = CpuPathCall(inputs, draft_tokens, seq_lens_this_time, config)
            return
        device = inputs.prompt_ids.device
        runtime.require_gpu(f"the {name} n-gram kernels")
        if device.type != "cuda":
            raise ValueError(f"{name} runs on the GPU; prompt_ids is on {device}")
        self.device = torch.cuda.current_device()  # the device whose loaded kernels the step launches
        prompt_width, gen_width = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
        if step in STREAM_STEPS:
            auto_vec = stream_vec(inputs.prompt_ids, inputs.generated_ids) if "vec" in takes else 1
            if vec not in (None, 1, 2) or (vec == 2 and auto_vec == 1):
                raise ValueError(f"vec must be None, 1, or 2 with 16-byte aligned rows of even width, got {vec!r}")
            self.vec = vec or auto_vec
            self.chunk_len = stream_chunk_len(self.batch, prompt_width, gen_width, THREADS * STREAM_LOADS * self.vec,
                                              chunk_len=chunk_len)
        else:
            self.chunk_len = fused_chunk_len(self.batch, prompt_width, gen_width, chunk_tiles=chunk_tiles)
        self.prompt_chunks = -(-prompt_width // self.chunk_len)
        self.gen_chunks = -(-gen_width // self.chunk_len)
        self.grid = (self.batch, self.prompt_chunks + self.gen_chunks)  # the split searches: a block per slot and chunk
        self.match_keys = torch.full((max(self.batch, 1),), -1, dtype=torch.int64, device=device)  # all NONE_KEY
        self.blocks_done = torch.zeros(1, dtype=torch.int32, device=device)
        c = config
        self.args = (inputs.prompt_ids, inputs.prompt_lens, prompt_width, inputs.generated_ids, inputs.step_idx,
                     gen_width, inputs.draft_token_num, inputs.max_dec_len, inputs.seq_lens_encoder,
                     inputs.seq_lens_decoder, seq_lens_this_time, draft_tokens, draft_tokens.shape[1],
                     self.match_keys, self.blocks_done, self.batch, c.max_ngram_size, c.min_ngram_size,
                     c.threshold, int(c.hybrid), c.max_draft_tokens, self.prompt_chunks, self.chunk_len)

    def __call__(self) -> None:
        if self.batch:
            self._launches(self)

    def check(self) -> None:
        """Check the bound tensors' current values (a device sync), and that no field of ``inputs`` was rebound."""
        rebound = [name for name in _BOUND_FIELDS if getattr(self.inputs, name) is not self._bound[name]]
        if self.graph_safe and rebound:
            raise ValueError(f"inputs.{', inputs.'.join(rebound)} was rebound to another tensor after the matcher "
                             "was built, and its kernels still read the old one: write new values in place "
                             "(old.copy_(new)), or build a new matcher")
        validate(self.inputs, self.draft_tokens, self.seq_lens_this_time, self.config, check_values=True)

    def capture(self) -> torch.cuda.CUDAGraph:
        """A CUDA graph of one call (after two warm-up calls, which update the state in place as any call does)."""
        if not self.graph_safe:
            raise ValueError(f"{self.step.__name__} cannot be captured in a CUDA graph: it copies the batch to "
                             "the host, waits for the GPU and runs a C loop there")
        return runtime.cuda_graph(self)[0]


DraftTokens = Int64[Tensor, "batch draft_width"]
SeqLens = Int32[Tensor, " batch"]
Drafts = tuple[DraftTokens, SeqLens]


#: The step functions, in order: the keyword options each takes (what :class:`NgramMatcher` accepts), its launches.
_STEPS: dict[Callable, tuple[tuple[str, ...], Callable]] = {}


def _step(*options: str) -> Callable:
    """A step function from its kernel launches on an :class:`NgramMatcher` ``m``: ``step(inputs, draft_tokens,
    seq_lens_this_time, *, config, **options)`` builds the matcher and drafts in place."""
    def wrap(launches: Callable[[NgramMatcher], None]) -> Callable:
        def step(inputs: NgramInputs, draft_tokens: DraftTokens, seq_lens_this_time: SeqLens, *,
                 config: NgramConfig = NgramConfig(), **options) -> Drafts:
            NgramMatcher(step, inputs, draft_tokens, seq_lens_this_time, config=config, **options)()
            return draft_tokens, seq_lens_this_time

        signature = inspect.signature(step)
        functools.update_wrapper(step, launches)
        step.__signature__ = signature  # the call's, not the launches'
        _STEPS[step] = options, launches
        return step
    return wrap


@_step()
def step01_cpu_path(m: NgramMatcher) -> None:
    """Step 1, the deployed path: copy to the host, run the serial C loop, copy the drafts back (not capturable)."""
    m._call()


@_step()
def step02_serial(m: NgramMatcher) -> None:
    """Step 2: the CPU loop as a one-thread GPU kernel (``ngram_serial``)."""
    _kernel("ngram_serial", "ngram_serial", m.device)((1,), (1,), *m.args)


@_step()
def step03_two_phase(m: NgramMatcher) -> None:
    """Step 3: a parallel search per slot and ``n`` (a block per slot), then the budget on one thread."""
    _kernel("ngram_two_phase", "ngram_search_per_n", m.device)((m.batch,), (THREADS,), *m.args)
    _kernel("ngram_two_phase", "ngram_budget_serial", m.device)((1,), (1,), *m.args)


@_step()
def step04_two_phase_scan(m: NgramMatcher) -> None:
    """Step 4: step 3's search, then the exact budget from block-wide prefix sums (one block)."""
    _kernel("ngram_two_phase", "ngram_search_per_n", m.device)((m.batch,), (THREADS,), *m.args)
    _kernel("ngram_two_phase", "ngram_budget_scan", m.device)((1,), (SCAN_THREADS,), *m.args)


@_step()
def step05_one_pass(m: NgramMatcher) -> None:
    """Step 5: one pass over each haystack for every ``n`` (a block per slot), then step 4's budget scan."""
    _kernel("ngram_one_pass", "ngram_search_one_pass", m.device)((m.batch,), (THREADS,), *m.args)
    _kernel("ngram_two_phase", "ngram_budget_scan", m.device)((1,), (SCAN_THREADS,), *m.args)


@_step("chunk_tiles")
def step06_one_pass_split(m: NgramMatcher) -> None:
    """Step 6: step 5 split over many blocks per slot, then step 4's budget scan (resetting the keys) apart."""
    _kernel("ngram_one_pass", "ngram_one_pass_split", m.device)(m.grid, (THREADS,), *m.args)
    _kernel("ngram_one_pass", "ngram_budget_scan_reset", m.device)((1,), (SCAN_THREADS,), *m.args)


@_step("chunk_tiles")
def step07_early_phase2(m: NgramMatcher) -> None:
    """Step 7: step 6 with phase 2 launched early (a programmatic dependent launch): the gap between launches goes."""
    _kernel("ngram_one_pass", "ngram_one_pass_split_early", m.device)(m.grid, (THREADS,), *m.args)
    _kernel("ngram_one_pass", "ngram_budget_scan_early", m.device)((1,), (SCAN_THREADS,), *m.args, early=True)


@_step("chunk_tiles")
def step08_one_pass_fused(m: NgramMatcher) -> None:
    """Step 8: step 6 with phase 2 in the last block to finish: one launch."""
    _kernel("ngram_one_pass", "ngram_one_pass_fused", m.device)(m.grid, (THREADS,), *m.args)


@_step("chunk_len")
def step09_stream(m: NgramMatcher) -> None:
    """Step 9: step 8 without barriers in its loop, every warp streaming its own tiles (:func:`stream_chunk_len`)."""
    _kernel("ngram_stream", "ngram_stream<4, 1, false, false>", m.device)(m.grid, (THREADS,), *m.args)


@_step("chunk_len", "vec")
def step10_wide_loads(m: NgramMatcher) -> None:
    """Step 10: step 9 with 16-byte loads (option ``vec`` = 2 tokens a load) where the rows allow."""
    _kernel("ngram_stream", f"ngram_stream<4, {m.vec}, false, false>", m.device)(m.grid, (THREADS,), *m.args)


@_step("chunk_len", "vec")
def step11_evict_first(m: NgramMatcher) -> None:
    """Step 11: step 10 with an L2 evict-first hint on the haystack loads."""
    _kernel("ngram_stream", f"ngram_stream<4, {m.vec}, true, false>", m.device)(m.grid, (THREADS,), *m.args)


@_step("chunk_len", "vec")
def step12_skip_refused(m: NgramMatcher) -> None:
    """Step 12: step 11 where the slots the batch budget refuses whatever the searches find skip their search."""
    _kernel("ngram_stream", f"ngram_stream<4, {m.vec}, true, true>", m.device)(m.grid, (THREADS,), *m.args)


#: The steps that launch ``ngram_stream`` (split by :func:`stream_chunk_len`).
STREAM_STEPS = (step09_stream, step10_wide_loads, step11_evict_first, step12_skip_refused)


#: The rule of :func:`final_step` (GPU clock): at least STREAM_MIN_TOKENS prompt positions (slots × width) in rows
#: at least STREAM_MIN_WIDTH wide, under a budget that can refuse slots, run step 12 (barrier-free blocks pay once
#: there is that much to stream, and refused slots skip their search); all else runs step 7 (step 8's fused phase 2
#: costs the search kernel registers and runs on THREADS threads, not SCAN_THREADS). The thresholds must keep the
#: entry point within the spread of the fastest of steps 6 to 12 at every case of the committed benchmark.
STREAM_MIN_WIDTH = 32_768
STREAM_MIN_TOKENS = 1 << 22


def step_for_shape(batch: int, prompt_width: int, config: NgramConfig = NgramConfig()) -> Callable:
    """The step the rule above picks for ``batch`` prompts of ``prompt_width`` tokens under ``config``'s budget (it
    can refuse a slot only below ``max_draft_tokens + 1`` tokens a slot, the most a slot counts)."""
    if (prompt_width >= STREAM_MIN_WIDTH and batch * prompt_width >= STREAM_MIN_TOKENS
            and config.threshold < batch * (config.max_draft_tokens + 1)):
        return step12_skip_refused
    return step07_early_phase2


def final_step(inputs: NgramInputs, config: NgramConfig = NgramConfig()) -> Callable:
    """The step the entry point runs on ``inputs`` under ``config``, by shapes and budget only (no sync)."""
    return step_for_shape(*inputs.prompt_ids.shape, config)


def ngram_match(inputs: NgramInputs, draft_tokens: DraftTokens, seq_lens_this_time: SeqLens, *,
                config: NgramConfig = NgramConfig()) -> Drafts:
    """The chapter's operator: drafts in place by the step :func:`final_step` picks. It checks values (a sync) and
    allocates scratch: a decoding loop captures an :class:`NgramMatcher` of ``final_step`` instead."""
    return final_step(inputs, config)(inputs, draft_tokens, seq_lens_this_time, config=config)
