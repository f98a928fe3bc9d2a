"""Chapter 1's page: the drawing names its states as the state table does, and the table of steps reads the
suite's pass counts."""

import re

import pytest

for _name in ("outlines_core", "outlines", "bpe_openai"):
    pytest.importorskip(_name)

from book.fsm import drawing, lesson  # noqa: E402
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


def test_steps_table_reads_the_pass_counts():
    class Row:
        def __init__(self, ws, none, token, char):
            self.whitespace, self.passes = ws, {"none": none, "token": token, "char": char}

    rows = [Row("default", 100, 80, 50), Row("compact", 10, 10, 1)]
    table = lesson.steps_table(rows)
    lines = table.splitlines()[2:]
    assert len(lines) == len(fsm.CHAPTER.steps)
    assert "| 100 | – | 0.0% | 1.00× |" in lines[0]
    assert "| 80 | 1.25× | 20.0% | 1.25× |" in lines[1]
    assert "| 50 | 1.60× | 50.0% | 2.00× |" in lines[2]
