"""Chapter 4's figures, headline and the answer to the blog post's question, all from a results file (the
committed JSON). They read the benchmark's series as :mod:`studylog.ctc.report` writes them and, where a file predates
a series, leave it out (or say that its measurement is pending) instead of failing."""

from __future__ import annotations

from studylog.ctc.reference import FAR_GRAD, FAR_LOSS, LOSS_TOLERANCE
from studylog.ctc.report import BENCH_A, BENCH_T

#: Rows of the comparison on the stress set: ours in probability space, ours in log space, torch's calls.
CUDNN_SET = "cudnn-set "
#: Outcome counts of a row (see :func:`studylog.ctc.reference.outcomes`).
OUTCOMES = ("utterances", "impossible", "infinite", "nan", "finite_wrong", "far", "right")


def _chapter():
    from studylog.ctc import CHAPTER

    return CHAPTER


def _step_series() -> list[str]:
    return [s.series for s in _chapter().steps]


def clock_of(results, series: str) -> str:
    """The clock of a series' rows (``"do_bench"`` for files that did not say), or ``""`` without rows."""
    rows = results.select(series)
    return rows[0].get("clock", "do_bench") if rows else ""


def label(results, series: str) -> str:
    """A legend label: the step's name for a step's series, with the clock where it is not the GPU clock."""
    CHAPTER = _chapter()
    clock = clock_of(results, series)
    name = series if series in CHAPTER.baselines else CHAPTER.label(series)
    return name if clock in ("gpu", "") else f"{name} ({clock} clock)"


def figures(results) -> dict[str, "matplotlib.figure.Figure"]:  # noqa: F821
    import matplotlib.pyplot as plt

    from studylog import plotting

    figs = {}
    lines = ["torch-cuDNN", "torch-native"] + _step_series()
    for A in BENCH_A:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        plotting.plot_times(results, "N", lines, where={"A": A, "T": BENCH_T}, ax=ax,
                            label=lambda s: label(results, s),
                            title=f"CTC loss + gradient, T = {BENCH_T}, A = {A} ({results.gpu})")
        figs[f"times_A{A}"] = fig
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, A in zip(axes, BENCH_A):
        plotting.plot_speedup(results, "N", "torch-best", _step_series(), where={"A": A, "T": BENCH_T}, ax=ax,
                              label=lambda s: label(results, s),
                              title=f"speedup over the faster torch path, A = {A} (dashed: the target)")
        ax.axhline(2.0 if A == 5000 else 1.0, color="tab:red", lw=1, ls="--")
    if axes[0].get_legend() is not None:
        axes[0].get_legend().remove()  # one legend, beside the plots, where it hides no line
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    figs["speedup"] = fig
    step4, step5 = _chapter().step(4).series, _chapter().step(5).series
    grain_series = [s for s in (f"{step4} strided", f"{step5} strided", f"{step5} blocked") if results.select(s)]
    if grain_series:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        for ax, A in zip(axes, BENCH_A):
            plotting.plot_times(results, "grain", grain_series, where={"A": A}, ax=ax, logx=False, logy=False,
                                floor=False, title=f"grain size (positions per thread), N = 64, A = {A}")
        fig.tight_layout()
        figs["grain"] = fig
    rescaling = _rescaling_figure(results)
    if rescaling is not None:
        figs["rescaling"] = rescaling
    if any(results.select(f"{_chapter().step(k).series} kernels") for k in (7, 8, 9, 10)):
        figs["kernels"] = _kernel_breakdown_figure(results)
    return figs


def _rescaling_figure(results):
    import matplotlib.pyplot as plt

    rows = [r for r in results.rows if r["series"].startswith("stress ")
            and r["params"].get("inputs", "blank-heavy") == "blank-heavy"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for series in sorted({r["series"] for r in rows}):
        pts = sorted((r["params"]["T"], max(r["loss_rel"], 1e-12)) for r in rows if r["series"] == series)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=_chapter().label(series.removeprefix("stress ")))
        for r in rows:
            if r["series"] == series and r["infinite_losses"]:
                ax.annotate(f"{r['infinite_losses']} inf", (r["params"]["T"], max(r["loss_rel"], 1e-12)),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(LOSS_TOLERANCE, color="k", lw=1, ls=":", label="tolerance of the log-space steps")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (frames); targets of T / 3 labels, blank-heavy frames")
    ax.set_ylabel("largest relative loss error")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"log space vs probability space on long utterances ({results.gpu})", fontsize=10)
    return fig


def _kernel_role(name: str) -> str:
    if "recursion" in name:
        return "recursion"
    if name.startswith("ctc_"):
        return "first pass" if ("stats" in name) else "last pass"
    return "other"


def _kernel_breakdown_figure(results):
    """Stacked per-kernel device times of steps 7 to 10 at the profiled points, with the step's timed median
    (GPU clock: CUDA-graph replay, or do_bench in older files) as a marker."""
    import matplotlib.pyplot as plt

    CHAPTER = _chapter()
    steps = [CHAPTER.step(k) for k in (7, 8, 9, 10)]
    cases = sorted({(r["params"]["A"], r["params"]["N"]) for s in steps for r in results.select(f"{s.series} kernels")})
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = {"first pass": "tab:blue", "recursion": "tab:orange", "last pass": "tab:green", "other": "tab:gray"}
    width = 0.8 / len(steps)
    used = set()
    for j, (A, N) in enumerate(cases):
        for i, step in enumerate(steps):
            rows = results.select(f"{step.series} kernels", A=A, N=N)
            if not rows:
                continue
            xpos = j + (i - (len(steps) - 1) / 2) * width
            bottom = 0.0
            order = ("first", "recursion", "last", "other")
            for name, us in sorted(rows[0]["kernels_us"].items(),
                                   key=lambda kv: order.index(_kernel_role(kv[0]).split()[0])):
                role = _kernel_role(name)
                ax.bar(xpos, us, width * 0.9, bottom=bottom, color=colors[role],
                       label=role if role not in used else None)
                used.add(role)
                bottom += us
            timed = results.select(step.series, A=A, N=N, T=BENCH_T)
            graph = results.select(f"{step.series} graph", A=A, N=N)  # files before the GPU clock
            top = max([bottom] + [r["ms"] * 1e3 for r in timed + graph])
            ax.text(xpos, top * 1.12, str(step.number), ha="center", va="bottom", fontsize=7)
            for rows_, marker, what in ((timed, "k_", "timed call"), (graph, "rv", "CUDA-graph replay")):
                if rows_:
                    clock = rows_[0].get("clock", "do_bench")
                    key = f"{what} ({clock})"
                    ax.plot(xpos, rows_[0]["ms"] * 1e3, marker, ms=10 if marker == "k_" else 5,
                            mew=2, label=key if key not in used else None)
                    used.add(key)
    ax.set_xticks(range(len(cases)), [f"A = {A}, N = {N}" for A, N in cases])
    ax.set_yscale("log")
    ax.set_ylabel("µs per call")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"device time per kernel of steps 7 to 10 (torch.profiler) against the timed call ({results.gpu})",
                 fontsize=10)
    return fig


def native_captured(results) -> bool | None:
    """Whether torch's native rows are on the GPU clock (None: the file has none)."""
    rows = results.select("torch-native")
    return None if not rows else all(r.get("clock") == "gpu" for r in rows)


def headline(results) -> list[dict]:
    """The book's headline rows (:func:`studylog.plotting.headline_row`): the last step measured against
    ``torch-best`` on the same clock, at the smallest speedup over N for each alphabet and at the largest batch
    of the large alphabet. ``torch-best`` is the faster of torch's calls timed on the GPU clock; where its native
    path cannot be captured in a graph, that is torch's cuDNN call alone, and the baseline says so."""
    from studylog.plotting import headline_row

    CHAPTER = _chapter()
    measured = [s for s in reversed(CHAPTER.steps) if results.select(s.series, T=BENCH_T)]
    if not measured or not results.select("torch-best"):
        return []
    step = measured[0]
    kernel = step.series
    if clock_of(results, "torch-best") != clock_of(results, kernel):  # no torch call on the GPU clock: spans
        kernel = f"{step.series} span"
        if clock_of(results, kernel) != clock_of(results, "torch-best"):
            return []
    captured = native_captured(results)
    if clock_of(results, "torch-best") == "gpu" and captured is False:
        baseline = "torch cuDNN (graph-timed; torch's native path cannot be captured in a CUDA graph)"
    elif clock_of(results, "torch-best") == "kernel":
        baseline = "faster of torch cuDNN / native (kernel clock: no torch call could be captured in a CUDA graph)"
    else:
        baseline = "faster of torch cuDNN / native"
    rows = []
    for A in BENCH_A:
        ratios = {r["params"]["N"]: r["ms"] / results.ms(kernel, **r["params"])
                  for r in results.select("torch-best", A=A, T=BENCH_T) if results.select(kernel, **r["params"])}
        if not ratios:
            continue
        worst = min(ratios, key=ratios.get)
        picks = [(f"T = {BENCH_T}, A = {A}, N = {worst} (smallest speedup over N = {min(ratios)}..{max(ratios)})",
                  worst)]
        if A == max(BENCH_A):
            picks.append((f"T = {BENCH_T}, A = {A}, N = {max(ratios)}", max(ratios)))
        for case, n in picks:
            rows.append(headline_row(results, kernel, "torch-best", case, kernel_label=f"{step.name} (CUDA C++)",
                                     baseline_label=baseline, T=BENCH_T, A=A, N=n))
    return rows[:3]


def cudnn_counts(results) -> dict[str, dict[str, int]]:
    """Outcome counts on the stress set's utterances that torch's cuDNN path takes, summed over its inputs,
    per series (``"torch-cuDNN"``, ``"step06"``...); empty for files that predate the comparison."""
    out: dict[str, dict[str, int]] = {}
    for row in results.rows:
        if row["series"].startswith(CUDNN_SET):
            series = row["series"].removeprefix(CUDNN_SET)
            total = out.setdefault(series, dict.fromkeys(OUTCOMES, 0))
            for key in OUTCOMES:
                total[key] += int(row.get(key, 0))
    return out


def cudnn_cases(results) -> list[dict]:
    """Per input of the stress set: its name, T, the utterances compared (of how many) and, per series, the
    utterances lost (:func:`lost`), to see where each backend loses them."""
    cases: dict[tuple, dict] = {}
    for row in results.rows:
        if row["series"].startswith(CUDNN_SET):
            p = row["params"]
            case = cases.setdefault((p.get("inputs"), p["T"]), {"inputs": p.get("inputs"), "T": p["T"], "N": p["N"],
                                                                "of": p.get("of", p["N"]), "lost": {}})
            case["lost"][row["series"].removeprefix(CUDNN_SET)] = lost({k: int(row.get(k, 0)) for k in OUTCOMES})
    return [cases[k] for k in sorted(cases, key=lambda k: (str(k[0]), k[1]))]


def lost(counts: dict[str, int]) -> int:
    """Utterances lost to what underflow does: an infinite or NaN answer, or a finite one far from float64."""
    return counts["infinite"] + counts["nan"] + counts["far"]


def cudnn_verdict(results) -> dict | None:
    """The blog post's question, answered from the comparison on the stress set: does cuDNN lose the utterances that
    float32 probability space (step 6, same inputs, same run) loses? None when the file predates it."""
    counts = cudnn_counts(results)
    prob = counts.get(_chapter().step(6).series)
    cudnn = {k: v for k, v in counts.items() if k.startswith("torch-cuDNN")}
    if prob is None or not cudnn:
        return None
    took_cudnn = all(r.get("use_cudnn_ctc_loss", True) for r in results.rows
                     if r["series"] == f"{CUDNN_SET}torch-cuDNN F.ctc_loss")
    worst = max(cudnn.values(), key=lost)
    verdict = {"counts": counts, "probability_space_lost": lost(prob), "cudnn_lost": lost(worst),
               "took_cudnn": took_cudnn, "supports": None}
    n = prob["utterances"] - prob["impossible"]
    if not took_cudnn:
        verdict["text"] = "F.ctc_loss did not take its cuDNN path on these inputs: no answer from this run."
    elif lost(prob) == 0:
        verdict["text"] = (f"Float32 probability space lost none of these {n} utterances: this run cannot tell "
                           "where cuDNN's arithmetic works.")
    elif lost(worst) > 0:
        verdict["supports"] = True
        verdict["text"] = (f"cuDNN loses {lost(worst)} of the {n} utterances (infinite {worst['infinite']}, NaN "
                           f"{worst['nan']}, finite but far from float64 {worst['far']}) where float32 probability "
                           f"space loses {lost(prob)}: this supports the hypothesis that cuDNN works in "
                           "probability space.")
    else:
        verdict["supports"] = False
        verdict["text"] = (f"Float32 probability space, rescaled every frame, loses {lost(prob)} of these {n} "
                           f"utterances (infinite {prob['infinite']}, NaN {prob['nan']}, finite but far from float64 "
                           f"{prob['far']}); cuDNN loses none: no infinite or NaN answer, none off by more than "
                           f"{FAR_LOSS:g} (loss) or {FAR_GRAD:g} (gradient). So cuDNN does not work in plain float32 "
                           "probability space; its speed has to come from elsewhere. (It may still rescale in "
                           "another way, in double, or in log space: the run only rules out the plain form.)")
    return verdict


#: The step whose recursion options were compared (an experiment: lab/ctc).
OPTIONS_STEP = 9


def recursion_series() -> list[tuple[str, str]]:
    """(series, label) of every recursion measured between step 9's two passes in the experiment kept in
    ``lab/ctc`` (the branch-free warp's options, and step 10's block of warps at both grains)."""
    from studylog.ctc.fused import BLOCK_GRAINS, DEFAULT_BLOCK_GRAIN, DEFAULT_RECURSION, RECURSION_OPTIONS

    CHAPTER = _chapter()
    nine, ten = CHAPTER.step(OPTIONS_STEP), CHAPTER.step(10)
    out = []
    for option in RECURSION_OPTIONS:
        series = nine.series + ("" if option == DEFAULT_RECURSION else f" recursion {option}")
        out.append((series, f"{nine.name}, {option}" + (" (default)" if option == DEFAULT_RECURSION else "")))
    for grain in BLOCK_GRAINS:
        series = ten.series + ("" if grain == DEFAULT_BLOCK_GRAIN else f" grain {grain}")
        out.append((series, f"{ten.name}, {grain} per thread" + (" (default)" if grain == DEFAULT_BLOCK_GRAIN else "")))
    return out
