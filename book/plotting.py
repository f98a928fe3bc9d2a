"""The book's figures and results tables, drawn from the committed benchmark JSON (read by :mod:`studylog.plotting`).

Each chapter that draws figures has ``book/<chapter>/figures.py`` whose ``figures(results)`` returns
``{name: Figure}``; :func:`save_chapter_figures` saves them as ``assets/figures/<chapter>_<name>.png`` and rewrites
the README's results block (``python -m book plot``). The notebooks call the same functions, so the book and the
files never differ. The headline tables (:func:`headline_markdown`) are the README's and the book's headline page's.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from book.common import us
from studylog import paths
from studylog.paths import BENCH_RESULTS as DEFAULT_OUT
from studylog.paths import ASSETS, REPO_ROOT
from studylog.plotting import Results, load_results, result_files

#: Figures drawn from the committed results: ``FIGURES/<chapter>_<name>.png``.
FIGURES = ASSETS / "figures"

#: The chapters that draw figures, in the course's order (each from ``book/<chapter>/figures.py``). Every one draws
#: from its committed benchmark results, except chapter 1 (fsm), which has no GPU benchmark: its figure is drawn from
#: its schema suite, run here on the CPU.
FIGURE_CHAPTERS = ("env", "fsm", "masked_lm_head", "ngram", "ctc", "ternary", "multi_item", "decode", "speculate")


#: A step's function name (``step09_tma``) inside a description.
_STEP_NAME = re.compile(r"\bstep(\d{2})_[a-z0-9_]+")


#: How a word of a step's name is written in a figure, where not as it is (an acronym, a number run into a word).
_WORDS = {"cpu": "CPU", "gpu": "GPU", "sdpa": "SDPA", "tma": "TMA", "mma": "MMA", "cuda": "CUDA", "phase2": "phase 2",
          "2bit": "2-bit", "w2a8": "W2A8", "smem": "in shared memory", "reg": "register", "ngram": "n-gram"}


def step_words(step) -> str:
    """How a figure names a step (a :class:`studylog.chapter.Step`): its number and its name in words,
    ``step 2: token jumps``; a reader never needs the function's name to read a legend."""
    return f"step {step.number}: " + " ".join(_WORDS.get(w, w) for w in step.slug.split("_"))


def plain_steps(text: str) -> str:
    """``text`` with every step's function name (``step04_tile_skip``) written as its number (``step 4``)."""
    return _STEP_NAME.sub(lambda m: f"step {int(m.group(1))}", text)


def series_words(chapter, series: str) -> str:
    """A benchmark series as a figure names it: a step's :func:`step_words`, or the chapter's description of a
    baseline or peer (:attr:`studylog.chapter.Chapter.baselines`) with step names in words (:func:`plain_steps`)."""
    step = next((s for s in chapter.steps if s.series == series), None)
    return step_words(step) if step is not None else plain_steps(chapter.baselines.get(series, series))


#: The width of the book's column of text (px): a figure wider than it is shown scaled down to it.
PAGE_PX = 800


def smallest_text_px(fig, page_px: int = PAGE_PX, dpi: float = 100) -> float:
    """The height (px) of a figure's smallest text as the book shows it, drawn at ``dpi`` (a notebook's): a figure
    wider than the page is scaled down to the page's width, so text of ``p`` points on a figure ``w`` inches wide
    shows at ``p × page_px / (72 × w)`` px, whatever its resolution; a narrower one at ``p × dpi / 72``."""
    from matplotlib.text import Text

    fig.canvas.draw()
    width_in = fig.get_tightbbox(fig.canvas.get_renderer()).width
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) * page_px / (72 * max(width_in, page_px / dpi))


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


def require_checkout(what: str) -> None:
    """Raise a clear error when ``what`` writes the book's files and the package is not a checkout."""
    if not paths.CHECKOUT:
        raise RuntimeError(f"{what} writes the repository's files (assets/, README.md), and studylog is installed "
                           f"from a wheel here ({paths.PACKAGE}), not run from a checkout: clone the repository and "
                           "`make install` there")


def save_figure(fig, name: str) -> Path:
    """Save a figure under ``assets/figures/<name>.png`` (the book and the README link these); needs a
    repository checkout (:data:`studylog.paths.CHECKOUT`)."""
    require_checkout(f"saving the figure {name!r}")
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.png"
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


def chapter_figures(chapter: str) -> dict[str, Any]:
    """A chapter's figures (``{name: Figure}``) as :func:`save_chapter_figures` saves them: drawn from its newest
    committed results (none when it has no results yet), chapter 1's from a run of its suite."""
    if chapter not in FIGURE_CHAPTERS:
        raise ValueError(f"chapter {chapter!r} draws no figures; the chapters that do: {', '.join(FIGURE_CHAPTERS)}")
    module = importlib.import_module(f"book.{chapter}.figures")
    if chapter == "fsm":
        from studylog.fsm import run_suite

        return module.figures(run_suite(n_samples=8))
    if not result_files(chapter):
        return {}
    card = getattr(module, "CARD", None)  # a chapter whose pages read one card draws its figures from that card
    if card is not None and any(f.parent.name == card for f in result_files(chapter)):
        return module.figures(load_results(chapter, gpu=card))
    return module.figures(load_results(chapter))


def save_chapter_figures(chapters: Sequence[str]) -> list[Path]:
    """Redraw the figures of ``chapters`` (``["all"]``: :data:`FIGURE_CHAPTERS`) as
    ``assets/figures/<chapter>_<name>.png``, then the README's results block; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = []
    for chapter in FIGURE_CHAPTERS if list(chapters) == ["all"] else chapters:
        for name, fig in chapter_figures(chapter).items():
            saved.append(save_figure(fig, f"{chapter}_{name}"))
            plt.close(fig)
    if update_readme():
        saved.append(REPO_ROOT / "README.md")
    return saved


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


def _spread_note(row: dict[str, Any]) -> str:
    """`` (spread x%)`` when the kernel's repetitions spread by more than 10% of its median."""
    spread = row.get("kernel_spread_ms")
    if not spread:
        return ""
    width = (spread[2] - spread[0]) / spread[1]
    return f" (spread {width:.0%})" if width > 0.10 else ""


def headline_rows(root: Path = DEFAULT_OUT) -> list[dict[str, Any]]:
    """One row per headline (``kernel``, ``baseline``, ``case``, ``speedup``...) of every chapter and GPU."""
    from studylog import chapter as registry

    rows = []
    for declared in registry.select(["all"], need="headline"):
        for f in result_files(declared.name, root):  # every GPU the chapter was measured on
            results = load_results(declared.name, gpu=f.parent.name, root=root)
            for row in declared.headline(results):
                rows.append({"chapter": declared.name, "gpu": results.gpu, "date": results.date, **row})
    return rows


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
    ours = us(r.get("kernel_ms"))
    if r.get("kernel_spread_ms"):
        lo, _, hi = r["kernel_spread_ms"]
        ours += f" ({us(lo)}–{us(hi)})"
    if r.get("kernel_gpu_ms") is not None and r.get("clock") != "gpu":  # a host-clock headline: GPU time too
        ours += f"; GPU {us(r['kernel_gpu_ms'])}"
    base = us(r.get("baseline_ms"))
    if r.get("baseline_spread_ms"):
        lo, _, hi = r["baseline_spread_ms"]
        base += f" ({us(lo)}–{us(hi)})"
    return (f"| {r['kernel']} | {r['baseline']} | {r['case']} | **{r['speedup']:.2f}×**{_spread_note(r)} | "
            f"{ours} | {base} | {us(r.get('host_ms'))} |")


README_START = "<!-- results: generated by `python -m book plot all` from assets/bench; do not edit -->"
README_END = "<!-- end of results -->"


def readme_headlines(root: Path = DEFAULT_OUT) -> str:
    """:func:`headline_markdown` for the README: a card's run set up differently from the other card's
    (:func:`book.results.not_comparable_runs`) keeps its table, with a line under its caption saying why it is not
    compared, and its chapter loses the list of where the cards differ (the book's results page leaves such a run
    out)."""
    import re

    from book.results import not_comparable_runs
    from book.scoreboard import ENTRIES, card_name, cards, short_card as short

    moved = not_comparable_runs(root)
    numbers = {e.bench: e.number for e in ENTRIES if e.bench}
    names = [card_name(c) for c in cards(root)]
    out, skipping, number = [], False, None
    for line in headline_markdown(root).splitlines():
        m = re.match(r"^\*\*(\w+)\*\* — (.+?), \d{4}-", line)
        if m:
            number, skipping = numbers.get(m.group(1)), False
            out.append(line)
            why = moved.get((number, m.group(2)))
            if why:
                others = " and the ".join(short(n) for n in names if n != m.group(2) and (number, n) not in moved)
                out += ["", f"Not compared with the {others or 'other card'}'s run: on the {short(m.group(2))} {why}."]
            continue
        if line.startswith("Where the cards differ") and any((number, n) in moved for n in names):
            skipping = True  # a difference from a run that is not comparable says nothing about the cards
            continue
        if skipping and (line.startswith("- ") or not line.strip()):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out)


def readme_results_block(root: Path = DEFAULT_OUT) -> str:
    """The README's results section: each chapter's question and fair headline (:mod:`book.results`), the
    scoreboard (:mod:`book.scoreboard`), then the GPU's ceilings and every chapter's headline rows."""
    from book.results import summary_markdown
    from book.scoreboard import scoreboard_markdown

    lines = [README_START, "", "**Each chapter in one line**: the question, and the answer against the strongest "
             "rival measured at the same shape in the same run.", "", summary_markdown(root), "",
             "**How close to the limit** (the book's *Scoreboard* page): each final kernel's time against its "
             "byte, compute and latency floors.", "", scoreboard_markdown(root), "", "**Every row, card by card**", ""]
    for f in result_files("env", root):
        env = Results(f, json.loads(f.read_text()))
        mm, ceilings = env.select("matmul_bfloat16", n=8192), env.data["ceilings"]
        lines.append(f"Measured on **{env.gpu}** ({env.date}): copy bandwidth "
                     f"{ceilings['copy_bandwidth_gbs'] / 1e3:.2f} TB/s, bf16 matmul (8192³) "
                     f"{mm[0]['tflops']:.0f} TFLOP/s, empty kernel launch {ceilings['empty_launch_ms'] * 1e3:.1f} µs.")
        lines.append("")
    lines += [readme_headlines(root), "", README_END]
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


__all__ = ["CARD_TOLERANCE", "FIGURE_CHAPTERS", "PAGE_PX", "README_END", "README_START",
           "card_differences", "chapter_figures", "headline_markdown", "plain_steps", "plot_speedup", "plot_times",
           "readme_results_block", "save_chapter_figures", "save_figure", "series_words", "smallest_text_px",
           "step_words", "table", "update_readme"]
