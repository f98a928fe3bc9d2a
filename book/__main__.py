"""The book's command line.

  python -m book plot CHAPTER... | all    redraw the chapters' figures (assets/figures) and the README's results
  python -m book words PAGE...            words of prose each page shows a reader (a notebook is built alone)

Figures are drawn from the committed benchmark results (chapter 1's from its suite, run on the CPU); the command
needs a repository checkout. Errors print one line, "error: ...", and exit with status 2 for a bad command line,
1 for a failure.
"""

from __future__ import annotations

import argparse
import sys


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``error: ...``, with exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _parser() -> _Parser:
    from book.plotting import FIGURE_CHAPTERS

    parser = _Parser(prog="python -m book", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{plot,words}")
    plot = sub.add_parser("plot", help="redraw chapters' figures and the README's results into the checkout",
                          description="Redraw chapters' figures (assets/figures/<chapter>_<name>.png) and the "
                                      "README's results block from the committed benchmark results (chapter 1's "
                                      "figure from its suite, run on the CPU); needs a repository checkout.")
    plot.add_argument("chapters", nargs="+", metavar="CHAPTER",
                      help=f"chapter names ({', '.join(FIGURE_CHAPTERS)}) or 'all'")
    words = sub.add_parser("words", help="words of prose each page shows, against the budget",
                           description="Words of prose each page shows a reader, outside code, tables and folded "
                                       "blocks (book.common.rendered_words), against the budget: a built .html "
                                       "as it is, a notebook or Markdown page built alone first.")
    words.add_argument("pages", nargs="+", metavar="PAGE", help=".ipynb, .md or built .html files")
    return parser


def _words(pages: list[str]) -> int:
    from book.common import PROSE_BUDGET, page_words

    over = 0
    for page in pages:
        try:
            n = page_words(page)
        except (OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        over += n > PROSE_BUDGET
        print(f"{n:6,d}  {'over' if n > PROSE_BUDGET else 'fits'} {PROSE_BUDGET:,}  {page}")
    return 1 if over else 0


def _check_chapters(names: list[str]) -> str | None:
    """What is wrong with the chapter names of a command line (None when nothing is): each a chapter that draws
    figures, or 'all' alone."""
    from book.plotting import FIGURE_CHAPTERS

    if "all" in names:
        return "'all' takes no other chapter names" if len(names) > 1 else None
    for name in names:
        if name not in FIGURE_CHAPTERS:
            return f"unknown chapter {name!r}; choose from {', '.join(FIGURE_CHAPTERS)} or 'all'"
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "words":
        return _words(args.pages)
    wrong = _check_chapters(args.chapters)
    if wrong is not None:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    from book.plotting import require_checkout, save_chapter_figures

    try:
        require_checkout("python -m book plot")
        for path in save_chapter_figures(args.chapters):
            print(path)
    except BrokenPipeError:  # the reader left (`... | head`): stop quietly, as other tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
