"""Chapter 3: n-gram matching for speculative decoding, from a CPU loop to one GPU launch.

Each active slot looks up its last ``n`` generated tokens in its prompt, then in its earlier generated tokens, and
drafts what followed the leftmost earlier occurrence, under a batch-wide token budget. Every step reproduces
:func:`reference_ngram_match` bit for bit: step 1 is the deployed CPU path (C), steps 2 to 12 CUDA C++ kernels."""

from __future__ import annotations

from studylog.chapter import Chapter, Step
from studylog.ngram.batches import corpus_batch, make_batch
from studylog.ngram.cpu_path import CPU_SOURCE
from studylog.ngram.formats import NGRAM_MAX, NgramConfig, NgramInputs, same_state, validate
from studylog.ngram.kernels import (NgramMatcher, ngram_match, step01_cpu_path, step02_serial, step03_two_phase,
                                    step04_two_phase_scan, step05_one_pass, step06_one_pass_split,
                                    step07_early_phase2, step08_one_pass_fused, step09_stream, step10_wide_loads,
                                    step11_evict_first, step12_skip_refused, one_pass_source, stream_source)
from studylog.ngram.models import SCAN_THREADS, match_key, model_budget_refused, model_one_pass_keys
from studylog.ngram.reference import reference_ngram_match
from studylog.ngram.report import (CHUNK_SWEEPS, NO_BUDGET, SYNCED_DESCRIPTION, SYNCED_SERIES, bench, gen_width_for,
                                   gpu_headline, sweep_series)
from studylog.paths import chapter_csrc
from studylog.ngram import ops  # the entry point as a torch.library operator (torch.ops.studylog)

_CSRC = chapter_csrc("ngram")

CHAPTER = Chapter(
    name="ngram", number=3, notebooks=("03_ngram_matching",),
    title="N-gram matching for speculative decoding",
    steps=(
        Step(1, "cpu_path", "the deployed path: copies to the host, the serial C loop, copies back", "c",
             step01_cpu_path, CPU_SOURCE, "ngram_match_cpu"),
        Step(2, "serial", "the same loop as one GPU thread (<<<1, 1>>>)", "cuda", step02_serial,
             _CSRC / "ngram_serial.cu", "ngram_serial"),
        Step(3, "two_phase", "a parallel search per slot and n, then the budget on one thread", "cuda",
             step03_two_phase, _CSRC / "ngram_two_phase.cu", "ngram_budget_serial"),
        Step(4, "two_phase_scan", "the budget exactly, from block-wide prefix sums", "cuda", step04_two_phase_scan,
             _CSRC / "ngram_common.cuh", "budget_scan_block"),
        Step(5, "one_pass", "one pass over each haystack for every n", "cuda", step05_one_pass,
             _CSRC / "ngram_one_pass.cu", "ngram_search_one_pass"),
        # steps 6, 7 and 8 share the search of one chunk (search_chunk): each shows it with its own kernels
        Step(6, "one_pass_split", "each slot split over many blocks; phase 2 a second launch", "cuda",
             step06_one_pass_split, one_pass_source("search_chunk", "ngram_one_pass_split", "ngram_budget_scan_reset")),
        Step(7, "early_phase2", "step 6 with phase 2 launched before the search ends", "cuda", step07_early_phase2,
             one_pass_source("search_chunk", "ngram_one_pass_split_early", "ngram_budget_scan_early")),
        Step(8, "one_pass_fused", "phase 2 in the last block to finish: one launch", "cuda", step08_one_pass_fused,
             one_pass_source("search_chunk", "ngram_one_pass_fused")),
        # steps 9 to 12 are instances of one template: each shows the code its instance compiles (stream_source)
        Step(9, "stream", "every warp streams its own tiles: no barrier in the loop", "cuda", step09_stream,
             stream_source(vec=1, evict_first=False, skip_refused=False)),
        Step(10, "wide_loads", "16-byte loads where the rows allow", "cuda", step10_wide_loads,
             stream_source(vec=None, evict_first=False, skip_refused=False)),
        Step(11, "evict_first", "an L2 evict-first hint on the haystack loads", "cuda", step11_evict_first,
             stream_source(vec=None, evict_first=True, skip_refused=False)),
        Step(12, "skip_refused", "slots the budget refuses skip their search", "cuda", step12_skip_refused,
             stream_source(vec=None, evict_first=True, skip_refused=True)),
    ),
    bench=bench,
    headline=gpu_headline,
    baselines={**{sweep_series(s): f"{s.__name__} over a range of haystack positions per block" for s in CHUNK_SWEEPS},
               SYNCED_SERIES: SYNCED_DESCRIPTION},
)

__all__ = [
    "CHAPTER", "ops", "step01_cpu_path", "step02_serial", "step03_two_phase", "step04_two_phase_scan",
    "step05_one_pass", "step06_one_pass_split", "step07_early_phase2", "step08_one_pass_fused", "step09_stream",
    "step10_wide_loads", "step11_evict_first", "step12_skip_refused", "ngram_match", "NgramMatcher",
    "NgramInputs", "NgramConfig", "validate", "same_state", "NGRAM_MAX", "reference_ngram_match", "match_key",
    "model_one_pass_keys", "model_budget_refused", "SCAN_THREADS", "make_batch", "corpus_batch", "gen_width_for",
    "NO_BUDGET",
]
