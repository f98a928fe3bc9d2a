"""Chapter 3's benchmark (GPU only), its figures and tables, and its headline, from the committed JSON.

Series names come from the chapter's table of steps (``CHAPTER.steps``): step N is recorded as
``stepNN`` and drawn as ``stepNN_<slug>``. Two more series sweep the split of the fused kernels
(:data:`CHUNK_SWEEPS`).
"""

from __future__ import annotations

import time

import torch

from studylog.ngram.batches import haystack_bytes, make_batch
from studylog.ngram.cpu_path import cpu_path_inplace
from studylog.ngram.formats import NgramConfig, same_state, validate
from studylog.ngram.kernels import NgramMatcher, step02_serial, step06_one_pass_fused, step07_stream
from studylog.ngram.reference import reference_ngram_match

NO_BUDGET = 1 << 30  # a threshold the batch never reaches: every active slot drafts
#: (batch, prompt length, threshold). 32x512 and 128x32768 use the deployed default budget.
BENCH_GRID = [(32, 512, 128), (128, 512, NO_BUDGET), (256, 512, NO_BUDGET), (1, 131072, NO_BUDGET),
              (16, 131072, NO_BUDGET), (512, 16384, NO_BUDGET), (128, 32768, 128), (256, 131072, NO_BUDGET)]
QUICK_GRID = [(32, 512, 128), (16, 131072, NO_BUDGET), (128, 32768, 128)]
SERIAL_LIMIT_MS = 5000.0  # skip the one-thread kernel where it would take longer than this per call
SLOW_MS = 50.0            # slower than this on the first call: time a few calls instead of do_bench
#: Steps 1 to 3 are the seed's (the CPU path, its one-thread port, its two-phase kernel): the bench
#: records them as baselines. From this step on, the kernels are this chapter's.
FIRST_OWN_STEP = 4


def _chapter():
    from studylog.ngram import CHAPTER  # the package defines it after importing this module

    return CHAPTER


def series_of(step) -> str:
    """The benchmark series of a step function (``stepNN``)."""
    return next(s.series for s in _chapter().steps if s.function is step)


def own_series() -> list[str]:
    """The series of this chapter's own kernels (the others are the seed's)."""
    return [s.series for s in _chapter().steps if s.number >= FIRST_OWN_STEP]


def sweep_series(step) -> str:
    """The series of a step's chunk sweep: ``chunk_sweep_stepNN`` (a step function's name starts with
    its series, ``stepNN``; the chapter's table of steps is built on that)."""
    return f"chunk_sweep_{step.__name__[:6]}"


#: Step -> the splits its chunk sweep measures (haystack positions per block come out of each).
CHUNK_SWEEPS = {step06_one_pass_fused: ("chunk_tiles", (1, 2, 4, 8, 16)),
                step07_stream: ("chunk_len", (2048, 4096, 8192, 16384, 32768, 65536))}


def gen_width_for(seq_len: int) -> int:
    """Generated-token buffer of the benchmark: half the prompt, at most 2048."""
    return max(16, min(seq_len // 2, 2048))


def _time_slow(fn, reps: int = 3) -> float:
    """Median of a few event-timed calls (for calls far longer than do_bench's budget)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench(run) -> None:
    """Every step on the grid; each result checked bit-identical to the CPU path (itself checked
    against the Python reference where that is fast enough) before and after timing."""
    grid = QUICK_GRID if run.quick else BENCH_GRID
    serial_ms_per_window = 0.0
    for batch, seq_len, threshold in run.progress(grid, "grid"):
        config = NgramConfig(threshold=threshold)
        kinds = ["short"] if batch == 1 else None  # one slot: the case that scans everything
        inputs, draft0, this0 = make_batch(batch, seq_len, gen_width_for(seq_len), kinds=kinds,
                                           seed=1000 + batch + seq_len, device="cuda")
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        validate(inputs, draft0, this0, config)
        nbytes = haystack_bytes(inputs, this0, config)
        floor = run.floor_ms(nbytes)
        host = inputs.to("cpu")
        expected = (draft0.cpu(), this0.cpu())
        windows = cpu_path_inplace(host, *expected, config)
        if batch * seq_len <= 128 * 512:
            ref = reference_ngram_match(host, draft0.cpu(), this0.cpu(), config)
            run.check("cpu path == python reference", same_state(ref, expected), params=params)
        drafted = int((expected[1] - 1).clamp(min=0)[inputs.seq_lens_encoder.cpu() == 0].sum())
        for step in _chapter().steps:
            role = "baseline" if step.number < FIRST_OWN_STEP else "kernel"
            if step.function is step02_serial and serial_ms_per_window \
                    and windows * serial_ms_per_window > SERIAL_LIMIT_MS:
                run.note(f"{step.name} <<<1,1>>> kernel skipped at {batch}x{seq_len}: it would compare "
                         f"{windows:,} windows on one thread, predicted {windows * serial_ms_per_window / 1e3:.0f} s "
                         f"per call from its speed on the smaller inputs of this run")
                continue
            state = (draft0.clone(), this0.clone())
            matcher = NgramMatcher(step.function, inputs, *state, config=config, check_values=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            matcher()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            check_params = params | {"step": step.name}
            run.check("bit-identical to the CPU path", same_state(state, expected), params=check_params)
            if first_ms > SLOW_MS:
                ms, how = _time_slow(matcher), "median of 3 event-timed calls"
            else:
                ms, how = run.time(matcher), "do_bench median"
            run.check("bit-identical after repeated calls", same_state(state, expected), params=check_params)
            if step.function is step02_serial and windows:
                serial_ms_per_window = max(serial_ms_per_window, ms / windows)
            run.record(step.series, ms, params=params, role=role, floor_ms=floor, haystack_bytes=nbytes,
                       windows_compared_by_cpu_loop=windows, drafted_tokens=drafted, timing=how)
        sweeps = []
        if batch * seq_len >= 16 * 131072:
            sweeps.append(step07_stream)
        if (batch, seq_len) in ((16, 131072), (256, 131072)):
            sweeps.append(step06_one_pass_fused)
        for step in sweeps if not run.quick else ():
            option, values = CHUNK_SWEEPS[step]
            for value in values:
                state = (draft0.clone(), this0.clone())
                matcher = NgramMatcher(step, inputs, *state, config=config, check_values=False, **{option: value})
                matcher()
                run.check("bit-identical to the CPU path", same_state(state, expected),
                          params=params | {"step": step.__name__, "chunk_len": matcher.chunk_len})
                run.record(sweep_series(step), run.time(matcher), params=params | {"chunk_len": matcher.chunk_len},
                           floor_ms=floor)
        del inputs, host, draft0, this0
        torch.cuda.empty_cache()
    run.note("The CPU path keeps the prompt on the host (copied once, as the deployed engine did) and copies the "
             "generated tokens, per-slot lengths and draft buffers each call; the loop is the C port of the "
             "deployed operator (csrc/ngram_cpu_path.c).")
    run.note("Floors: haystack bytes of the active slots read once at the copy bandwidth measured in this run; "
             "early exit lets a kernel read less than that.")


# =========================================================================================
# Figures and tables (from the committed results)
# =========================================================================================

#: Colour and marker of each step's series, by step number.
STYLE = {1: ("#7f7f7f", "s"), 2: ("#bcbd22", "v"), 3: ("#1f77b4", "o"), 4: ("#2ca02c", "o"),
         5: ("#ff7f0e", "D"), 6: ("#d62728", "D"), 7: ("#9467bd", "*")}


def _configs(results) -> list[tuple[int, int, int]]:
    steps = {s.series for s in _chapter().steps}
    seen: dict[tuple, None] = {}
    for row in results.rows:
        if row["series"] in steps:
            p = row["params"]
            seen.setdefault((p["batch"], p["seq_len"], p["threshold"]), None)
    return list(seen)


def _label(cfg: tuple[int, int, int]) -> str:
    b, s, t = cfg
    return f"{b}x{s}" + (f"\nthr {t}" if t != NO_BUDGET else "")


def figures(results) -> dict:
    """Latency of every step across the grid; kernel time over the one-pass floor; chunk sweeps."""
    import matplotlib.pyplot as plt

    chapter = _chapter()
    configs = _configs(results)
    xs = list(range(len(configs)))
    figs = {}

    fig, ax = plt.subplots(figsize=(10, 4.6))
    for step in chapter.steps:
        color, marker = STYLE[step.number]
        pts = [(i, results.select(step.series, batch=c[0], seq_len=c[1], threshold=c[2]))
               for i, c in enumerate(configs)]
        pts = [(i, rows[0]["ms"] * 1e3) for i, rows in pts if rows]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                    label=chapter.label(step.series), lw=1.2, ms=5)
    floors = []
    for i, c in enumerate(configs):
        rows = [r for r in results.select(batch=c[0], seq_len=c[1], threshold=c[2]) if "floor_ms" in r]
        if rows:
            floors.append((i, rows[0]["floor_ms"] * 1e3))
    if floors:
        ax.plot([p[0] for p in floors], [p[1] for p in floors], "k--", lw=1, label="floor: haystacks read once")
    ax.set_xticks(xs, [_label(c) for c in configs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs, median)")
    ax.set_xlabel("batch x prompt length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"n-gram matching, every step, on {results.gpu}", fontsize=10)
    fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["latency"] = fig

    fig, ax = plt.subplots(figsize=(10, 4.2))
    kernel_series = [s for s in own_series() if results.select(s)]
    width = 0.8 / max(len(kernel_series), 1)
    for k, series in enumerate(kernel_series):
        color, _ = STYLE[chapter.step(series).number]
        vals = []
        for c in configs:
            rows = results.select(series, batch=c[0], seq_len=c[1], threshold=c[2])
            vals.append(rows[0]["ms"] / rows[0]["floor_ms"] if rows and rows[0].get("floor_ms") else float("nan"))
        ax.bar([x + (k - (len(kernel_series) - 1) / 2) * width for x in xs], vals, width, color=color,
               label=chapter.label(series))
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(1.5, color="k", lw=1, ls=":", label="1.5x floor (target at 256x131072)")
    ax.set_xticks(xs, [_label(c) for c in configs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time / one-pass floor")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("how far each kernel is from reading every haystack once", fontsize=10)
    fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["vs_floor"] = fig

    sweeps = [(step, results.select(sweep_series(step))) for step in CHUNK_SWEEPS]
    if any(rows for _, rows in sweeps):
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for step, sweep in sweeps:
            final = step is step07_stream
            cfgs = {(r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) for r in sweep}
            for cfg in sorted(cfgs):
                rows = sorted((r for r in sweep if (r["params"]["batch"], r["params"]["seq_len"],
                                                    r["params"]["threshold"]) == cfg),
                              key=lambda r: r["params"]["chunk_len"])
                ax.plot([r["params"]["chunk_len"] for r in rows], [r["ms"] / r["floor_ms"] for r in rows],
                        marker="o" if final else "x", ls="-" if final else ":",
                        label=f"{step.__name__}, {_label(cfg).replace(chr(10), ' ')}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("haystack positions per block (chunk_len)")
        ax.set_ylabel("time / floor")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title("fused kernels: how finely to split each slot", fontsize=10)
        fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        figs["chunks"] = fig
    return figs


def summary_table(results) -> str:
    """Markdown: µs per step, the best kernel's speedup over the CPU path, and its distance to the floor."""
    steps = _chapter().steps
    cpu = steps[0].series
    head = ["config", "threshold"] + [s.name for s in steps] + ["best kernel vs CPU", "best / floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in _configs(results):
        cells = [f"{c[0]}x{c[1]}", "none" if c[2] == NO_BUDGET else str(c[2])]
        ms = {}
        for s in steps:
            rows = results.select(s.series, batch=c[0], seq_len=c[1], threshold=c[2])
            if rows:
                ms[s.series] = rows[0]["ms"]
            cells.append(f"{ms[s.series] * 1e3:,.1f}" if s.series in ms else "skipped")
        kernels = {s: v for s, v in ms.items() if s in own_series()}
        if kernels and cpu in ms:
            best = min(kernels.values())
            floor = results.select(next(iter(kernels)), batch=c[0], seq_len=c[1], threshold=c[2])[0]["floor_ms"]
            cells += [f"{ms[cpu] / best:,.0f}x", f"{best / floor:.2f}" if floor else "–"]
        else:
            cells += ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The cases the book's headline page quotes: the deployed budget at the small and the issue's
#: mid-size batch, and the largest batch with no budget.
HEADLINE_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))


def headline(results) -> list[dict]:
    """For each headline case, the fastest of the chapter's kernels against the CPU path it replaces
    (the kernel's name says which step won), from the committed results."""
    from studylog.plotting import headline_row

    chapter = _chapter()
    cpu = chapter.steps[0]
    out = []
    for batch, seq_len, threshold in HEADLINE_CASES:
        where = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        kernels = [r for s in own_series() for r in results.select(s, **where)]
        if results.select(cpu.series, **where) and kernels:
            best = min(kernels, key=lambda r: r["ms"])
            budget = f", budget {threshold}" if threshold != NO_BUDGET else ", no budget"
            out.append(headline_row(results, best["series"], cpu.series, f"{batch} slots x {seq_len} tokens{budget}",
                                    kernel_label=f"n-gram matching, {chapter.step(best['series']).label}",
                                    baseline_label=cpu.label, **where))
    return out


#: The seed's two-phase kernel as its pull request published it (µs, on an H100/H20-class GPU).
PUBLISHED_US = {(32, 512): 19.0, (256, 131072): 151.0}


def target_verdicts(results) -> str:
    """The issue's targets, each with the measured number that meets or misses it (Markdown list)."""
    chapter = _chapter()
    cpu_series = chapter.steps[0].series
    checks = results.data.get("checks", [])
    failed = [c for c in checks if not c["passed"]]
    lines = [f"- bit-identical on every benchmark input: {len(checks) - len(failed)} of {len(checks)} checks passed"
             + (" (failures: " + "; ".join(f"{c['name']} {c['params']}" for c in failed[:5]) + ")" if failed else "")]

    def best(c):
        rows = [r for s in own_series() for r in results.select(s, batch=c[0], seq_len=c[1], threshold=c[2])]
        return min(rows, key=lambda r: r["ms"]) if rows else None

    speedups = []
    for c in _configs(results):
        cpu, top = results.select(cpu_series, batch=c[0], seq_len=c[1], threshold=c[2]), best(c)
        if c[0] >= 32 and cpu and top:
            speedups.append((cpu[0]["ms"] / top["ms"], c, chapter.label(top["series"])))
    if speedups:
        worst = min(speedups)
        verdict = "met" if worst[0] >= 10 else "missed"
        lines.append(f"- at least 10x faster than the CPU path at batch >= 32: {verdict}; the smallest speedup is "
                     f"{worst[0]:,.0f}x ({worst[1][0]}x{worst[1][1]}, {worst[2]})")
    for (b, s), target, what in (((256, 131072), None, "floor"), ((32, 512), 15.0, "15 µs")):
        cfg = next((c for c in _configs(results) if c[:2] == (b, s)), None)
        top = best(cfg) if cfg else None
        if top is None:
            continue
        us = top["ms"] * 1e3
        name = chapter.label(top["series"])
        published = f"; the seed's kernel: {PUBLISHED_US[(b, s)]:.0f} µs on an H100/H20-class GPU"
        if target is None:
            ratio = top["ms"] / top["floor_ms"]
            verdict = "met" if ratio <= 1.5 else "missed"
            lines.append(f"- {b}x{s} within 1.5x of the one-pass floor: {verdict}; {name} takes {us:.1f} µs, "
                         f"{ratio:.2f}x the floor of {top['floor_ms'] * 1e3:.1f} µs{published}")
        else:
            verdict = "met" if us < target else "missed"
            lines.append(f"- {b}x{s} under {what}: {verdict}; {name} takes {us:.1f} µs{published}")
    return "\n".join(lines)


__all__ = ["NO_BUDGET", "BENCH_GRID", "QUICK_GRID", "FIRST_OWN_STEP", "CHUNK_SWEEPS", "series_of", "own_series",
           "sweep_series", "gen_width_for", "bench", "figures", "summary_table", "headline", "target_verdicts"]
