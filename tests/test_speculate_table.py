"""Chapter 8's benchmark table (``studylog.speculate.report.table``) against the committed H200 results: a dropped,
renamed or reordered row, or a changed parameter, fails here before a GPU run would show it."""

import ast
import inspect
import json
import re
from pathlib import Path

from studylog.speculate import report
from studylog.speculate.loop import SpeculativeDecoder

DATA = json.loads((Path(__file__).resolve().parents[1] / "assets/bench/nvidia-h200/speculate.json").read_text())


def test_the_table_is_the_committed_h200_run():
    """The layer each chunk length runs is measured per card (``SpeculativeDecoder.tune``), so the table takes it
    from the run's notes, as the run recorded it."""
    gemv = {int(m[1]): ast.literal_eval(m[2]) for m in (re.match(r"batch (\d+): .* at chunk lengths (\[[\d, ]*\])", n)
                                                        for n in DATA["notes"]) if m}
    chunk_sizes = inspect.signature(SpeculativeDecoder).parameters["chunk_sizes"].default
    plan = report.plan(False)
    got = report.table(plan["batches"], report.WORKLOADS, chunk_sizes=chunk_sizes, gemv_chunks=gemv,
                       limit=plan["limit"])
    assert gemv == {1: [1, 2], 8: []}
    assert got == [(r["series"], r["params"]) for r in DATA["measurements"]]
