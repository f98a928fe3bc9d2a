"""Turn the committed benchmark JSON into the chapters' tables and figures.

Notebooks never time anything on the CPU: they load the results a GPU run wrote under
``assets/bench/<gpu-name>/<chapter>.json`` and say on which GPU and date they were measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from studylog import paths
from studylog.paths import BENCH_RESULTS as DEFAULT_OUT
from studylog.paths import FIGURES, REPO_ROOT


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
        """``Measured on <GPU> on <date> (torch ..., triton ...; copy bandwidth ...)``: the commit and the
        command stay in the file."""
        v = self.data["versions"]
        return (f"Measured on {self.gpu} on {self.date} (torch {v['torch']}, triton {v['triton']}; "
                f"copy bandwidth {self.data['ceilings']['copy_bandwidth_gbs']:.0f} GB/s).")

    def select(self, series: str | None = None, role: str | None = None, **params: Any) -> list[dict[str, Any]]:
        """Rows matching a series name, a role and parameter values."""
        out = []
        for row in self.rows:
            if series is not None and row["series"] != series:
                continue
            if role is not None and row["role"] != role:
                continue
            if any(row["params"].get(k) != v for k, v in params.items()):
                continue
            out.append(row)
        return out

    def series(self, role: str | None = None) -> list[str]:
        """Series names in the order they were first recorded."""
        seen: dict[str, None] = {}
        for row in self.rows:
            if role is None or row["role"] == role:
                seen.setdefault(row["series"], None)
        return list(seen)

    def with_series_names(self, names: dict[str, str]) -> "Results":
        """The same results with series renamed by ``names`` (old -> new): results measured before a
        chapter named its series after its steps are read under today's names. The file is not changed."""
        import copy

        data = copy.deepcopy(self.data)
        for row in data["measurements"]:
            row["series"] = names.get(row["series"], row["series"])
        return Results(self.path, data)

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
    """The chapter's results on ``gpu`` (a folder name such as ``nvidia-h100-80gb-hbm3``), or the
    newest results of any GPU when ``gpu`` is None. Files written before the chapter named its series
    after its steps (no ``"schema"`` 2) are read under today's names (``CHAPTER.renamed_series``)."""
    from studylog import chapter as registry

    files = result_files(chapter, root)
    if gpu is not None:
        files = [f for f in files if f.parent.name == gpu]
    if not files:
        raise FileNotFoundError(
            f"no benchmark results for {chapter!r} under {root}; run `python -m studylog bench {chapter}` on a GPU"
        )
    loaded = [Results(f, json.loads(f.read_text())) for f in files]
    newest = max(loaded, key=lambda r: r.data["date"])
    if chapter in registry.CHAPTERS and newest.data.get("schema", 1) < 2:
        newest = newest.with_series_names(dict(registry.get(chapter).renamed_series))
    return newest


def load_lab(chapter: str, name: str, gpu: str = "nvidia-h200", root: Path | None = None) -> Any:
    """The output of one of a chapter's experiments, kept under ``lab/<chapter>/results/<gpu>/``: ``name``
    is a file name (``.json`` is read as JSON, anything else as text) or a JSON file's stem. Its provenance
    (command, commit, what it answers) is in ``lab/<chapter>/README.md``."""
    folder = Path(root) / chapter / "results" / gpu if root is not None else paths.lab_results(chapter, gpu)
    path = folder / (name if Path(name).suffix else f"{name}.json")
    if not path.is_file():
        raise FileNotFoundError(f"no experiment output {path} (see lab/{chapter}/README.md)")
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def table(results: Results, columns: Sequence[str], series: Sequence[str], where: dict[str, Any] | None = None,
          fmt: str = "{:.1f}", unit_scale: float = 1e3) -> str:
    """A Markdown table: one line per distinct parameter tuple, one column per series (µs by default)."""
    where = where or {}
    keys: dict[tuple, None] = {}
    for row in results.rows:
        if row["series"] in series and all(row["params"].get(k) == v for k, v in where.items()):
            keys.setdefault(tuple(row["params"].get(c) for c in columns), None)
    head = "| " + " | ".join(list(columns) + [f"{s} (µs)" if unit_scale == 1e3 else s for s in series]) + " |"
    lines = [head, "|" + "---|" * (len(columns) + len(series))]
    for key in keys:
        params = dict(zip(columns, key)) | where
        cells = []
        for s in series:
            rows = results.select(s, **params)
            cells.append(fmt.format(rows[0]["ms"] * unit_scale) if rows else "–")
        lines.append("| " + " | ".join([str(k) for k in key] + cells) + " |")
    return "\n".join(lines)


def _xy(results: Results, series: str, x: str, where: dict[str, Any], value) -> tuple[list, list]:
    pts = sorted((row["params"][x], value(row)) for row in results.select(series, **where))
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_times(results: Results, x: str, series: Iterable[str], *, where: dict[str, Any] | None = None,
               floor: bool = True, ax=None, logx: bool = True, logy: bool = True, title: str | None = None,
               label=None):
    """Time (µs) against a swept parameter, one line per series, with the row floors dashed; ``label`` maps a
    series to its legend label (for example ``CHAPTER.label``)."""
    import matplotlib.pyplot as plt

    where = where or {}
    ax = ax or plt.subplots(figsize=(7, 4.2))[1]
    floor_pts: dict = {}
    for s in series:
        xs, ys = _xy(results, s, x, where, lambda r: r["ms"] * 1e3)
        if xs:
            ax.plot(xs, ys, marker="o", ms=3, label=label(s) if label else s)
        for row in results.select(s, **where):
            if "floor_ms" in row:
                floor_pts[row["params"][x]] = max(floor_pts.get(row["params"][x], 0), row["floor_ms"] * 1e3)
    if floor and floor_pts:
        xs = sorted(floor_pts)
        ax.plot(xs, [floor_pts[v] for v in xs], "k--", lw=1, label="floor (bytes / measured bandwidth)")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(x)
    ax.set_ylabel("time (µs, median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{results.data['chapter']} on {results.gpu}", fontsize=10)
    return ax


def plot_speedup(results: Results, x: str, baseline: str, series: Iterable[str], *,
                 where: dict[str, Any] | None = None, ax=None, logx: bool = True, title: str | None = None,
                 label=None):
    """Speedup over ``baseline`` (baseline time / series time) against a swept parameter."""
    import matplotlib.pyplot as plt

    where = where or {}
    ax = ax or plt.subplots(figsize=(7, 4.2))[1]
    base = {row["params"][x]: row["ms"] for row in results.select(baseline, **where)}
    for s in series:
        pts = sorted((row["params"][x], base[row["params"][x]] / row["ms"])
                     for row in results.select(s, **where) if row["params"][x] in base)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label(s) if label else s)
    ax.axhline(1.0, color="k", lw=1, ls=":")
    ax.set_xscale("log" if logx else "linear")
    ax.set_ylim(bottom=0)  # speedups on a linear axis, from zero
    ax.set_xlabel(x)
    ax.set_ylabel(f"speedup over {baseline}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{results.data['chapter']} on {results.gpu}", fontsize=10)
    return ax


def save_figure(fig, name: str) -> Path:
    """Save a figure under ``assets/figures/<name>.png`` (the book and the README link these); needs a
    repository checkout (:data:`studylog.paths.CHECKOUT`)."""
    paths.require_checkout(f"saving the figure {name!r}")
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.png"
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


def save_chapter_figures(chapters: Sequence[str]) -> list[Path]:
    """Redraw figures from committed results: each chapter that declares ``figures`` (see
    :mod:`studylog.chapter`) draws ``{name: Figure}``, saved as ``assets/figures/<chapter>_<name>.png``.
    The notebooks call the same function, so the book and the files never differ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from studylog import chapter as registry

    saved = []
    for declared in registry.select(list(chapters), need="figures"):
        if not result_files(declared.name):
            continue
        for name, fig in declared.figures(load_results(declared.name)).items():
            saved.append(save_figure(fig, f"{declared.name}_{name}"))
            plt.close(fig)
    if update_readme():
        saved.append(REPO_ROOT / "README.md")
    return saved


def headline_rows(root: Path = DEFAULT_OUT) -> list[dict[str, Any]]:
    """One row per headline of every chapter with committed results that declares a ``headline``
    (a list of dicts with ``kernel``, ``baseline``, ``case`` and ``speedup``)."""
    from studylog import chapter as registry

    rows = []
    for declared in registry.select(["all"], need="headline"):
        for f in result_files(declared.name, root):  # every GPU the chapter was measured on
            results = load_results(declared.name, gpu=f.parent.name, root=root)
            for row in declared.headline(results):
                rows.append({"chapter": declared.name, "gpu": results.gpu, "date": results.date, **row})
    return rows


#: How far a headline may differ between two cards before the tables say so.
CARD_TOLERANCE = 0.15


def card_differences(rows: list[dict[str, Any]]) -> list[str]:
    """Sentences naming each headline (same kernel, baseline and case) whose speedup differs between two GPUs by
    more than :data:`CARD_TOLERANCE`: a ratio that holds on one card need not hold on another."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["kernel"], r["baseline"], r["case"]), []).append(r)
    out = []
    for (kernel, baseline, case), rs in by_key.items():
        if len(rs) < 2:
            continue
        lo, hi = min(rs, key=lambda r: r["speedup"]), max(rs, key=lambda r: r["speedup"])
        if hi["speedup"] > (1 + CARD_TOLERANCE) * lo["speedup"]:
            out.append(f"{kernel} against {baseline} ({case}): {hi['speedup']:.2f}× on the {hi['gpu']}, "
                       f"{lo['speedup']:.2f}× on the {lo['gpu']}.")
    return out


def headline_row(results: Results, kernel: str, baseline: str, case: str, *, kernel_label: str | None = None,
                 baseline_label: str | None = None, **params: Any) -> dict[str, Any]:
    """One headline of a chapter: ``kernel``'s and ``baseline``'s rows at ``params`` (one row each), the
    speedup (baseline median over kernel median), and what the headline page shows beside it: the clock,
    both times with their spread, the kernel's host time per call and the empty launch's of the same run.
    Both rows must be on the same clock."""
    k, b = results.select(kernel, **params), results.select(baseline, **params)
    if len(k) != 1 or len(b) != 1:
        raise KeyError(f"headline {kernel} vs {baseline} at {params}: {len(k)} and {len(b)} rows match")
    k, b = k[0], b[0]
    clock_k, clock_b = k.get("clock", "do_bench"), b.get("clock", "do_bench")
    if clock_k != clock_b:
        raise ValueError(f"headline {kernel} ({clock_k}) vs {baseline} ({clock_b}): not the same clock")
    row = {"kernel": kernel_label or kernel, "baseline": baseline_label or baseline, "case": case,
           "speedup": b["ms"] / k["ms"], "clock": clock_k, "kernel_ms": k["ms"], "baseline_ms": b["ms"]}
    for key, source in (("kernel_spread_ms", k), ("baseline_spread_ms", b)):
        if "spread_ms" in source:
            row[key] = source["spread_ms"]
    if "host_ms" in k:
        row["host_ms"] = k["host_ms"]
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    if empty is not None:
        row["empty_launch_host_ms"] = empty
    if "kernel_spread_ms" in row and "baseline_spread_ms" in row:  # the ratio's range over the repetitions
        row["speedup_range"] = [row["baseline_spread_ms"][0] / row["kernel_spread_ms"][2],
                                row["baseline_spread_ms"][2] / row["kernel_spread_ms"][0]]
    return row


def _us(ms: float | None) -> str:
    return "–" if ms is None else f"{ms * 1e3:,.1f}"


def _spread_note(row: dict[str, Any]) -> str:
    """`` (±x%)`` when the kernel's repetitions spread by more than 10% of its median."""
    spread = row.get("kernel_spread_ms")
    if not spread:
        return ""
    width = (spread[2] - spread[0]) / spread[1]
    return f" (spread {width:.0%})" if width > 0.10 else ""


def headline_markdown(root: Path = DEFAULT_OUT) -> str:
    """The headline tables (Markdown), computed from the committed JSON: used by the book and the README. One
    table per chapter and GPU, under a line naming the GPU, the date and the clock; beside each speedup, our time
    and the baseline's (µs, medians; min–max of the repetitions where the file has them) and our host time per
    call. After a chapter's tables, the headlines whose speedup differs between its cards (:func:`card_differences`)."""
    rows = headline_rows(root)
    if not rows:
        return "No GPU results are committed yet."
    out: list[str] = []
    for chapter in dict.fromkeys(r["chapter"] for r in rows):
        of_chapter = [r for r in rows if r["chapter"] == chapter]
        for gpu in dict.fromkeys(r["gpu"] for r in of_chapter):
            mine = [r for r in of_chapter if r["gpu"] == gpu]
            clocks = sorted({r.get("clock", "do_bench") for r in mine})
            out += [f"**{chapter}** — {gpu}, {mine[0]['date']}; clock: {', '.join(clocks)}", "",
                    "| ours | against | case | speedup | ours (µs) | theirs (µs) | host per call (µs) |",
                    "|---|---|---|---|---|---|---|"]
            out += [_headline_line(r) for r in mine] + [""]
        differ = card_differences(of_chapter)
        if differ:
            out += [f"Where the cards differ by more than {CARD_TOLERANCE:.0%}:", ""] + [f"- {d}" for d in differ]
            out.append("")
    return "\n".join(out).rstrip()


def _headline_line(r: dict[str, Any]) -> str:
    """One headline's row of :func:`headline_markdown`'s tables."""
    ours = _us(r.get("kernel_ms"))
    if r.get("kernel_spread_ms"):
        lo, _, hi = r["kernel_spread_ms"]
        ours += f" ({_us(lo)}–{_us(hi)})"
    if r.get("kernel_gpu_ms") is not None and r.get("clock") != "gpu":  # a host-clock headline: GPU time too
        ours += f"; GPU {_us(r['kernel_gpu_ms'])}"
    base = _us(r.get("baseline_ms"))
    if r.get("baseline_spread_ms"):
        lo, _, hi = r["baseline_spread_ms"]
        base += f" ({_us(lo)}–{_us(hi)})"
    return (f"| {r['kernel']} | {r['baseline']} | {r['case']} | **{r['speedup']:.2f}×**{_spread_note(r)} | "
            f"{ours} | {base} | {_us(r.get('host_ms'))} |")


README_START = "<!-- results: generated by `python -m studylog plot all` from assets/bench; do not edit -->"
README_END = "<!-- end of results -->"


def readme_results_block(root: Path = DEFAULT_OUT) -> str:
    """The README's results section: the GPU's ceilings and every chapter's headline."""
    lines = [README_START, ""]
    for f in result_files("env", root):
        env = Results(f, json.loads(f.read_text()))
        mm = env.select("matmul_bfloat16", n=8192)
        lines.append(f"Measured on **{env.gpu}** ({env.date}): copy bandwidth "
                     f"{env.data['ceilings']['copy_bandwidth_gbs'] / 1e3:.2f} TB/s, bf16 matmul (8192³) "
                     f"{mm[0]['tflops']:.0f} TFLOP/s, empty kernel launch {env.data['ceilings']['empty_launch_ms'] * 1e3:.1f} µs.")
        lines.append("")
    lines += [headline_markdown(root), "", README_END]
    return "\n".join(lines)


def update_readme(readme: Path = REPO_ROOT / "README.md") -> bool:
    """Rewrite the generated block of the README; returns True when it changed."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no generated results block ({README_START!r} ... {README_END!r})")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    new = head + readme_results_block() + tail
    if new != text:
        readme.write_text(new)
    return new != text
