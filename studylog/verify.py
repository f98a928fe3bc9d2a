"""``python -m studylog bench verify DIR``: does a fresh run repeat the committed one, row by row (same series,
role, clock and parameters) and headline by headline (a headline holds when its fresh speedup is within tolerance)?
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from studylog.paths import BENCH_RESULTS as DEFAULT_OUT


def _row_key(row: dict[str, Any]) -> tuple:
    return (row["series"], row["role"], row["clock"], json.dumps(row["params"], sort_keys=True))


def verify(fresh_root: Path, committed_root: Path = DEFAULT_OUT, *, tolerance: float = 0.15) -> dict[str, Any]:
    """Compare every ``fresh_root/<gpu>/<chapter>.json`` with the committed file of that GPU (else the newest): per
    file, the rows that moved by more than ``tolerance``, those in one file only, and whether each headline holds."""
    from studylog import chapter as registry
    from studylog.plotting import load_results, result_files

    fresh_root, committed_root = Path(fresh_root), Path(committed_root)
    files = sorted(fresh_root.glob("*/*.json"))
    if not files:
        raise ValueError(f"no results files under {fresh_root} (expected <gpu>/<chapter>.json)")
    report: dict[str, Any] = {"tolerance": tolerance, "fresh_root": str(fresh_root), "files": []}
    for path in files:
        chapter_name, gpu = path.stem, path.parent.name
        if chapter_name not in registry.CHAPTERS:
            continue
        fresh = load_results(chapter_name, gpu=gpu, root=fresh_root)
        committed_gpus = [f.parent.name for f in result_files(chapter_name, committed_root)]
        if not committed_gpus:
            report["files"].append({"chapter": chapter_name, "gpu": gpu, "committed": None})
            continue
        same_gpu = gpu in committed_gpus
        committed = load_results(chapter_name, gpu=gpu if same_gpu else None, root=committed_root)
        old = {_row_key(r): r for r in committed.rows}
        new = {_row_key(r): r for r in fresh.rows}
        moved = []
        for key in old.keys() & new.keys():
            a, b = old[key]["ms"], new[key]["ms"]
            if a > 0 and abs(b / a - 1) > tolerance:
                moved.append({"series": key[0], "clock": key[2], "params": old[key]["params"],
                              "committed_ms": a, "fresh_ms": b, "ratio": b / a})
        moved.sort(key=lambda m: -abs(math.log(m["ratio"])))
        entry = {"chapter": chapter_name, "gpu": gpu, "fresh_gpu": fresh.gpu, "committed_gpu": committed.gpu,
                 "same_gpu": same_gpu, "committed_commit": committed.data.get("git_commit"),
                 "fresh_commit": fresh.data.get("git_commit"), "rows_compared": len(old.keys() & new.keys()),
                 "committed_clocks": sorted({k[2] for k in old}), "fresh_clocks": sorted({k[2] for k in new}),
                 "only_committed": len(old.keys() - new.keys()), "only_fresh": len(new.keys() - old.keys()),
                 "moved": moved, "headlines": []}
        declared = registry.get(chapter_name)
        if declared.headline is not None:
            key = ("kernel", "baseline", "case")
            before = {tuple(r[k] for k in key): r for r in declared.headline(committed)}
            for row in declared.headline(fresh):
                headline = {k: row[k] for k in key}
                if (old_row := before.get(tuple(headline.values()))) is None:
                    headline.update(committed_speedup=None, holds=None)
                else:
                    ratio = row["speedup"] / old_row["speedup"]
                    headline.update(committed_speedup=old_row["speedup"], fresh_speedup=row["speedup"], ratio=ratio,
                                    holds=abs(ratio - 1) <= tolerance)
                entry["headlines"].append(headline)
        report["files"].append(entry)
    return report


def verify_markdown(report: dict[str, Any]) -> str:
    """The verify report as Markdown: per chapter, the headlines (held or not) and what moved."""
    tol = report["tolerance"]
    lines = [f"# bench verify: {report['fresh_root']} against the committed results (±{tol:.0%})", ""]
    for f in report["files"]:
        if "rows_compared" not in f:  # no committed file to compare with
            lines += [f"## {f['chapter']} ({f['gpu']})", "", "No committed results to compare with.", ""]
            continue
        where = "the same GPU" if f["same_gpu"] else f"another GPU ({f['committed_gpu']})"
        lines += [f"## {f['chapter']}: {f['fresh_gpu']} against {where}", "",
                  f"{f['rows_compared']} rows compared ({f['only_committed']} only committed, {f['only_fresh']} only "
                  f"fresh); {len(f['moved'])} moved by more than ±{tol:.0%}.", ""]
        if f["rows_compared"] == 0:
            lines += [f"**Nothing to compare**: the committed rows are on clock(s) {', '.join(f['committed_clocks'])}, "
                      f"the fresh ones on {', '.join(f['fresh_clocks'])}; a headline compared across clocks says "
                      "little.", ""]
        if f["headlines"]:
            lines += ["| headline | case | committed | fresh | holds |", "|---|---|---|---|---|"]
            for h in f["headlines"]:
                if h["committed_speedup"] is None:
                    lines.append(f"| {h['kernel']} vs {h['baseline']} | {h['case']} | – | new | – |")
                else:
                    lines.append(f"| {h['kernel']} vs {h['baseline']} | {h['case']} | {h['committed_speedup']:.2f}× | "
                                 f"{h['fresh_speedup']:.2f}× | {'yes' if h['holds'] else '**no**'} |")
            lines.append("")
        if f["moved"]:
            lines += ["| series | clock | params | committed (µs) | fresh (µs) | fresh / committed |",
                      "|---|---|---|---|---|---|"]
            for m in f["moved"][:40]:
                params = ", ".join(f"{k}={v}" for k, v in m["params"].items())
                lines.append(f"| {m['series']} | {m['clock']} | {params} | {m['committed_ms'] * 1e3:.1f} | "
                             f"{m['fresh_ms'] * 1e3:.1f} | {m['ratio']:.2f} |")
            if len(f["moved"]) > 40:
                lines.append(f"| … {len(f['moved']) - 40} more | | | | | |")
            lines.append("")
    return "\n".join(lines)
