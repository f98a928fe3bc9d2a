"""Read the committed benchmark JSON (``assets/bench/<gpu>/<chapter>.json``) and an experiment's output.

Notebooks never time anything on the CPU: they load what a GPU run wrote and say on which GPU and date it was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studylog import paths
from studylog.paths import BENCH_RESULTS as DEFAULT_OUT


@dataclass
class Results:
    """One chapter's benchmark file."""

    path: Path
    data: dict[str, Any]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.data["measurements"]

    @property
    def gpu(self) -> str:
        return self.data["device"]["name"]

    @property
    def date(self) -> str:
        return self.data["date"][:10]

    def caption(self) -> str:
        """``Measured on <GPU> on <date> (torch ..., triton ...; copy bandwidth ...)``."""
        v = self.data["versions"]
        return (f"Measured on {self.gpu} on {self.date} (torch {v['torch']}, triton {v['triton']}; "
                f"copy bandwidth {self.data['ceilings']['copy_bandwidth_gbs']:,.0f} GB/s).")

    def select(self, series: str | None = None, role: str | None = None, **params: Any) -> list[dict[str, Any]]:
        """Rows matching a series name, a role and parameter values."""
        return [row for row in self.rows if (series is None or row["series"] == series)
                and (role is None or row["role"] == role) and all(row["params"].get(k) == v for k, v in params.items())]

    def series(self) -> list[str]:
        """Series names in the order they were first recorded."""
        return list(dict.fromkeys(row["series"] for row in self.rows))

    def ms(self, series: str, **params: Any) -> float:
        """The time of exactly one matching row."""
        rows = self.select(series, **params)
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} rows match series={series!r} {params}")
        return rows[0]["ms"]


def result_files(chapter: str, root: Path = DEFAULT_OUT) -> list[Path]:
    """Every committed result file of a chapter, one per GPU."""
    return sorted(Path(root).glob(f"*/{chapter}.json"))


def load_results(chapter: str, gpu: str | None = None, root: Path = DEFAULT_OUT) -> Results:
    """The chapter's results on ``gpu`` (a folder name: ``nvidia-h100-80gb-hbm3``), or the newest of any GPU."""
    files = result_files(chapter, root)
    if gpu is not None:
        files = [f for f in files if f.parent.name == gpu]
    if not files:
        raise FileNotFoundError(f"no benchmark results for {chapter!r} under {root}; "
                                f"run `python -m studylog bench {chapter}` on a GPU")
    loaded = [Results(f, json.loads(f.read_text())) for f in files]
    return max(loaded, key=lambda r: r.data["date"])


def load_lab(chapter: str, name: str, gpu: str = "nvidia-h200", root: Path | None = None) -> Any:
    """An experiment's output under ``lab/<chapter>/results/<gpu>/`` (its README says where it comes from): ``name``
    is a file name (``.json`` read as JSON, else text) or a JSON file's stem."""
    folder = Path(root) / chapter / "results" / gpu if root is not None else paths.lab_results(chapter, gpu)
    path = folder / (name if Path(name).suffix else f"{name}.json")
    if not path.is_file():
        raise FileNotFoundError(f"no experiment output {path} (see lab/{chapter}/README.md)")
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def headline_row(results: Results, kernel: str, baseline: str, case: str, *, kernel_label: str | None = None,
                 baseline_label: str | None = None, **params: Any) -> dict[str, Any]:
    """One headline: ``kernel``'s and ``baseline``'s rows at ``params`` (one each, on one clock), the speedup
    (baseline median over kernel median), both times with their spread, both sides' host time per call and the
    run's empty launch's."""
    k, b = results.select(kernel, **params), results.select(baseline, **params)
    if len(k) != 1 or len(b) != 1:
        raise KeyError(f"headline {kernel} vs {baseline} at {params}: {len(k)} and {len(b)} rows match")
    k, b = k[0], b[0]
    clock_k, clock_b = k["clock"], b["clock"]
    if clock_k != clock_b:
        raise ValueError(f"headline {kernel} ({clock_k}) vs {baseline} ({clock_b}): not the same clock")
    row = {"kernel": kernel_label or kernel, "baseline": baseline_label or baseline, "case": case,
           "speedup": b["ms"] / k["ms"], "clock": clock_k, "kernel_ms": k["ms"], "baseline_ms": b["ms"]}
    for key, source, field in (("kernel_spread_ms", k, "spread_ms"), ("baseline_spread_ms", b, "spread_ms"),
                               ("host_ms", k, "host_ms"), ("baseline_host_ms", b, "host_ms")):
        if field in source:
            row[key] = source[field]
    if (empty := results.data.get("ceilings", {}).get("empty_launch_host_ms")) is not None:
        row["empty_launch_host_ms"] = empty
    if "kernel_spread_ms" in row and "baseline_spread_ms" in row:  # the ratio's range over the repetitions
        row["speedup_range"] = [row["baseline_spread_ms"][0] / row["kernel_spread_ms"][2],
                                row["baseline_spread_ms"][2] / row["kernel_spread_ms"][0]]
    return row
