"""Integer bounds in schema regexes (studylog.fsm.ranges): the range regex, the sentinel rewrite, the regex.

Every range regex is checked against Python's arithmetic on a window of integers around the range (all of
it for small ranges; boundaries, powers of ten, a dense middle and random draws for large or open ones),
with Python's ``re`` and with the automaton outlines-core builds from it (byte level and token level).
"""

import json
import random
import re
from typing import Annotated, Literal, Optional, Union

import pytest

for _name in ("outlines_core", "jsonschema", "pydantic"):
    pytest.importorskip(_name)

import jsonschema  # noqa: E402
from outlines_core.json_schema import build_regex_from_schema  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from studylog import fsm  # noqa: E402
from studylog.fsm.ranges import (SENTINEL_BASE, bound_integers, integer_bounds, integer_range_regex,  # noqa: E402
                                 replace_sentinels)

RANGES = [
    (1, 99999), (-40, 125), (0, 0), (-5, -1), (5, 480), (1, 21), (0, 500), (-1000000, 1000000),
    (1, 9), (0, 9), (10, 10), (-1, 0), (-1, 1), (-10, -10), (99, 101), (100, 999), (123, 98765),
    (-98765, -123), (-7, 3), (1, 10), (9, 10), (0, 1), (-100, 100), (7, 7), (19, 2001), (-2001, -19),
    (1000, 1000000), (987654321, 98765432112), (-98765432112, -987654321), (-5, 10 ** 20),
    (-(2 ** 63), 2 ** 63 - 1),
    (None, None), (None, 0), (None, -3), (None, 42), (None, -1000), (0, None), (17, None), (-12, None),
    (1, None), (100, None), (-100, None), (10 ** 12, None),
]

NON_CANONICAL = ["", "-", "+", "-0", "+0", "00", "007", "05", "-05", "-00", "+5", "1.0", "0.0", "5.", "1e3", "1E3",
                 " 5", "5 ", "--5", "0x1", "1_000", "\u0663", "\uff15", "1\u0663", "-\u0661"]


def _ids(r):
    return f"{r[0]}..{r[1]}"


def _window(lo, hi, rnd: random.Random) -> set[int]:
    """Integers around [lo, hi]: everything for small ranges, else boundaries, powers of ten and draws."""
    if lo is not None and hi is not None and hi - lo <= 3000:
        return set(range(lo - (hi - lo) - 150, hi + (hi - lo) + 151))
    out = set(range(-1200, 1201))
    ends = [e for e in (lo, hi) if e is not None]
    for e in ends:
        out.update(range(e - 300, e + 301))
    top = max([abs(e) for e in ends] + [10 ** 6])
    for k in range(len(str(top)) + 3):
        for d in range(-3, 4):
            out.update({10 ** k + d, -(10 ** k) + d, 5 * 10 ** k + d, -5 * 10 ** k + d})
    span = 2 * top + 10
    out.update(rnd.randint(-span, span) for _ in range(3000))
    return out


def _in_range(n: int, lo, hi) -> bool:
    return (lo is None or n >= lo) and (hi is None or n <= hi)


def _cases(lo, hi, rnd) -> dict[str, bool]:
    """Strings to try and whether each must be matched."""
    window = sorted(_window(lo, hi, rnd))
    cases = {str(n): _in_range(n, lo, hi) for n in window}
    for s in NON_CANONICAL:
        cases[s] = False
    for n in rnd.sample(window, min(400, len(window))) + [e for e in (lo, hi) if e is not None]:
        for s in (f"0{abs(n)}", f"-0{abs(n)}", f"+{n}", f"{n}.0", f"{n}e0", f" {n}", f"{n}-", f"{n}{n}"):
            if s not in cases:  # "{n}{n}" may be a canonical integer in range: let arithmetic decide
                cases[s] = bool(re.fullmatch(r"0|-?[1-9][0-9]*", s)) and _in_range(int(s), lo, hi)
    return cases


@pytest.fixture(scope="module")
def digit_vocab():
    tokens = [*"0123456789", "-", "+", ".", "e", " ", "00", "10", "-1", "99", "480", "12", "000", "x",
              "\u0663", "\uff15"]
    return fsm.make_vocabulary({t: i for i, t in enumerate(tokens)}, eos_id=len(tokens), name="digits")


def _tokens(vocab, text: str) -> Optional[list[int]]:
    """Greedy longest-match tokenization over the small vocabulary; None when a character has no token."""
    table = {vocab.token_bytes[i]: i for i in range(vocab.vocab_size) if vocab.token_bytes[i]}
    data, out, i = text.encode(), [], 0
    while i < len(data):
        j = next((j for j in range(len(data), i, -1) if data[i:j] in table), None)
        if j is None:
            return None
        out.append(table[data[i:j]])
        i = j
    return out


def _token_accepts(auto, ids) -> bool:
    if ids is None:
        return False
    s = auto.initial
    for t in ids:
        s = auto.index.get_next_state(s, t)
        if s is None:
            return False
    return s in auto.finals


# --- integer_range_regex ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bounds", RANGES, ids=_ids)
def test_range_regex_matches_exactly_the_range(bounds, rng, digit_vocab):
    lo, hi = bounds
    rx = integer_range_regex(lo, hi)
    assert "\\d" not in rx and "(?:" in f"(?:{rx})"
    assert re.search(r"\((?!\?:)", rx) is None, f"capturing group in {rx!r}"
    digits = len(str(max(abs(lo or 0), abs(hi or 0))))
    sides = (lo is None or lo < 0) + (hi is None or hi >= 0)  # a negative and a non-negative part
    assert len(rx) <= sides * (32 * digits + 20) + 20, f"not compact: {rx!r}"
    rnd = random.Random(f"{rng.seed_value}/{lo}/{hi}")
    cases = _cases(lo, hi, rnd)
    # outlines-core builds its DFA with an unanchored start too, which grows exponentially with a long
    # run of counted digits after a [1-9] (a bound of 16 digits costs a second, 20 digits several): the
    # widest ranges are checked with Python's re only.
    auto = fsm.compile_fsm(rx, digit_vocab, name=f"{lo}..{hi}") if digits <= 12 else None
    token_checked = set(rnd.sample(sorted(cases), min(1500, len(cases))))
    for text, want in cases.items():
        assert bool(re.fullmatch(rx, text)) == want, f"re: {text!r} with {rx!r}"
        if auto is None:
            continue
        assert auto.matches(text) == want, f"outlines-core automaton: {text!r} with {rx!r}"
        if text in token_checked:
            assert _token_accepts(auto, _tokens(digit_vocab, text)) == want, f"token level: {text!r} with {rx!r}"


def test_range_regex_is_compact_and_longest_first():
    assert integer_range_regex(1, 99999) == "[1-9][0-9]{0,4}"
    assert integer_range_regex(0, 0) == "0"
    assert integer_range_regex(-5, -1) == "-[1-5]"
    assert integer_range_regex(1, 21) == "2[01]|1[0-9]|[1-9]"
    assert integer_range_regex(5, 480) == "4(?:80|[0-7][0-9])|[1-3][0-9]{2}|[1-9][0-9]|[5-9]"
    assert integer_range_regex(None, None) == "-[1-9][0-9]*|[1-9][0-9]+|[0-9]"
    for lo, hi in RANGES:
        rx = integer_range_regex(lo, hi)
        assert rx.count("|") <= 4 * len(str(max(abs(lo or 0), abs(hi or 0)))) + 4, rx


def test_range_regex_without_end_anchor_keeps_long_numbers(digit_vocab):
    """Longer branches come first, so even outlines-core's leftmost-first DFA without the chapter's end
    anchor keeps the long numbers (raw Index, not compile_fsm)."""
    from outlines_core import Index

    for lo, hi in [(5, 480), (1, 21), (-40, 125), (0, 500), (17, None)]:
        rx = integer_range_regex(lo, hi)
        index = Index(rx, digit_vocab.outlines_vocabulary())
        for n in [lo, hi, 10, 99, 100, 125, 480, 21, 200, 1000]:
            if n is None:
                continue
            s = index.get_initial_state()
            for t in _tokens(digit_vocab, str(n)):
                s = None if s is None else index.get_next_state(s, t)
            assert (s is not None and index.is_final_state(s)) == _in_range(n, lo, hi), (n, rx)


def test_range_regex_refuses_bad_input():
    with pytest.raises(ValueError, match="empty"):
        integer_range_regex(5, 4)
    for bad in [(1.5, 3), (True, 3), ("1", 3), (1, 2.0)]:
        with pytest.raises(TypeError):
            integer_range_regex(*bad)


def test_outlines_core_ignores_bounds():
    """The bug this module fixes: outlines-core's regex for 1..9 accepts 10 (and -3)."""
    schema = {"type": "integer", "minimum": 1, "maximum": 9}
    plain = build_regex_from_schema(json.dumps(schema))
    assert re.fullmatch(plain, "10") and re.fullmatch(plain, "-3")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(10, schema)
    bounded = regex_with_bounds(schema)
    assert bounded == "(?:[1-9])"
    assert [n for n in range(-20, 30) if re.fullmatch(bounded, str(n))] == list(range(1, 10))


# --- bounds of a subschema ----------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, want", [
    ({"minimum": 1, "maximum": 9}, (1, 9)),
    ({"exclusiveMinimum": 1, "exclusiveMaximum": 9}, (2, 8)),
    ({"minimum": 1.5, "maximum": 9.5}, (2, 9)),
    ({"exclusiveMinimum": 1.5, "exclusiveMaximum": 9.5}, (2, 9)),
    ({"exclusiveMinimum": -1.0, "exclusiveMaximum": 1.0}, (0, 0)),
    ({"minimum": -2.5}, (-2, None)),
    ({"maximum": -2.5}, (None, -3)),
    ({"minimum": 1, "exclusiveMinimum": 3, "maximum": 10, "exclusiveMaximum": 7.2}, (4, 7)),
    ({"minimum": 1, "maximum": 9, "exclusiveMinimum": True, "exclusiveMaximum": True}, (2, 8)),  # draft 4
    ({"minimum": 1, "maximum": 9, "exclusiveMinimum": False}, (1, 9)),
    ({"minimum": 1e20}, (10 ** 20, None)),
    ({}, (None, None)),
])
def test_integer_bounds(schema, want):
    assert integer_bounds(schema) == want
    lo, hi = want
    if lo is not None and hi is not None:  # agrees with jsonschema around the interval
        validator = jsonschema.validators.validator_for({"$schema": "http://json-schema.org/draft-04/schema#"}
                                                        if schema.get("exclusiveMinimum") is True
                                                        or schema.get("exclusiveMaximum") is True else {})
        v = validator(dict(schema, type="integer"))
        for n in range(lo - 5, hi + 6):
            assert v.is_valid(n) == (lo <= n <= hi), n


# --- bound_integers and the regex with bounds ------------------------------------------------------------

def regex_with_bounds(schema, whitespace_pattern=None):
    return fsm.regex_from_schema(schema, whitespace_pattern, integer_bounds=True)


class Dice(BaseModel):
    kind: Literal["dice"]
    faces: int = Field(ge=1, le=9)


class Coin(BaseModel):
    kind: Literal["coin"]
    side: int = Field(ge=0, le=1)
    count: int  # no bounds: left alone


class Roll(BaseModel):
    pick: Union[Dice, Coin]
    history: list[Dice]
    temperature: int = Field(gt=-41, lt=126)
    maybe: Optional[Annotated[int, Field(ge=5, le=480)]]
    pair: tuple[Annotated[int, Field(ge=1, le=21)], str]
    year: int = Field(ge=0, le=500)
    exact: Literal[3, 4]  # enum of integers: left alone


ROLL_SCHEMA = Roll.model_json_schema()


def test_bound_integers_rewrites_definitions_in_place():
    before = json.dumps(ROLL_SCHEMA)
    rewritten, mapping = bound_integers(ROLL_SCHEMA)
    assert json.dumps(ROLL_SCHEMA) == before, "the input schema was modified"
    assert len(mapping) == 6  # faces, side, temperature, maybe, pair[0], year
    assert set(mapping) == {str(SENTINEL_BASE + k) for k in range(6)}
    assert all(v.startswith("(?:") and v.endswith(")") for v in mapping.values())
    # $refs stay, the definitions are rewritten where they are
    assert rewritten["properties"]["history"]["items"] == {"$ref": "#/$defs/Dice"}
    assert rewritten["properties"]["pick"] == ROLL_SCHEMA["properties"]["pick"]
    faces = rewritten["$defs"]["Dice"]["properties"]["faces"]
    assert list(faces) == ["const"] and mapping[str(faces["const"])] == "(?:[1-9])"
    assert rewritten["$defs"]["Coin"]["properties"]["count"] == ROLL_SCHEMA["$defs"]["Coin"]["properties"]["count"]
    assert rewritten["properties"]["exact"] == ROLL_SCHEMA["properties"]["exact"]
    assert mapping[str(rewritten["properties"]["temperature"]["const"])] == f"(?:{integer_range_regex(-40, 125)})"
    maybe = rewritten["properties"]["maybe"]["anyOf"]
    assert mapping[str(maybe[0]["const"])] == f"(?:{integer_range_regex(5, 480)})" and maybe[1] == {"type": "null"}
    jsonschema.validators.validator_for(rewritten).check_schema(rewritten)


def _roll_text(faces, side, history, temperature, maybe, pair0, year, exact=3, coin=False, sep=""):
    pick = ({"kind": "coin", "side": side, "count": 12345} if coin else {"kind": "dice", "faces": faces})
    doc = {"pick": pick, "history": [{"kind": "dice", "faces": f} for f in history], "temperature": temperature,
           "maybe": maybe, "pair": [pair0, "x"], "year": year, "exact": exact}
    return json.dumps(doc, separators=("," + sep, ":" + sep))


@pytest.mark.parametrize("whitespace", [None, ""])
def test_regex_with_bounds_on_nested_pydantic_schema(whitespace, rng):
    rx = regex_with_bounds(Roll, whitespace)
    assert rx == regex_with_bounds(ROLL_SCHEMA, whitespace) == regex_with_bounds(json.dumps(ROLL_SCHEMA), whitespace)
    assert str(SENTINEL_BASE)[:10] not in rx, "a sentinel was left in the regex"
    plain = fsm.regex_from_schema(Roll, whitespace)
    sep = " " if whitespace is None else ""
    valid = [
        _roll_text(1, 0, [9, 1], -40, None, 1, 0),
        _roll_text(9, 1, [], 125, 480, 21, 500, exact=4, coin=True),
        _roll_text(5, 1, [3] * 7, 0, 5, 10, 250, sep=sep),
    ]
    out_of_range = [
        _roll_text(10, 0, [1], 0, None, 1, 0),       # faces in the union branch
        _roll_text(0, 0, [1], 0, None, 1, 0),
        _roll_text(1, 0, [1, 10], 0, None, 1, 0),    # faces in a list item (the $def written twice)
        _roll_text(1, 0, [1], 0, None, 1, 0).replace('"faces":1}]', '"faces":-1}]'),
        _roll_text(1, 2, [1], 0, None, 1, 0, coin=True),
        _roll_text(1, 0, [1], -41, None, 1, 0),      # exclusive bounds
        _roll_text(1, 0, [1], 126, None, 1, 0),
        _roll_text(1, 0, [1], 0, 4, 1, 0),           # Optional[...] branch
        _roll_text(1, 0, [1], 0, 481, 1, 0),
        _roll_text(1, 0, [1], 0, None, 22, 0),       # prefixItems
        _roll_text(1, 0, [1], 0, None, 1, 501),
        _roll_text(1, 0, [1], 0, None, 1, -1),
    ]
    for text in valid:
        Roll.model_validate_json(text)
        assert re.fullmatch(rx, text), text
        assert re.fullmatch(plain, text), text
    for text in out_of_range:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(text), ROLL_SCHEMA)
        assert re.fullmatch(plain, text), f"outlines' own regex should accept {text} (the bug)"
        assert not re.fullmatch(rx, text), text
    # random documents: the regex agrees with jsonschema on every one
    rnd = random.Random(f"{rng.seed_value}/roll")
    for _ in range(400):
        args = (rnd.randint(-2, 11), rnd.randint(-1, 2), [rnd.randint(-1, 10) for _ in range(rnd.randint(0, 3))],
                rnd.randint(-45, 130), rnd.choice([None, rnd.randint(0, 490)]), rnd.randint(-1, 23),
                rnd.randint(-3, 503))
        text = _roll_text(*args, exact=rnd.choice([3, 4, 5]), coin=rnd.random() < 0.5, sep=sep)
        ok = jsonschema.validators.validator_for(ROLL_SCHEMA)(ROLL_SCHEMA).is_valid(json.loads(text))
        assert bool(re.fullmatch(rx, text)) == ok, text


def test_regex_with_bounds_automaton(digit_vocab):
    """The regex of a nested schema compiles with outlines-core and its automaton agrees with ``re``."""
    schema = {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/Small"},
        "b": {"type": "array", "items": {"$ref": "#/$defs/Small"}, "maxItems": 3},
        "c": {"type": ["integer", "null"], "minimum": -5, "exclusiveMaximum": 0},
        "d": {"anyOf": [{"type": "integer", "minimum": 100}, {"type": "boolean"}]},
        "e": {"type": "integer"},
    }, "required": ["a", "b", "c", "d", "e"], "$defs": {"Small": {"type": "integer", "minimum": 1, "maximum": 9}}}
    rx = regex_with_bounds(schema, "")
    words = [*"0123456789", "-", "{", "}", "[", "]", ",", ":", '"', "a", "b", "c", "d", "e", "n", "u", "l",
             "t", "r", "f", "s", "true", "null", '"a":', "false"]
    vocab = fsm.make_vocabulary({w: i for i, w in enumerate(words)}, eos_id=len(words), name="json-digits")
    auto = fsm.compile_fsm(rx, vocab)
    validator = jsonschema.validators.validator_for(schema)(schema)
    rnd = random.Random(7)
    for _ in range(600):
        doc = {"a": rnd.randint(-1, 11), "b": [rnd.randint(0, 10) for _ in range(rnd.randint(0, 3))],
               "c": rnd.choice([None, rnd.randint(-7, 2)]),
               "d": rnd.choice([True, False, rnd.randint(90, 110), rnd.randint(-5, 5) * 10 ** rnd.randint(0, 4)]),
               "e": rnd.randint(-10 ** 6, 10 ** 6)}
        text = json.dumps(doc, separators=(",", ":"))
        want = validator.is_valid(doc)
        assert bool(re.fullmatch(rx, text)) == want, text
        assert auto.matches(text) == want, text


def test_bound_integers_leaves_unbounded_and_pinned_integers_alone():
    schema = {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer", "enum": [1, 50]},
        "c": {"const": 5, "type": "integer", "minimum": 6}, "d": {"type": "number", "minimum": 1},
        "e": {"type": "integer", "minimum": 0}}}
    rewritten, mapping = bound_integers(schema)
    assert list(mapping.values()) == [f"(?:{integer_range_regex(0, None)})"]
    assert {k: v for k, v in rewritten["properties"].items() if k != "e"} == \
        {k: v for k, v in schema["properties"].items() if k != "e"}
    assert bound_integers({"type": "integer"}) == ({"type": "integer"}, {})


def test_bound_integers_unreferenced_definitions_and_recursion():
    schema = {"$defs": {"Unused": {"type": "integer", "minimum": 3},
                        "Node": {"type": "object", "properties": {
                            "v": {"type": "integer", "minimum": 0, "maximum": 99},
                            "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}, "required": ["v"]}},
              "$ref": "#/$defs/Node"}
    rewritten, mapping = bound_integers(schema)
    assert len(mapping) == 1  # Unused is not written by outlines-core: not rewritten, no sentinel to miss
    assert rewritten["$defs"]["Unused"] == schema["$defs"]["Unused"]
    rx = regex_with_bounds(schema, "")
    assert re.fullmatch(rx, '{"v":7,"next":{"v":99,"next":null}}')
    assert not re.fullmatch(rx, '{"v":7,"next":{"v":100,"next":null}}')


def test_sentinels_avoid_digits_already_in_the_schema():
    schema = {"type": "object", "properties": {"a": {"const": SENTINEL_BASE}, "b": {"type": "integer", "maximum": 3}}}
    rewritten, mapping = bound_integers(schema)
    (digits,) = mapping
    assert str(SENTINEL_BASE)[:10] not in digits
    rx = regex_with_bounds(schema, "")
    assert re.fullmatch(rx, f'{{"a":{SENTINEL_BASE},"b":-7}}') and not re.fullmatch(rx, f'{{"a":{SENTINEL_BASE},"b":4}}')


def test_never_a_silent_miss():
    mapping = {str(SENTINEL_BASE): "(?:[1-9])"}
    with pytest.raises(ValueError, match="does not occur"):
        replace_sentinels(r"\{\}", mapping)
    with pytest.raises(ValueError, match="longer literal"):
        replace_sentinels(f"{SENTINEL_BASE}5", mapping)
    with pytest.raises(ValueError, match="longer literal"):
        replace_sentinels(f"-{SENTINEL_BASE}", mapping)
    assert replace_sentinels(f"a{SENTINEL_BASE}b({SENTINEL_BASE})", mapping) == "a(?:[1-9])b((?:[1-9]))"
    with pytest.raises(ValueError, match="empty"):
        bound_integers({"type": "integer", "minimum": 5, "maximum": 4})
    with pytest.raises(ValueError, match="empty"):
        regex_with_bounds({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})
    with pytest.raises(ValueError):
        regex_with_bounds("{not json")
