"""When two configurations may write different tokens, and a check that they only do so there: each sums the logits
in fp32 in its own order, so they write the same tokens wherever the two tokens in question are further apart than
the error bound of the two computations, and every divergence must sit at a gap inside it.

The bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2): a logit ``h . w`` summed in fp32
in any order is within ``gamma_k sum_i |h_i w_i|`` of its exact value, ``k = 2 D + 1`` (a tensor core's truncating
alignment can double an addition's error); hidden states that differ by ``dh`` move the logit of ``t`` by at most
``|dh| . |w_t|``. Steering and seeded noise enter the gap, not the bound; a temperature divides both."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from studylog.decode.generation import STEER, Generation, gumbel_noise

#: fp32's unit roundoff.
U = 2.0 ** -24


def logit_bound(h: Tensor, rows: Tensor) -> Tensor:
    """The rounding bound of each logit ``h . rows[j]`` computed in fp32 (float64 inputs of the exact values):
    ``gamma_k sum_i |h_i w_i|``, ``k = 2 D + 1`` (module docstring)."""
    ku = (2 * h.shape[-1] + 1) * U
    return ku / (1 - ku) * (h.abs() @ rows.abs().t())


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(reference: Generation, other: Generation, weight: Tensor) -> dict[str, Any]:
    """Compare two generations of one request (both run with ``record=True``; ``weight``: the LM head):
    ``sequences``, ``identical``, ``divergences`` (each sequence's first difference: gap, bound, ``inside``) and
    ``all_inside``."""
    for name, g in (("reference", reference), ("other", other)):
        if not isinstance(g, Generation):
            raise TypeError(f"{name} must be a Generation, got {type(g).__name__}")
    if len(reference.ids) != len(other.ids):
        raise ValueError(f"the generations have {len(reference.ids)} and {len(other.ids)} sequences")
    if (reference.temperature, reference.seed) != (other.temperature, other.seed):
        raise ValueError("the generations were sampled with different temperatures or seeds")
    divergences = []
    for b, (ids_a, ids_b) in enumerate(zip(reference.ids, other.ids)):
        p = _first_difference(ids_a, ids_b)
        if p is None:
            continue
        if reference.records is None or other.records is None:
            raise ValueError("the generations differ; run both with record=True to check the divergence")
        ra, rb = reference.records[b].get(p), other.records[b].get(p)
        if ra is None or rb is None:  # a token one of them did not sample (a jump): not a rounding question
            divergences.append({"sequence": b, "position": p, "tokens": None, "gap": None, "bound": None,
                                "inside": False, "why": "a configuration did not sample this position"})
            continue
        (ha, ta, sa), (hb, tb, _) = ra, rb
        if ta == tb:
            raise ValueError(f"sequence {b}: the records say both picked {ta} at position {p}")
        pair = torch.tensor([ta, tb])
        w = weight.index_select(0, pair.to(weight.device)).double().cpu()
        exact = ha @ w.t()
        exact = exact + STEER * (pair == sa).double()
        t = reference.temperature
        bound = (logit_bound(ha, w).sum() + logit_bound(hb, w).sum() + (hb - ha).abs() @ w.abs().sum(0))
        if sa in (ta, tb):  # the steering bias is added in fp32: one more rounding, at the bias's size
            bound = bound + 2 * U * (STEER + exact.abs().max())
        if t > 0:
            pos = torch.full((b + 1,), p, dtype=torch.int64)
            exact = exact / t + gumbel_noise(reference.seed, pos, pair)[b].double()
            bound = bound / t
        gap, bound = float(exact[0] - exact[1]), float(bound)
        divergences.append({"sequence": b, "position": p, "tokens": (ta, tb), "gap": gap, "bound": bound,
                            "inside": gap <= bound})
    return {"sequences": len(reference.ids), "identical": len(reference.ids) - len(divergences),
            "divergences": divergences, "all_inside": all(d["inside"] for d in divergences)}

