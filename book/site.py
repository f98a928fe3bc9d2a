"""Sphinx extension that makes the Jupyter Book read like a blog.

* ``{studylog-posts}`` lists the chapters in the course's order (00, 01, ...): title, what to read first, a one-paragraph
  summary and a teaser figure. Post metadata lives in ``posts.yml`` at the book root; titles come from
  each notebook's first heading, so they are never written twice.
* every post page but chapter 00's ends with a one-line note on opening its notebook in JupyterLab locally,
  linking to chapter 00's section on it;
* what an exercise's check prints for a function not written yet is left out of the built page (JupyterLab
  still shows it);
* an Atom feed, ``feed.xml``, is written next to the HTML and announced in every page's head.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

from book.common import NOT_WRITTEN, read_table

POSTS_FILE = "posts.yml"
FEED_FILE = "feed.xml"


def load_posts(srcdir: Path) -> list[dict[str, Any]]:
    """Posts from ``posts.yml`` in the course's order (by notebook number), each with its notebook's title
    filled in."""
    path = Path(srcdir) / POSTS_FILE
    posts = yaml.safe_load(path.read_text())["posts"] if path.is_file() else []
    for post in posts:
        for key in ("notebook", "date", "summary", "tags"):
            if key not in post:
                raise ValueError(f"{POSTS_FILE}: post {post.get('notebook', '?')} has no {key!r}")
        post["date"] = str(post["date"])
        _dt.date.fromisoformat(post["date"])  # a clear error on a malformed date
        post["title"] = notebook_title(Path(srcdir) / post["notebook"])
    return sorted(posts, key=lambda p: p["notebook"])


def notebook_title(path: Path) -> str:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ValueError(f"{path} has no '# Title' heading")


#: What each teaser figure shows, for its alt text (a reader who cannot see the figure gets what it says).
FIGURE_ALT = {
    "assets/figures/env_ceilings.png": "The card's copy bandwidth against the size of the copy, rising to its "
                                        "ceiling above a gibibyte, beside cuBLAS's matmul rates",
    "assets/figures/fsm_savings.png": "The share of forward passes each step of the chapter, and llguidance's "
                                      "fast-forward tokens, save on every entry of the suite of JSON schemas and "
                                      "regexes",
    "assets/figures/masked_lm_head_practitioners.png": "The whole masked step's speedup over cuBLAS logits followed "
                                                       "by xgrammar's bitmask, from the packed bitmask, against the "
                                                       "number of allowed tokens, at batch sizes 1 to 256",
    "assets/figures/masked_lm_head_speedup_b1.png": "Each step of the masked LM head's speedup over index_select "
                                                    "then a matmul, given the allowed ids, at batch 1, against the "
                                                    "number of allowed tokens",
    "assets/figures/ngram_latency.png": "Time per call of the n-gram entry point beside the CPU path, the ported "
                                        "FastDeploy kernels, steps 5 and 6 and the byte floor at every shape; below, "
                                        "the two paths' last steps (7 and 12) against step 6",
    "assets/figures/ctc_speedup.png": "Speedup of the CTC kernels of steps 7c, 10, 12, 13 and 14 over the faster of "
                                      "torch's CTC calls, against the number of utterances, for two alphabet sizes",
    "assets/figures/ternary_steps.png": "GPU time of the Triton steps of the ternary matmul at the Llama weight "
                                        "shapes (steps 4 and 13 at 4096 x 14336 only), one row of activations, "
                                        "beside cuBLAS and GemLite",
    "assets/figures/ternary_steps_bitnet.png": "On the H200, one row of activations: the Triton steps' GPU time "
                                                "beside cuBLAS and GemLite at the BitNet shapes where GemLite passes "
                                                "our check",
    "assets/figures/ternary_speedup.png": "On the H200, one row of activations: each ternary kernel's speedup "
                                          "over cuBLAS in bf16 at each weight shape it times, beside GemLite's "
                                          "and torch._int_mm's",
    "assets/figures/ternary_bitnet.png": "On the H200, one row of activations: BitNet's own W2A8 kernel's time over "
                                         "step 23's at the ten shapes BitNet's kernel is built for",
    "assets/figures/multi_item_times.png": "Time per call of every multi-item attention approach, from a dense "
                                           "mask in SDPA to the batched kernel and FlashInfer, per prompt shape",
    "assets/figures/decode_breakdown_8b.png": "The 8B cost model: where each step of the decode loop spends its "
                                              "time per output token, the whole step at batch 1, then everything but "
                                              "the model body (LM head, mask, sampling, host) at batch 1 and 8",
    "assets/figures/speculate_speedup.png": "Per request, the speculative loop's speedup per output token over "
                                            "chapter 07's loop, against how many forwards it saves",
}


#: A line under a card's figure where the figure is not of the chapter's answer (every card's figure is now).
FIGURE_CAPTION: dict[str, str] = {}


#: What a card's reader should have read first (the landing page's reader's path, per chapter).
READ_AFTER = {
    "notebooks/01_fsm_compression.ipynb": "chapter 00",
    "notebooks/02_masked_lm_head.ipynb": "chapters 00 and 01; Triton's first two tutorials and its matrix "
                                         "multiplication tutorial",
    "notebooks/03_ngram_matching.ipynb": "chapter 02",
    "notebooks/04_ctc_loss.ipynb": "chapter 02",
    "notebooks/05_ternary_1_triton.ipynb": "chapter 02; Triton's matrix multiplication tutorial",
    "notebooks/05_ternary_2_cuda.ipynb": "part 1",
    "notebooks/06_multi_item_attention.ipynb": "chapter 02",
    "notebooks/07_constrained_decoding.ipynb": "chapters 01 and 02",
    "notebooks/08_speculation_under_a_grammar.ipynb": "chapters 03 and 07",
}


class PostsDirective(SphinxDirective):
    """The landing page's list of posts."""

    def run(self) -> list[nodes.Node]:
        posts = load_posts(Path(self.env.srcdir))
        self.env.note_dependency(str(Path(self.env.srcdir) / POSTS_FILE))
        from book.results import page_titles

        names = page_titles()  # the landing table's names, so a card and its row are named alike
        lines: list[str] = []
        for post in posts:
            doc = post["notebook"]
            # a post's tags go to the feed's categories, not onto its card: a list of keywords reads as noise there
            under = ([f"*{post['title']}*"] if post["title"] not in names.get(doc, "") else []) + (
                [f"Read after: {READ_AFTER[doc]}."] if doc in READ_AFTER else [])
            lines += [f"### [{names.get(doc, post['title'])}]({doc})", ""] + (["  \n".join(under), ""] if under else [])
            lines += [post["summary"].strip(), ""]
            if post.get("teaser") and (Path(self.env.srcdir) / post["teaser"]).is_file():
                alt = post.get("alt") or FIGURE_ALT.get(post["teaser"]) or f"The main figure of {post['title']}"
                lines += [f"[![{alt}](/{post['teaser']})]({doc})", ""]
                if post["teaser"] in FIGURE_CAPTION:
                    lines += [f"*{FIGURE_CAPTION[post['teaser']]}*", ""]
            lines += ["---", ""]
        container = nodes.container(classes=["studylog-posts"])
        self.state.nested_parse(StringList(lines, source="posts.yml"), self.content_offset, container)
        return [container]


#: Plain names for the series ids the benchmark files use, on the results page (the step number kept).
PLAIN_NAMES = {
    "MaskedHeadPlan (step 13: the whole step from the packed bitmask)": "the whole masked step from the packed bitmask (step 13)",
    "step12_dispatch": "the masked head's dispatching entry point, allowed ids given (step 12)",
    "n-gram matching, step12_skip_refused": "the GPU drafter (step 12)",
    "n-gram matching, ngram_match (step07)": "the GPU drafter's entry point (running step 7)",
    "n-gram matching, ngram_match (step12)": "the GPU drafter's entry point (running step 12)",
    "n-gram matching, ngram_match (step08)": "the GPU drafter's entry point (running step 8)",
    "n-gram matching, ngram_match (step06)": "the GPU drafter's entry point (running step 6)",
    "step14_warps_per_direction (CUDA C++)": "the fused CTC kernel (step 14, CUDA C++)",
    "step12_flush_to_zero (CUDA C++)": "the fused CTC kernel (step 12, CUDA C++)",
    "ctc_loss (step14, CUDA C++)": "the CTC entry point (running step 14, CUDA C++)",
    "step21_magic_reg (CUDA C++)": "the ternary kernel with TMA copies (step 21, CUDA C++)",
    "step14_workspace (Triton)": "the ternary kernel on tensor cores (step 14, Triton)",
    "step23_w2a8_fused (CUDA C++)": "the ternary kernel with int8 activations (step 23, CUDA C++)",
    "step25_x_tma (CUDA C++)": "the W2A8 kernel for several rows of x, one tile a warp (step 25, CUDA C++)",
    "step05_batched (Triton, tile skipping, one launch)": "the batched attention kernel (step 5, Triton, tile "
                                                          "skipping, one launch)",
    "step03_masked_head": "the loop with chapters 01 and 02 (step 3)",
    "step02_jump_forward": "the loop with chapter 01's jumps (step 2)",
    "automaton_mask": "step 2 with its allowed sets cached, a dense head (3a)",
    "step01_baseline": "the loop with a dense head and a mask (step 1)",
    "step03_forced_draft": "the loop with grammar-cut drafts (step 3)",
    "chapter 07's step 3 (ch7_step03)": "chapter 07's loop (its step 3), run on these requests, not on "
                                       "chapter 07's own",
    "chapter 7's step 3 (ch7_step03)": "chapter 07's loop (its step 3), run on these requests, not on "
                                      "chapter 07's own",
    "torch dense_mask": "torch: dense logits, then a mask",
    "step03_two_phase (our port of the pull request's first, two-phase kernel)": "our port of FastDeploy's first "
                                                                                 "GPU n-gram kernel, two-phase "
                                                                                 "(step 3)",
}

#: The clocks of the results page's tables, in words.
CLOCK_WORDS = {"gpu": "GPU time of the call replayed in a CUDA graph",
               "wall": "wall-clock time per output token, the whole step with its host work",
               "do_bench": "CUDA events around repeated calls (Triton's do_bench)"}


def folded_by_chapter(markdown: str) -> str:
    """The results page's tables for readers: each file-key caption (``**decode** — NVIDIA H200, 2026-11-25;
    clock: wall``) becomes the card, the date and the clock in words, and each chapter's tables fold under its
    number and title."""
    from book.scoreboard import ENTRIES

    titles = {e.bench: f"Chapter {e.number}: {e.title}" for e in ENTRIES if e.bench}
    caption = re.compile(r"^\*\*(\w+)\*\* — (.+), (\d{4}-\d{2}-\d{2}); clock: (.+)$")
    out: list[str] = []
    current = None
    for line in markdown.splitlines():
        m = caption.match(line)
        if m:
            chapter, gpu, date, clocks = m.groups()
            if chapter != current:
                if current is not None:
                    out += [":::", ""]
                out += [f":::{{dropdown}} {titles.get(chapter, chapter)}", ""]
                current = chapter
            when = _dt.date.fromisoformat(date)
            words = "; ".join(CLOCK_WORDS.get(c.strip(), c.strip()) for c in clocks.split(","))
            line = f"**{gpu}**, measured {when.day} {when:%B %Y}: {words}."
        out.append(line)
    if current is not None:
        out += ["", ":::"]
    return "\n".join(out)


def difference_cells(item: str) -> tuple[str, str, str, dict[str, str]] | None:
    """One "where the cards differ" line (``ours (step 21, CUDA C++) against rival (its setting) (case): 4.51× on the
    NVIDIA H100 80GB HBM3, 3.36× on the NVIDIA H200.``) as table cells: our step, the rival without its setting, the
    case, and each card's short name -> its ratio; None where the line does not read so."""
    from book.scoreboard import short_card

    head, sep, tail = item.rstrip(".").rpartition("): ")
    if not sep or " against " not in head:
        return None
    depth, i = 1, len(head)  # inside the case's parentheses, whose ")" the split took
    while i > 0 and depth:  # the case may hold parentheses of its own
        i -= 1
        depth += {")": 1, "(": -1}.get(head[i], 0)
    if depth:
        return None
    pair, case = head[:i].rstrip(), head[i + 1:]
    ours, _, rival = pair.partition(" against ")
    step = re.search(r"\((step \d+[^)]*)\)", ours)
    ratios = {}
    for part in tail.split(", "):
        ratio, _, card = part.partition(" on the ")
        if not card:
            return None
        ratios[short_card(card)] = ratio
    return (step.group(1) if step else ours), rival.split(" (")[0], case, ratios


def readable_headlines(markdown: str, end_to_end: dict[str, dict[str, Any]] | None = None) -> str:
    """The results page's table of every headline row, for readers: each row's first two cells named in plain words
    beside the series id (:data:`PLAIN_NAMES`), chapter 03's comparison with the CPU loop FastDeploy's kernel replaced (end
    to end; ``end_to_end`` maps a card's name to the scoreboard's row) added under that card's n-gram
    table, and each "where the cards differ" list folded into a collapsed block."""
    from html import escape

    out: list[str] = []
    lines = markdown.splitlines()
    i, section = 0, ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("**") and " — " in line:
            section = line
        if line.startswith("| ") and not line.startswith("| ours"):
            cells = line.split(" | ")
            for k in (0, 1):
                head = cells[k].lstrip("| ").strip()
                if head in PLAIN_NAMES:
                    cells[k] = ("| " if k == 0 else "") + PLAIN_NAMES[head]
            line = " | ".join(cells)
        out.append(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (end_to_end and section.startswith("**ngram**") and line.startswith("|") and not nxt.startswith("|")):
            card = section.split(" — ", 1)[1].split(",")[0]
            r = end_to_end.get(card)
            if r and r.get("ours_end_to_end_ms") and r.get("rival_ms"):
                out.append(_pair_line("the GPU drafter, end to end (the call, then a sync)",
                                      "the CPU loop it replaces, end to end", f"{r['shape']} (as deployed)",
                                      {"ms": r["ours_end_to_end_ms"], "spread_ms": r.get("ours_end_to_end_spread_ms")},
                                      {"ms": r["rival_ms"], "spread_ms": r.get("rival_spread_ms")}))
        if line.startswith("Where the cards differ"):
            items = []
            while i + 1 < len(lines) and (lines[i + 1].startswith("- ") or not lines[i + 1].strip()):
                i += 1
                if lines[i].startswith("- "):
                    items.append(lines[i][2:])
                elif items:
                    break
            names = re.compile("|".join(re.escape(k) for k in sorted(PLAIN_NAMES, key=len, reverse=True)))
            items = [names.sub(lambda m: PLAIN_NAMES[m.group(0)], t) for t in items]
            parsed = [difference_cells(t) for t in items]
            if all(parsed):  # one compact table: step, rival, case, then each card's ratio
                cards = list(dict.fromkeys(c for row in parsed for c in row[3]))
                head = "".join(f"<th>{escape(c)}</th>" for c in ("ours", "against", "case", *cards))
                body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row[:3])
                               + "".join(f"<td>{escape(row[3].get(c, '–'))}</td>" for c in cards) + "</tr>"
                               for row in parsed)
                listed = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            else:
                listed = "<ul>" + "".join(f"<li>{escape(t)}</li>" for t in items) + "</ul>"
            out[-1] = (f"<details><summary>{escape(line.rstrip(':'))} ({len(items)} rows)</summary>{listed}"
                       "</details>")
            out.append("")
        i += 1
    return "\n".join(out)


#: What the host column means on a decode loop's rows, said above each such table.
LOOP_HOST = ("host per call: here the host's own time per output token, the part of the step outside every timed "
             "GPU part")


#: Why a card's speedups in a folded table are marked, by the mark: the sentence said once above the table.
MARKS = {"not comparable": "not comparable with the other card: this run's head is not padded as real models ship "
                           "it, which slows the dense baseline",
         "L2-favoured": "L2-favoured: this run replayed one copy of the head, so the rows a call reads could stay in "
                        "L2 between calls (the other card's run rotates copies); its small allowed sets are not "
                        "comparable with the other card's"}


def compact_tables(markdown: str, not_comparable: dict[str, set[str]] | None = None,
                   l2_favoured: dict[str, set[str]] | None = None) -> str:
    """The folded tables for readers: the "ours" or "against" column moves into a line above each table of a chapter
    where it is the same on every row of every one of that chapter's tables (so a chapter's tables share one layout
    on every card), as does the tail the case cells of a table share (``…, batch 1, end to end per output token``);
    the speedups of a card whose run is not comparable with the other's (``not_comparable`` maps a chapter's
    dropdown title to its cards' full names) are marked in their cells."""
    marked = {mark: by_chapter or {} for mark, by_chapter in (("not comparable", not_comparable),
                                                             ("L2-favoured", l2_favoured))}
    lines, out, i = markdown.splitlines(), [], 0
    loop = False
    factor: dict[str, set[str]] = {}  # per chapter: the columns constant in every table of it
    chapter = ""
    for k, line in enumerate(lines):
        if line.startswith(":::{dropdown} "):
            chapter = line.split(" ", 1)[1]
        if line.startswith("| ours"):
            head, body, _ = read_table(lines, k)
            same = {name for j, name in enumerate(head) if name in ("ours", "against") and len(body) > 1
                    and len({c[j] for c in body}) == 1}
            factor[chapter] = factor.get(chapter, same) & same
    chapter = card = ""
    while i < len(lines):
        line = lines[i]
        if line.startswith(":::{dropdown} "):
            chapter = line.split(" ", 1)[1]
        m = re.match(r"^\*\*(.+?)\*\*, measured", line)
        if m:
            card = m.group(1)
            loop = CLOCK_WORDS["wall"] in line
        if not line.startswith("| ours"):
            out.append(line)
            i += 1
            continue
        head, body, i = read_table(lines, i)
        said = []
        if len(body) > 1 and "case" in head:  # the tail every case shares, said once
            k = head.index("case")
            parts = [c[k].split(", ") for c in body]
            n = 0
            while n < min(len(p) for p in parts) - 1 and len({tuple(p[-n - 1:]) for p in parts}) == 1:
                n += 1
            if n:
                said.append("every case: " + ", ".join(parts[0][-n:]))
                for c, p in zip(body, parts):
                    c[k] = ", ".join(p[:-n])
        keep = []
        for k, name in enumerate(head):
            if name in factor.get(chapter, set()):
                said.append(f"{name}: {body[0][k]}")
            else:
                keep.append(k)
        if loop and "host per call (µs)" in head and any(c[head.index("host per call (µs)")] != "–" for c in body):
            said.append(LOOP_HOST)
        for mark, by_chapter in marked.items():
            if card in by_chapter.get(chapter, set()) and "speedup" in head:
                k = head.index("speedup")
                for c in body:
                    c[k] += f" ({mark})"
                said.append(MARKS[mark])
        if said:
            out += ["; ".join(said)[0].upper() + "; ".join(said)[1:] + ".", ""]
        out.append("| " + " | ".join(head[k] for k in keep) + " |")
        out.append("|" + "---|" * len(keep))
        out += ["| " + " | ".join(c[k] for k in keep) + " |" for c in body]
    return "\n".join(out)


_TIME = re.compile(r"^([\d,.]+) \(([\d,.]+)–([\d,.]+)\)")


def _time_spread(cell: str) -> float | None:
    """The spread of a folded table's time cell (``median (fastest–slowest)``) as a share of its median."""
    from book.results import spread

    m = _TIME.match(cell.strip())
    if not m:
        return None
    median, lo, hi = (float(x.replace(",", "")) for x in m.groups())
    return spread(lo, median, hi)


def flag_rows(markdown: str) -> str:
    """Every row of the folded tables (:func:`book.plotting.headline_markdown`'s) flagged by the results page's one
    rule (:func:`book.results.caveat`): either side's spread more than 10% of its median. The plotting module's own
    flag (our spread only) gives way to it."""
    from book.results import caveat

    out = []
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| ours"):
            cells = line.split(" | ")
            if len(cells) >= 7:
                cells[3] = re.sub(r" \(spread \d+%\)", "", cells[3]) + caveat(_time_spread(cells[4]),
                                                                               _time_spread(cells[5]))
                line = " | ".join(cells)
        out.append(line)
    return "\n".join(out)


def _time_cell(row: dict[str, Any]) -> str:
    """A benchmark row's time as the folded tables write it: median (fastest–slowest), µs."""
    from book.common import us
    from book.scoreboard import spread

    lo, med, hi = spread(row)
    return f"{us(med)} ({us(lo)}–{us(hi)})"


def _pair_line(ours_label: str, rival_label: str, case: str, ours: dict[str, Any], rival: dict[str, Any]) -> str:
    """A folded table's row for two benchmark rows of one run: the ratio with the page's flag, both times with their
    spread, and our host time per call."""
    from book.common import us
    from book.results import caveat, spread as share
    from book.scoreboard import spread

    flag = caveat(share(*spread(ours)), share(*spread(rival)))
    return (f"| {ours_label} | {rival_label} | {case} | **{rival['ms'] / ours['ms']:.2f}×**{flag} | "
            f"{_time_cell(ours)} | {_time_cell(rival)} | {us(ours.get('host_ms'))} |")


#: The folded tables' label of chapter 05's step 12 at its default place to quantise x (the chapter times it).
W2A8_DEFAULT = "step23_w2a8_fused (CUDA C++)"


def headline_rival_rows(markdown: str) -> str:
    """The folded tables with the rows each headline stands on that the chapters' own tables leave out, computed from
    the same card's benchmark file: chapter 02's kernel alone against index_select at the headline's 1,000 allowed
    tokens; chapter 03's drafter against our corrected port of the pull request's revision (step 4); chapter 05's W2A8
    step against BitNet's own kernel at its shapes, in a table of its own under the card's; and chapter 05's step 12
    at the place to quantise x its chapter times (its default), not the fastest of its places."""
    from book.results import bitnet_rows
    from book.scoreboard import (MASKED_HEAD_CASE, NGRAM_CASE, bitnet_run, card_name, cards, load, one, rows,
                                 run_words)

    folders = {card_name(c): c for c in cards()}
    extra: dict[tuple[str, str], list[str]] = {}
    after: dict[tuple[str, str], list[str]] = {}
    for gpu, folder in folders.items():
        data = load(folder, "masked_lm_head")
        if data is not None:
            ours, rival = one(data, "step12", **MASKED_HEAD_CASE, layout="vd"), one(data, "index_select",
                                                                                  **MASKED_HEAD_CASE)
            if ours is not None and rival is not None:
                extra[("masked_lm_head", gpu)] = [_pair_line(
                    "the masked head's kernel alone, allowed ids given (step 12)",
                    "torch index_select of the allowed rows, then a matmul",
                    "batch 1, 1,000 of 128,256 tokens allowed, the kernel alone", ours, rival)]
        data = load(folder, "ngram")
        if data is not None:
            series = "ngram_match" if rows(data, "ngram_match") else "step12"
            ours, rival = one(data, series, **NGRAM_CASE), one(data, "step04", **NGRAM_CASE)
            if ours is not None and rival is not None and ours["clock"] == rival["clock"]:
                step = re.search(r"\d+", ours.get("step") or "")
                label = (f"the GPU drafter's entry point (running step {int(step.group(0))})" if step
                         else "the GPU drafter (step 12)")
                extra[("ngram", gpu)] = [_pair_line(
                    label, "our corrected port of FastDeploy's revised GPU n-gram kernel, made exact (step 4)",
                    "128 slots x 32768 tokens, budget 128", ours, rival)]
        found = bitnet_rows(folder)
        run = bitnet_run(Path(folder).name) if found else None
        if found and run is not None:
            after[("ternary", gpu)] = [
                "", f"Against BitNet's own W2A8 kernel (2-bit weights, 8-bit activations; x quantised to int8 before "
                    f"its call, inside ours), one row of x, at the {len(found)} shapes its kernel is built for, on the "
                    f"GPU clock. {run_words(run)}:", "",
                "| ours | against | case | speedup | ours (µs) | theirs (µs) | host per call (µs) |",
                "|---|---|---|---|---|---|---|"] + [_pair_line(ours_label, "BitNet's W2A8 kernel", case, ours, rival)
                                                    for ours_label, case, ours, rival in found]
    out, key, lines = [], ("", ""), markdown.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\*\*(\w+)\*\* — (.+?), \d{4}-", line)
        if m:
            key = (m.group(1), m.group(2))
        if key[0] == "ternary" and line.startswith("| step23_w2a8_fused, quantize="):  # the chapter's default place
            data = load(folders[key[1]], "ternary") if key[1] in folders else None
            cells = line.split(" | ")
            ours = one(data, "step23", shape="4096x14336", m=1) if data else None
            rival = one(data, "torch_int_mm", shape="4096x14336", m=1) if data else None
            if ours is not None and rival is not None and ours["clock"] == rival["clock"] == "gpu":
                line = _pair_line(W2A8_DEFAULT, cells[1], cells[2], ours, rival)
        out.append(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("| ") and not nxt.startswith("|"):  # the end of a card's table
            out += extra.pop(key, [])
            out += after.pop(key, [])
    return "\n".join(out)


def ctc_entry_rows(markdown: str) -> str:
    """Chapter 04's folded table of a card whose file times the steps directly (no row of the entry point): its rows
    rebuilt so that each case times the step the entry point picks there (:func:`book.results.ctc_cases`), as the
    headline table's range over the grid does: the smallest speedup over the batches of each alphabet, and the
    largest batch of the largest alphabet. A card whose file times the entry point keeps its rows."""
    from book.results import ctc_cases
    from book.scoreboard import card_name, cards, load, one
    from studylog.ctc import CHAPTER

    names = {s.series: s.name for s in CHAPTER.steps}
    folders = {card_name(c): c for c in cards()}
    out, lines, card = [], markdown.splitlines(), ""
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\*\*(\w+)\*\* — (.+?), \d{4}-", line)
        if m:
            card = m.group(2) if m.group(1) == "ctc" else ""
        cases = ctc_cases(folders[card]) if card in folders else []
        if not (card and line.startswith("| ") and not line.startswith("| ours") and cases
                and all(c["series"] != "ctc_loss" for c in cases)):
            out.append(line)
            i += 1
            continue
        rival_label = line.split(" | ")[1]
        while i < len(lines) and lines[i].startswith("| "):  # the file's rows, replaced below
            i += 1
        data = load(folders[card], "ctc")
        alphabets = sorted({c["ours"]["params"]["A"] for c in cases})
        picks = []
        for a in alphabets:
            grid = [c for c in cases if c["ours"]["params"]["A"] == a]
            batches = sorted(c["ours"]["params"]["N"] for c in grid)
            worst = min(grid, key=lambda c: c["ratio"])
            picks.append((worst, f" (smallest speedup over N = {batches[0]}..{batches[-1]})"))
            if a == alphabets[-1]:
                picks.append((max(grid, key=lambda c: c["ours"]["params"]["N"]), ""))
        for c, why in picks:
            p = c["ours"]["params"]
            rival = one(data, "torch-best", **p)
            case = f"T = {p['T']}, A = {p['A']}, N = {p['N']}{why}"
            out.append(_pair_line(f"{names.get(c['series'], c['series'])} (CUDA C++)", rival_label, case, c["ours"],
                                  rival))
    return "\n".join(out)


def grouped_rows(markdown: str, board: list[dict[str, Any]]) -> str:
    """Chapter 06's grouped-query headline (the scoreboard's row of the entry point on grouped heads) added to its
    card's folded table, which times 32 heads only: the page's headline for that card has a row to stand on."""
    from book.common import us
    from book.results import caveat, spread
    from book.scoreboard import MULTI_ITEM_GQA_CASE, card_name, cards, load, one

    folders = {card_name(c): c for c in cards()}
    grouped = {r["card"]: r for r in board if r["number"] == 6 and not r["lead"] and "missing" not in r
               and r.get("vs_rival") is not None}
    batch = {r["card"]: ", ".join(r["shape"].split(", ")[:2]) for r in board if r["number"] == 6 and r["lead"]}
    out, lines, card = [], markdown.splitlines(), ""
    for i, line in enumerate(lines):
        m = re.match(r"^\*\*multi_item\*\* — (.+?), \d{4}-", line)
        if m:
            card = m.group(1)
        elif line.startswith("**"):
            card = ""
        out.append(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        r = grouped.get(card)
        if r and line.startswith("| ") and not nxt.startswith("|"):
            shape = r["shape"].replace("the same batch", batch.get(card, "the same batch"))
            data = load(folders[card], "multi_item") if card in folders else None
            mine = one(data, "step06", **MULTI_ITEM_GQA_CASE) if data else None
            peer = one(data, "FlashInfer", **MULTI_ITEM_GQA_CASE) if data else None
            if mine is not None and peer is not None:  # both rows of the run, with their spreads and host time
                out.append(_pair_line(r["ours_long"], r["rival"], shape, mine, peer))
            else:
                ours = spread(r["fastest_ms"], r["median_ms"], r["slowest_ms"])
                out.append(f"| {r['ours']} | {r['rival']} | {shape} | **{r['vs_rival']:.2f}×**{caveat(ours)} | "
                           f"{us(r['median_ms'])} ({us(r['fastest_ms'])}–{us(r['slowest_ms'])}) | "
                           f"{us(r['rival_ms'])} | – |")
            card = ""
    return "\n".join(out)


def headlines_page_markdown() -> str:
    """The results page's folded tables, every chapter's (the page shows them through
    :func:`book.results.headline_tables_markdown`)."""
    from book.plotting import headline_markdown
    from book.scoreboard import scoreboard

    board = scoreboard()
    from book.ngram.lesson import entry_end_to_end
    from studylog.bench import gpu_slug

    # the row against the CPU loop, end to end, where the chapter has no run of its public call: on a card that
    # has one, the chapter and the results line quote that run, against its own CPU loop, and not this one
    ngram = {r["card"]: r for r in board if r["number"] == 3 and r.get("ours_end_to_end_ms")
             and "missing" not in r and entry_end_to_end(gpu_slug(r["card"])) is None}
    # chapter 07's runs whose head was not padded (the scoreboard's flag): their speedups are marked
    unpadded = {f"Chapter {r['number']}: {r['title']}": {r["card"]} for r in board if r.get("unpadded_head")}
    one_copy: dict[str, set[str]] = {}  # chapter 02's runs that replayed one copy of the head, where another rotated
    if any(r.get("one_copy") is False for r in board):
        for r in board:
            if r.get("one_copy"):
                one_copy.setdefault(f"Chapter {r['number']}: {r['title']}", set()).add(r["card"])
    text = grouped_rows(headline_rival_rows(ctc_entry_rows(flag_rows(headline_markdown()))), board)
    return compact_tables(folded_by_chapter(readable_headlines(text, ngram)), unpadded, one_copy)


#: Chapter 00's section on running the notebooks (docname, section id): each chapter's run note links to it.
HOW_TO_RUN = ("notebooks/00_how_to_read", "running-it-yourself")


def _add_open_locally_note(app, doctree) -> None:
    """A one-line note on running the chapter's notebook, at the end of the page: after the last section before
    "Further reading" (the reader meets the problem first). Chapter 00 has a section of its own on it, which the
    note links to."""
    docname = app.env.docname
    posts = {Path(p["notebook"]).with_suffix("").as_posix(): p for p in load_posts(Path(app.srcdir))}
    if docname not in posts or docname == HOW_TO_RUN[0]:
        return
    notebook = posts[docname]["notebook"]
    note = nodes.admonition(classes=["tip", "studylog-open-locally"])
    note += nodes.title(text="Run this chapter yourself")
    para = nodes.paragraph()
    para += nodes.Text("In a clone of the repository, ")
    para += nodes.literal(text="make lab")
    para += nodes.Text(" opens JupyterLab; open ")
    para += nodes.literal(text=notebook)
    para += nodes.Text(", which runs on a CPU or a GPU")
    if HOW_TO_RUN[0] in app.env.found_docs:
        para += nodes.Text(" (")
        para += nodes.reference("", "how to run the notebooks", internal=True,
                                refuri=app.builder.get_relative_uri(docname, HOW_TO_RUN[0]) + "#" + HOW_TO_RUN[1])
        para += nodes.Text(")")
    para += nodes.Text(".")
    note += para
    top = next(iter(doctree.findall(nodes.section)), None)
    if top is None:
        return
    parts = [s for s in top.children if isinstance(s, nodes.section)]
    titles = [s.next_node(nodes.title).astext().strip().lower() for s in parts]
    last = titles.index("further reading") - 1 if "further reading" in titles else len(parts) - 1
    (parts[last] if last >= 0 else top).append(note)


#: An exercise's check line for a function that is still the page's stub (``book.common.NOT_WRITTEN``).
UNWRITTEN_LINE = re.compile(r"^\S+: " + re.escape(NOT_WRITTEN) + r"\s*$")


def without_unwritten_checks(text: str) -> str:
    """A cell's printed text without the lines that say an exercise's function is not written yet."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not UNWRITTEN_LINE.match(line.rstrip("\n")))


def _drop_unwritten_checks(app, doctree) -> None:
    """The built page leaves out what an exercise's check prints for a function that is still the stub: in
    JupyterLab the line tells the reader to write it; on the site it would be plumbing under every exercise. A
    printed block that held only such lines goes, and so does a cell's output area left empty."""
    for block in list(doctree.findall(nodes.literal_block)):
        if "output" not in block["classes"] or NOT_WRITTEN not in block.astext():
            continue
        kept = without_unwritten_checks(block.astext())
        parent = block.parent
        if kept.strip():
            block.children = [nodes.Text(kept)]
            block.rawsource = kept
            continue
        parent.remove(block)
        if "cell_output" in parent.get("classes", []) and not parent.children:
            parent.parent.remove(parent)


def _page_context(app, pagename, templatename, context, doctree) -> None:
    # Jupyter Book 1 registers sphinx-thebe's inline configuration twice, which makes browsers throw
    # "Identifier 'THEBE_JS_URL' has already been declared" on every page: keep the first copy only.
    seen, scripts = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", str(script)) or "", repr(getattr(script, "attributes", {})))
        if key not in seen:
            seen.add(key)
            scripts.append(script)
    context["script_files"] = scripts
    depth = pagename.count("/")
    href = "../" * depth + FEED_FILE
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" type="application/atom+xml" title="{escape(app.config.html_title or "studylog")}" '
        f'href="{href}" />')


def _write_feed(app, exception) -> None:
    if exception is not None or app.builder.name != "html":
        return
    posts = sorted(load_posts(Path(app.srcdir)), key=lambda p: (p["date"], p["notebook"]), reverse=True)  # newest first
    base = (app.config.html_baseurl or "").rstrip("/")
    title = escape(app.config.html_title or "studylog")
    updated = max((p["date"] for p in posts), default="2026-01-01")
    entries = []
    for post in posts:
        link = f"{base}/{Path(post['notebook']).with_suffix('.html').as_posix()}" if base else \
            Path(post["notebook"]).with_suffix(".html").as_posix()
        entries.append(
            "  <entry>\n"
            f"    <title>{escape(post['title'])}</title>\n"
            f'    <link href="{escape(link)}" />\n'
            f"    <id>{escape(link)}</id>\n"
            f"    <updated>{post['date']}T00:00:00Z</updated>\n"
            f"    <summary>{escape(post['summary'].strip())}</summary>\n"
            + "".join(f'    <category term="{escape(t)}" />\n' for t in post["tags"])
            + "  </entry>\n"
        )
    feed = (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<feed xmlns="http://www.w3.org/2005/Atom">\n'
        f"  <title>{title}</title>\n"
        f'  <link href="{escape(base or "index.html")}" />\n'
        f"  <id>{escape(base or 'studylog')}</id>\n"
        f"  <updated>{updated}T00:00:00Z</updated>\n"
        "  <author><name>the studylog authors</name></author>\n"
        + "".join(entries)
        + "</feed>\n"
    )
    (Path(app.outdir) / FEED_FILE).write_text(feed)


def _favicon_at_site_root(app, exception) -> None:
    """Browsers ask for /favicon.ico on pages without an icon link, such as Jupyter Book's redirecting
    index.html; serve the site's icon there too, so that request is not a 404."""
    if exception is not None or app.builder.name != "html" or not app.config.html_favicon:
        return
    icon = Path(app.srcdir) / app.config.html_favicon
    if icon.is_file():
        shutil.copyfile(icon, Path(app.outdir) / "favicon.ico")


#: Every figure that the page shows smaller than it is gets a link to itself at full size (a zoom link), so
#: a wide figure stays readable: the site test checks that no shrunk figure lacks one.
ZOOM_SCRIPT = """
window.addEventListener("load", function () {
  document.querySelectorAll("main img").forEach(function (img) {
    if (img.closest("a") || img.naturalWidth <= img.clientWidth + 2) return;
    var link = document.createElement("a");
    link.href = img.currentSrc || img.src;
    link.target = "_blank";
    link.className = "studylog-zoom";
    link.title = "Open the figure at full size";
    img.parentNode.insertBefore(link, img);
    link.appendChild(img);
  });
});
"""


#: Tables of results are wider than the theme's text column: the column may use the width the window has (up
#: to 64em) and cells wrap, a size smaller, so the last columns stay on the page, not behind a scroll bar.
#: Printed output, source listings and code cells wrap their long lines instead of being cut at the column's edge
#: (!important: a listing's <pre> carries an inline white-space of its own), each line hanging under its own
#: indentation (``studylog.source``). A link set in code reads as code, not bold. Tables written as HTML (a fold's
#: table) get the same rules and padding as the theme's.
TABLE_STYLE = """
document.head.insertAdjacentHTML("beforeend",
  "<style>main table th, main table td { white-space: normal; overflow-wrap: break-word; }" +
  " main table { font-size: 0.85em; }" +
  " main .cell_output pre, main .cell_input pre, main div.highlight pre { white-space: pre-wrap !important;" +
  " overflow-wrap: anywhere; }" +
  " main .cell_output div[style*='white-space: pre'] { white-space: pre-wrap !important; }" +
  " main a > code.literal, main a > code.literal span { font-weight: inherit; }" +
  " main table:not([class]) th, main table:not([class]) td { padding: 0.2em 0.6em; border-bottom: 1px solid #d0d7de;" +
  " text-align: left; vertical-align: top; }" +
  " .bd-main .bd-content .bd-article-container { max-width: 64em; }</style>");
"""


def setup(app):
    app.add_js_file(None, body=ZOOM_SCRIPT)
    app.add_js_file(None, body=TABLE_STYLE)
    app.add_directive("studylog-posts", PostsDirective)
    app.connect("doctree-read", _add_open_locally_note)
    app.connect("doctree-read", _drop_unwritten_checks)
    app.connect("html-page-context", _page_context, priority=900)
    app.connect("build-finished", _write_feed)
    app.connect("build-finished", _favicon_at_site_root)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
