"""Chapter 1 beside xgrammar and llguidance (book.fsm.peers).

The peers are optional: tests that run them skip when they are missing. Their answers (forced strings,
masks, fast-forward tokens) are checked state by state against a brute-force computation over small finite
languages with the real cl100k vocabulary: every valid document listed, every allowed token found among
the substrings of the valid continuations, the canonical tokenization taken from the tokenizer itself.
"""

import itertools
import sys

import numpy as np
import pytest

for _name in ("outlines_core", "outlines", "bpe_openai", "pydantic", "regex"):
    pytest.importorskip(_name)

from book.fsm import lesson  # noqa: E402
from book.fsm.exercises import toy_model  # noqa: E402
from studylog import fsm  # noqa: E402
from book.fsm import peers  # noqa: E402
from studylog.fsm import schemas  # noqa: E402


def _need_peers():
    for name in ("xgrammar", "llguidance"):
        pytest.importorskip(name, reason=f"{name} is an optional peer (the package's 'peers' extra)")


@pytest.fixture(scope="module")
def vocab():
    return fsm.load_vocabulary("cl100k_base")


# --- small finite languages, written out ------------------------------------------------------------------

_META = set("\\.+*?()|[]{}^$")


def _literal(s: str) -> str:
    return "".join("\\" + c if c in _META else c for c in s)


#: name -> every valid document (the regex is their alternation, so the language is exactly this list)
LANGUAGES = {
    "classifier": ['"true"', '"false"', '"NA"'],
    "sql": ["SELECT name FROM users;", "SELECT age FROM users;", "SELECT name FROM orders;"],
    "optional_end": ["yes", "yes!", "no", "no!"],
    "json_ids": ['{"id": 1}', '{"id": 22}', '{"id": 333, "ok": true}'],
    "shared_prefix": ["orderId", "orderName", "order"],
}


def _regex(docs) -> str:
    """The alternation of the documents, longest first: outlines-core's index keeps leftmost-first priority,
    so a branch listed after one of its own prefixes would be lost (see
    test_ours_loses_a_branch_listed_after_its_prefix)."""
    return "(" + "|".join(_literal(d) for d in sorted(docs, key=len, reverse=True)) + ")"


def _entry(name):
    docs = LANGUAGES[name]
    cycle = itertools.cycle(docs)
    return schemas.SuiteEntry(name, "regex", pattern=_regex(docs), sampler=lambda _rng, _ws: next(cycle))


class BruteForce:
    """Answers computed from the list of documents and the vocabulary alone."""

    def __init__(self, docs, vocab):
        self.docs = [d.encode() for d in docs]
        self.vocab = vocab
        self.canon = {d: vocab.encode(d.decode()) for d in self.docs}

    def completions(self, prefix: bytes):
        return [d[len(prefix):] for d in self.docs if d.startswith(prefix)]

    def forced_bytes(self, prefix: bytes) -> bytes:
        """The longest common start of the valid continuations (empty where the text may end here)."""
        out = b""
        for chars in zip(*self.completions(prefix)):  # stops at the shortest continuation, b"" included
            if len(set(chars)) > 1:
                break
            out += bytes([chars[0]])
        return out

    def allowed(self, prefix: bytes) -> set:
        out = set()
        for c in self.completions(prefix):
            if not c:
                out.add(self.vocab.eos_id)
            for j in range(1, len(c) + 1):
                try:
                    out.add(self.vocab.token_id(c[:j]))
                except KeyError:
                    pass
        return out

    def dropped_by_outlines_core(self, prefix: bytes) -> set:
        """What outlines-core 0.2.14's index leaves out: a token whose last byte leaves a text that may end
        (a document) toward one that may not. Its DFA reports a match one byte late, and the index keeps a
        token's end state only when that state is not a match state or is a full match (src/index.rs;
        changed upstream after 0.2.14 by "fix: avoid generating incomplete automata")."""
        out = set()
        for t in self.allowed(prefix):
            data = self.vocab.token_bytes[t]
            if data is not None and prefix + data[:-1] in self.docs and prefix + data not in self.docs:
                out.add(t)
        return out

    def canonical_forced(self, ids) -> list:
        """The longest run of tokens that the canonical tokenization of every document continuing ``ids``
        (canonically) puts next."""
        rest = [self.canon[d][len(ids):] for d in self.docs if self.canon[d][:len(ids)] == list(ids)]
        out = []
        for toks in zip(*rest):
            if len(set(toks)) > 1:
                break
            out.append(toks[0])
        return out


# --- the judge and the decode loop (no peer needed) --------------------------------------------------------

def test_viable_prefix_follows_the_regex():
    assert peers.viable_prefix(r"a\sb", b"a")
    assert peers.viable_prefix(r"a\sb", b"a\xe2\x80")          # U+2000..U+200A are White_Space
    assert peers.viable_prefix(r"a\sb", b"a\xe3\x80\x80")      # U+3000 IDEOGRAPHIC SPACE
    assert not peers.viable_prefix(r"a\sb", b"ax")
    assert not peers.viable_prefix(r"a\sb", b"a\xe4")          # no White_Space starts with E4
    assert peers.viable_prefix(r"a.b", b"a\t")
    assert not peers.viable_prefix(r"a.b", b"a\n")             # '.' stops at a newline
    assert peers.viable_prefix(r"abc", b"")
    with pytest.raises(ValueError, match="UTF-8"):
        peers.viable_prefix(r"a.b", b"a\x80\x80")


@pytest.mark.parametrize("name", ["classifier", "weather_call", "us_phone", "sql_query"])
def test_the_loop_driven_by_ours_is_the_chapters_steps(vocab, rng, name):
    e = schemas.entry(name)
    ours = peers.library("ours", vocab)
    grammar = ours.compile(e.regex())
    seed = int(rng.seed_value)
    for cap in (3, 64):
        model = toy_model(vocab, seed=seed)
        for policy, mode in (("none", "none"), ("tokens", "token"), ("bytes", "char")):
            want = fsm.decode(model, grammar.handle, mode, max_tokens=cap)
            got = peers.jump_forward_decode(model, ours.matcher(grammar), vocab, policy, max_tokens=cap)
            assert (got.ids, got.forward_passes, got.finished) == (want.ids, want.forward_passes, want.finished), \
                (name, policy, cap)
            assert (got.jumped_tokens, got.retokenized) == (want.jumped_tokens, want.retokenized)


def test_a_missing_peer_names_the_extra(vocab, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError, match="peers"):
        peers.library("xgrammar", vocab)
    assert peers.peer_versions(["xgrammar"]) == {"xgrammar": None}
    with pytest.raises(ValueError, match="name"):
        peers.library("outlines", vocab)


def test_packed_masks_round_trip(vocab):
    words = peers.only_eos_mask(vocab)
    allowed = peers.unpack_mask(words, vocab.vocab_size)
    assert allowed.sum() == 1 and allowed[vocab.eos_id]


# --- the peers on brute-force cases ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def libraries(vocab):
    _need_peers()
    return {name: peers.library(name, vocab) for name in peers.LIBRARIES}


def _mask(m, vocab):
    words = np.zeros(peers.mask_words(vocab.vocab_size), dtype=np.int32)
    m.fill_mask(words)
    return set(np.flatnonzero(peers.unpack_mask(words, vocab.vocab_size)).tolist())


@pytest.mark.parametrize("name", list(LANGUAGES))
def test_every_state_against_brute_force(vocab, libraries, name):
    docs = LANGUAGES[name]
    bf = BruteForce(docs, vocab)
    regex = _regex(docs)
    grammars = {lib: libraries[lib].compile(regex) for lib in libraries}
    for doc in bf.docs:
        ids = bf.canon[doc]
        ms = {lib: libraries[lib].matcher(g) for lib, g in grammars.items()}
        for i in range(len(ids) + 1):
            prefix = vocab.decode(ids[:i])
            forced, allowed = bf.forced_bytes(prefix), bf.allowed(prefix)
            for lib, m in ms.items():
                assert m.forced_bytes() == forced, (name, lib, prefix)
            assert _mask(ms["ours"], vocab) == allowed, (name, prefix)
            assert _mask(ms["xgrammar"], vocab) == allowed, (name, prefix)
            llg_mask = _mask(ms["llguidance"], vocab)
            assert llg_mask <= allowed, (name, prefix)
            if not forced:
                assert llg_mask == allowed, (name, prefix)
            # ours forces a token exactly where the brute-force mask holds one text token
            single = len(allowed) == 1 and vocab.eos_id not in allowed
            ours_tokens = ms["ours"].forced_tokens()
            assert bool(ours_tokens) == single and (not single or ours_tokens[0] in allowed), (name, prefix)
            # llguidance's fast-forward tokens start the canonical tokenization of every document here
            ff = list(ms["llguidance"].forced_tokens())
            assert ff == bf.canonical_forced(ids[:i])[:len(ff)], (name, prefix, ff)
            if i < len(ids):
                for m in ms.values():
                    m.consume(ids[i])


def _brute_force_passes(bf, vocab):
    """Passes of a decode that writes each document canonically: with no jumps; with ours' token jumps (a
    state whose brute-force mask holds one text token); and a lower bound for any canonical fast-forward
    (every canonically forced token appended)."""
    none = token = canonical = 0
    for doc in bf.docs:
        ids = bf.canon[doc]
        for i in range(len(ids) + 1):
            allowed = bf.allowed(vocab.decode(ids[:i]))
            if allowed == {vocab.eos_id}:
                continue
            none += 1
            token += not (len(allowed) == 1 and vocab.eos_id not in allowed)
        i = 0
        while True:
            allowed = bf.allowed(vocab.decode(ids[:i]))
            if allowed == {vocab.eos_id}:
                break
            forced = bf.canonical_forced(ids[:i])
            if forced:
                i += len(forced)
                continue
            canonical += 1
            if i == len(ids):
                break
            i += 1
    return none, token, canonical


@pytest.mark.parametrize("name", list(LANGUAGES))
def test_counts_of_compare_peers_against_brute_force(vocab, libraries, name):
    docs = LANGUAGES[name]
    bf = BruteForce(docs, vocab)
    rows = {r.library: r for r in peers.compare_peers([_entry(name)], vocab, n_samples=len(docs))}
    forced_states = single = dropped = 0
    for doc in bf.docs:
        ids = bf.canon[doc]
        for i in range(len(ids) + 1):
            prefix = vocab.decode(ids[:i])
            forced_states += bool(bf.forced_bytes(prefix))
            allowed = bf.allowed(prefix)
            single += len(allowed) == 1 and vocab.eos_id not in allowed
            dropped += bool(bf.dropped_by_outlines_core(prefix))
    assert rows["ours"].states == sum(len(bf.canon[d]) + 1 for d in bf.docs)
    for lib in ("ours", "xgrammar", "llguidance"):
        assert rows[lib].forced_byte_states == forced_states, lib
        assert rows[lib].forced_bytes_differ == 0, lib
    assert rows["ours"].single_token_masks == rows["xgrammar"].single_token_masks == single
    # the peers differ from ours only where outlines-core 0.2.14 drops a token (if it still does)
    assert rows["xgrammar"].masks_differ == rows["llguidance"].masks_differ_unforced in (0, dropped)
    none, token, canonical = _brute_force_passes(bf, vocab)
    assert rows["ours"].passes["none"] == none
    assert rows["ours"].passes["tokens"] == token
    assert rows["llguidance"].passes["tokens"] >= canonical       # it may hold tokens back, never force more
    assert rows["xgrammar"].passes["bytes"] == rows["ours"].passes["bytes"]  # the same forced strings
    assert rows["llguidance"].noncanonical["tokens"] == 0
    for table in (lesson.peers_table, lesson.agreement_table, lesson.timing_table):
        text = table(list(rows.values()))
        assert text.count("\n") >= 2 and name in text


def test_llguidance_holds_back_the_opening_quote(vocab, libraries):
    """On the classifier every document's canonical split starts with the token '"' (brute force), which the
    byte-level jump appends, while llguidance holds it back ('"N' and '"f' are tokens that span the end)."""
    bf = BruteForce(LANGUAGES["classifier"], vocab)
    assert bf.canonical_forced([])[:1] == [vocab.token_id(b'"')]
    m = libraries["llguidance"].matcher(libraries["llguidance"].compile(_regex(LANGUAGES["classifier"])))
    assert m.forced_bytes() == b'"' and m.forced_tokens() == ()


# --- the suite's disagreements, judged without any of the three libraries ----------------------------------

def test_the_suites_mask_disagreements_are_judged_by_the_regex(vocab):
    """xgrammar lets '\\' + newline follow a calendar time (outlines' regex writes the fraction as '\\\\.',
    a backslash then any character but a newline); it refuses the partial UTF-8 tokens that start a Unicode
    space after a date (the regex's '\\s' is Unicode White_Space). The regex module settles both."""
    calendar = schemas.entry("calendar_event").regex()
    prefix = b'{"title": "Dentist", "date": "2024-07-28", "start": "16:30:00'
    assert peers.viable_prefix(calendar, prefix)
    assert not peers.viable_prefix(calendar, prefix + vocab.token_bytes[5779])  # b"\\\n"
    assert peers.viable_prefix(calendar, prefix + b"\\x5")
    datetime = schemas.entry("datetime").regex()
    for t in (157, 158, 159, 378, 1300, 23249, 53233):  # \xe1 \xe2 \xe3 \xe2\x80 \xe3\x80 \xe3\x80\x80 \xe2\x81
        assert peers.viable_prefix(datetime, b"2026-06-16" + vocab.token_bytes[t]), t
    assert not peers.viable_prefix(datetime, b"2026-06-16" + b"\xe4")


def test_compare_peers_refuses_bad_arguments(vocab):
    with pytest.raises(ValueError, match="ours"):
        peers.compare_peers([_entry("sql")], vocab, libraries=("xgrammar",))
    with pytest.raises(ValueError, match="n_samples"):
        peers.compare_peers([_entry("sql")], vocab, n_samples=0)
    other = fsm.compile_fsm("(a|b)", vocab)
    with pytest.raises(ValueError, match="another regex"):
        peers.compare_peers([_entry("sql")], vocab, libraries=("ours",), fsms={"sql": other})


def test_ours_keeps_a_branch_listed_after_its_prefix(vocab, libraries):
    """outlines-core builds its automaton with leftmost-first priority, so in ``(yes|yes!)`` a plain index drops
    the lower-priority ``yes!`` once ``yes`` has matched. Chapter 1 indexes the regex anchored at its end
    (``automaton.end_anchored``), where nothing matches before the end, so no branch is dropped: all three
    libraries allow ``!`` after ``yes``, as the regex's language (the regex module) says."""
    import regex as regex_module

    assert regex_module.fullmatch("(yes|yes!|no|no!)", "yes!")
    answers = {}
    for name, lib in libraries.items():
        m = lib.matcher(lib.compile("(yes|yes!|no|no!)"))
        for t in vocab.encode("yes"):
            m.consume(t)
        answers[name] = _mask(m, vocab)
    bang = vocab.token_id(b"!")
    assert answers["ours"] == answers["xgrammar"] == answers["llguidance"] == {vocab.eos_id, bang}
    from outlines_core import Index

    plain = Index("(yes|yes!|no|no!)", vocab.outlines_vocabulary())  # the index without the anchor
    state = plain.get_initial_state()
    for t in vocab.encode("yes"):
        state = plain.get_next_state(state, t)
    assert set(plain.get_allowed_tokens(state)) == {vocab.eos_id}
    for rx in ("(yes!|yes|no!|no)", "(yes|no)(!)?"):
        assert fsm.compile_fsm(rx, vocab).matches("yes!")


def test_ours_drops_a_one_byte_step_out_of_a_final_state(vocab, libraries):
    """A difference where the peers are right: in ``ab(cd)?`` the text ``ab`` may end or go on with ``cd``;
    outlines-core 0.2.14 keeps the token ``cd`` but not ``c`` (see BruteForce.dropped_by_outlines_core). The
    suite's automata have no such step (test_fsm.py checks every final state of the suite)."""
    bf = BruteForce(["ab", "abcd"], vocab)
    assert bf.dropped_by_outlines_core(b"ab") == {vocab.token_id(b"c")}
    assert peers.viable_prefix("ab(cd)?", b"abc")
    answers = {}
    for name, lib in libraries.items():
        m = lib.matcher(lib.compile("ab(cd)?"))
        m.consume(vocab.token_id(b"ab"))
        answers[name] = _mask(m, vocab)
    assert answers["xgrammar"] == answers["llguidance"] == bf.allowed(b"ab")
    assert answers["ours"] == bf.allowed(b"ab")  # the end-anchored index keeps the step a plain one drops


def test_a_matcher_refuses_a_mask_buffer_it_would_fill_wrongly(vocab, libraries):
    """Every library writes the mask through a pointer: an int64, short, strided or read-only buffer used to get a
    wrong mask without an error. A rollback of a negative count (or, in ours, more than was consumed) is refused."""
    words = peers.mask_words(vocab.vocab_size)
    for name, lib in libraries.items():
        m = lib.matcher(lib.compile("(ab|a)c"))
        for bad in (np.zeros(words, dtype=np.int64), np.zeros(words - 1, dtype=np.int32),
                    np.zeros(2 * words, dtype=np.int32)[::2]):
            with pytest.raises(ValueError, match="int32 array of"):
                m.fill_mask(bad)
        frozen = np.zeros(words, dtype=np.int32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            m.fill_mask(frozen)
        with pytest.raises(TypeError, match="numpy array"):
            m.fill_mask([0] * words)
        with pytest.raises(ValueError, match="rollback takes"):
            m.rollback(-1)
        assert _mask(m, vocab)  # a correct buffer still works
    ours = libraries["ours"].matcher(libraries["ours"].compile("abc"))
    with pytest.raises(ValueError, match="cannot roll back 1 tokens: 0 were consumed"):
        ours.rollback(1)
