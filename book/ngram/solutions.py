"""The answers to chapter 3's exercises. The notebook does not import this module: read it after trying.
Exercise 1's answer is the library's own key, :func:`studylog.ngram.match_key`."""

from __future__ import annotations

from typing import Sequence

from studylog.ngram.formats import NONE_KEY
from studylog.ngram.models import decode_key, match_key

__all__ = ["one_pass", "budget_scan", "refused_bound", "no_stop_step12", "no_stop_measured", "warp_min_step6"]


def one_pass(hay: Sequence[int], hay_len: int, gen: Sequence[int], top_n: int, min_n: int = 1):
    """Exercise 2's answer: one pass over the end positions. The window of size ``n`` ending at ``e`` matches
    when ``hay[:e + 1]`` and ``gen`` share a suffix of at least ``n`` tokens, so the common suffix at ``e``
    (capped at ``top_n``) is that position's best candidate; the smallest key over all ends wins."""
    best = NONE_KEY
    for end in range(hay_len - 1):  # a token must follow the window
        length = 0
        while length < top_n and length <= end and hay[end - length] == gen[len(gen) - 1 - length]:
            length += 1
        if length >= min_n:
            best = min(best, match_key(length, 0, end - length + 1))
    if best == NONE_KEY:
        return None
    n, _, start = decode_key(best)
    return n, start


def budget_scan(threshold: int, kinds: Sequence[str], counted: Sequence[bool], bases: Sequence[int],
                wants: Sequence[int]) -> list[int]:
    """Exercise 3's answer, as ``budget_scan_block`` computes it: tentative counts (every active slot with all it
    wants), their exclusive prefix sum, the first active slot where the budget bites, and no drafts after it."""
    tentative = [0 if k == "zero" else b + (w if k == "active" else 0) for k, b, w in zip(kinds, bases, wants)]
    before, running = [], 0
    for t in tentative:  # exclusive prefix sum of the tentative counts
        before.append(running)
        running += t
    served, active_so_far = [], 0
    for k in kinds:  # inclusive prefix sum of the active slots
        active_so_far += k == "active"
        served.append(active_so_far)
    counted_total = sum(bool(c) for c in counted)
    rooms = [threshold - (before[i] + bases[i]) - (counted_total - served[i]) for i in range(len(kinds))]
    bites = [i for i, k in enumerate(kinds) if k == "active" and wants[i] > 0 and (rooms[i] < 2 or wants[i] > rooms[i])]
    first = bites[0] if bites else len(kinds)  # a block-wide minimum on the GPU
    final = []
    for i, (k, b, w) in enumerate(zip(kinds, bases, wants)):
        if k != "active":
            final.append(tentative[i])
        elif i < first:
            final.append(b + w)
        elif i == first:
            final.append(b + (rooms[i] if rooms[i] >= 2 else 0))
        else:
            final.append(b)
    return final


def refused_bound(threshold: int, kinds: Sequence[str], counted: Sequence[bool], bases: Sequence[int]) -> list[bool]:
    """Exercise 4's answer: drafts only add tokens, so the smallest possible ``total`` at a slot is the sum of the
    bases up to it; an active slot is refused whatever the searches find when that plus ``left`` reaches
    ``threshold - 1``."""
    left = sum(bool(c) for c in counted)
    smallest_total, refused = 0, []
    for kind, base in zip(kinds, bases):
        smallest_total += 0 if kind == "zero" else base
        left -= kind == "active"
        refused.append(kind == "active" and smallest_total + left >= threshold - 1)
    return refused


#: Step 12's early stop (in ``ngram_stream``'s tile loop): the read of the slot's key with each tile, and the test that
#: leaves the loop once no later window can beat it; exercise 5 removes both.
STEP11_KEY_READ = "                seen = load_shared_key(match_keys + b);  // in flight with the tile's loads\n"
STEP11_STOP = "                if (tile > last_end || seen <= tile_floor_key(top, src, tile)) break;"


def no_stop_step12(source: str) -> str:
    """Exercise 5's answer: step 12 without the early stop it inherits from step 9. The read of the slot's key each
    tile goes, and a thread leaves its loop only past its chunk's end (or when the budget refuses the slot): every
    searching block reads its whole chunk. ``seen`` keeps its first value (a block whose chunk cannot beat the key
    when it starts still skips it: that check is step 6's split), so the results stay step 12's bit for bit. It is
    the lab's variant ``12 no exit``; :func:`no_stop_measured` gives its measured answer (the page does not)."""
    if source.count(STEP11_KEY_READ) != 1 or source.count(STEP11_STOP) != 1:
        raise ValueError("step 12's key read and stop were not found once in ngram_stream")
    return source.replace(STEP11_KEY_READ, "").replace(STEP11_STOP, "                if (tile > last_end) break;")


def no_stop_measured(case: tuple[int, int, int] = (256, 131072, 1 << 30), gpu: str = "nvidia-h200") -> float | None:
    """Exercise 5's measured answer: how many times slower step 12 runs without its stop at ``case`` (default: 256
    slots of 131,072 tokens, no budget, where the exercise times it), on the GPU clock, from the lab run that times
    the variant ``12 no exit`` beside ``12``; None where that run is not committed. The stop matters least where a
    slot's blocks find nothing to stop on (no match, or one late in the haystack): they read their whole chunks
    either way."""
    from book.ngram import lesson

    return lesson.exit_factor(lesson.lab_run("step12_changes", gpu), "step12_changes", case)


#: Step 6's per-lane publication of a tile's candidates (in ``search_chunk``, its search), and exercise 6's replacement.
STEP6_PUBLISH = ("                if (mine != NONE_KEY) atomicMin(&s_best, mine);\n"
                 "                __syncthreads();  // s_best is final for this tile")
WARP_MIN = """                // The warp's smallest key first: redux.sync works on 32 bits, so the high words, then the low
                // words of the lanes that hold the smallest high word; one shared atomic per warp, not per lane.
                // Every lane of the block reaches this line (s_stop is the block's), as the intrinsic requires.
                const unsigned hi = __reduce_min_sync(0xffffffffu, (unsigned)(mine >> 32));
                const unsigned lo = __reduce_min_sync(0xffffffffu,
                                                      (unsigned)(mine >> 32) == hi ? (unsigned)mine : 0xffffffffu);
                const u64 warp_best = ((u64)hi << 32) | lo;
                if ((threadIdx.x & 31) == 0 && warp_best != NONE_KEY) atomicMin(&s_best, warp_best);
                __syncthreads();  // s_best is final for this tile"""


def warp_min_step6(source: str) -> str:
    """Exercise 6's answer: in step 6's search (``search_chunk``, which steps 7 and 8 share), each warp takes the
    minimum of its lanes' keys with two
    32-bit ``__reduce_min_sync`` (``redux.sync.min.u32`` on sm_80 and later: the high words, then the low words
    among the lanes holding the smallest high word), and lane 0 alone updates the block's ``s_best``. A lane without
    a candidate holds ``NONE_KEY``, the largest key, so it never wins; the key a warp publishes is the smallest of
    its lanes', so the block's key, and every result, stay bit for bit step 6's. On the GPU a tile issues up to 32
    times fewer shared 64-bit atomics, for two warp reductions every tile: expect it to pay where candidates are
    dense (a small vocabulary: most lanes match the newest token) and to cost a little on uniform ids, where few
    lanes hold one (an expectation: this change was compiled, not timed, for the chapter)."""
    start = source.index("__device__ __forceinline__ void search_chunk(")
    end = source.find('extern "C"', start)
    end = len(source) if end < 0 else end
    kernel = source[start:end]
    if kernel.count(STEP6_PUBLISH) != 1:
        raise ValueError("step 6's publication line was not found once in search_chunk")
    return source[:start] + kernel.replace(STEP6_PUBLISH, WARP_MIN) + source[end:]
