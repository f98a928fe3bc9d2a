"""Chapter 7's benchmark table (``studylog.decode.report.table``) against the committed results: a dropped, renamed
or reordered row, or a changed parameter, fails here before a GPU run would show it."""

import inspect
import json
from pathlib import Path

from studylog.decode import report
from studylog.decode.loop import Decoder

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "bench"
#: The chunk lengths the benchmark's decoders run (Decoder's default).
CHUNK_SIZES = inspect.signature(Decoder).parameters["chunk_sizes"].default


def committed(card: str) -> list[tuple[str, dict]]:
    data = json.loads((ASSETS / card / "decode.json").read_text())
    return [(r["series"], r["params"]) for r in data["measurements"]]


def test_the_table_is_the_committed_h200_run():
    assert report.table(report.plan(False), chunk_sizes=CHUNK_SIZES) == committed("nvidia-h200")


def test_the_table_is_the_committed_h100_run_of_the_cost_models():
    """The H100 file predates the real model and the cost models' padded head (its notes give 100,277 rows, so
    no ``dense_head_unpadded`` row): the table of the cost models' sweeps, without that row."""
    plans = [p for p in report.plan(False) if report.REAL_MODEL not in p["shapes"]]
    want = [row for row in report.table(plans, chunk_sizes=CHUNK_SIZES) if row[0] != "dense_head_unpadded"]
    assert want == committed("nvidia-h100-80gb-hbm3")

