"""Chapter 1's page: the drawing names its states as the state table does, and the table of steps reads the
suite's pass counts."""

import re

import pytest

for _name in ("outlines_core", "outlines", "bpe_openai"):
    pytest.importorskip(_name)

from book.fsm import drawing, events, lesson  # noqa: E402
from studylog import fsm  # noqa: E402


@pytest.fixture(scope="module")
def classifier():
    vocab = fsm.load_vocabulary("cl100k_base")
    schema = {"type": "string", "enum": ["true", "false", "NA"]}
    return fsm.compile_fsm(fsm.regex_from_schema(schema), vocab, name="classifier")


def test_drawing_and_table_name_the_states_alike(classifier):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = drawing.state_table(classifier)
    rows = re.findall(r"^\| (q\d+) \|", table, flags=re.MULTILINE)
    assert rows == [f"q{i}" for i in range(len(rows))], "the table lists its states in the order of their names"
    names = drawing.state_names(classifier)
    assert names[classifier.initial] == "q0"
    for level in ("token", "char"):
        fig, ax = plt.subplots()
        drawing.draw_automaton(classifier, level, ax=ax)
        shown = {t.get_text() for t in ax.texts if re.fullmatch(r"q\d+", t.get_text())}
        plt.close(fig)
        graph = drawing.automaton_graph(classifier, level)
        assert shown == {names[n] for n in graph.nodes}
    # a jump's end in the table is the drawing's name of that state
    for state, jump in classifier.token_jumps.items():
        assert f"→ {names[jump.end]} |" in table


@pytest.mark.parametrize("level,compressed", [("token", False), ("token", True), ("char", True)])
def test_no_two_labels_of_a_drawing_overlap(classifier, level, compressed):
    """At the size the page draws it, no edge label's box overlaps another's or a state's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = drawing.draw_automaton(classifier, level, compressed=compressed)
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    boxes = []
    for t in ax.texts:
        patch = t.get_bbox_patch()
        boxes.append((t.get_text(), (patch or t).get_window_extent(renderer)))
    plt.close(fig)
    labels = [(s, b) for s, b in boxes if not re.fullmatch(r"q\d+", s)]
    states = [(s, b) for s, b in boxes if re.fullmatch(r"q\d+", s)]
    for i, (a, box_a) in enumerate(labels):
        for b, box_b in labels[i + 1:] + states:
            assert not box_a.overlaps(box_b), f"label {a!r} overlaps {b!r}"


def test_steps_table_reads_the_pass_counts():
    class Row:
        def __init__(self, name, ws, none, token, char):
            self.name, self.whitespace, self.passes = name, ws, {"none": none, "token": token, "char": char}

    rows = [Row("a", "default", 60, 50, 30), Row("b", "default", 40, 30, 20), Row("b", "compact", 10, 10, 1)]
    table = lesson.steps_table(rows)
    # two suites, each column headed by the one it covers (the compact one holds only the JSON schemas); a cell is the
    # passes and, in parentheses, the share of step 1's saved
    head = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    assert head == ["step", "the one change", "suite: all 2 entries", "suite: 1 JSON schemas, compact"]
    lines = table.splitlines()[2:]
    assert len(lines) == len(fsm.CHAPTER.steps)
    assert lines[0].endswith("| 100 (0.0%) | 10 (0.0%) |")
    assert lines[1].endswith("| 80 (20.0%) | 10 (0.0%) |")
    assert lines[2].endswith("| 50 (50.0%) | 1 (90.0%) |")
    # llguidance's policy: a row after the steps, labelled a peer, counted on the first suite only
    peer = {"none": 100, "policies": {"llguidance/tokens": {"passes": 60, "noncanonical": 0}}}
    last = lesson.steps_table(rows, peer).splitlines()[-1]
    assert last.startswith("| *peer, not a step* |") and last.endswith("| 60 (40.0%) | – |")
    # with the comparison on the compact suite, its cell is filled too
    compact = {"none": 10, "policies": {"llguidance/tokens": {"passes": 4, "noncanonical": 0}}}
    assert lesson.steps_table(rows, peer, compact).splitlines()[-1].endswith("| 60 (40.0%) | 4 (60.0%) |")
    # every row counts passes: the peer's row is the last, and no share of forced tokens joins them
    table = lesson.steps_table(rows, peer, compact).splitlines()
    assert len(table) == 2 + len(fsm.CHAPTER.steps) + 1 and table[-1].startswith("| *peer, not a step* |")
    assert "% forced" not in "\n".join(table) and "SchemaStore" not in "\n".join(table)
    # the comparison on real schemas is a third column by the same measure: step 1 is its passes without jumps,
    # step 2 our token jumps, step 3 our character jumps, the peer llguidance's; a schema without documents not counted
    real = {"totals": {"none": 200, "policies": {"ours/tokens": {"passes": 190}, "ours/bytes": {"passes": 150},
                                                  "xgrammar/bytes": {"passes": 150}, "llguidance/tokens": {"passes": 170}}},
            "schemas": [{"schema": "a", "documents": 3}, {"schema": "b", "documents": 0}]}
    table = lesson.steps_table(rows, peer, compact, real).splitlines()
    assert table[0].endswith("| suite: 1 JSON schemas, compact | 1 real schemas (SchemaStore), compact |")
    assert [ln.rsplit("|", 2)[1].strip() for ln in table[2:]] == ["200 (0.0%)", "190 (5.0%)", "150 (25.0%)",
                                                                 "170 (15.0%)"]
    assert len(table) == 2 + len(fsm.CHAPTER.steps) + 1 and "% forced" not in "\n".join(table)
    with pytest.raises(ValueError):  # a count over other documents is refused
        lesson.steps_table(rows, {**peer, "none": 99})
    with pytest.raises(ValueError):
        lesson.steps_table(rows, peer, {**compact, "none": 11})


def test_the_peers_policy_has_its_place_beside_the_steps():
    """llguidance's fast-forward tokens are told after step 3, before the steps table, from the committed comparison
    (what they are, why they win, their count); the steps table carries them as a labelled row."""
    import json
    from pathlib import Path

    from book.results import fsm_peers

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    sources = ["".join(c["source"]) for c in cells["cells"]]
    place = next(i for i, s in enumerate(sources) if s.startswith("## Beside the steps: llguidance holds back"))
    step3 = next(i for i, s in enumerate(sources) if s.startswith("## Step 3"))
    table = next(i for i, s in enumerate(sources)
                 if "lesson.steps_table(results, committed_peers, committed_compact, real_record)" in s)
    assert step3 < place < table
    assert "committed_peers = fsm_peers()" in sources[place + 1] and "held['passes']" in sources[place + 1]
    assert 'committed_compact = fsm_peers(whitespace="compact")' in sources[place + 1]
    assert fsm_peers() is not None and "llguidance/tokens" in fsm_peers()["policies"]
    assert fsm_peers(whitespace="compact") is not None and "llguidance/tokens" in fsm_peers(whitespace="compact")["policies"]


def test_the_compact_comparison_is_recorded_and_the_page_qualifies_its_claims():
    """The committed comparison holds the compact suite (the JSON schemas) as the same call gives it now, over step 1's
    passes on that suite; the page says that holding back costs nothing with default whitespace only, and gives
    the compact numbers from the file."""
    import json
    from pathlib import Path

    from book.fsm import matchers
    from book.results import fsm_peer_totals, fsm_peers, fsm_suite

    compact = fsm_peers(whitespace="compact")
    assert compact["none"] == fsm_suite()["compact"]["passes"]["none"]  # the same documents as the suite's
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    (bullets,) = ["".join(c["source"]) for c in cells["cells"] if c.get("id") == "cell-30"]
    assert "With default whitespace\n  that costs nothing on the JSON schemas" in bullets
    assert "committed_compact[\"policies\"]" in bullets and "With compact JSON it costs" in bullets
    if any(v is None for v in matchers.peer_versions().values()):
        pytest.skip("xgrammar or llguidance is not installed")
    from book.fsm import peers
    from studylog.fsm import schemas

    with_versions = json.loads((Path(__file__).resolve().parent.parent / "assets" / "data" / "fsm_peers.json").read_text())
    if with_versions["versions"] != peers.peer_versions():
        pytest.skip("the recorded comparison ran with other peer versions")
    json_entries = [e for e in schemas.suite() if e.kind == "json"]
    assert compact == fsm_peer_totals(peers.compare_peers(json_entries, whitespace="compact", n_samples=8, seed=0))


def test_exercise_4_accepts_the_answer_and_rejects_wrong_loops(capsys):
    """The held-back loop's check passes the chapter's answer and refuses step 3 (retokenizes), step 2 (token
    jumps only) and a loop that appends the forced string's whole split (nothing held back)."""
    from book.fsm import exercises, solutions

    assert exercises.check_ff_decode(solutions.reference_ff_decode, seeds=4)

    def step3(model, f, ff, max_tokens=256):
        return fsm.step03_char_jumps(model, f, max_tokens=max_tokens)

    def step2(model, f, ff, max_tokens=256):
        return fsm.step02_token_jumps(model, f, max_tokens=max_tokens)

    def nothing_held_back(model, f, ff, max_tokens=256):
        return solutions.reference_ff_decode(model, f, f.vocab.encode, max_tokens=max_tokens)

    for wrong in (step3, step2, nothing_held_back):
        assert not exercises.check_ff_decode(wrong, seeds=4, verbose=False), wrong.__name__
    capsys.readouterr()


def test_step_3s_core_diff_is_the_loops_own_code():
    """The page shows step 3's core as a diff, open, read from the library (the whole diff is not on the page): every
    line of it is a line of ``step02_token_jumps`` or ``step03_char_jumps`` (comments aside), so it cannot drift from
    the loop; it keeps the retokenization and drops the bookkeeping, in at most 40 changed lines."""
    import inspect
    import json
    from pathlib import Path

    from book.fsm import lesson

    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "01_fsm_compression.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "lesson.step3_core()" in code and "step_diff(fsm.CHAPTER, 2, 3)" not in code
    core = lesson.step3_core()
    assert len(core.added) + len(core.removed) <= 40
    # the label gives how many of the whole change's lines it leaves out, the whole within ~40 changed lines
    rest = lesson.step3_changed_lines() - len(core.added) - len(core.removed)
    assert rest > 0 and f"its core; {rest} more changed lines not shown" in core.new_name
    assert len(core.added) + len(core.removed) < lesson.step3_changed_lines() <= 40
    sources = {s: {line.split("  #", 1)[0].strip() for line in inspect.getsource(f).splitlines()}
               for s, f in (("old", fsm.step02_token_jumps), ("new", fsm.step03_char_jumps))}
    assert not [ln for ln in core.added if ln.strip() not in sources["new"]]
    assert not [ln for ln in core.removed if ln.strip() not in sources["old"]]
    added = "\n".join(core.added)
    assert "vocab.encode(" in added and "res.retokenized" in added and "res.events" not in added


def test_the_folded_events_table_continues_the_first(classifier):
    """The first rows and the folded rest are together the whole table, the passes counted from the start."""
    result = events.record(fsm.writer_model(classifier.vocab, '"false"'), classifier, "char")
    whole = drawing.events_table(result, classifier.vocab).splitlines()
    for cut in range(len(result.events) + 1):
        first = drawing.events_table(result, classifier.vocab, stop=cut).splitlines()
        rest = drawing.events_table(result, classifier.vocab, start=cut).splitlines()
        assert first[:2] == rest[:2] == whole[:2]
        assert first[2:] + rest[2:] == whole[2:]
    passes = [int(row.rsplit("|", 2)[1]) for row in whole[2:]]
    assert passes[-1] == result.forward_passes


def test_no_label_of_a_drawing_covers_another_edge(classifier):
    """At the size the page draws it, no edge label's box covers a point of another edge's curve (the classifier's
    drawings have room for every label beside its own edge)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    for level, compressed in (("token", False), ("token", True), ("char", True)):
        ax = drawing.draw_automaton(classifier, level, compressed=compressed)
        fig = ax.figure
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
        labels = [t for t in ax.texts if t.get_bbox_patch() is not None and not re.fullmatch(r"q\d+", t.get_text())]
        assert len(arrows) == len(labels)  # one label per edge, drawn in the edges' order
        for k, label in enumerate(labels):
            box = label.get_bbox_patch().get_window_extent(renderer)
            for j, arrow in enumerate(arrows):
                if j == k:
                    continue
                path = arrow.get_transform().transform_path(arrow.get_path())
                points = [p for poly in path.to_polygons(closed_only=False) for p in poly]
                assert not any(box.contains(x, y) for x, y in points), (level, compressed, label.get_text(), j)
        plt.close(fig)


def test_step_1s_calls_are_one_sentence_not_a_fold_of_glue_code():
    """Step 1's listing is followed by one sentence naming the two calls that matter (the pass and the masked argmax),
    the rest called bookkeeping; no fold of the module's helpers sits under it."""
    import json
    from pathlib import Path

    from studylog.fsm import decoding

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    source = {c.get("id"): "".join(c["source"]) for c in cells["cells"]}
    text = "\n".join(source.values())
    assert "step_helpers" not in text and "Show what step 1 calls" not in text
    said = " ".join(source["cell-10"].split())
    assert "Its `forward_pass` calls the model once and appends `greedy`'s pick" in said and "bookkeeping" in said
    for name in ("forward_pass", "greedy"):  # the names the sentence uses are the loop's own
        assert callable(getattr(decoding, name))


def test_the_real_schemas_paragraph_says_why_llguidance_compiles_few():
    """llguidance compiles few of the real schemas because it refuses keywords it does not implement: most of its
    refusals in the committed file say so, and the page counts them from that file; the sentence on chapter 07's
    per-token count is in plain words; the prose stays within the book's length."""
    import json
    from pathlib import Path

    from book.common import prose_words
    from studylog import paths

    doc = json.loads((paths.DATA / "realworld_cl100k_base.json").read_text())
    refused = [s for s in doc["schemas"] if s["engines"]["llguidance"]["outcome"] == "refused"]
    assert len(refused) == doc["summary"]["llguidance"]["refused"]
    unimplemented = [s for s in refused if "Unimplemented keys" in s["engines"]["llguidance"]["error"]]
    assert len(unimplemented) > len(refused) / 2  # the page's reason covers most refusals, not a few
    page = Path(__file__).parents[1] / "notebooks" / "01_fsm_compression.ipynb"
    text = " ".join("".join(c["source"]) for c in json.loads(page.read_text())["cells"])
    assert "keyword it does not implement" in text and '"Unimplemented keys"' in text
    assert "forced end of sequence" not in text  # the pass on EOS in plain words: chapter 07's table names it
    assert prose_words(page) <= 2500


def test_the_retokenization_counts_compare_like_with_like_and_the_page_says_where_its_numbers_come_from():
    """Compact JSON covers the JSON schemas only, so the retokenization sentence counts both whitespaces over those
    (tokens written, not passes); the page says in words where its numbers come from, with no repository paths
    shown, while its cells read the committed files themselves."""
    import json
    from pathlib import Path

    page = Path(__file__).parents[1] / "notebooks" / "01_fsm_compression.ipynb"
    text = "".join("".join(c["source"]) for c in json.loads(page.read_text())["cells"])
    sentence = text[text.index("**Step 3, the largest saving, rewrites what it has written.**"):
                    text.index("Each replacement is prefill")]
    assert "json_tokens['default']" in sentence and "json_tokens['compact']" in sentence
    assert 'if r.kind == "json"' in text and "written['compact']" not in text
    where = text[text.index("## Where the numbers come from"):text.index("## Further reading")]
    assert "how_we_measure" in where and not any(part in where for part in ("assets/", "lab/", ".json", "`"))
    for read in ("decode_lesson.committed()", '"realworld_cl100k_base.json"', "fsm_suite()"):
        assert read in text, read


def test_the_exercises_come_in_an_order_each_can_be_done_in():
    """An exercise that uses another's function comes after it (the held-back loop runs with ``ff_tokens``), and the
    numbers on the page run 1, 2, 3, 4."""
    import json
    import re
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in cells["cells"])
    numbers = [int(m) for m in re.findall(r"^\*\*(\d)\. ", text, re.M)]
    assert numbers == [1, 2, 3, 4]
    assert text.index("def ff_tokens(") < text.index("def my_ff_decode(")
    for m in re.finditer(r"exercise (\d)'s `(\w+)`", text):
        assert text.index(f"**{m[1]}. ") < m.start() and f"def {m[2]}(" in text


def test_step_2s_saving_is_one_number_and_chapter_07s_count_is_a_pointer():
    """The page gives step 2's saving once, over its own suite; chapter 07's answer for the same jumps is its number,
    set in one clause against the suite's 1/(1-f), named a count on the suite's documents in the tokenizer's split
    (no "bound" a measurement exceeds), beside the same measure on SmolLM2's answers (forwards skipped, not tokens
    forced), read from chapter 07's committed run; no ratio of tokens forced to passes saved is printed."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in cells["cells"])
    assert "jump_counts" not in text and "ch7[" not in text
    flat = " ".join(text.split())
    # bound against bound (SmolLM2's own split against the suite's), then chapter 07's measurement, which stays under
    # SmolLM2's bound
    assert "[chapter 07](07_constrained_decoding.ipynb) measures its step 2 at **{ch07_jumps:.2f}×** its step 1" in flat
    assert "decode_lesson.real_forced(ch07)" in text and "decode_lesson.real_steps_rows(ch07, 1)[1]" in text
    assert ("a bound of {lesson.amdahl_bound(ch07_forced['saved'] / ch07_forced['forwards_step1']):.2f}× against the "
            "suite's {lesson.amdahl_bound(suite_saved):.2f}×") in flat
    assert "The suite's counts are of its documents as the tokenizer splits them" in flat
    from book.decode import lesson as decode_lesson

    ch07 = decode_lesson.committed()
    forced = decode_lesson.real_forced(ch07)
    measured = decode_lesson.real_steps_rows(ch07, 1)[1]["x_previous"]
    assert measured <= lesson.amdahl_bound(forced["saved"] / forced["forwards_step1"])
    assert "suite's bound" not in flat and "(a bound)" not in flat
    # like with like: forwards skipped on SmolLM2's answers, as the suite's share is passes skipped
    assert "{100 * ch07_forced['saved'] / ch07_forced['forwards_step1']:.0f}% of the forward passes" in flat
    assert "ch01_real_saved" not in text and "the real schemas' share" not in flat  # the tokens-forced ratio is gone
    assert flat.count(":::{{dropdown}}") + flat.count(":::{dropdown}") == 2  # the counts' note and the peers' table


def test_one_note_holds_every_other_count_of_forced_tokens():
    """"Why it matters" shows the one measure (passes saved, tokenizer's split) on two sets of documents, the real
    schemas' walks and the suite, each 1/(1-f) that of its f; every other count (MaskBench, each engine's share, the
    suite's kinds, SmolLM2's answers) is one folded table naming its documents, tokens and rule."""
    import json
    from pathlib import Path

    from book.decode import lesson as decode_lesson

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    source = {c.get("id"): "".join(c["source"]) for c in cells["cells"]}
    why = source["cell-03"]
    shown = why[:why.index(":::")]
    assert shown.count("\n| ") == 1 and "\n{table}\n" in shown  # one head; its two rows are `rows`, built above
    assert 'real_saved["ours/tokens"]' in why and "suite_saved, suite_ff" in why
    assert "not a bound on other workloads" in shown
    note = why[why.index(":::"):]
    assert "lesson.forced_counts_table(decode_lesson.committed(), real_doc, results)" in note
    assert not any(":::{{dropdown}}" in s for k, s in source.items() if k not in ("cell-03", "cell-29"))
    vocab = fsm.load_vocabulary("cl100k_base")
    results, _ = lesson.run_suite(vocab)
    real_doc = json.loads((Path(__file__).resolve().parent.parent / "assets" / "data" / "realworld_cl100k_base.json")
                          .read_text())
    table = lesson.forced_counts_table(decode_lesson.committed(), real_doc, results)
    for named in ("MaskBench", "Llama 3 tokenizer", "tokens forced", "step 2's rule", "each engine's own random walks",
                  "regexes", "its tokenizer's split of their text", "the model's own tokens", "the one on EOS included",
                  "llguidance's policy"):
        assert named in table, named
    assert len(table.splitlines()) == 2 + 7
    # one policy a row: llguidance's share on SmolLM2's answers has its own row, never a parenthesis beside step 2's
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    policy = [r for r in rows if r[2].startswith("llguidance's policy")]
    assert len(policy) == 1 and policy[0][0] == "the same answers" and "(" not in policy[0][3]
    step2 = [r for r in rows if r[2] == "step 2 skips its pass"]
    assert len(step2) == 3 and not any("(" in r[3] for r in step2 if "regexes" in r[0] or "SmolLM2" in r[0])
    # each row's 1/(1-f) is computed from the same share the row shows, policy by policy
    flat = " ".join(why.split())
    assert ('f"| {what} | {100 * a:.1f}% | {100 * b:.1f}% | {lesson.amdahl_bound(a):.2f}× | " '
            'f"{lesson.amdahl_bound(b):.2f}× |" for what, a, b in rows') in flat


def test_the_page_says_where_it_loses_to_llguidance_from_the_measured_rows():
    """The stronger peer policy is said plainly: a "Where we lose" section before the exercises reads llguidance's
    saving from the compared rows (:func:`lesson.policy_totals`), the opening paragraph from the committed comparison
    on real schemas, never typed."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    sources = ["".join(c["source"]) for c in cells["cells"]]
    lose = next(i for i, s in enumerate(sources) if s.startswith("## Where we lose"))
    assert lose < next(i for i, s in enumerate(sources) if s.startswith("## Exercises"))
    assert "ff['saved']" in sources[lose + 1] and "step2['saved']" in sources[lose + 1]
    opening = next(i for i, s in enumerate(sources) if "lesson.policy_totals(peer_rows)" in s)
    assert opening == 1 and "Where we lose" in sources[opening]
    assert "real_saved['llguidance/tokens']" in sources[opening]


def test_policy_totals_are_the_peers_tables_totals_row():
    """The prose's totals and the table's last row add up the same cells."""
    from types import SimpleNamespace

    def row(entry, library, passes, noncanonical):
        return SimpleNamespace(entry=entry, library=library, passes=passes, picked=passes, out_tokens=passes,
                               noncanonical=noncanonical,
                               saved=lambda policy, base, p=passes: 1 - p[policy] / base.passes["none"])

    rows = [row("a", "ours", {"none": 10, "tokens": 9, "bytes": 6}, {"none": 0, "tokens": 0, "bytes": 2}),
            row("a", "llguidance", {"tokens": 7}, {"tokens": 0}),
            row("b", "ours", {"none": 30, "tokens": 27, "bytes": 20}, {"none": 0, "tokens": 0, "bytes": 1}),
            row("b", "llguidance", {"tokens": 21}, {"tokens": 1})]
    totals = lesson.policy_totals(rows)
    assert totals[("llguidance", "tokens")] == {"passes": 28, "saved": pytest.approx(0.3), "entries": 2,
                                                "noncanonical": 1}
    assert totals[("ours", "bytes")]["noncanonical"] == 3 and ("xgrammar", "bytes") not in totals
    last = lesson.peers_table(rows).splitlines()[-1]
    assert "**28 (30.0%)**" in last and "**36 (10.0%)**" in last


def test_exercise_3s_worked_example_is_the_answers_and_the_real_schemas_paragraph_backs_the_opening():
    """Exercise 3's example (`name"` keeps `name`, holds back `"`) is what the reference answer does; the Real schemas
    paragraph points to the result's table for the passes saved there, says what its documents are (mostly keys) and
    reads its sample from the committed file, with no fold of its own."""
    import json
    from pathlib import Path

    from book.fsm.solutions import reference_ff_tokens

    vocab = fsm.load_vocabulary("cl100k_base")
    assert [vocab.show(t) for t in vocab.encode(b'name"')] == ["name", '"']
    assert reference_ff_tokens(b'name"', vocab) == vocab.encode(b"name")
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    sources = ["".join(c["source"]) for c in cells["cells"]]
    flat = " ".join(" ".join(sources).split())
    assert "For `name\"` the tokens are `name` and `\"`; `\"` starts the longer token `\":`" in flat
    real = next(s for s in sources if "**Real schemas.**" in s)
    for read in ("doc['schemas_measured']", "run['timeout_s']", "the steps table's last column gives their passes saved",
                 "mostly keys"):
        assert read in real, read
    # each engine's share and MaskBench's are the note's (test_one_note_holds_every_other_count_of_forced_tokens)
    assert "bench[" not in real and ":::" not in real
    assert "suite_saved_by" not in real  # the six shares are the result's table, said once


def test_why_it_matters_tables_each_count_and_the_opening_says_what_its_range_rests_on():
    """"Why it matters" sets the passes saved on the real schemas' walks and on the suite in one table, each with its
    1/(1-f), the suite's step 2 figure being the landing's (:func:`book.results.fsm_line` through the same function),
    named a count on those documents, not a bound; its note says, from the suite's own rows, why the suite saves more;
    in the open it gives no time: the table is the section's only numbers, the chunk's cost a clause in words. The
    opening gives the decision with the real schemas' two numbers and llguidance's ceiling, named as random walks of
    the real schemas; the suite's shares wait for the steps."""
    import json
    from pathlib import Path

    from book.results import fsm_line, fsm_suite

    class Row:
        def __init__(self, kind, ws, none, token):
            self.kind, self.whitespace, self.passes = kind, ws, {"none": none, "token": token, "char": token}

    rows = [Row("json", "default", 90, 88), Row("regex", "default", 10, 7), Row("json", "compact", 50, 48)]
    assert lesson.suite_passes(rows)[2] == 95 and lesson.suite_passes(rows, kind="regex")[2] == 7
    assert lesson.suite_passes(rows, "compact", kind="json") == {1: 50, 2: 48, 3: 48}
    saved, _, _ = fsm_line(fsm_suite())
    assert f"{lesson.amdahl_bound(saved):.2f}" == "1.05"  # the landing's "at most 1.05× a request"
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    source = {c.get("id"): "".join(c["source"]) for c in cells["cells"]}
    why = source["cell-03"]
    # two rows by one measure, shown: the real schemas' walks and the suite, step 2 and llguidance's policy
    assert "| documents | $f$, exact jumps (step 2) | $f$, llguidance's fast-forward tokens |" in why
    assert "suite_saved = lesson.saved_share(passes, 2)" in why and why.index("{table}") < why.index(":::")
    assert "a count on these documents as the tokenizer splits them, not a bound on other workloads" in why
    # the open text's numbers are the table's: the chunk's cost is said in words, and no time is read
    shown = why[why.index('say(f"""'):why.index(":::")]
    assert "in the next pass's chunk, which costs more than a\npass of one token" in shown
    assert "ms" not in shown.replace("{table}", "") and "chunk_ms" not in why and "floor_ms" not in why
    assert "MASKBENCH_LLGUIDANCE_MASK_US" not in why and "bandwidth" not in why  # the fold: the counts' table alone
    # the suite's regexes are named with the steps, where its shares are
    assert "{n_kind['regex']} regexes, made of such fields" in source["cell-27"]
    opening = " ".join(source["cell-01"].split())
    # the answer first: the decision and the real schemas' two numbers (llguidance's and step 2's), each said once
    said = opening[opening.index("say(f"):]
    assert "fsm_peers_realworld.json" in opening and "lesson.amdahl_bound(ff_real)" in opening
    assert said.index("**The chapter's answer") < said.index("{opening}")
    assert "saved_share(passes, 2)" not in opening[opening.index("opening = "):] and "ff['saved']" not in opening
    assert "real_saved['llguidance/tokens']" in opening and "real_saved['ours/tokens']" in opening
    assert "walked at random through the automata of {n_real} real SchemaStore schemas" in opening  # named once
    assert "saved_share(passes, 3)" not in opening and "real_lo:.1f" not in said  # the rest waits for later sections
    assert "noncanonical" not in opening  # the count of documents in another split is in the result's fold
    # the engines' forced shares (step 2's rule) and the suite's kinds are the note's table, not the open text
    assert "real_lo" not in why and "by_kind" not in opening and "untouched" not in opening
    assert "The suite's regexes have fixed-width fields" in why[why.index(":::"):]


def test_the_real_schemas_share_stays_out_of_the_pass_counts_and_the_page_reads_in_reader_words():
    """The steps table counts passes only; the real-schema forced share is a row of "Why it matters"'s note, with why
    the engines' counts differ; the Real schemas section says the engines' compile failures in a sentence of their
    own; the result's fold says, beside llguidance's
    "none", that the writer writes the tokenizer's own split; the allowed-tokens histogram folds under step 1, not
    under further reading; "Where the numbers come from" and the exercises speak as the course's other pages do."""
    import json
    import re
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_fsm_compression.ipynb").read_text())
    ids = [c.get("id") for c in cells["cells"]]
    source = {c.get("id"): "".join(c["source"]) for c in cells["cells"]}
    text = "\n".join(source.values())
    assert "real=" not in source["cell-25"]
    why = source["cell-03"]
    assert "On the {n_common} real schemas" not in why
    flat_why = " ".join(why.split())
    assert flat_why.index(":::") < flat_why.index("engines differ because each builds its own grammar")
    real = source["cell-34"]
    flat = " ".join(real.split())
    assert "**The other {len(dropped)} schemas fail to compile in at least one engine**" in flat
    assert "real_lo" not in real and ":::" not in real
    # why the other schemas drop out (each engine's failures) and how their size compares, from the committed file
    assert "fail to compile in at least one engine" in flat and 'schema_bytes' in real
    assert flat.index("fail to compile") < flat.index("the small ones")
    assert "an engine refusing" not in real
    result = " ".join(source["cell-29"].split())
    # the count of documents in another split is not in the result's sentence (partly by construction): the fold's
    # table has it, and the fold's title, its visible legend, gives the reason llguidance's is none
    assert "x_str['noncanonical']" not in result
    title = next(line for line in source["cell-29"].splitlines() if line.startswith(":::{{dropdown}}"))
    assert "partly by design" in title and "in a split the tokenizer would not write" in title
    # the answer is one sentence over the steps table (one table of the steps: the suite, compact, the real schemas),
    # checked against the committed comparisons (fsm_peers.json, fsm_peers_realworld.json), so no share is said twice
    assert "| passes saved |" not in result and "in each column of the steps table" in result
    assert "columns = (suite_saved_by, compact_saved_by, real_saved)" in result
    assert 'd["ours/bytes"] == d["xgrammar/bytes"] for d in columns' in result
    assert "ff['saved']" not in result and "x_str" not in result
    assert "our writer always writes it" not in source["cea7eb19"]
    # the histogram of allowed tokens: folded right after step 1's count, before step 2
    assert ids.index("cell-36") == ids.index("cell-12") + 1 < ids.index("cell-13")
    assert "hide-output" in cells["cells"][ids.index("cell-36")]["metadata"]["tags"]
    assert "(folded below)" in source["cell-12"]
    reading = source["cell-45"]
    assert "folded below the list" not in reading and ids.index("cell-45") == len(ids) - 1
    where = source["0ebfc179"]
    assert not re.search(r"recorded|The runs|ceilings run", where)
    assert "answers:\n`book/fsm/solutions.py` in the repository." in source["cell-37"] and "the chapter's\n`solutions.py`" not in text


def test_real_policy_shares_count_the_documents_kept_and_each_policys_saving():
    """The real-schema comparison's shares are the steps table's measure (passes saved against none); a schema with
    no document is not counted, and a refused document is out of the count."""
    record = {"totals": {"none": 200, "policies": {"ours/tokens": {"passes": 190, "noncanonical": 0},
                                                    "llguidance/tokens": {"passes": 150, "noncanonical": 0}}},
              "schemas": [{"schema": "a", "documents": 3, "refused": ["document 1: ..."]}, {"schema": "b", "documents": 0}]}
    n, docs, shares = lesson.real_policy_shares(record)
    assert (n, docs) == (1, 2) and shares == pytest.approx({"ours/tokens": 0.05, "llguidance/tokens": 0.25})


def test_the_savings_figure_draws_llguidance_under_both_whitespaces_by_one_measure():
    """The figure's peer bars: llguidance's fast-forward tokens with default whitespace and, on the JSON schemas,
    compact (the steps table's 40.1% cell), each bar the share of passes saved against the same entry's passes without
    jumps; no band of another counting rule (MaskBench's tokens forced)."""
    from types import SimpleNamespace

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from book.fsm.figures import plot_savings

    def entry(name, ws, none, token, char):
        return SimpleNamespace(name=name, whitespace=ws, passes={"none": none, "token": token, "char": char})

    def peer(name, library, none, tokens):
        return SimpleNamespace(entry=name, library=library, passes={"none": none, "tokens": tokens},
                               saved=lambda policy, base, p={"tokens": tokens}: 1 - p[policy] / base.passes["none"])

    results = [entry("a", "default", 10, 9, 5), entry("r", "default", 20, 10, 10), entry("a", "compact", 8, 8, 2)]
    default = [peer("a", "ours", 10, 9), peer("a", "llguidance", 10, 6), peer("r", "ours", 20, 10),
               peer("r", "llguidance", 20, 10)]
    compact = [peer("a", "ours", 8, 8), peer("a", "llguidance", 8, 4)]
    ax = plot_savings(results, default, compact_peer_rows=compact)
    bars = {c.get_label(): [round(b.get_height(), 6) for b in c] for c in ax.containers}
    plt.close(ax.figure)
    labels = list(bars)
    assert labels.index("llguidance: fast-forward tokens (a peer), default whitespace") == 2
    assert labels[-1] == "llguidance: fast-forward tokens (a peer), compact whitespace"
    assert bars[labels[2]] == [40.0, 50.0] and bars[labels[-1]] == [50.0]
    assert not any("MaskBench" in label for label in labels) and not ax.patches[0].get_label().startswith("MaskBench")


def test_a_long_jump_label_is_packed_into_a_few_lines():
    """The compressed classifier's edge from q3 to the end writes five labels: packed two a line, so the box stays
    low enough to sit on its own arc rather than stand over the others (the no-overlap tests check the rest)."""
    assert drawing._label(["a", "b", "c", "d", "e"], 6, pack=True) == "a  b\nc  d\ne"
    assert drawing._label(["a", "b", "c", "d", "e"], 6) == "a\nb\nc\nd\ne"
    assert drawing._label(["a", "b"], 2, pack=True) == "a\nb" and drawing._label(["a", "b", "c"], 2) == "a\nb\n+1 more"
