"""Chapter 7 on xgrammar alone: where outlines-core cannot build chapter 1's automaton, steps 2 and 3 read allowed
sets and forced tokens from xgrammar's matcher (``lab/decode/fallback.py``). On grammars both engines compile,
the matcher's automaton is checked against chapter 1's state by state (allowed ids, EOS, forced chains, refused
tokens) and the steps on it write chapter 1's tokens; a real schema outlines refuses decodes with the three steps
writing the same tokens; bad engines and schemas are refused with errors that name them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from studylog.decode import (Decoder, Grammar, LlamaModel, model_config, pieces, schema_regex, step01_baseline,
                             step02_jump_forward, step03_masked_head, suite_sample)
from studylog.fsm import make_vocabulary
from book.fsm.exercises import longest_match_encoder
import lab_scripts

fallback = lab_scripts.load("decode", "fallback")
MatcherAutomaton = fallback.MatcherAutomaton

STEPS = (step01_baseline, step02_jump_forward, step03_masked_head)
PROMPT = "Give the answer in the required format."
#: SchemaStore's JSONPatch schema (json.schemastore.org/json-patch, as the catalog of chapter 1 holds it): outlines
#: cannot write its untyped "value" as a regex; xgrammar compiles it.
JSON_PATCH = {
    "title": "JSON schema for JSONPatch files", "$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
    "items": {"oneOf": [
        {"additionalProperties": False, "required": ["value", "op", "path"],
         "properties": {"path": {"$ref": "#/definitions/path"},
                        "op": {"description": "The operation to perform.", "type": "string",
                               "enum": ["add", "replace", "test"]},
                        "value": {"description": "The value to add, replace or test."}}},
        {"additionalProperties": False, "required": ["op", "path"],
         "properties": {"path": {"$ref": "#/definitions/path"},
                        "op": {"description": "The operation to perform.", "type": "string", "enum": ["remove"]}}},
        {"additionalProperties": False, "required": ["from", "op", "path"],
         "properties": {"path": {"$ref": "#/definitions/path"},
                        "op": {"description": "The operation to perform.", "type": "string", "enum": ["move", "copy"]},
                        "from": {"$ref": "#/definitions/path",
                                 "description": "A JSON Pointer path pointing to the location to move/copy from."}}}]},
    "definitions": {"path": {"description": "A JSON Pointer path.", "type": "string"}}}
#: Valid JSONPatch documents, written as xgrammar's grammar orders an object's properties (the schema's order).
PATCHES = ['[{"path":"/a/b","op":"remove"}]',
           '[{"path":"/tags/0","op":"add","value":{"k":[1,true,null]}},{"path":"/x","op":"move","from":"/y"}]',
           '[{"path":"/name","op":"replace","value":"Ada"}]']


@pytest.fixture(scope="module")
def vocab():
    return pieces.load_vocabulary("cl100k_base")


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel(model_config("tiny"), dtype=torch.float32, seed=1)


@pytest.fixture(scope="module")
def decoders(tiny):
    return {1: Decoder(tiny, batch=1, max_seq=200), 3: Decoder(tiny, batch=3, max_seq=200)}


def _grammar(kind: str, vocab, engine: str) -> Grammar:
    """A suite entry (``name/whitespace``) or a regex (``re:...``), built by ``engine``."""
    if kind.startswith("re:"):
        return fallback.from_regex(kind[3:], vocab, engine=engine)
    name, ws = kind.split("/")
    return fallback.from_suite(name, vocab, whitespace=ws, engine=engine)


def _walks(kind: str, vocab, seed: int) -> list[list[int] | None]:
    """Token walks: the tokenizations of two valid outputs (suite entries), and two random walks (None)."""
    if kind.startswith("re:"):
        return [None] * 4
    name, ws = kind.split("/")
    return [vocab.encode(suite_sample(name, seed=s, whitespace=ws)) for s in (seed, seed + 1)] + [None, None]


# --- the matcher's automaton is chapter 1's, state by state ------------------------------------------------------

@pytest.mark.parametrize("kind", ["weather_call/compact", "tool_call/default", "ipv4/default", "datetime/compact",
                                  "re:(cat|category)s?", r"re:[a-z]{2,8}(\.(com|org))?( [0-9]{1,3})?",
                                  "re:(café|naïve|señor|Ærø|日本)s?"])
def test_the_matcher_automaton_is_chapter_1s(vocab, kind):
    """Along valid outputs and random walks (each step a uniformly drawn allowed token, EOS aside): the same
    allowed ids (EOS included), the same ``only_eos``, the same forced chains ending in equal states, and the same
    refusals; where xgrammar's own mask has more (a dead end such as " \\xe0" before a digit), the fallback drops
    it as chapter 1 does."""
    import xgrammar as xgr

    ref = _grammar(kind, vocab, "outlines-core")
    fb = MatcherAutomaton(ref.xgrammar, vocab, kind)
    auto = ref.automaton
    raw, dropped = xgr.allocate_token_bitmask(1, vocab.vocab_size), 0
    rng = np.random.default_rng(7)
    for walk in _walks(kind, vocab, seed=1):
        s, t, matcher = auto.initial, fb.initial, ref.matcher()
        for i in range(len(walk) if walk is not None else 40):
            want, got = auto.allowed_ids(s), fb.allowed_ids(t)
            assert np.array_equal(want, got), (kind, i, np.setdiff1d(want, got)[:5], np.setdiff1d(got, want)[:5])
            assert auto.only_eos(s) == fb.only_eos(t)
            ja, jb = auto.token_jump(s), fb.token_jump(t)
            assert (ja is None) == (jb is None), (kind, i)
            if ja is not None:
                assert (ja.tokens, ja.data) == (jb.tokens, jb.data)
                assert np.array_equal(auto.allowed_ids(ja.end), fb.allowed_ids(jb.end))
            assert fb.char_jump(t) is None
            matcher.fill_next_token_bitmask(raw)
            dropped += int(np.unpackbits(raw[0].numpy().view(np.uint8)).sum()) > len(got)
            refused = int(rng.integers(vocab.vocab_size))
            if refused not in want:
                assert auto.next(s, refused) is None and fb.next(t, refused) is None
            assert fb.next(t, vocab.eos_id) is None
            choices = want[want != vocab.eos_id]
            if walk is None and not len(choices):
                break
            tok = int(walk[i] if walk is not None else choices[rng.integers(len(choices))])
            s, t = auto.next(s, tok), fb.next(t, tok)
            assert matcher.accept_token(tok)
    assert dropped or kind != "tool_call/default"  # its walks cross " \xe0" after "passengers": (a dead end)
    assert fb.n_states == len(fb.token_states()) and 0 <= fb.n_token_forced <= fb.n_states
    assert fb.n_token_forced or kind.startswith("re:")  # every suite entry has forced tokens


def test_inside_a_character_the_matcher_automaton_allows_what_chapter_1s_does(vocab):
    """After a lone lead byte inside a JSON string, only its continuation bytes may follow: xgrammar's mask and
    matcher also take a surrogate's (0xA0 after 0xED), which leaves the text invalid UTF-8; the fallback drops it
    as chapter 1's automaton does. Unknown states and disallowed tokens are refused by name."""
    ref = Grammar.from_suite("weather_call", vocab, whitespace="compact")
    fb = MatcherAutomaton(ref.xgrammar, vocab, "weather_call")
    prefix = vocab.encode('{"name":"get_weather","arguments":{"location":"')
    for lead in (0xED, 0xE4, 0xF0, 0xC3):
        ids = prefix + [vocab.token_id(bytes([lead]))]
        s, t = ref.automaton.walk(ids, ref.automaton.initial)[-1], fb.walk(ids, fb.initial)[-1]
        want = ref.automaton.allowed_ids(s)
        assert np.array_equal(want, fb.allowed_ids(t)), hex(lead)
        assert all(0x80 <= vocab.token_bytes[int(x)][0] <= 0xBF for x in want)
    surrogate, matcher = vocab.token_id(bytes([0xA0])), ref.matcher()
    for tok in prefix + [vocab.token_id(b"\xed")]:
        assert matcher.accept_token(tok)
    assert matcher.accept_token(surrogate)  # xgrammar takes it
    assert fb.next(fb.walk(prefix + [vocab.token_id(b"\xed")], 0)[-1], surrogate) is None
    with pytest.raises(ValueError, match="not allowed"):
        fb.walk(prefix + [vocab.eos_id], 0)
    with pytest.raises(ValueError, match="not a state"):
        fb.allowed_ids(fb.n_states)


# --- the three steps on the matcher's automaton ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["weather_call", "us_phone"])
def test_the_steps_write_chapter_1s_tokens_on_the_fallback(vocab, decoders, name):
    """Greedy, batch 1 and 3, steered (realistic samples) and free: steps 1-3 on the fallback grammar write the
    same tokens as each other and as on chapter 1's grammar, with the same jumps and forwards."""
    ws = "compact"
    fb = fallback.from_suite(name, vocab, whitespace=ws, engine="xgrammar")
    ref = Grammar.from_suite(name, vocab, whitespace=ws)
    assert fb.engine == "xgrammar" and isinstance(fb.automaton, MatcherAutomaton)
    assert not isinstance(ref, fallback.FallbackGrammar)
    samples = [suite_sample(name, seed=s, whitespace=ws) for s in (0, 4, 9)]
    cases = [(1, [PROMPT], [samples[0]]), (1, [PROMPT], None),
             (3, [PROMPT, "Another prompt", PROMPT + " Be brief."], [samples[1], None, samples[2]])]
    for batch, prompts, targets in cases:
        dec = decoders[batch]
        kw = dict(max_new_tokens=24, targets=targets)
        outs = [step(dec, fb, prompts, **kw) for step in STEPS]
        want = step02_jump_forward(dec, ref, prompts, **kw)
        for out in outs:
            assert out.ids == want.ids, (name, batch, out.config, out.text, want.text)
        for out in outs[1:]:  # the same forced chains: as many tokens jumped, as many forwards
            assert (out.forwards, out.jumped) == (want.forwards, want.jumped), (name, batch, out.config)
        for b, target in enumerate(targets or []):
            if target is not None:
                assert outs[0].text[b] == target.encode() and outs[0].finished[b]
    # the matcher enumerates no character-level automaton: the "char" configuration takes no jumps on it
    char = decoders[1].generate(fb, [PROMPT], "char_jump", max_new_tokens=24, targets=[samples[0]])
    assert char.text == [samples[0].encode()] and char.jumped == [0] and char.retokenized == [0]


# --- a real schema outlines refuses ------------------------------------------------------------------------------

def test_a_schema_outlines_refuses_decodes_on_xgrammar(vocab, decoders):
    """SchemaStore's JSONPatch: outlines cannot write it as a regex; engine="auto" compiles it with xgrammar and
    the three steps write the same tokens, steered to valid patches (which the schema validates) and free."""
    import jsonschema

    with pytest.raises(ValueError, match="Unsupported JSON Schema"):
        schema_regex(JSON_PATCH, "compact")
    with pytest.raises(ValueError, match="JSONPatch.*Unsupported JSON Schema"):
        Grammar.from_schema(JSON_PATCH, vocab, whitespace="compact")
    with pytest.raises(ValueError, match="JSONPatch.*engine='auto'"):
        fallback.from_schema(JSON_PATCH, vocab, whitespace="compact", engine="outlines-core")
    grammar = fallback.from_schema(JSON_PATCH, vocab, whitespace="compact", engine="auto")
    assert grammar.engine == "xgrammar" and grammar.regex == "" and "Unsupported" in grammar.fallback_reason
    assert set(grammar.compile_seconds) == {"xgrammar"}
    with pytest.raises(ValueError, match="no automaton of chapter 1"):
        grammar.check_agreement()
    for batch, targets in ((1, PATCHES[:1]), (1, None), (3, [PATCHES[1], None, PATCHES[2]])):
        prompts = [PROMPT + " " * b for b in range(batch)]
        outs = [step(decoders[batch], grammar, prompts, max_new_tokens=40, targets=targets) for step in STEPS]
        assert all(o.ids == outs[0].ids for o in outs), (batch, [o.text for o in outs])
        for b, target in enumerate(targets or []):
            if target is not None:
                assert outs[0].text[b] == target.encode() and outs[0].finished[b]
                jsonschema.validate(json.loads(target), JSON_PATCH)
        # (cl100k writes every prefix of a key several ways, so JSONPatch's outputs cross no forced chain here)
        assert outs[2].forwards == outs[1].forwards <= outs[0].forwards


@pytest.mark.parametrize("ws,good,bad", [
    ("compact", '[{"path":"/a","op":"remove"}]', '[{"path": "/a","op":"remove"}]'),
    ("default", '[{"path": "/a", "op": "remove"}]', '[{"path":  "/a", "op": "remove"}]')])
def test_the_schemas_whitespace_is_chapter_1s_where_xgrammar_can_say_it(vocab, ws, good, bad):
    """compact: no whitespace; default: one optional whitespace character where outlines allows a space."""
    auto = fallback.from_schema(JSON_PATCH, vocab, whitespace=ws, engine="xgrammar").automaton
    assert vocab.eos_id in auto.allowed_ids(auto.walk(vocab.encode(good), auto.initial)[-1])
    compact = good.replace(" ", "")
    assert vocab.eos_id in auto.allowed_ids(auto.walk(vocab.encode(compact), auto.initial)[-1])
    with pytest.raises(ValueError, match="not allowed"):
        auto.walk(vocab.encode(bad), auto.initial)


# --- engines ---------------------------------------------------------------------------------------------------

def test_auto_keeps_chapter_1s_automaton_where_outlines_core_builds_it(vocab):
    auto = fallback.from_regex(r"[0-9]{3}-[0-9]{4}", vocab, engine="auto")
    assert not isinstance(auto, fallback.FallbackGrammar) and "agreement" in auto.compile_seconds
    fb = fallback.from_regex(r"[0-9]{3}-[0-9]{4}", vocab, engine="xgrammar")
    assert fb.engine == "xgrammar" and set(fb.compile_seconds) == {"xgrammar"}
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}},
              "required": ["n"]}
    assert fallback.from_schema(schema, vocab, engine="xgrammar").regex == schema_regex(schema)  # outlines' regex


def test_auto_falls_back_where_outlines_core_refuses_a_regex():
    """A vocabulary without "z" cannot write ``az+``: outlines-core refuses to index it, xgrammar compiles it (and
    allows nothing after the "a"), so "auto" records the fallback and why."""
    table = {bytes([b]): b for b in range(256) if b != ord("z")}
    toy = make_vocabulary(table, eos_id=256, name="no-z", encoder=longest_match_encoder(table))
    with pytest.raises(ValueError, match="automaton of chapter 1 cannot be built"):
        Grammar.from_regex("az+", toy)
    grammar = fallback.from_regex("az+", toy, engine="auto")
    assert grammar.engine == "xgrammar" and "cannot write" in grammar.fallback_reason
    assert set(grammar.compile_seconds) == {"xgrammar", "automaton_refused"}
    auto = grammar.automaton
    assert auto.allowed_ids(auto.initial).tolist() == [ord("a")]
    assert auto.allowed_ids(auto.next(auto.initial, ord("a"))).tolist() == []


def test_bad_engines_and_schemas_are_refused(vocab):
    for bad in ("xgr", "", None, "Outlines-Core"):
        with pytest.raises(ValueError, match="engine must be one of"):
            fallback.from_regex("a+", vocab, engine=bad)
        with pytest.raises(ValueError, match="engine must be one of"):
            fallback.from_schema({"type": "string"}, vocab, engine=bad)
    with pytest.raises(ValueError, match="engine must be one of"):
        fallback.from_suite("ipv4", vocab, engine="fast")
    with pytest.raises(ValueError, match=r"schema 'schema' compiles with neither engine: outlines: .*not valid JSON.*"
                                         r"xgrammar cannot compile"):
        fallback.from_schema("{not json", vocab, engine="auto")
    missing = {"title": "dangling", "type": "object", "properties": {"a": {"$ref": "#/definitions/nowhere"}}}
    with pytest.raises(ValueError, match="schema 'dangling' compiles with neither engine.*outlines.*xgrammar"):
        fallback.from_schema(missing, vocab, engine="xgrammar")
    with pytest.raises(ValueError, match="whitespace must be one of"):
        fallback.from_schema(JSON_PATCH, vocab, whitespace="pretty", engine="auto")
