"""Chapter 3, step 9 in two parts (``lab/ngram/step09_parts.py``): the frozen copy of step 8 compiles on the CPU
(NVRTC) without spills, at the knob's library value to the library's step 8 (the same PTX, names aside), and without
its barriers to a search whose loop has no barrier."""

import re

import lab_scripts

from studylog import cuda


def test_the_frozen_step_8_compiles_to_the_librarys_ptx_and_9a_drops_its_barriers():
    parts = lab_scripts.load("ngram", "step09_parts")
    assert parts.compile_check() == 0  # spills, and fused_parts<true> == ngram_one_pass_fused, names aside
    ours = cuda.compile_source(parts.SOURCE, arch="sm_90", name_expressions=parts.INSTANCES)
    lib = cuda.compile_source("ngram_one_pass", arch="sm_90")
    assert parts.code(ours, "fused_parts<true>") == parts.code(lib, "ngram_one_pass_fused")
    barriers = {e: len(re.findall(r"\bbar(rier)?\.sync\b", ours.ptx_function(ours.lowered_names[e])))
                for e in parts.INSTANCES}
    # step 8: two barriers a tile and one after the pattern loads, then the ticket's and phase 2's; 9a: only those
    assert barriers["fused_parts<true>"] - barriers["fused_parts<false>"] == 3, barriers
    body = ours.ptx_function(ours.lowered_names["fused_parts<false>"])
    assert "atom.global.min.u64" in body and "atom.shared.min.u64" not in body  # no block-wide key: each thread publishes its own
    assert set(parts.VARIANTS) == {"8", "9a", "9a long", "9 short"} and parts.NAME == "step09_parts"
