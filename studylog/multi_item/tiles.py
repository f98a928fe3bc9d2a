"""What the host plans before a launch: the key tiles each query tile visits (steps 4 and 5) and step 5's
program order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from studylog.checks import check_choice
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch, check_rule, dense_mask

#: step 5's program orders (the first is the default): ``"head_groups"``, groups of heads whose keys and values fit
#: :data:`GROUP_KV_BYTES` (so they stay in L2), heaviest tiles first within a group; ``"heads_outer"``, groups of
#: one head; ``"prompts_outer"``, prompt by prompt, head by head, tiles from the prompt's end; ``"first_run"``,
#: tiles from each prompt's end, every (prompt, head) side by side.
SCHEDULE_ORDERS = ("head_groups", "heads_outer", "prompts_outer", "first_run")
DEFAULT_ORDER = SCHEDULE_ORDERS[0]
SCHEDULE_BLOCK_MS = (16, 32, 64, 128)  # a schedule table's rows: the kernel picks one by BLOCK_M
GROUP_KV_BYTES = 24 * 2**20  # keys and values a head group may span: well under an H200's 60 MB of L2 (H100: 50)


def head_groups(batch: MultiItemBatch, heads: int, kv_bytes_per_token: int) -> list[range]:
    """The heads in as few near-equal groups as keep each group's keys and values (``kv_bytes_per_token`` a
    head, every token) within :data:`GROUP_KV_BYTES`; one head at least."""
    size = max(1, min(heads, GROUP_KV_BYTES // max(batch.total_tokens * kv_bytes_per_token, 1)))
    n = -(-heads // size)
    bounds = [round(i * heads / n) for i in range(n + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(n)]


def query_tile_costs(batch: MultiItemBatch, block_m: int, block_n: int = 1,
                     rule: str = DEFAULT_RULE) -> list[tuple[int, int, int]]:
    """``(prompt, query tile, key tiles it visits)`` for every query tile: steps 4 and 5's three ranges, counted in
    tiles of ``block_n`` keys as the kernels count them (``block_n=1``: in keys)."""
    skip = ITEM_KEYS_FROM[check_rule(rule)]
    out = []
    for b, (s, p) in enumerate(zip(batch.seq_lens, batch.prefix_lens)):
        starts = batch.host_item_starts[b]
        for t, m_lo in enumerate(range(0, s, block_m)):
            m_hi = min(m_lo + block_m, s)
            prefix_hi = -(-min(p, m_hi) // block_n) * block_n
            first_item_row = max(m_lo, p)  # == p (starts[0] == p) for a tile wholly inside the prefix
            items_lo = max((starts[first_item_row - p] + skip) // block_n * block_n, prefix_hi)
            out.append((b, t, prefix_hi // block_n + max(0, -(-(m_hi - items_lo) // block_n))))
    return out


def work_order(batch: MultiItemBatch, heads: int, block_m: int, order: str = DEFAULT_ORDER,
               kv_bytes_per_token: int = 2 * 128 * 2, rule: str = DEFAULT_RULE) -> Int[Tensor, "n 3"]:
    """Step 5's programs in launch order, rows of ``(prompt, query tile, head)``; ``kv_bytes_per_token`` (one
    head's key and value) sizes ``"head_groups"``."""
    check_choice("order", order, SCHEDULE_ORDERS)
    tiles = query_tile_costs(batch, block_m, rule=rule)
    if order in ("head_groups", "heads_outer"):
        ranked = torch.tensor([(b, t) for b, t, _ in sorted(tiles, key=lambda w: (-w[2], w[0], w[1]))])
        groups = (head_groups(batch, heads, kv_bytes_per_token) if order == "head_groups"
                  else [range(h, h + 1) for h in range(heads)])
        # within a group: tile by tile in that ranking, the group's heads side by side
        return torch.cat([torch.cat([ranked.repeat_interleave(len(g), dim=0),
                                     torch.tensor(list(g)).repeat(len(ranked))[:, None]], dim=1) for g in groups])
    if order == "prompts_outer":
        work = [sum(cost for p, _, cost in tiles if p == b) for b in range(batch.batch_size)]
        rows = [(b, t, h) for b in sorted(range(batch.batch_size), key=lambda b: -work[b])
                for h in range(heads) for t in reversed(range(-(-batch.seq_lens[b] // block_m)))]
        return torch.tensor(rows)
    n_tiles = [-(-s // block_m) for s in batch.seq_lens]  # "first_run"
    return torch.tensor([(b, n - 1 - r, h) for r in range(max(n_tiles)) for b, n in enumerate(n_tiles) if r < n
                         for h in range(heads)])


def schedule_table(batch: MultiItemBatch, heads: int, order: str = DEFAULT_ORDER,
                   block_ms: Sequence[int] = SCHEDULE_BLOCK_MS,
                   kv_bytes_per_token: int = 2 * 128 * 2,
                   rule: str = DEFAULT_RULE, rows_per_token: int = 1) -> tuple[Int[Tensor, "4 n 8"], dict[int, int]]:
    """Step 5's program table on the batch's device (cached on the batch), and each tile height's program count.
    Row ``r`` serves ``BLOCK_M = SCHEDULE_BLOCK_MS[r]``; entry ``i`` is program ``i``'s ``(prompt, query tile,
    head, seq_begin, seq_len, prefix_len, 0, 0)``. ``rows_per_token`` (step 6's group of query heads): row
    ``BLOCK_M`` holds tiles of ``BLOCK_M // rows_per_token`` tokens."""
    key = (heads, order, tuple(sorted(set(block_ms))), kv_bytes_per_token, check_rule(rule), rows_per_token)
    if key not in batch.schedules:
        if not key[2] or any(h not in SCHEDULE_BLOCK_MS for h in key[2]):
            raise ValueError(f"block_ms must be among {SCHEDULE_BLOCK_MS}, got {block_ms!r}")
        if isinstance(rows_per_token, bool) or not isinstance(rows_per_token, int) \
                or not 1 <= rows_per_token <= key[2][0]:
            raise ValueError(f"rows_per_token must be an int from 1 to the smallest tile height ({key[2][0]}), "
                             f"got {rows_per_token!r}")
        prompts = torch.tensor([batch.seq_starts, batch.seq_lens, batch.prefix_lens]).T  # seq_begin, seq_len, prefix
        rows = {}
        for block_m in key[2]:
            w = work_order(batch, heads, block_m // rows_per_token, order, kv_bytes_per_token, rule)
            rows[block_m] = torch.cat([w, prompts[w[:, 0]], torch.zeros(len(w), 2, dtype=w.dtype)], dim=1)
        table = torch.zeros(len(SCHEDULE_BLOCK_MS), max(map(len, rows.values())), 8, dtype=torch.int32)
        for block_m, r in rows.items():
            table[SCHEDULE_BLOCK_MS.index(block_m), : len(r)] = r.to(torch.int32)
        batch.schedules[key] = (table.to(batch.device), {bm: len(r) for bm, r in rows.items()})
    return batch.schedules[key]


# Tile accounting: what each kernel visits, what causal attention visits, what is really needed

def planned_key_tiles(batch: MultiItemBatch, block_m: int, block_n: int, rule: str = DEFAULT_RULE) -> list[list[int]]:
    """For each prompt and query tile, how many key tiles steps 4 and 5 visit."""
    out: list[list[int]] = [[] for _ in range(batch.batch_size)]
    for b, _, tiles in query_tile_costs(batch, block_m, block_n, rule):
        out[b].append(tiles)
    return out


@dataclass(frozen=True)
class TileStats:
    """Key tiles of one tiling, summed over prompts (per head)."""

    block_m: int
    block_n: int
    total: int        #: every (query tile, key tile) pair: what steps 2 and 3 visit
    causal: int       #: pairs on or below the diagonal: what causal attention visits
    needed: int       #: pairs holding at least one visible (query, key): the least any kernel must visit
    visited: int      #: what steps 4 and 5 visit
    visible_pairs: int  #: visible (query, key) pairs: the useful work
    causal_pairs: int   #: (query, key) pairs of causal attention over the same sequences

    @property
    def skipped_fraction(self) -> float:
        """Fraction of all key tiles steps 4 and 5 never load."""
        return 1.0 - self.visited / self.total

    @property
    def skipped_vs_causal(self) -> float:
        """Fraction of causal attention's key tiles steps 4 and 5 never load."""
        return 1.0 - self.visited / self.causal


def tile_stats(batch: MultiItemBatch, block_m: int, block_n: int, rule: str = DEFAULT_RULE) -> TileStats:
    """The key tiles of all prompts at ``block_m x block_n`` tiles: all, causal, needed, visited (per head)."""
    total = causal = needed = visible = causal_pairs = 0
    for b, s in enumerate(batch.seq_lens):
        mask = dense_mask(batch, b, rule).cpu()
        visible += int(mask.sum())
        causal_pairs += s * (s + 1) // 2
        tm, tn = -(-s // block_m), -(-s // block_n)
        padded = torch.zeros(tm * block_m, tn * block_n, dtype=torch.bool)
        padded[:s, :s] = mask
        needed += int(padded.view(tm, block_m, tn, block_n).any(dim=3).any(dim=1).sum())
        total += tm * tn
        causal += sum(-(-min(m_lo + block_m, s) // block_n) for m_lo in range(0, s, block_m))
    visited = sum(map(sum, planned_key_tiles(batch, block_m, block_n, rule)))
    return TileStats(block_m, block_n, total, causal, needed, visited, visible, causal_pairs)
