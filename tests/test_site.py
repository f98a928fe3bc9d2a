"""The built site, read as a reader would: headless Chromium opens the landing page, the results page and
every post, saves a screenshot of each, and fails on a blank page, a missing image, a broken internal link
or a JavaScript error.

Needs a built site (``make book``) and Chromium; ``make test`` builds the site and then runs this file.
Without Chromium the test is skipped, unless ``STUDYLOG_REQUIRE_BROWSER=1`` (as in CI) makes that a failure.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

pytest.importorskip("docutils", reason="the site test needs the book's packages (pip install -e .[book])")
from book.site import load_posts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("STUDYLOG_SITE", ROOT / "_build" / "html"))
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.site


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("STUDYLOG_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server():
    _require((SITE / "index.html").is_file(), f"no built site at {SITE}: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    _require(chromium is not None, "Chromium is not installed (Debian: apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def _pages() -> list[str]:
    posts = load_posts(ROOT)
    return ["index.html", "results.html", "scoreboard.html", "how_we_measure.html"] + [
        Path(p["notebook"]).with_suffix(".html").as_posix() for p in posts]


def _visit(browser, url: str, shot: Path) -> dict:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, failed = [], []
    origin = urlparse(url).netloc
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on("console", lambda msg: errors.append(f"console.error: {msg.text} ({msg.location.get('url') or 'no url'})")
            if msg.type == "error" else None)
    page.on("requestfailed", lambda req: failed.append(f"failed: {req.url}") if urlparse(req.url).netloc == origin else None)
    page.on("response", lambda res: failed.append(f"HTTP {res.status}: {res.url}") if res.status >= 400 else None)
    page.goto(url, wait_until="networkidle")
    # load lazy images: scroll through the page, then wait for the network to settle
    page.evaluate("""async () => { for (let y = 0; y < document.body.scrollHeight; y += 600) {
        window.scrollTo(0, y); await new Promise(r => setTimeout(r, 30)); } window.scrollTo(0, 0); }""")
    page.wait_for_load_state("networkidle")
    info = page.evaluate("""() => ({
        text: (document.querySelector('main') || document.body).innerText.trim(),
        h1: Array.from(document.querySelectorAll('main h1')).map(h => h.innerText),
        images: Array.from(document.images).map(i => ({src: i.currentSrc || i.src, alt: i.getAttribute('alt') || '',
            ok: i.complete && i.naturalWidth > 0,
            natural: i.naturalWidth, shown: i.clientWidth, linked: !!i.closest('a[href]'),
            inMain: !!i.closest('main')})),
        tables: document.querySelectorAll('main table').length,
        bold: Array.from(document.querySelectorAll('main strong, main b')).map(e => e.innerText.trim()),
        height: document.documentElement.scrollHeight,
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
        prose: Array.from(document.querySelectorAll('main p, main li, main td, main th'))
            .filter(e => !e.closest('pre, .highlight, .cell_input, .math, mjx-container, .MathJax'))
            .map(e => { const c = e.cloneNode(true);
                c.querySelectorAll('code, pre, .highlight, .math, mjx-container, .MathJax, script').forEach(n => n.remove());
                return {cell: e.tagName === 'TD' || e.tagName === 'TH', text: c.textContent}; }),
        listings: Array.from(document.querySelectorAll('main .studylog-code pre')).map(p => ({
            text: p.textContent, blocks: p.querySelectorAll(':scope > span').length})),
        final: location.href,
    })""")
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    return info | {"errors": errors, "failed": failed}


@pytest.fixture(scope="module")
def visits(server, browser):
    return {path: _visit(browser, server + path, SHOTS / (path.replace("/", "_").removesuffix(".html") + ".png"))
            for path in _pages()}


@pytest.mark.parametrize("path", _pages())
def test_page_renders_without_errors(visits, path):
    v = visits[path]
    assert not v["errors"], f"{path}: JavaScript errors: {v['errors']}"
    assert not v["failed"], f"{path}: failed requests: {v['failed']}"
    assert len(v["text"]) > 300, f"{path}: the page is (nearly) blank: {v['text'][:200]!r}"
    assert v["h1"], f"{path}: no title heading"
    broken = [i["src"] for i in v["images"] if not i["ok"]]
    assert not broken, f"{path}: images that did not load: {broken}"


#: A Markdown table that reached the page as text: a row of pipes and dashes (or of the dashes that smart
#: quotes make of them).
RAW_TABLE = re.compile(r"^\s*\|?\s*:?[-—–]{3,}:?\s*(\|\s*:?[-—–]{3,}:?\s*)+\|?\s*$", re.MULTILINE)
#: Link syntax that was not parsed: ``[text](http...)`` or ``<http...>`` left as text.
RAW_LINK = re.compile(r"\]\((https?://|\.{0,2}/)[^)]*\)|<https?://[^>]+>")


@pytest.mark.parametrize("path", _pages())
def test_tables_and_links_render(visits, path):
    """Tables a cell prints render as tables, not as walls of pipes; link syntax renders as links."""
    v = visits[path]
    raw = RAW_TABLE.findall(v["text"])
    assert not raw, f"{path}: a Markdown table shown as raw text ({len(raw)} separator rows)"
    links = RAW_LINK.findall(v["text"])
    assert not links, f"{path}: link syntax shown as text: {links[:3]}"


@pytest.mark.parametrize("path", _pages())
def test_figures_are_readable_at_page_width(visits, path):
    """A figure shown much smaller than it is must link to itself at full size (the book adds the link)."""
    v = visits[path]
    shrunk = [i["src"][-60:] for i in v["images"]
              if i["ok"] and i["inMain"] and i["natural"] > 1.05 * i["shown"] and not i["linked"]]
    assert not shrunk, f"{path}: figures shrunk to the page with no zoom link: {shrunk}"


def test_landing_page_lists_every_chapter_in_course_order(visits):
    v = visits["index.html"]
    posts = load_posts(ROOT)
    positions = [v["text"].find(p["title"]) for p in posts]
    assert all(pos >= 0 for pos in positions), "a post is missing from the landing page"
    assert positions == sorted(positions), "chapters are not listed in the course's order (00 -> 07)"
    teasers = [p for p in posts if p.get("teaser")]
    shown = [i for i in v["images"] if i["ok"]]
    assert len(shown) >= len(teasers), "a teaser figure is missing"
    from book.results import headlines

    for h in headlines():  # each chapter's card leads with its question, not a plot
        assert h["question"] in v["text"], f"the landing page does not ask chapter {h['number']}'s question"
    from book.results import page_titles

    names = page_titles()  # each card is named as the table names its row: the name is on the page twice
    assert all(v["text"].count(name) >= 2 for name in names.values()), names


def test_every_card_says_what_to_read_first_and_points_back():
    """Each chapter's card but chapter 00's names what to read first, and only pages that come before it."""
    from book.site import READ_AFTER

    posts = [p["notebook"] for p in load_posts(ROOT)]
    assert set(READ_AFTER) == set(posts[1:])
    for notebook, before in READ_AFTER.items():
        number = int(Path(notebook).stem[:2])
        earlier = [int(n) for n in re.findall(r"\b(\d\d)\b", before)]
        assert all(n < number for n in earlier) and (earlier or before == "part 1"), (notebook, before)


@pytest.mark.parametrize("path", [p for p in _pages() if p.startswith("notebooks/")])
def test_post_pages_show_figures_and_how_to_run_them(visits, path):
    v = visits[path]
    assert [i for i in v["images"] if i["ok"]], f"{path}: no figure on the page"
    assert "make lab" in v["text"], f"{path}: no note on opening the notebook in JupyterLab"


@pytest.mark.parametrize("path", [p for p in _pages() if p.startswith("notebooks/")])
def test_how_to_run_note_comes_after_the_lesson(path):
    """The reader meets the problem first: a chapter's note on running its notebook sits at the end of the page,
    before "Further reading", and links to chapter 00's section on running the notebooks (which chapter 00 holds
    instead of a note)."""
    from book.site import HOW_TO_RUN

    _require((SITE / path).is_file(), f"no built page {path} at {SITE}: run `make book` first")
    html = (SITE / path).read_text()
    article = html[html.index("<main"):]
    sections = [m.start() for m in re.finditer(r"<section id=", article)]
    if path == HOW_TO_RUN[0] + ".html":
        assert "studylog-open-locally" not in article and f'id="{HOW_TO_RUN[1]}"' in article
        return
    assert article.count("studylog-open-locally") == 1, f"{path}: no note on running the notebook, or two"
    note = article.index("studylog-open-locally")
    assert note > sections[-2], f"{path}: the note on running the notebook comes before the lesson's end"
    further = article.find('<section id="further-reading"')
    assert further < 0 or note < further, f"{path}: the note on running the notebook comes after Further reading"
    assert f'{Path(HOW_TO_RUN[0]).name}.html#{HOW_TO_RUN[1]}"' in article[note:note + 2000], \
        f"{path}: the note does not link to chapter 00's section on running the notebooks"


def test_unwritten_exercise_lines_are_left_out_of_the_site_pattern():
    """What a check prints for a function still the page's stub is the line the site leaves out; a check's other
    lines stay."""
    import contextlib
    import io

    from book.common import guarded
    from book.site import without_unwritten_checks

    def check_thing(fn):
        fn()

    def stub():
        raise NotImplementedError

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        guarded(check_thing)(stub)
    printed = out.getvalue()
    assert "not written yet" in printed  # JupyterLab shows it
    assert without_unwritten_checks(printed) == ""
    assert without_unwritten_checks("a line\n" + printed + "another\n") == "a line\nanother\n"
    assert without_unwritten_checks("the output tokens not written yet are copied\n") == \
        "the output tokens not written yet are copied\n"


@pytest.mark.parametrize("path", _pages())
def test_no_page_shows_an_unwritten_exercise(visits, path):
    """An exercise's check run on the stub prints that the function is not written yet: JupyterLab shows it, the
    site does not (``book.site``)."""
    text = visits[path]["text"]
    assert "not written yet" not in text, f"{path}: an exercise's 'not written yet' line reaches the page"


def test_internal_links_resolve(visits, server, browser):
    """Every same-site link of every visited page points to an existing page, and its #anchor exists."""
    page = browser.new_page()
    checked: dict[str, str] = {}
    broken = []
    for path, v in visits.items():
        for href in v["links"]:
            if not href.startswith(server):
                continue
            target, fragment = urldefrag(href)
            if target not in checked:
                res = page.request.get(target)
                checked[target] = res.text() if res.ok else ""
                if not res.ok:
                    broken.append(f"{path} -> {href} (HTTP {res.status})")
                    continue
            html = checked[target]
            if fragment and html and not re.search(r'id="' + re.escape(fragment) + '"', html):
                broken.append(f"{path} -> {href} (no #{fragment} on the page)")
    page.close()
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_feed_lists_every_post(server, browser):
    page = browser.new_page()
    res = page.request.get(urljoin(server, "feed.xml"))
    ok, body = res.ok, res.text() if res.ok else ""
    page.close()
    assert ok, "feed.xml is missing"
    assert body.startswith("<?xml") and "<feed" in body
    for post in load_posts(ROOT):
        assert f"<title>{post['title']}</title>" in body.replace("&amp;", "&")


def test_favicon_served_at_site_root(server, browser):
    """Pages without an icon link (the redirecting index.html) make Chromium ask for /favicon.ico; a 404
    there is a console error on the landing page."""
    page = browser.new_page()
    res = page.request.get(urljoin(server, "favicon.ico"))
    ok, body = res.ok, res.body() if res.ok else b""
    page.close()
    assert ok, "favicon.ico is missing at the site root"
    assert body.startswith(b"\x89PNG"), "favicon.ico is not the site's PNG icon"


#: Words that CUDA writes between double underscores: Markdown turns ``__restrict__`` outside backticks into a
#: bold "restrict".
CUDA_DUNDER = {"restrict", "ldg", "global", "device", "shared", "host", "syncthreads", "threadfence",
               "launch_bounds", "forceinline", "shfl_up_sync", "shfl_down_sync", "shfl_sync", "constant"}
#: The tallest a page may be at 1280 px wide: a lesson a reader finishes, not a listing to scroll through.
HEIGHT_BUDGET_PX = 36_000


@pytest.mark.parametrize("path", [p for p in _pages() if p.startswith("notebooks/")])
def test_every_figure_says_what_it_shows(visits, path):
    """A figure's alt text describes it: not empty, not the image's file name (what the page gets when the alt text
    sits on another cell than the one that draws the figure)."""
    bad = [i["src"][-40:] for i in visits[path]["images"] if i["inMain"] and i["ok"]
           and (not i["alt"].strip() or i["alt"].endswith((".png", ".svg", ".jpg")) or "_images/" in i["alt"])]
    assert not bad, f"{path}: figures without an alt text of their own: {bad}"


@pytest.mark.parametrize("path", _pages())
def test_no_markup_reaches_the_reader_raw(visits, path):
    """No myst-nb glue role left as text, and no CUDA keyword turned bold by Markdown."""
    v = visits[path]
    assert "{glue" not in v["text"], f"{path}: a glue role shown as text"
    bold = [b for b in v["bold"] if b in CUDA_DUNDER]
    assert not bold, f"{path}: CUDA keywords rendered bold (write them in backticks): {bold}"


@pytest.mark.parametrize("path", _pages())
def test_prose_a_page_shows_fits_the_budget(path):
    """At most about 2,500 words of prose as the page shows it: Markdown cells and every paragraph a cell prints,
    without code, diffs, tables and folded blocks (the notebook-side count, ``prose_words``, sees only the first)."""
    from book.common import PROSE_BUDGET, rendered_words

    _require((SITE / path).is_file(), f"no built page {path} at {SITE}: run `make book` first")
    words = rendered_words((SITE / path).read_text())
    assert words <= PROSE_BUDGET, f"{path}: {words:,} words of prose shown, over the budget of {PROSE_BUDGET:,}"


@pytest.mark.parametrize("path", [p for p in _pages() if p.startswith("notebooks/")])
def test_pages_fit_a_height_budget(visits, path):
    assert visits[path]["height"] <= HEIGHT_BUDGET_PX, \
        f"{path}: {visits[path]['height']:,} px tall at 1280 px wide, over the budget of {HEIGHT_BUDGET_PX:,}"


#: A format field that reached the page because its string was not an f-string (or ``.format`` was not called):
#: ``{name}``, ``{name[4]}``, ``{name:.1f}``. Looked for in prose and table cells, with code and math taken out.
RAW_FIELD = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?(:[^}]*)?\}")
#: Words a table cell shows where a number or an entry is missing: a table on the site is finished or says why not.
UNFINISHED = re.compile(r"\b(pending|TODO)\b", re.IGNORECASE)


def test_no_raw_format_field_or_unfinished_cell_reaches_the_reader_pattern():
    assert [m.group(0) for m in RAW_FIELD.finditer("a ({tried[4]}) b {n:.1f} c {x} d {-1, 0, +1} e {{")] == \
        ["{tried[4]}", "{n:.1f}", "{x}"]
    assert UNFINISHED.search("13.8 (0.84×) | pending") and not UNFINISHED.search("spending")


@pytest.mark.parametrize("path", _pages())
def test_no_raw_format_field_or_unfinished_cell_reaches_the_reader(visits, path):
    """Prose and table cells show no ``{name[i]}`` left by a string that missed its ``f``, and no table cell reads
    "pending" or "TODO"."""
    prose = visits[path]["prose"]
    fields = sorted({m.group(0) for p in prose for m in RAW_FIELD.finditer(p["text"])})
    assert not fields, f"{path}: format fields shown as text: {fields[:5]}"
    unfinished = [p["text"].strip()[:60] for p in prose if p["cell"] and UNFINISHED.search(p["text"])]
    assert not unfinished, f"{path}: table cells that read pending or TODO: {unfinished[:5]}"


def test_listing_html_keeps_its_lines_and_shows_docstring_markup_as_code():
    """A listing's <pre> holds one block per line, each ending with its newline, so the listing's text (copied,
    indexed, read by a reader mode) keeps its lines; reST roles and double back-ticks in a docstring read as code."""
    import html as html_module

    from studylog.source import Code, Diff

    text = ('def f(x):\n    """:func:`step12_dispatch` takes ``"few_ids"``; :data:`~mod.GROUP_KV_BYTES`."""\n\n'
            "    return x\n")
    page = Code(text, "python")._repr_html_()
    pre = page[page.index("<pre"):page.index("</pre>")]
    shown = html_module.unescape(re.sub("<[^>]*>", "", pre.partition(">")[2]))
    assert "\u200b" not in shown and "\xa0" not in shown  # copied into an editor, code must stay code
    assert shown.splitlines() == ['def f(x):', '    """`step12_dispatch` takes `"few_ids"`; `GROUP_KV_BYTES`."""', "",
                                  "    return x"]
    assert pre.count('<span style="display: block;') == 4
    diff = Diff(text, text.replace("return x", "return -x"), "a", "b", 3)._repr_html_()
    assert ":func:" not in diff and "``" not in diff and diff.count("\n</span>") >= 4 and diff.count("<pre") == 1
    assert "&nbsp;<" not in diff.replace("&nbsp;<span", "") and "&#8203;" not in page


@pytest.mark.parametrize("path", [p for p in _pages() if p.startswith("notebooks/")])
def test_listings_keep_their_lines_and_no_docstring_markup(visits, path):
    """Every source listing's text has a line per block (not one run-on line), and no reST role or double
    back-tick of a docstring reaches the reader."""
    listings = visits[path]["listings"]
    joined = [l["text"][:60] for l in listings if l["blocks"] > 1 and l["text"].count("\n") < l["blocks"]]
    assert not joined, f"{path}: listings whose text lost its line breaks: {joined[:3]}"
    raw = [m.group(0) for l in listings for m in re.finditer(r":[a-z]+:`[^`]+`|``[^`\n]+``", l["text"])]
    assert not raw, f"{path}: docstring markup shown raw in listings: {raw[:5]}"
