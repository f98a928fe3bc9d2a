"""Chapter 1 (FSM compression): automata, jump tables, the decode loop, the suite and the mask file.

The suite's automata are built once per module (outlines-core needs about a second per index over the
100k-token vocabulary). Every decode uses fresh random seeds from the ``rng`` fixture.
"""

import json
import random
import re

import numpy as np
import pytest
import torch

# The chapter runs on the CPU; the GPU machine does not carry these packages, so skip rather than fail there.
for _name in ("outlines_core", "outlines", "bpe_openai", "jsonschema", "pydantic", "regex"):
    pytest.importorskip(_name)

import jsonschema  # noqa: E402
import regex as regex_module  # noqa: E402  (current Unicode tables, see _check_valid)

import lab_scripts  # noqa: E402
from book.fsm import drawing, events  # noqa: E402
from book.fsm.exercises import toy_model  # noqa: E402
from studylog import data, fsm  # noqa: E402
from studylog.fsm import schemas  # noqa: E402

SUITE = schemas.suite()
NAMES = [e.name for e in SUITE]


@pytest.fixture(scope="module")
def vocab():
    return fsm.load_vocabulary("cl100k_base")


@pytest.fixture(scope="module")
def automata(vocab):
    """Every suite entry with outlines' default whitespace, plus two entries with compact JSON."""
    out = {(e.name, "default"): (e, fsm.ConstrainedFSM(e.regex("default"), vocab, e.name)) for e in SUITE}
    for name in ("weather_call", "calendar_event"):
        e = schemas.entry(name)
        out[(name, "compact")] = (e, fsm.ConstrainedFSM(e.regex("compact"), vocab, name))
    return out


CASES = [(n, "default") for n in NAMES] + [("weather_call", "compact"), ("calendar_event", "compact")]


def _case_id(case):
    return f"{case[0]}-{case[1]}"


def _py_rng(rng, salt: str) -> random.Random:
    return random.Random(f"{rng.seed_value}/{salt}")


def _check_valid(entry, regex: str, text: bytes) -> None:
    """Independent checks of an output: the `regex` module on the regex, and JSON parsing for JSON entries.

    Not Python's `re`: its classes such as `\\d` follow the Unicode version of the interpreter (14.0 in
    Python 3.11), while outlines-core's follow a newer one, so a walk that writes U+1E4F7 (a Nag Mundari
    digit, new in Unicode 15) is a digit to the FSM and not to `re`. `regex` ships current Unicode tables.
    """
    s = text.decode("utf-8")
    assert regex_module.fullmatch(regex, s, flags=regex_module.DOTALL), f"{entry.name}: {s!r} does not match the regex"
    if entry.kind == "json":
        json.loads(s)


def test_independent_check_knows_new_unicode_digits():
    """The seed that once failed: outlines-core counts U+1E4F7 (Unicode 15) as \\d; so must the check."""
    entry = type("Entry", (), {"name": "digits", "kind": "regex"})()
    _check_valid(entry, r"\d{2}", "4\U0001E4F7".encode())
    with pytest.raises(AssertionError, match="does not match"):
        _check_valid(entry, r"\d{2}", "4x".encode())


# --- vocabulary ------------------------------------------------------------------------------------------

def test_cl100k_vocabulary(vocab, rng):
    assert vocab.vocab_size == 100277 and vocab.eos_id == 100257
    assert vocab.byte_complete
    text_tokens = sum(b is not None for b in vocab.token_bytes)
    assert text_tokens == 100256 and len(vocab.outlines_vocabulary()) == text_tokens + 1  # outlines counts EOS
    words = ["alpha", " beta", '{"k": 1}', "ünïcode", "  ", "\n", "Zebra", "42"]
    r = _py_rng(rng, "vocab")
    text = "".join(r.choice(words) for _ in range(40))
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text.encode()
    assert vocab.show(vocab.eos_id) == "<EOS>"


def test_vocabulary_without_eos_is_refused():
    with pytest.raises(ValueError, match="no EOS token"):
        fsm.make_vocabulary({"a": 0, "b": 1}, None)
    with pytest.raises(ValueError, match="no EOS token"):
        fsm.TokenVocabulary("toy", [b"a", b"b"], None)
    with pytest.raises(ValueError, match="EOS token id 7 .* outside"):
        fsm.TokenVocabulary("toy", [b"a", b"b"], 7)
    with pytest.raises(ValueError, match="EOS token id 1 .* text token"):
        fsm.TokenVocabulary("toy", [b"a", b"b"], 1)
    with pytest.raises(ValueError, match="EOS token id 1 is also given"):
        fsm.make_vocabulary({"a": 0, "b": 1}, 1)


# --- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("regex", ["(unclosed", "[z-a]", "a{3,1}"])
def test_invalid_regex_is_refused(vocab, regex):
    with pytest.raises(ValueError, match="invalid regex"):
        fsm.compile_fsm(regex, vocab)


def test_regex_the_vocabulary_cannot_write():
    toy = fsm.make_vocabulary({"a": 0, "b": 1}, 2)
    with pytest.raises(ValueError, match="cannot write any text matching"):
        fsm.compile_fsm("c+", toy)


@pytest.mark.parametrize(
    "schema, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"type": "nonsense"}, "invalid"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "JSON schema"),
        (42, "schema must be"),
    ],
)
def test_invalid_json_schema_is_refused(schema, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fsm.regex_from_schema(schema)


def test_pydantic_model_dict_and_json_text_give_the_same_regex():
    model = schemas.WeatherCall
    from_model = fsm.regex_from_schema(model)
    assert from_model == fsm.regex_from_schema(model.model_json_schema())
    assert from_model == fsm.regex_from_schema(json.dumps(model.model_json_schema()))
    assert '"get_weather"' in from_model and "celsius" in from_model
    assert "[ ]?" not in fsm.regex_from_schema(model, whitespace_pattern="")


def test_token_id_outside_the_vocabulary(vocab, automata):
    _, f = automata[("classifier", "default")]
    for bad in (vocab.vocab_size, -1, 10**12):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            f.next_state(f.initial, bad)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            f.walk([bad])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            vocab.decode([bad])
    with pytest.raises(TypeError, match="must be an int"):
        f.next_state(f.initial, 1.5)
    with pytest.raises(ValueError, match="not allowed in state"):
        f.walk(vocab.encode("maybe"))


def test_decode_refuses_bad_arguments(vocab, automata):
    _, f = automata[("classifier", "default")]
    good = toy_model(vocab)
    with pytest.raises(ValueError, match="mode must be one of"):
        fsm.decode(good, f, "bytes")
    with pytest.raises(ValueError, match="max_tokens"):
        fsm.decode(good, f, max_tokens=0)
    with pytest.raises(ValueError, match=r"shape \(100277,\)"):
        fsm.decode(lambda ids: torch.zeros(1000), f)
    with pytest.raises(ValueError, match=r"shape \(100277,\)"):
        fsm.decode(lambda ids: torch.zeros(2, vocab.vocab_size), f)
    with pytest.raises(TypeError, match="torch.Tensor"):
        fsm.decode(lambda ids: [0.0] * vocab.vocab_size, f)
    with pytest.raises(TypeError, match="floating-point"):
        fsm.decode(lambda ids: torch.zeros(vocab.vocab_size, dtype=torch.int64), f)
    no_encoder = fsm.TokenVocabulary("toy", [b"a", b"b", None], 2)
    with pytest.raises(ValueError, match="no encoder"):
        fsm.decode(toy_model(no_encoder), fsm.compile_fsm("ab", no_encoder), "char")


# --- the automaton and its jump tables -------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_token_index_and_char_automaton_share_state_ids(automata, vocab, rng, case):
    """Walking a token's bytes through the character-level automaton lands where the token index says."""
    _, f = automata[case]
    r = _py_rng(rng, "share")
    checked = 0
    for s in f.states:
        ids = f.index.get_allowed_tokens(s)
        if ids is None:
            continue
        for t in r.sample(ids, min(len(ids), 60)):
            if t == vocab.eos_id:
                assert f.is_final(s)
                continue
            assert f.char_walk(vocab.token_bytes[t], s) == f.index.get_next_state(s, t), (s, vocab.show(t))
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_token_jumps_are_exactly_the_forced_states(automata, vocab, case):
    """Full scan (every state, every allowed token) against the precompute's shortcut."""
    _, f = automata[case]
    forced = {}
    for s in f.states:
        ids = f.index.get_allowed_tokens(s)
        if ids is not None and len(ids) == 1 and not f.is_final(s):
            assert ids[0] != vocab.eos_id
            forced[s] = ids[0]
    assert set(f.token_jumps) == set(forced)
    for s, jump in f.token_jumps.items():
        states = f.walk(jump.tokens, s)
        assert states[-1] == jump.end
        assert all(st in forced for st in states[:-1]), "a jump passes through an unforced state"
        assert jump.end not in forced, "a jump stops before the end of its chain"
        assert jump.data == b"".join(vocab.token_bytes[t] for t in jump.tokens)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_char_jumps_follow_forced_bytes(automata, case):
    _, f = automata[case]

    def forced(s):
        return s not in f.char_finals and len(f.char_out.get(s, {})) == 1

    assert set(f.char_jumps) == {s for s in f.char_out if forced(s)}
    for s, jump in f.char_jumps.items():
        assert jump.data and jump.tokens == ()
        cur = s
        for b in jump.data:
            assert forced(cur) and b in f.char_out[cur]
            cur = f.char_out[cur][b]
        assert cur == jump.end and not forced(cur)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_final_states_keep_every_ascii_continuation(automata, case):
    """Where a text may end, outlines-core's index can lose a continuation (in 0.2.14, a token whose last byte
    leaves a final state toward a non-final one; a lower-priority branch of an alternation): check every
    final state of the suite's character-level automata against the regex module, byte by ASCII byte, on a
    shortest text reaching it. Every byte out of a final state of the suite leads to a final state, so no
    token of the index ends one byte after a final state in a non-final one."""
    from book.fsm.peers import viable_prefix

    _, f = automata[case]
    paths, frontier = {f.initial: b""}, [f.initial]
    while frontier:
        nxt = []
        for s in frontier:
            for b, n in sorted(f.char_out.get(s, {}).items()):
                if n not in paths:
                    paths[n] = paths[s] + bytes([b])
                    nxt.append(n)
        frontier = nxt
    finals = [s for s in f.char_finals if s in paths]
    assert finals
    for s in finals:
        text = paths[s]
        assert regex_module.fullmatch(f.regex, text.decode()) is not None
        for b in range(128):
            assert (b in f.char_out.get(s, {})) == viable_prefix(f.regex, text + bytes([b])), (text, chr(b))
        assert all(n in f.char_finals for n in f.char_out.get(s, {}).values()), text


def test_chains_cut_a_forced_cycle():
    jumps = fsm.automaton.forced_chains({1: ((5,), b"a", 2), 2: ((6,), b"b", 1), 3: ((7,), b"c", 1)})
    assert jumps[3].tokens[:2] == (7, 5) and set(jumps) == {1, 2, 3}


def test_small_vocabulary_without_every_byte(rng):
    """The slow path of the precompute (a vocabulary that is not byte-complete) finds the forced state."""
    toy = fsm.make_vocabulary({"ab": 0, "c": 1, "abc": 2, "d": 3}, 4)
    assert not toy.byte_complete
    f = fsm.compile_fsm("abc(d)?", toy)
    after_ab = f.next_state(f.initial, 0)
    assert set(f.token_jumps) == {after_ab}
    assert f.token_jumps[after_ab].tokens == (1,)
    model = toy_model(toy, seed=rng.seed_value)
    none = fsm.decode(model, f, "none")
    token = fsm.decode(model, f, "token")
    assert none.ids == token.ids and none.finished and f.matches(none.text)


# --- the decode loop on the suite ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_token_jumps_write_exactly_the_same_tokens(automata, rng, vocab, case):
    """Greedy decoding of a deterministic toy model: token-level compression changes nothing but the passes."""
    entry, f = automata[case]
    jumped = 0
    for k in range(2):
        model = toy_model(vocab, seed=rng.seed_value + k)
        none = fsm.decode(model, f, "none", max_tokens=300)
        token = fsm.decode(model, f, "token", max_tokens=300)
        assert none.finished, f"toy model did not finish: {none.text[:200]!r}"
        assert token.ids == none.ids and token.text == none.text and token.finished
        assert none.jumped_tokens == 0
        assert token.forward_passes == none.forward_passes - token.jumped_tokens
        _check_valid(entry, f.regex, none.text)
        jumped += token.jumped_tokens
    # the writer model visits the forced states of real outputs: there the jumps must fire
    r = _py_rng(rng, case[0])
    for _ in range(2):
        sample = entry.sample(r, case[1])
        model = fsm.writer_model(vocab, sample)
        none = fsm.decode(model, f, "none")
        token = fsm.decode(model, f, "token")
        assert token.ids == none.ids == vocab.encode(sample)
        assert token.forward_passes == none.forward_passes - token.jumped_tokens
        jumped += token.jumped_tokens
    if f.token_jumps and case[0] in ("classifier", "us_phone", "datetime", "ipv4", "calendar_event"):
        assert jumped > 0, "no token jump fired, so the equivalence above was not exercised"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_char_jumps_still_match_the_regex(automata, rng, vocab, case):
    entry, f = automata[case]
    jumped = 0
    for k in range(2):
        out = fsm.decode(toy_model(vocab, seed=rng.seed_value + 100 + k), f, "char", max_tokens=300)
        assert out.finished, f"toy model did not finish: {out.text[:200]!r}"
        assert vocab.decode(out.ids) == out.text
        assert f.matches(out.text)
        _check_valid(entry, f.regex, out.text)
        jumped += out.jumped_bytes
    assert jumped > 0 or not f.char_jumps


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_mode_writes_the_sample(automata, rng, vocab, case):
    """Samples are valid (regex and JSON schema); the writer model writes them exactly in all three modes."""
    entry, f = automata[case]
    r = _py_rng(rng, "writer/" + case[0])
    for _ in range(2):
        sample = entry.sample(r, case[1])
        assert re.fullmatch(f.regex, sample) and f.matches(sample), sample
        if entry.kind == "json":
            jsonschema.validate(json.loads(sample), entry.schema)
        canon = vocab.encode(sample)
        results = {}
        for mode in fsm.MODES:
            out = events.record(fsm.writer_model(vocab, sample), f, mode)
            assert out.finished and out.text == sample.encode(), (mode, out.text)
            assert sum(s.kind in ("pass", "eos") for s in out.events) == out.forward_passes
            assert _replay(out.events) == out.ids and sum(e.dropped for e in out.events) == out.retokenized
            results[mode] = out
        assert results["none"].ids == canon
        assert results["none"].forward_passes >= len(canon)
        assert results["token"].forward_passes <= results["none"].forward_passes


def _replay(recorded) -> list[int]:
    """The ids a decode's events add up to: a pass appends its pick, a jump replaces the tokens it dropped."""
    ids: list[int] = []
    for e in recorded:
        if e.kind in ("pass", "token-jump", "char-jump"):
            ids = ids[:len(ids) - e.dropped] + list(e.tokens)
    return ids


def test_retokenization_rewrites_a_split_the_model_would_not_make(automata, vocab):
    """The concrete case of the chapter: with optional whitespace, a forced key ends at its closing quote;
    the writer then has to emit ':' alone, and the next jump's retokenization merges the pair back into
    the one token '":' the tokenizer prefers, dropping tokens already emitted."""
    _, f = automata[("weather_call", "default")]
    sample = '{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}'
    out = events.record(fsm.writer_model(vocab, sample), f, "char")
    quote, colon, quote_colon = (vocab.token_id(b) for b in (b'"', b":", b'":'))
    passes = [s.tokens[0] for s in out.events if s.kind == "pass"]
    assert colon in passes, "the writer never had to emit ':' on its own"
    jumps = [s for s in out.events if s.kind == "char-jump"]
    assert any(s.dropped > 0 and quote_colon in s.tokens for s in jumps)
    assert out.retokenized > 0 and out.ids[-1] != quote


# --- suite measurement and the mask file --------------------------------------------------------------------

def test_measure_entry_counts(automata, vocab):
    entry, f = automata[("us_phone", "default")]
    res, _ = fsm.report.measure_entry(entry, vocab, "default", n_samples=4, seed=3, fsm=f)
    assert res.passes["none"] >= res.tokens > 0
    assert 0 < res.passes["char"] <= res.passes["token"] < res.passes["none"]  # steps 2 and 3 save, 3 no less
    assert res.visited and all(n == f.n_allowed(s) for s, n in res.visited.items())
    table = fsm.savings_table([res])
    assert "us_phone" in table and table.count("\n") == 3


def test_suite_summary_totals_each_whitespace(automata, vocab):
    """The totals the landing page reads (assets/data/fsm_suite.json): passes summed per whitespace pattern, the
    share saved computed from those sums (not averaged over entries)."""
    from studylog.fsm.report import suite_summary

    results = [fsm.report.measure_entry(automata[(name, ws)][0], vocab, ws, n_samples=2, seed=1,
                                 fsm=automata[(name, ws)][1])[0]
               for name, ws in (("us_phone", "default"), ("weather_call", "default"))]
    summary = suite_summary(results)
    assert list(summary) == ["default"]
    d = summary["default"]
    assert d["entries"] == 2 and d["documents"] == 4
    for mode in ("none", "token", "char"):
        assert d["passes"][mode] == sum(r.passes[mode] for r in results)
    assert d["saved"]["char"] == 1 - d["passes"]["char"] / d["passes"]["none"]
    assert d["retokenized"] == sum(r.retokenized for r in results)


def _export_script():
    """lab/fsm/export_masks.py, the script that writes the committed mask file (run from the repository root)."""
    return lab_scripts.load("fsm", "export_masks")


def test_select_masks_spans_bins_within_budget():
    counts = [("a", s, n) for s, n in enumerate([1, 1, 2, 3, 5, 9, 17, 33, 800, 900, 60000, 70000, 90000])]
    picked = _export_script().select_masks(counts, per_bin=1, max_ids=100_000)
    sizes = sorted(n for _, _, n in picked)
    assert sum(sizes) <= 100_000
    assert sizes[0] == 1 and sizes[-1] >= 60000
    assert len({int(np.log2(n)) for n in sizes}) == len(sizes)


def test_mask_file(vocab):
    path = data.MASKS_FILE
    assert path.is_file(), "run `python lab/fsm/export_masks.py`"
    assert path.stat().st_size < 1_000_000
    ms = data.load_masks(path)
    assert ms.tokenizer == "cl100k_base" and ms.vocab_size == vocab.vocab_size
    counts = ms.counts()
    assert 100 <= len(ms) <= 400
    assert counts.min() == 1 and counts.max() > 50_000, "masks must span sparse to dense"
    assert len({int(np.log2(c)) for c in counts}) >= 8
    names = {n for n in NAMES} | {f"{n}[compact]" for n in NAMES}
    assert set(ms.source.tolist()) <= names
    for i in range(len(ms)):
        ids = ms.allowed(i)
        assert np.all(np.diff(ids) > 0) and ids[0] >= 0 and ids[-1] < ms.vocab_size


def test_mask_file_holds_the_real_masks(automata, vocab):
    """Masks of the default-whitespace entries are recomputed from the index (with the digit class the file
    was exported with) and compared id by id; so are the date entries' masks, whose automata differ."""
    ms = data.load_masks()
    digits = _export_script().COMMITTED_MASKS_ASCII_DIGITS
    compared, dates = 0, 0
    for i in range(len(ms)):
        key = (str(ms.source[i]), "default")
        if key not in automata:
            continue
        entry, f = automata[key]
        if entry.regex("default", ascii_digits=digits) != f.regex:
            automata[key + ("file",)] = automata.get(key + ("file",)) or (
                entry, fsm.ConstrainedFSM(entry.regex("default", ascii_digits=digits), vocab, entry.name))
            f = automata[key + ("file",)][1]
            dates += 1
        np.testing.assert_array_equal(ms.allowed(i), f.allowed(int(ms.state[i])).numpy())
        compared += 1
    assert compared >= 50 and dates > 0



# --- figures ---------------------------------------------------------------------------------------------

def test_automaton_graphs(automata, vocab):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, f = automata[("classifier", "default")]
    full = drawing.automaton_graph(f, "token")
    small = drawing.automaton_graph(f, "token", compressed=True)
    chars = drawing.automaton_graph(f, "char", compressed=True)
    assert small.number_of_nodes() < full.number_of_nodes()
    assert any(d["jump"] for *_, d in small.edges(data=True))
    assert any(full.nodes[n]["final"] for n in full.nodes)
    labels = [lab for *_, d in chars.edges(data=True) for lab in d["labels"]]
    assert any("rue" in lab for lab in labels), labels
    fig, axes = plt.subplots(1, 2)
    drawing.draw_automaton(f, "token", ax=axes[0])
    drawing.draw_automaton(f, "char", compressed=True, ax=axes[1])
    plt.close(fig)


# --- defects: the cap on tokens, and what `format: date` allows -------------------------------------------

def test_token_jumps_stop_at_the_cap_on_the_smallest_case():
    table = {"a": 0, "b": 1, "c": 2, "x": 3}
    toy = fsm.make_vocabulary(table, eos_id=4, encoder=lambda s: [table[c] for c in s])
    f = fsm.compile_fsm("abc(x)*", toy)
    model = lambda ids: torch.zeros(5)  # noqa: E731
    for cap in range(1, 6):
        none = fsm.decode(model, f, "none", max_tokens=cap)
        token = fsm.decode(model, f, "token", max_tokens=cap)
        assert len(none.ids) <= cap and token.ids == none.ids, (cap, none.ids, token.ids)
    # character mode: the forced "abc" is retokenized to [0, 1, 2] and cut to the cap
    for cap, ids in [(1, [0]), (2, [0, 1]), (3, [0, 1, 2])]:
        char = events.record(model, f, "char", max_tokens=cap)
        assert char.ids == ids and char.text == b"abc"[:cap] and char.jumped_bytes == cap
        assert char.forward_passes == 0 and not char.finished
        assert [(e.kind, e.tokens, e.data) for e in char.events] == [("char-jump", tuple(ids), b"abc"[:cap])]


def test_each_mode_runs_its_step():
    """``decode``'s modes are the chapter's steps, in the lesson's order."""
    assert [fsm.decoding.STEP_OF_MODE[m] for m in fsm.MODES] == [s.function for s in fsm.CHAPTER.steps]
    assert [s.name for s in fsm.CHAPTER.steps] == ["step01_uncompressed", "step02_token_jumps", "step03_char_jumps"]


def _caps(rng, full, jumped):
    """Caps to try: the smallest, the length of the output and one past it, some at random, and every cap
    that falls inside a token jump of the uncapped decode (where a jump must be cut)."""
    n = len(full.ids)
    caps = {1, 2, 3, n, n + 1, *rng.sample(range(1, n + 2), min(n + 1, 6))}
    pos = 0
    for s in jumped.events:
        if s.kind == "token-jump":
            caps.update(range(pos + 1, pos + len(s.tokens)))
        pos += len(s.tokens) if s.kind in ("pass", "token-jump") else 0
    return sorted(caps)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_token_jumps_give_the_ids_of_uncompressed_decoding_under_every_cap(automata, rng, vocab, case):
    """``max_tokens`` caps the ids in every mode; token jumps are cut there, so their ids stay those of mode none."""
    entry, f = automata[case]
    r = _py_rng(rng, "caps/" + case[0])
    sample = entry.sample(r, case[1])
    cut = 0
    for model in (fsm.writer_model(vocab, sample), toy_model(vocab, seed=rng.seed_value)):
        full = fsm.decode(model, f, "none", max_tokens=300)
        jumped = events.record(model, f, "token", max_tokens=300)
        assert jumped.ids == full.ids
        caps = _caps(r, full, jumped)
        for cap in caps:
            token = fsm.decode(model, f, "token", max_tokens=cap)
            assert token.ids == full.ids[:cap], (cap, token.ids, full.ids[:cap])
            assert token.finished == (full.finished and cap > len(full.ids))
            cut += cap < len(full.ids)
    assert cut > 0


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_char_jumps_respect_the_cap(automata, rng, vocab, case):
    """Under a cap, character jumps give at most ``max_tokens`` ids, a valid walk whose text begins the
    uncapped output's."""
    entry, f = automata[case]
    r = _py_rng(rng, "char-caps/" + case[0])
    sample = entry.sample(r, case[1])
    for model in (fsm.writer_model(vocab, sample), toy_model(vocab, seed=rng.seed_value)):
        full = fsm.decode(model, f, "char", max_tokens=300)
        for cap in sorted({1, 2, 3, *r.sample(range(1, len(full.ids) + 2), min(len(full.ids) + 1, 8))}):
            char = fsm.decode(model, f, "char", max_tokens=cap)
            assert len(char.ids) <= cap, (cap, char.ids)
            f.walk(char.ids)
            assert char.text == vocab.decode(char.ids) and full.text.startswith(char.text)
            if char.finished:
                assert full.finished and char.text == full.text


NAG_MUNDARI_DATE = '"206\U0001E4F2-02-04"'  # U+1E4F2 NAG MUNDARI DIGIT TWO (Unicode 15), a `\\d` to outlines-core
DATE = {"type": "string", "format": "date"}


def test_a_date_field_accepts_only_ascii_digits(vocab):
    """RFC 3339 dates are ASCII; outlines-core's `\\d` is any Unicode digit. By default the schema's regex
    says `[0-9]`; `ascii_digits=False` keeps outlines' regex, and with it the Nag Mundari date."""
    f = fsm.compile_fsm(fsm.regex_from_schema(DATE), vocab)
    assert f.matches('"2064-02-04"')
    assert not f.matches(NAG_MUNDARI_DATE)
    assert "\\d" not in f.regex
    unicode = fsm.compile_fsm(fsm.regex_from_schema(DATE, ascii_digits=False), vocab)
    assert unicode.matches('"2064-02-04"') and unicode.matches(NAG_MUNDARI_DATE)


@pytest.mark.parametrize("name", ["tool_call", "calendar_event", "datetime"])
def test_the_suites_dates_accept_only_ascii_digits(automata, rng, name):
    """A valid sample with its year's first digit made U+1E4F2: outlines' own regex accepts it (checked with
    the `regex` module), the suite's automaton, built with ASCII digits by default, refuses it."""
    entry, f = automata[(name, "default")]
    sample = entry.sample(_py_rng(rng, "date/" + name), "default")
    year = regex_module.search(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", sample).start()
    bad = sample[:year] + "\U0001E4F2" + sample[year + 1:]
    assert f.matches(sample) and not f.matches(bad)
    assert regex_module.fullmatch(entry.regex("default", ascii_digits=False), bad, flags=regex_module.DOTALL)
    assert "\\d" not in f.regex


@pytest.mark.parametrize(
    "regex, ascii",
    [
        (r"\d{4}", "[0-9]{4}"),
        (r"[\d.]+", "[0-9.]+"),
        (r"[^\d]", "[^0-9]"),
        (r"\D", "[^0-9]"),
        (r"\\d", r"\\d"),                 # an escaped backslash, then a letter d
        (r"\\\d", r"\\[0-9]"),
        (r"[]\d]", "[]0-9]"),                # ']' first in a class is a literal
        (r"[\]\d]x\d", r"[\]0-9]x[0-9]"),
        (r"[[:alpha:]\d]", "[[:alpha:]0-9]"),  # a nested (POSIX) class
        (r"\p{Nd}\w\s", r"\p{Nd}\w\s"),      # other classes are left alone
    ],
)
def test_ascii_digit_classes(regex, ascii):
    """The rewrite, and (where Python's `regex` reads the syntax the same way) the same matches as the
    original regex read with ASCII classes."""
    assert fsm.automaton.ascii_digit_classes(regex) == ascii
    if "[:" not in regex and "\\p" not in regex:
        for text in ("7", "\U0001E4F2", "x", "]", "."):
            want = regex_module.fullmatch(regex, text, flags=regex_module.ASCII)
            assert bool(regex_module.fullmatch(ascii, text)) == bool(want), text


def test_ascii_digit_classes_refuses_what_it_cannot_write():
    with pytest.raises(ValueError, match="inside a character class"):
        fsm.automaton.ascii_digit_classes(r"[\Da]")
    with pytest.raises(TypeError, match="regex must be a str"):
        fsm.automaton.ascii_digit_classes(None)


def _unicode_digit_prefix(b: bytes, digits: set[str], partial: set[bytes], n: int) -> bool:
    """Whether ``b`` begins a string of at most ``n`` Unicode digits (``digits``, from the `regex` module's
    tables) and holds a non-ASCII byte: whole digits, then possibly the first bytes of one more (``partial``)."""
    for cut in range(len(b), -1, -1):
        try:
            head = b[:cut].decode()
        except UnicodeDecodeError:
            continue
        rest = b[cut:]
        if not all(c in digits for c in head) or (rest and rest not in partial):
            return False
        return max(b) >= 0x80 and len(head) + bool(rest) <= n
    return False


def test_what_the_unicode_digit_class_adds_to_a_date_mask(vocab):
    """The tokens a Unicode `\\d` adds where a date's year begins, against an independent count: every
    cl100k token that begins a string of at most four Unicode digits and is not ASCII."""
    ascii_date = fsm.compile_fsm(fsm.regex_from_schema(DATE), vocab)
    unicode_date = fsm.compile_fsm(fsm.regex_from_schema(DATE, ascii_digits=False), vocab)
    ids = vocab.encode('"2024-02-29"')
    extra = [np.setdiff1d(unicode_date.allowed_array(s), ascii_date.allowed_array(t))
             for s, t in zip(unicode_date.walk(ids), ascii_date.walk(ids), strict=True)]
    assert len(extra) == len(ids) + 1
    for s, t in zip(unicode_date.walk(ids), ascii_date.walk(ids)):  # the ASCII masks are subsets
        assert set(ascii_date.allowed(t).tolist()) <= set(unicode_date.allowed(s).tolist())
    every_char = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    digits = set(regex_module.findall(r"\d", every_char))
    partial = {d.encode()[:k] for d in digits for k in range(1, len(d.encode()))}
    expected = {i for i, b in enumerate(vocab.token_bytes)
                if b is not None and _unicode_digit_prefix(b, digits, partial, 4)}
    assert set(extra[1].tolist()) == expected and len(expected) > 0
    assert extra[0].size == 0 and sum(e.size for e in extra) > len(expected)
