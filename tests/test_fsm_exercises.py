"""Chapter 1's exercises: every check accepts the chapter's answer and rejects a planted wrong one."""

import random

import pytest

for _name in ("outlines_core", "outlines", "bpe_openai"):
    pytest.importorskip(_name)

from book.fsm import exercises, solutions  # noqa: E402
from studylog import fsm  # noqa: E402


def test_token_jumps_check(rng, capsys):
    seed = rng.seed_value
    assert exercises.check_token_jumps(solutions.reference_token_jumps, seed=seed)
    # a table read from Jump objects is accepted too
    assert exercises.check_token_jumps(
        lambda t, f: {s: fsm.Jump(tok, b"", end) for s, (tok, end) in solutions.reference_token_jumps(t, f).items()},
        seed=seed, cases=20)

    def one_step_only(trans, finals):  # forgets to follow the chain
        return {s: ((t,), n) for s, out in trans.items() if s not in finals and len(out) == 1 for t, n in out.items()}

    def finals_forced(trans, finals):  # forgets that a final state also allows EOS
        step = {s: ((t,), b"", n) for s, out in trans.items() if len(out) == 1 for t, n in out.items()}
        return {s: (j.tokens, j.end) for s, j in fsm.automaton.forced_chains(step).items()}

    for wrong in (one_step_only, finals_forced, lambda t, f: 1 / 0, lambda t, f: None):
        assert not exercises.check_token_jumps(wrong, seed=seed)
    assert "differ from the chapter's answer" in capsys.readouterr().out


def test_reference_token_jumps_match_the_automaton():
    f = exercises.small_fsm(exercises.SMALL_REGEXES[1])
    eos = f.vocab.eos_id
    trans = {s: {t: n for t, n in out.items() if t != eos} for s, out in f.index.get_transitions().items()}
    assert solutions.reference_token_jumps(trans, f.finals) == {s: (j.tokens, j.end) for s, j in f.token_jumps.items()}


def test_small_vocabulary_indexes_every_regex():
    vocab = exercises.small_vocabulary()
    assert vocab.byte_complete
    for regex in exercises.SMALL_REGEXES:
        f = exercises.small_fsm(regex)
        assert f.token_jumps, f"{regex}: no forced token, the exercise would test nothing"
    assert vocab.decode(vocab.encode('{"name":"x"}')) == b'{"name":"x"}'


def test_jump_decode_check():
    assert exercises.check_jump_decode(fsm.step02_token_jumps)
    assert exercises.check_jump_decode(lambda m, f, max_tokens: (lambda r: (r.ids, r.forward_passes))(
        fsm.step02_token_jumps(m, f, max_tokens=max_tokens)), seeds=3)

    def ignores_the_cap(m, f, max_tokens):
        r = fsm.step02_token_jumps(m, f, max_tokens=10_000)
        return r.ids[:max_tokens], r.forward_passes

    for wrong in (fsm.step01_uncompressed, fsm.step03_char_jumps, ignores_the_cap):
        assert not exercises.check_jump_decode(wrong, seeds=4)


def test_replaced_tokens_check(rng):
    seed = rng.seed_value
    assert exercises.check_replaced_tokens(solutions.reference_replaced_tokens, seed=seed)
    r = random.Random(seed)
    assert solutions.reference_replaced_tokens([1, 2, 3], [1, 2, 4, 5]) == (1, 2)
    assert solutions.reference_replaced_tokens([1, 2], [1, 2, 3]) == (0, 1)

    def off_by_one(a, b):
        replaced, fed = solutions.reference_replaced_tokens(a, b)
        return replaced, fed + 1

    def counts_all(a, b):  # recomputes everything: correct only when nothing is kept
        return len(a), len(b)

    for wrong in (off_by_one, counts_all, lambda a, b: "x"):
        assert not exercises.check_replaced_tokens(wrong, seed=r.randrange(1 << 30))


def test_ff_tokens_check():
    vocab = fsm.load_vocabulary()
    assert exercises.check_ff_tokens(solutions.reference_ff_tokens)
    show = lambda ids: [vocab.show(t) for t in ids]  # noqa: E731
    # the key's closing quote is held back: '":' spans the end of the forced text
    assert show(solutions.reference_ff_tokens(b'location"', vocab)) == ["location"]
    assert show(solutions.reference_ff_tokens(b'{"name":"', vocab)) == ['{"', "name"]

    def everything(forced, v):  # no hold-back: SGLang's retokenized jump
        return v.encode(forced)

    def one_less(forced, v):  # always drops one token
        return v.encode(forced)[:-1]

    for wrong in (everything, one_less):
        assert not exercises.check_ff_tokens(wrong)
